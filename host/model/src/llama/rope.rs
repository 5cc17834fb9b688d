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
use super::Llama;
use anyhow::{bail, Context, Result};
use specd_mlx::{fast, kernels, Array};

/// The frequency divisors a Hugging Face `rope_scaling` (or transformers
/// 5's `rope_parameters`) implies for `dims` rotated values at `base`:
/// `None` for the default rope. Types the forward cannot run are an error.
pub fn factors_from_hf(
    scaling: &serde_json::Map<String, serde_json::Value>,
    dims: usize,
    base: f32,
) -> Result<Option<Vec<f32>>> {
    let kind = scaling
        .get("rope_type")
        .or_else(|| scaling.get("type"))
        .and_then(|t| t.as_str())
        .unwrap_or("default");
    let num = |k: &str| -> Result<f64> {
        scaling
            .get(k)
            .and_then(|x| x.as_f64())
            .with_context(|| format!("rope scaling {kind:?} lacks the number {k}"))
    };
    match kind {
        "default" => Ok(None),
        // mlx-lm's initialize_rope: nn.RoPE with scale 1 / factor.
        "linear" => Ok(Some(vec![num("factor")? as f32; dims / 2])),
        "llama3" => Ok(Some(llama3(
            num("factor")?,
            num("low_freq_factor")?,
            num("high_freq_factor")?,
            num("original_max_position_embeddings")?,
            dims,
            base,
        ))),
        k => bail!(
            "rope scaling of type {k:?} is not supported (specd runs default, linear and llama3)"
        ),
    }
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
        let (hd, trad) = (self.config.head_dim as i32, self.config.rope_traditional);
        let f = self.rope_factors();
        if self.own_kernels {
            kernels::rope_heads(y, hd, trad, base, 1.0, offset, f)
        } else {
            fast::rope(&y.transpose(&[0, 2, 1, 3])?, hd, trad, base, 1.0, offset, f)
        }
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

    #[test]
    fn hf_scaling_types() {
        let map = |v: serde_json::Value| v.as_object().unwrap().clone();
        let none = factors_from_hf(&map(serde_json::json!({"rope_type": "default"})), 8, 1e4);
        assert_eq!(none.unwrap(), None);
        let lin = factors_from_hf(
            &map(serde_json::json!({"type": "linear", "factor": 2.0})),
            8,
            1e4,
        );
        assert_eq!(lin.unwrap(), Some(vec![2.0; 4]));
        let e = factors_from_hf(
            &map(serde_json::json!({"rope_type": "yarn", "factor": 4.0})),
            8,
            1e4,
        );
        assert!(format!("{:#}", e.unwrap_err()).contains("yarn"));
        let e = factors_from_hf(
            &map(serde_json::json!({"rope_type": "llama3", "factor": 8.0})),
            8,
            1e4,
        );
        assert!(format!("{:#}", e.unwrap_err()).contains("low_freq_factor"));
    }
}
