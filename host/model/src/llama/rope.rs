//! Rotary position embedding: the angles a model rotates q and k by, and
//! the ops that rotate them.
//!
//! A scaled rope is the plain one with each frequency divided by a factor,
//! as llama.cpp applies a GGUF's `rope_freqs.weight` (its converter writes
//! Llama 3's scaling there) and as mlx-lm's `Llama3RoPE` builds its
//! periods: theta_i(pos) = pos * base^(-2i / dims) / f_i. So a model holds
//! one list of factors ([`crate::LlamaConfig::rope_freq_factors`]) whatever
//! the file said, and every rope op (specd's kernel, the rope folded into
//! the q/k/v matmul, MLX's `fast::rope`) takes it.
//!
//! Phi-3.5's `longrope` and Qwen 2.5's `yarn` are such factors too, plus an
//! attention factor that multiplies the rotated values of q and k
//! ([`crate::LlamaConfig::rope_attn_factor`]); the loader folds its square
//! into the q projection (`load.rs`), so the forward is the plain one.
//! Phi-4-mini rotates only the first `rope_dims` values of each head.
use super::Llama;
use anyhow::{bail, Context, Result};
use specd_mlx::{fast, kernels, Array};

/// What a scaled rope changes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Scaling {
    /// Divisors of the frequencies, one per rotated pair (`None`: plain).
    pub factors: Option<Vec<f32>>,
    /// Multiplies the rotated values of q and k (`None`: 1).
    pub attn_factor: Option<f32>,
}

/// The rope a config states besides its `rope_scaling`: the rotated values
/// per head, the base, the context the model serves (its
/// `max_position_embeddings`) and Phi-3's top-level
/// `original_max_position_embeddings`.
pub struct RopeShape {
    pub dims: usize,
    pub base: f32,
    pub context: usize,
    pub original: Option<usize>,
}

/// The scaling a Hugging Face `rope_scaling` (or transformers 5's
/// `rope_parameters`) implies: `default` for the plain rope. Types the
/// forward cannot run are an error.
pub fn scaling_from_hf(
    scaling: &serde_json::Map<String, serde_json::Value>,
    shape: &RopeShape,
) -> Result<Scaling> {
    let kind = scaling
        .get("rope_type")
        .or_else(|| scaling.get("type"))
        .and_then(|t| t.as_str())
        .unwrap_or("default");
    let opt = |k: &str| scaling.get(k).and_then(|x| x.as_f64());
    let num = |k: &str| -> Result<f64> {
        opt(k).with_context(|| format!("rope scaling {kind:?} lacks the number {k}"))
    };
    let (dims, base) = (shape.dims, shape.base);
    let factors = |f: Vec<f32>| Scaling {
        factors: Some(f),
        attn_factor: None,
    };
    match kind {
        "default" => Ok(Scaling::default()),
        // mlx-lm's initialize_rope: nn.RoPE with scale 1 / factor.
        "linear" => Ok(factors(vec![num("factor")? as f32; dims / 2])),
        "llama3" => Ok(factors(llama3(
            num("factor")?,
            num("low_freq_factor")?,
            num("high_freq_factor")?,
            num("original_max_position_embeddings")?,
            dims,
            base,
        ))),
        "longrope" | "su" => {
            let original = opt("original_max_position_embeddings")
                .map(|x| x as usize)
                .or(shape.original)
                .with_context(|| "rope scaling \"longrope\" lacks original_max_position_embeddings")?;
            let list = |k: &str| -> Result<Vec<f32>> {
                let v = scaling
                    .get(k)
                    .and_then(|x| x.as_array())
                    .with_context(|| format!("rope scaling {kind:?} lacks the list {k}"))?;
                let f: Vec<f32> = v.iter().filter_map(|x| x.as_f64()).map(|x| x as f32).collect();
                check_factors(k, &f, dims)?;
                Ok(f)
            };
            let (short, long) = (list("short_factor")?, list("long_factor")?);
            // HF's explicit factor (transformers: attention_factor; mlx-lm's
            // SuScaledRoPE: long_mscale), else the default.
            let attn = opt("attention_factor")
                .or_else(|| opt("long_mscale"))
                .unwrap_or_else(|| longrope_attn_factor(shape.context, original));
            Ok(Scaling {
                factors: Some(longrope_pick(shape.context, original, short, long)),
                attn_factor: Some(attn as f32),
            })
        }
        "yarn" => {
            let factor = num("factor")?;
            let original = opt("original_max_position_embeddings")
                .unwrap_or(shape.context as f64);
            let f = yarn(
                factor,
                original,
                opt("beta_fast").unwrap_or(32.0),
                opt("beta_slow").unwrap_or(1.0),
                dims,
                base,
            );
            // transformers' attention_factor where given, else mlx-lm's
            // (and HF's) mscale ratio: 1 + 0.1 ln(factor) by default.
            let mscale = |m: f64| if factor <= 1.0 { 1.0 } else { 0.1 * m * factor.ln() + 1.0 };
            let attn = opt("attention_factor").unwrap_or_else(|| {
                mscale(opt("mscale").unwrap_or(1.0)) / mscale(opt("mscale_all_dim").unwrap_or(0.0))
            });
            Ok(Scaling {
                factors: Some(f),
                attn_factor: Some(attn as f32),
            })
        }
        k => bail!(
            "rope scaling of type {k:?} is not supported (specd runs default, linear, llama3, longrope and yarn)"
        ),
    }
}

/// A list of `what` factors must hold one positive value per rotated pair.
pub fn check_factors(what: &str, f: &[f32], dims: usize) -> Result<()> {
    if f.len() != dims / 2 || f.iter().any(|&x| !(x.is_finite() && x > 0.0)) {
        bail!(
            "{what} holds {} values, not {} positive ones (one per rotated pair)",
            f.len(),
            dims / 2
        );
    }
    Ok(())
}

/// Which of longrope's factor lists a model serving `context` positions
/// rotates by: llama.cpp's rule (`get_rope_factors`), the long factors
/// where the context exceeds the original one, else the short ones, for
/// every position. (specd serves the model's whole
/// `max_position_embeddings`, so a Phi-3.5 or Phi-4-mini runs its long
/// factors, as mlx-lm's `SuScaledRoPE` always does. HF transformers picks
/// by the current sequence's length instead, which would change the keys
/// already cached when a sequence grows past the original context.)
pub fn longrope_pick(context: usize, original: usize, short: Vec<f32>, long: Vec<f32>) -> Vec<f32> {
    if context > original {
        long
    } else {
        short
    }
}

/// Longrope's default attention factor (transformers, mlx-lm and llama.cpp's
/// converter): sqrt(1 + ln(s) / ln(original)) for s = context / original,
/// 1 where the context is not extended.
pub fn longrope_attn_factor(context: usize, original: usize) -> f64 {
    let s = context as f64 / original as f64;
    if s <= 1.0 {
        1.0
    } else {
        (1.0 + s.ln() / (original as f64).ln()).sqrt()
    }
}

/// YaRN's frequency divisors (mlx-lm's `YarnRoPE`, transformers'
/// `_compute_yarn_parameters`, ggml's `rope_yarn` with `ext_factor` 1):
/// pairs that turn more than `beta_fast` times over the original context
/// keep their frequency, those turning fewer than `beta_slow` times are
/// slowed by `factor`, and a linear ramp blends between.
pub fn yarn(
    factor: f64,
    original: f64,
    beta_fast: f64,
    beta_slow: f64,
    dims: usize,
    base: f32,
) -> Vec<f32> {
    let d = dims as f64;
    let corr = |rot: f64| {
        d * (original / (rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * (base as f64).ln())
    };
    let low = corr(beta_fast).floor().max(0.0);
    let high = corr(beta_slow).ceil().min(d - 1.0);
    let span = if high == low { 0.001 } else { high - low };
    (0..dims / 2)
        .map(|i| {
            // 0: extrapolate (keep), 1: interpolate (divide by factor).
            let ramp = ((i as f64 - low) / span).clamp(0.0, 1.0);
            (1.0 / ((1.0 - ramp) + ramp / factor)) as f32
        })
        .collect()
}

/// Llama 3.1's scaling as llama.cpp's converter writes it into
/// `rope_freqs.weight` (and mlx-lm's `Llama3RoPE` computes it): wavelengths
/// shorter than `original / high` keep their frequency, those longer than
/// `original / low` are slowed by `factor`, and those between by a blend.
pub fn llama3(factor: f64, low: f64, high: f64, original: f64, dims: usize, base: f32) -> Vec<f32> {
    let (low_wavelen, high_wavelen) = (original / low, original / high);
    (0..dims / 2)
        .map(|i| {
            let freq = 1.0 / (base as f64).powf(2.0 * i as f64 / dims as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let f = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (original / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            f as f32
        })
        .collect()
}

impl Llama {
    /// The factors the model's rope divides its frequencies by (empty:
    /// none).
    pub(super) fn rope_factors(&self) -> &[f32] {
        self.config.rope_freq_factors.as_deref().unwrap_or(&[])
    }

    /// Heads `[1, T, n, head_dim]` rotated for positions `offset..` at
    /// `base`, returned as `[1, n, T, head_dim]`: specd's kernel, or MLX's
    /// `fast::rope` on the float32 path.
    pub(super) fn rotate(&self, y: &Array, base: f32, offset: i32) -> specd_mlx::Result<Array> {
        let (dims, trad) = (
            self.config.rotary_dims() as i32,
            self.config.rope_traditional,
        );
        let f = self.rope_factors();
        if self.own_kernels {
            kernels::rope_heads(y, dims, trad, base, 1.0, offset, f)
        } else {
            fast::rope(
                &y.transpose(&[0, 2, 1, 3])?,
                dims,
                trad,
                base,
                1.0,
                offset,
                f,
            )
        }
    }

    /// Whether the rope may fold into the q/k/v matmul: that op rotates
    /// whole heads, so a partial rotary rope (Phi-4-mini) runs apart.
    pub(super) fn rope_folds(&self) -> bool {
        self.config.rotary_dims() == self.config.head_dim
    }

    /// How the fused q/k/v matmul rotates q and k (`offset`: the first
    /// row's position, where one sequence).
    pub(super) fn rope(&self, offset: i32) -> kernels::RopeSpec<'_> {
        let c = &self.config;
        let (nh, nkv, hd) = self.head_counts();
        kernels::RopeSpec {
            cols: (nh + nkv) * hd,
            head_dim: hd,
            traditional: c.rope_traditional,
            base: c.rope_theta,
            offset,
            factors: self.rope_factors(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_factors_as_llama_cpp_writes_them() {
        // Llama 3.2 1B's: head 64, base 500000, factor 32, 1 / 4, 8192.
        let f = llama3(32.0, 1.0, 4.0, 8192.0, 64, 500000.0);
        assert_eq!(f.len(), 32);
        assert_eq!(f[0], 1.0, "the highest frequency is kept");
        assert_eq!(f[31], 32.0, "the lowest is slowed by the factor");
        let mid: Vec<_> = f.iter().filter(|&&x| x > 1.0 && x < 32.0).collect();
        assert!(!mid.is_empty(), "a band blends between: {f:?}");
        assert!(f.windows(2).all(|w| w[0] <= w[1]), "{f:?}");
    }

    fn shape(context: usize) -> RopeShape {
        RopeShape {
            dims: 8,
            base: 1e4,
            context,
            original: Some(32),
        }
    }

    fn hf(v: serde_json::Value, context: usize) -> Result<Scaling> {
        scaling_from_hf(v.as_object().unwrap(), &shape(context))
    }

    #[test]
    fn hf_scaling_types() {
        let none = hf(serde_json::json!({"rope_type": "default"}), 4096);
        assert_eq!(none.unwrap(), Scaling::default());
        let lin = hf(serde_json::json!({"type": "linear", "factor": 2.0}), 4096).unwrap();
        assert_eq!(lin.factors, Some(vec![2.0; 4]));
        let e = hf(
            serde_json::json!({"rope_type": "dynamic", "factor": 4.0}),
            4096,
        );
        assert!(format!("{:#}", e.unwrap_err()).contains("dynamic"));
        let e = hf(
            serde_json::json!({"rope_type": "llama3", "factor": 8.0}),
            4096,
        );
        assert!(format!("{:#}", e.unwrap_err()).contains("low_freq_factor"));
    }

    #[test]
    fn longrope_picks_by_the_served_context() {
        let v = serde_json::json!({"type": "longrope", "short_factor": [1.0, 1.5, 2.0, 2.5],
            "long_factor": [3.0, 4.0, 5.0, 6.0]});
        // The context beyond the original (32): long factors, and
        // sqrt(1 + ln(4096 / 32) / ln(32)).
        let s = hf(v.clone(), 4096).unwrap();
        assert_eq!(s.factors, Some(vec![3.0, 4.0, 5.0, 6.0]));
        let want = (1.0 + 128f64.ln() / 32f64.ln()).sqrt() as f32;
        assert!((s.attn_factor.unwrap() - want).abs() < 1e-6, "{s:?}");
        // Within it: the short ones, no attention factor.
        let s = hf(v.clone(), 32).unwrap();
        assert_eq!(s.factors, Some(vec![1.0, 1.5, 2.0, 2.5]));
        assert_eq!(s.attn_factor, Some(1.0));
        // An explicit factor wins.
        let mut e = v.clone();
        e["attention_factor"] = serde_json::json!(1.25);
        assert_eq!(hf(e, 4096).unwrap().attn_factor, Some(1.25));
        let mut e = v;
        e["long_factor"] = serde_json::json!([1.0, 2.0]);
        assert!(format!("{:#}", hf(e, 4096).unwrap_err()).contains("long_factor holds 2 values"));
    }

    #[test]
    fn yarn_as_mlx_lm_builds_it() {
        // Qwen 2.5's: factor 4 over 32768, head 128, base 1e6.
        let f = yarn(4.0, 32768.0, 32.0, 1.0, 128, 1e6);
        assert_eq!(f.len(), 64);
        assert_eq!(f[0], 1.0, "fast pairs extrapolate");
        assert_eq!(f[63], 4.0, "slow pairs interpolate");
        assert!(f.windows(2).all(|w| w[0] <= w[1]), "{f:?}");
        assert!(
            f.iter().any(|&x| x > 1.0 && x < 4.0),
            "a ramp between: {f:?}"
        );
        let s = hf(
            serde_json::json!({"type": "yarn", "factor": 4.0,
            "original_max_position_embeddings": 32}),
            4096,
        )
        .unwrap();
        let want = 1.0 + 0.1 * 4f32.ln();
        assert!((s.attn_factor.unwrap() - want).abs() < 1e-6, "{s:?}");
        assert_eq!(s.factors.unwrap(), yarn(4.0, 32.0, 32.0, 1.0, 8, 1e4));
    }
}
