//! Loading weights: GGUF through MLX's own reader, or a Hugging Face
//! directory of safetensors. Quantized tensors stay quantized for specd's
//! kernels ([`WeightMode::Quantized`]) or are dequantized to float32
//! ([`WeightMode::F32`]); a layout the kernels don't take (bits other than
//! 4 and 8, groups not a multiple of 32) is dequantized either way.
use super::gemma3::PostNorms;
use super::ggml;
use super::linear::{Linear, QuantSource, QuantizedWeight, WeightMode};
use super::llama::{ForwardFlags, Layer, LayerKind};
use super::{Arch, Llama, LlamaConfig};
use anyhow::{bail, Context, Result};
use specd_mlx::{io, kernels, ops, Array, Dtype};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::path::{Path, PathBuf};

mod fold;
pub use fold::rope_freqs;
use fold::{fold_attn_factor, fold_granite, longrope_factors, ROPE_FREQS};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFormat {
    Gguf,
    HfDir,
}

impl ModelFormat {
    pub fn detect(path: &Path) -> Result<ModelFormat> {
        if path.is_dir() {
            if !path.join("config.json").exists() {
                bail!(
                    "{} is a directory without config.json (not a Hugging Face model directory)",
                    path.display()
                );
            }
            Ok(ModelFormat::HfDir)
        } else if path.is_file() {
            Ok(ModelFormat::Gguf)
        } else {
            bail!("model file {} does not exist", path.display())
        }
    }
}

/// Splits Phi-3's fused tensors into the llama names (a no-op elsewhere).
fn split_fused(t: &mut Tensors, config: &LlamaConfig, layer_prefix: &str) -> Result<()> {
    let has = |base: &str| t.has(base);
    for (from, to) in super::llama::phi3::fused_splits(config, layer_prefix, has) {
        t.split_rows(&from, &to)?;
    }
    Ok(())
}

/// Weights by name, plus how quantized ones are packed.
pub struct Tensors {
    map: HashMap<String, Array>,
    /// Group size of affine-quantized tensors (MLX's `X.scales`/`X.biases`).
    group_size: Option<i32>,
    /// Bits, where the source says (HF quantization config); else inferred.
    bits: Option<i32>,
    /// `(group_size, bits)` by base name where a tensor differs from the
    /// defaults: an MLX checkpoint's per-layer `quantization` entries, a GGUF
    /// K-quant's group size (its bits then inferred from the packed width).
    overrides: HashMap<String, (i32, Option<i32>)>,
    mode: WeightMode,
    /// Names read so far: what is left after building was not used.
    used: RefCell<HashSet<String>>,
}

/// `SPECD_INT8_FLOAT=attn_q,ffn_down,...`: a debug switch that keeps float
/// activations, under `--weights int8`, for the weights whose names contain
/// one of the listed parts (`token_embd`/`model.embed_tokens` is the tied
/// head). It measures where int8's divergence enters (docs/benchmarks.md,
/// "Accuracy"); unset, every matmul that can runs on 8-bit activations.
fn float_activations_asked(base: &str) -> bool {
    std::env::var("SPECD_INT8_FLOAT").is_ok_and(|v| {
        v.split(',')
            .map(str::trim)
            .any(|p| !p.is_empty() && base.contains(p))
    })
}

impl Tensors {
    pub fn has(&self, base: &str) -> bool {
        self.map.contains_key(&format!("{base}.weight"))
    }

    /// The tensor `name`, marked used.
    fn get(&self, name: &str) -> Option<&Array> {
        let a = self.map.get(name)?;
        self.used.borrow_mut().insert(name.to_string());
        Some(a)
    }

    fn weight(&self, base: &str) -> Result<&Array> {
        let name = format!("{base}.weight");
        self.get(&name)
            .with_context(|| format!("model has no tensor {name}"))
    }

    /// The tensor `name` (a bias or a norm weight) as float32.
    pub fn vector(&self, name: &str) -> Result<Array> {
        let a = self
            .get(name)
            .with_context(|| format!("model has no tensor {name}"))?;
        Ok(a.as_type(Dtype::Float32)?)
    }

    /// The tensors no part of the model read, sorted (a file for another
    /// architecture than its config names).
    fn unused(&self) -> Vec<&str> {
        let used = self.used.borrow();
        let mut v: Vec<&str> = self
            .map
            .keys()
            .filter(|k| !used.contains(*k))
            .map(String::as_str)
            .collect();
        v.sort();
        v
    }

    /// `base` as MLX quantized arrays (scales/biases in their stored dtype),
    /// or `None` when it is stored dense.
    fn quantized(&self, base: &str) -> Result<Option<QuantizedWeight>> {
        let w = self.weight(base)?;
        let Some(scales) = self.get(&format!("{base}.scales")) else {
            return Ok(None);
        };
        let biases = self
            .get(&format!("{base}.biases"))
            .with_context(|| format!("quantized {base} has scales but no biases"))?;
        let (group, bits) = match self.overrides.get(base) {
            Some(&o) => o,
            None => (self.group_size.unwrap_or(32), self.bits),
        };
        let packed_cols = w.dim(-1);
        let in_features = scales.dim(-1) * group;
        let bits = bits.unwrap_or(packed_cols * 32 / in_features.max(1));
        if packed_cols * 32 != in_features * bits {
            bail!("cannot infer the quantization of {base}: packed width {packed_cols}, {in_features} inputs");
        }
        let src = QuantSource {
            w: w.clone(),
            scales: scales.clone(),
            biases: biases.clone(),
        };
        Ok(Some(QuantizedWeight::new(src, group, bits)))
    }

    /// The tensor `base.weight` as float32, dequantized if it is quantized.
    pub fn dense(&self, base: &str) -> Result<Array> {
        let Some(q) = self.quantized(base)? else {
            return Ok(self.weight(base)?.as_type(Dtype::Float32)?);
        };
        // Scales and biases in f32 so the result is f32 without a second rounding.
        let src = q.source.as_ref().expect("a file's weight has its source");
        let s = src.scales.as_type(Dtype::Float32)?;
        let b = src.biases.as_type(Dtype::Float32)?;
        Ok(ops::dequantize(&src.w, &s, &b, q.group_size, q.bits)?)
    }

    /// `base` as a linear layer: quantized where the mode and the layout
    /// allow it, else float32.
    pub fn linear(&self, base: &str) -> Result<Linear> {
        // MLX's own quantized matmul (the portable path, and GPUs) takes
        // groups of 32, 64 or 128; specd's kernels groups of 16k. A weight
        // that does not fit (a GGUF Q6_K's groups of 16) is dequantized to
        // its exact float32 values (docs/portable.md).
        let mlx_ops = kernels::mlx_ops();
        let kernel_fit = |q: &QuantizedWeight| {
            matches!(q.bits, 4 | 8)
                && match mlx_ops {
                    true => matches!(q.group_size, 32 | 64 | 128),
                    false => q.group_size % 16 == 0,
                }
        };
        match self.quantized(base)? {
            Some(q) if self.mode.quantized() && kernel_fit(&q) => {
                // The kernels read float16 scales (GGUF's own dtype; bf16
                // ones from MLX checkpoints convert exactly enough), or
                // float32 ones (GGUF K-quants, which float16 cannot hold).
                let src = q.source.expect("a file's weight has its source");
                let dt = if src.scales.dtype() == Dtype::Float32 {
                    Dtype::Float32
                } else {
                    Dtype::Float16
                };
                let src = QuantSource {
                    scales: src.scales.as_type(dt)?,
                    biases: src.biases.as_type(dt)?,
                    w: src.w,
                };
                let mut w = QuantizedWeight::new(src, q.group_size, q.bits);
                // Groups of 16 (Q6_K) have no 8-bit-activation kernel.
                w.int8_activations = self.mode == WeightMode::Int8
                    && q.group_size % 32 == 0
                    && !float_activations_asked(base);
                Ok(Linear::Quantized(w))
            }
            _ => Ok(Linear::Dense(self.dense(base)?)),
        }
    }

    /// Splits `from` (`X.weight`, and `X.scales`/`X.biases` where
    /// quantized; or a vector `X`) by rows into the tensors `to`, each
    /// `(base, rows)` in order; the rows must add up to `from`'s.
    pub fn split_rows(&mut self, from: &str, to: &[(String, i32)]) -> Result<()> {
        let total: i32 = to.iter().map(|p| p.1).sum();
        for suffix in ["weight", "scales", "biases", "bias"] {
            let name = format!("{from}.{suffix}");
            let Some(a) = self.map.remove(&name) else {
                continue;
            };
            if a.dim(0) != total {
                bail!("tensor {name} has {} rows, its parts {total}", a.dim(0));
            }
            let shape = a.shape();
            let mut at = 0;
            for (base, rows) in to {
                let mut start = vec![0; shape.len()];
                let mut end = shape.clone();
                (start[0], end[0]) = (at, at + rows);
                self.map
                    .insert(format!("{base}.{suffix}"), a.slice(&start, &end)?);
                at += rows;
            }
        }
        if let Some(o) = self.overrides.remove(from) {
            for (base, _) in to {
                self.overrides.insert(base.clone(), o);
            }
        }
        Ok(())
    }

    /// Multiplies every row of the linear layer `base` (its weight, or its
    /// quantized scales and biases, and its bias) by `by`; absent (another
    /// rank's layer): nothing.
    fn scale_linear(&mut self, base: &str, by: f32) -> Result<()> {
        let quantized = self.map.contains_key(&format!("{base}.scales"));
        for suffix in ["weight", "scales", "biases", "bias"] {
            let name = format!("{base}.{suffix}");
            if suffix == "weight" && quantized {
                continue;
            }
            if let Some(rows) = self.map.get(&name).map(|a| a.dim(0) as usize) {
                self.scale_rows(&name, &vec![by; rows])?;
            }
        }
        Ok(())
    }

    /// `base`'s k and v siblings with float32 scales and biases where q's
    /// were scaled into float32, so the three still fuse into one matmul.
    fn f32_scales_like_q(&mut self, q: &str, siblings: &[String]) -> Result<()> {
        if !self.map.contains_key(&format!("{q}.scales")) {
            return Ok(());
        }
        for base in siblings {
            for suffix in ["scales", "biases"] {
                let name = format!("{base}.{suffix}");
                if let Some(a) = self.map.remove(&name) {
                    self.map.insert(name, a.as_type(Dtype::Float32)?);
                }
            }
        }
        Ok(())
    }

    /// Multiplies row r of tensor `name` by `by[r]`, keeping its dtype
    /// (quantization scales and biases: float32).
    fn scale_rows(&mut self, name: &str, by: &[f32]) -> Result<()> {
        let a = self.map.remove(name).context("no such tensor")?;
        if a.dim(0) as usize != by.len() {
            bail!("tensor {name} has {} rows, not {}", a.dim(0), by.len());
        }
        let mut shape = vec![1; a.shape().len()];
        shape[0] = by.len() as i32;
        let s = ops::multiply(&a.as_type(Dtype::Float32)?, &Array::from_f32(by, &shape)?)?;
        // Quantization scales and biases keep the product in float32 (the
        // kernels read float32 scales, as GGUF K-quants have them): one in
        // float16 moves a 4-bit model's logits by ~1e-4 of their range.
        // Other bfloat16 tensors go to float16.
        let dt = match a.dtype() {
            _ if name.ends_with(".scales") || name.ends_with(".biases") => Dtype::Float32,
            Dtype::Bfloat16 => Dtype::Float16,
            d => d,
        };
        self.map.insert(name.to_string(), s.as_type(dt)?);
        Ok(())
    }

    /// Whether any weight is stored quantized.
    fn any_quantized(&self) -> bool {
        self.map.keys().any(|k| k.ends_with(".scales"))
    }
}

/// Reads the tensors of a GGUF file (MLX's reader) and the string/number
/// metadata specd-mlx hands back.
pub fn read_gguf(path: &Path, mode: WeightMode) -> Result<(Tensors, HashMap<String, String>)> {
    read_gguf_kept(path, mode, &|_| true)
}

/// [`read_gguf`] holding only the tensors `keep` names (a pipeline rank's
/// part: the others are never decoded, or dropped as soon as MLX's reader
/// has read them).
fn read_gguf_kept(
    path: &Path,
    mode: WeightMode,
    keep: &dyn Fn(&str) -> bool,
) -> Result<(Tensors, HashMap<String, String>)> {
    // Parse the header ourselves first: a truncated or foreign file gets a
    // clear error instead of whatever the C++ reader does with it.
    let header = specd_text::gguf::GgufFile::open(path)
        .with_context(|| format!("{} is not a readable GGUF model file", path.display()))?;
    // MLX's reader decodes these; anything else (K-quants, Q5_0) we do.
    let mlx_reads = header.tensors.iter().all(|t| {
        use specd_text::gguf::ggml_type as ty;
        matches!(
            t.ggml_type,
            ty::F32 | ty::F16 | ty::Q4_0 | ty::Q4_1 | ty::Q8_0
        )
    });
    if !mlx_reads {
        return read_gguf_blocks(path, &header, mode, keep);
    }
    let f = io::load_gguf(path).with_context(|| format!("loading GGUF {}", path.display()))?;
    let meta = f.metadata.into_iter().collect();
    let map = f.tensors.into_iter().filter(|(k, _)| keep(k)).collect();
    Ok((
        Tensors {
            map,
            group_size: Some(32),
            bits: None,
            overrides: HashMap::new(),
            mode,
            used: RefCell::default(),
        },
        meta,
    ))
}

/// Reads a GGUF's tensors with specd's own block decoders ([`ggml`]):
/// quantized ones as MLX's affine layout (`X.weight` words, `X.scales`,
/// `X.biases`, float32 scales where float16 cannot hold them), the rest as
/// float32. Metadata as MLX's reader gives it: numbers and strings as text.
fn read_gguf_blocks(
    path: &Path,
    header: &specd_text::gguf::GgufMeta,
    mode: WeightMode,
    keep: &dyn Fn(&str) -> bool,
) -> Result<(Tensors, HashMap<String, String>)> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut map = HashMap::new();
    let mut overrides = HashMap::new();
    for t in header.tensors.iter().filter(|t| keep(&t.name)) {
        let start = (header.data_offset + t.offset) as usize;
        let data = bytes.get(start..).unwrap_or(&[]);
        let cols = *t.shape.first().unwrap_or(&1) as usize;
        let rows = t.shape.iter().skip(1).product::<u64>() as usize;
        // MLX's order: the slowest dimension first.
        let dims: Vec<i32> = t.shape.iter().rev().map(|&d| d as i32).collect();
        let base = t
            .name
            .strip_suffix(".weight")
            .unwrap_or(&t.name)
            .to_string();
        match ggml::decode(&t.name, t.ggml_type, data, rows, cols)? {
            ggml::Decoded::Dense(v) => {
                map.insert(t.name.clone(), Array::from_f32(&v, &dims)?);
            }
            ggml::Decoded::Quantized(a) => {
                let words = a.words();
                let per_row = (cols * a.bits as usize / 32) as i32;
                let g = [rows as i32, (cols / a.group) as i32];
                let dt = |v: &[f32]| -> Result<Array> {
                    let x = Array::from_f32(v, &g)?;
                    Ok(if a.half {
                        x.as_type(Dtype::Float16)?
                    } else {
                        x
                    })
                };
                map.insert(
                    t.name.clone(),
                    Array::from_u32(&words, &[rows as i32, per_row])?,
                );
                map.insert(format!("{base}.scales"), dt(&a.scales)?);
                map.insert(format!("{base}.biases"), dt(&a.biases)?);
                overrides.insert(base, (a.group as i32, None));
            }
        }
    }
    let meta = header
        .keys()
        .filter_map(|k| {
            let v = header.get(k)?;
            let text = match (v.as_str(), v.as_i128(), v.as_f64()) {
                (Some(s), _, _) => s.to_string(),
                (None, Some(i), _) => i.to_string(),
                (None, None, Some(f)) => f.to_string(),
                _ => return None,
            };
            Some((k.to_string(), text))
        })
        .collect();
    Ok((
        Tensors {
            map,
            group_size: Some(32),
            bits: None,
            overrides,
            mode,
            used: RefCell::default(),
        },
        meta,
    ))
}

/// The layers `part` (all: `None`) of the model in `t`; the embedding,
/// final norm and head where the part starts at layer 0 (a later rank
/// holds placeholders in their place).
fn build(
    config: LlamaConfig,
    t: &Tensors,
    names: &Names,
    part: Option<Range<usize>>,
) -> Result<Llama> {
    let mut config = config;
    let part = part.unwrap_or(0..config.num_hidden_layers);
    if part.is_empty() || part.end > config.num_hidden_layers {
        bail!(
            "layers {part:?} of a model of {} layers",
            config.num_hidden_layers
        );
    }
    let ends = part.start == 0;
    let d = config.hidden_size as i32;
    let placeholder = || Array::zeros(&[1, d], Dtype::Float32);
    let embed = match ends {
        true => t.linear(names.embed)?,
        false => Linear::Dense(placeholder()?),
    };
    let vocab = embed.shape()[0] as usize;
    if config.vocab_size == 0 && ends {
        config.vocab_size = vocab;
    }
    // Gemma's HF norms hold w for a scale of 1 + w (GGUF's hold 1 + w).
    let norm = |name: &str| -> Result<Array> {
        let w = t.dense(name)?;
        Ok(match names.norm_plus_one {
            true => ops::add(&w, &Array::scalar(1.0)?)?,
            false => w,
        })
    };
    let mut layers = Vec::with_capacity(part.len());
    for i in part.clone() {
        let n = |suffix: &str| format!("{}{i}.{suffix}", names.layer_prefix);
        let bias = |part: &str| t.vector(&format!("{}.bias", n(part)));
        let qkv_bias = match config.qkv_bias {
            true => Some(ops::concatenate(
                &[&bias(names.q)?, &bias(names.k)?, &bias(names.v)?],
                0,
            )?),
            false => None,
        };
        let qk_norm = |part: &str| config.qk_norm.then(|| norm(&n(part))).transpose();
        layers.push(Layer {
            attn_norm: norm(&n(names.attn_norm))?,
            q: t.linear(&n(names.q))?,
            k: t.linear(&n(names.k))?,
            v: t.linear(&n(names.v))?,
            o: t.linear(&n(names.o))?,
            ffn_norm: norm(&n(names.ffn_norm))?,
            gate: t.linear(&n(names.gate))?,
            up: t.linear(&n(names.up))?,
            down: t.linear(&n(names.down))?,
            qkv: None,
            gate_up: None,
            qkv_bias,
            o_bias: config.o_bias.then(|| bias(names.o)).transpose()?,
            q_norm: qk_norm(names.q_norm)?,
            k_norm: qk_norm(names.k_norm)?,
            rope: !config.no_rope_layers.contains(&i),
            kind: match config.arch {
                Arch::Gemma3 => LayerKind::Gemma3(PostNorms {
                    attn: norm(&n(names.post_attn_norm))?,
                    ffn: norm(&n(names.post_ffn_norm))?,
                }),
                Arch::Gemma2 => LayerKind::Gemma2(PostNorms {
                    attn: norm(&n(names.post_attn_norm))?,
                    ffn: norm(&n(names.post_ffn_norm))?,
                }),
                Arch::Olmo2 => LayerKind::Olmo2,
                Arch::Llama => LayerKind::Llama,
            },
        });
    }
    let lm_head = if ends && t.has(names.head) && !config.tie_word_embeddings {
        Some(t.linear(names.head)?)
    } else {
        config.tie_word_embeddings = true;
        None
    };
    let mut model = Llama {
        config,
        embed,
        // Quantized mode is the batch-invariant path throughout; a file with
        // no quantized tensors runs there too (dense matmul rows are not
        // invariant, but attention still is).
        // The portable path (`--kernels mlx`, and GPU builds) runs MLX's
        // own ops throughout.
        own_kernels: t.mode.quantized() && t.any_quantized() && !kernels::mlx_ops(),
        layers,
        norm: match ends {
            true => norm(names.norm)?,
            false => placeholder()?.reshape(&[d])?,
        },
        lm_head,
        flags: ForwardFlags::default(),
        first_layer: part.start,
    };
    check_shapes(&model)?;
    // Packed (and q/k/v, gate/up fused) for the CPU kernels; MLX's own
    // kernels (the portable path, GPUs) take the file's layout.
    if !kernels::mlx_ops() {
        model.pack_for_cpu()?;
    }
    // Materialize layer by layer so the quantized sources can be freed.
    for chunk in model.weights().chunks(16) {
        specd_mlx::eval(chunk)?;
    }
    Ok(model)
}

fn check_shapes(m: &Llama) -> Result<()> {
    let c = &m.config;
    let (d, hd) = (c.hidden_size as i32, c.head_dim as i32);
    let (nq, nk) = (
        c.num_attention_heads as i32 * hd,
        c.num_key_value_heads as i32 * hd,
    );
    let ff = c.intermediate_size as i32;
    let fail = |name: &str, got: &[i32], want: &[i32]| -> Result<()> {
        bail!("tensor {name} has shape {got:?}, config.json implies {want:?}")
    };
    let want = |name: &str, a: &Linear, shape: &[i32]| -> Result<()> {
        match a.shape() == shape {
            true => Ok(()),
            false => fail(name, &a.shape(), shape),
        }
    };
    let want_vec = |name: &str, a: &Option<Array>, n: i32| -> Result<()> {
        match a {
            Some(a) if a.shape() != [n] => fail(name, &a.shape(), &[n]),
            _ => Ok(()),
        }
    };
    if m.first_layer == 0 {
        want("embedding", &m.embed, &[c.vocab_size as i32, d])?;
    }
    if let Some(h) = &m.lm_head {
        want("lm_head", h, &[c.vocab_size as i32, d])?;
    }
    want_vec("norm", &Some(m.norm.clone()), d)?;
    for (i, l) in (m.first_layer..).zip(&m.layers) {
        let name = |part: &str| format!("layer {i} {part}");
        want(&name("q"), &l.q, &[nq, d])?;
        want(&name("k"), &l.k, &[nk, d])?;
        want(&name("v"), &l.v, &[nk, d])?;
        want(&name("o"), &l.o, &[d, nq])?;
        want(&name("gate"), &l.gate, &[ff, d])?;
        want(&name("up"), &l.up, &[ff, d])?;
        want(&name("down"), &l.down, &[d, ff])?;
        want_vec(&name("attention norm"), &Some(l.attn_norm.clone()), d)?;
        want_vec(&name("mlp norm"), &Some(l.ffn_norm.clone()), d)?;
        want_vec(&name("q/k/v bias"), &l.qkv_bias, nq + 2 * nk)?;
        want_vec(&name("o bias"), &l.o_bias, d)?;
        // OLMo 2 norms the whole projection, the others each head.
        let (qn, kn) = match c.arch {
            Arch::Olmo2 => (nq, nk),
            _ => (hd, hd),
        };
        want_vec(&name("q norm"), &l.q_norm, qn)?;
        want_vec(&name("k norm"), &l.k_norm, kn)?;
    }
    Ok(())
}

/// Tensor names of one file layout.
struct Names {
    embed: &'static str,
    layer_prefix: &'static str,
    attn_norm: &'static str,
    q: &'static str,
    k: &'static str,
    v: &'static str,
    o: &'static str,
    ffn_norm: &'static str,
    gate: &'static str,
    up: &'static str,
    down: &'static str,
    q_norm: &'static str,
    k_norm: &'static str,
    /// Gemma 3's norms after attention and after the MLP.
    post_attn_norm: &'static str,
    post_ffn_norm: &'static str,
    norm: &'static str,
    head: &'static str,
    /// Norm weights stored as w for a scale of 1 + w (Gemma's HF files).
    norm_plus_one: bool,
}

const GGUF_NAMES: Names = Names {
    embed: "token_embd",
    layer_prefix: "blk.",
    attn_norm: "attn_norm",
    q: "attn_q",
    k: "attn_k",
    v: "attn_v",
    o: "attn_output",
    ffn_norm: "ffn_norm",
    gate: "ffn_gate",
    up: "ffn_up",
    down: "ffn_down",
    q_norm: "attn_q_norm",
    k_norm: "attn_k_norm",
    post_attn_norm: "post_attention_norm",
    post_ffn_norm: "post_ffw_norm",
    norm: "output_norm",
    head: "output",
    norm_plus_one: false,
};

const HF_NAMES: Names = Names {
    embed: "model.embed_tokens",
    layer_prefix: "model.layers.",
    attn_norm: "input_layernorm",
    q: "self_attn.q_proj",
    k: "self_attn.k_proj",
    v: "self_attn.v_proj",
    o: "self_attn.o_proj",
    ffn_norm: "post_attention_layernorm",
    gate: "mlp.gate_proj",
    up: "mlp.up_proj",
    down: "mlp.down_proj",
    q_norm: "self_attn.q_norm",
    k_norm: "self_attn.k_norm",
    post_attn_norm: "",
    post_ffn_norm: "",
    norm: "model.norm",
    head: "lm_head",
    norm_plus_one: false,
};

/// Gemma 3's HF names (mlx-lm's gemma3_text.py; Gemma 2's too): its norm after attention
/// is `post_attention_layernorm`, the MLP's input norm
/// `pre_feedforward_layernorm`.
const GEMMA3_HF_NAMES: Names = Names {
    ffn_norm: "pre_feedforward_layernorm",
    post_attn_norm: "post_attention_layernorm",
    post_ffn_norm: "post_feedforward_layernorm",
    norm_plus_one: true,
    ..HF_NAMES
};

/// OLMo 2's names (mlx-lm's olmo2.py; llama.cpp's `LLM_ARCH_OLMO2`): its
/// layer has no norm before attention or the MLP, only after them; those
/// two are read into the layer's `attn_norm` and `ffn_norm`, which
/// [`crate::llama::olmo2`] applies to attention's and the MLP's outputs.
const OLMO2_HF_NAMES: Names = Names {
    attn_norm: "post_attention_layernorm",
    ffn_norm: "post_feedforward_layernorm",
    ..HF_NAMES
};

const OLMO2_GGUF_NAMES: Names = Names {
    attn_norm: "post_attention_norm",
    ffn_norm: "post_ffw_norm",
    ..GGUF_NAMES
};

/// Whether a tensor belongs to the layers `part` (or, outside any layer,
/// to the part that starts at layer 0).
fn in_part(part: &Option<Range<usize>>, name: &str) -> bool {
    match (part, crate::ranks::split::layer_of(name)) {
        (None, _) => true,
        (Some(p), Some(i)) => p.contains(&i),
        (Some(p), None) => p.start == 0,
    }
}

pub fn load_gguf_model(path: &Path, mode: WeightMode, part: Option<Range<usize>>) -> Result<Llama> {
    let (t, meta) = read_gguf_kept(path, mode, &|name| {
        name == ROPE_FREQS || name.starts_with("rope_factors_") || in_part(&part, name)
    })?;
    // The head's presence comes from the header: a later rank holds none.
    let has_output = specd_text::gguf::GgufFile::open(path)?
        .tensors
        .iter()
        .any(|t| t.name == "output.weight");
    let mut config = LlamaConfig::from_gguf(&meta, has_output)?;
    if let Some(f) = rope_freqs(&t, &config)? {
        config.rope_freq_factors = Some(f);
    }
    if let Some(f) = longrope_factors(&t, &config, &meta)? {
        config.rope_freq_factors = Some(f);
    }
    let mut t = t;
    let names = match config.arch {
        Arch::Olmo2 => &OLMO2_GGUF_NAMES,
        _ => &GGUF_NAMES,
    };
    split_fused(&mut t, &config, names.layer_prefix)?;
    fold_attn_factor(&mut t, &config, names)?;
    fold_granite(&mut t, &config, names)?;
    build(config, &t, names, part)
        .with_context(|| format!("building the model from {}", path.display()))
}

pub fn load_hf_model(dir: &Path, mode: WeightMode, part: Option<Range<usize>>) -> Result<Llama> {
    let cfg_path = dir.join("config.json");
    let text = std::fs::read_to_string(&cfg_path)
        .with_context(|| format!("reading {}", cfg_path.display()))?;
    let config =
        LlamaConfig::from_hf_json(&text).with_context(|| format!("in {}", cfg_path.display()))?;
    let raw: serde_json::Value = serde_json::from_str(&text)?;
    let files = safetensors_files(dir)?;
    if files.is_empty() {
        bail!("{} holds no *.safetensors files", dir.display());
    }
    let mut map = HashMap::new();
    for f in &files {
        let tf = io::load_safetensors(f).with_context(|| format!("loading {}", f.display()))?;
        // Lazy arrays: those of another rank's layers are never read.
        map.extend(tf.tensors.into_iter().filter(|(k, _)| in_part(&part, k)));
    }
    let q = quantization(&raw).with_context(|| format!("in {}", cfg_path.display()))?;
    let mut t = Tensors {
        map,
        group_size: Some(q.group_size),
        bits: q.bits,
        overrides: (q.overrides.into_iter())
            .map(|(layer, (g, b))| (layer, (g, Some(b))))
            .collect(),
        mode,
        used: RefCell::default(),
    };
    let names = match config.arch {
        // Gemma 2's HF names are Gemma 3's.
        Arch::Gemma3 | Arch::Gemma2 => &GEMMA3_HF_NAMES,
        Arch::Olmo2 => &OLMO2_HF_NAMES,
        Arch::Llama => &HF_NAMES,
    };
    split_fused(&mut t, &config, names.layer_prefix)?;
    fold_attn_factor(&mut t, &config, names)?;
    fold_granite(&mut t, &config, names)?;
    let model = build(config, &t, names, part).with_context(|| {
        format!(
            "the weights in {} do not match its config.json",
            dir.display()
        )
    })?;
    // A tensor nothing read means the config names another architecture
    // (e.g. q/k norms under model_type llama): refuse rather than run a
    // different model. Rope tables some exports carry are recomputed; a
    // tied model may still carry its head.
    let tied_head = |k: &str| model.lm_head.is_none() && k.starts_with("lm_head.");
    // A MiMo checkpoint's MTP layers are a draft head, read apart.
    let mtp = |k: &str| k.starts_with("model.mtp_layers.");
    let unused: Vec<&str> = t
        .unused()
        .into_iter()
        .filter(|k| !k.ends_with("rotary_emb.inv_freq") && !tied_head(k) && !mtp(k))
        .collect();
    if let Some(first) = unused.first() {
        bail!(
            "the weights in {} do not match its config.json: {} tensor(s) unused by model_type {}, first {first}",
            dir.display(),
            unused.len(),
            raw["model_type"].as_str().unwrap_or("llama"),
        );
    }
    Ok(model)
}

/// An MLX checkpoint's quantization settings.
struct Quantization {
    group_size: i32,
    /// `None`: inferred per tensor from its packed width.
    bits: Option<i32>,
    /// `(group_size, bits)` of layers quantized otherwise.
    overrides: HashMap<String, (i32, i32)>,
}

/// An MLX checkpoint's `quantization` (or `quantization_config`): the
/// default group size and bits, and the layers quantized otherwise (mlx-lm
/// writes those as entries named by layer). Only MLX's affine mode is read.
fn quantization(config: &serde_json::Value) -> Result<Quantization> {
    let q = match &config["quantization"] {
        serde_json::Value::Null => &config["quantization_config"],
        q => q,
    };
    let mode_of = |o: &serde_json::Value| -> Result<()> {
        match o["mode"].as_str() {
            None | Some("affine") => Ok(()),
            Some(m) => {
                bail!("quantization mode {m:?} is not supported (specd reads MLX's affine mode)")
            }
        }
    };
    mode_of(q)?;
    let group_size = q["group_size"].as_i64().unwrap_or(64) as i32;
    let bits = q["bits"].as_i64().map(|b| b as i32);
    let mut overrides = HashMap::new();
    if let Some(o) = q.as_object() {
        for (layer, v) in o {
            if !v.is_object() {
                continue; // the defaults above, or `false` (kept dense)
            }
            mode_of(v)?;
            let g = v["group_size"].as_i64().unwrap_or(group_size as i64) as i32;
            let b = v["bits"]
                .as_i64()
                .or(bits.map(i64::from))
                .with_context(|| format!("quantization of {layer} gives no bits"))?;
            overrides.insert(layer.clone(), (g, b as i32));
        }
    }
    Ok(Quantization {
        group_size,
        bits,
        overrides,
    })
}

/// A model from a GGUF file or a HF directory, its weights held as `mode`
/// says, running the default [`ForwardFlags`].
pub fn load_model_with(path: &Path, mode: WeightMode) -> Result<(Llama, ModelFormat)> {
    load_model_part(path, mode, None, ForwardFlags::default())
}

/// The layers `part` of a model (all: `None`): a pipeline rank's share,
/// the other layers' weights never held. The model runs `flags` for its
/// life: they are set here, before anyone holds it, and never after.
pub fn load_model_part(
    path: &Path,
    mode: WeightMode,
    part: Option<Range<usize>>,
    flags: ForwardFlags,
) -> Result<(Llama, ModelFormat)> {
    let format = ModelFormat::detect(path)?;
    let m = match format {
        ModelFormat::Gguf => load_gguf_model(path, mode, part)?,
        ModelFormat::HfDir => load_hf_model(path, mode, part)?,
    };
    Ok((Llama { flags, ..m }, format))
}

/// The `*.safetensors` files of a checkpoint directory, in name order
/// (shards in sequence).
pub fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::quantization;

    #[test]
    fn mlx_quantization_with_per_layer_entries() {
        let cfg = serde_json::json!({"quantization": {
            "group_size": 64, "bits": 4, "mode": "affine",
            "model.embed_tokens": {"group_size": 32, "bits": 8},
            "model.layers.0.mlp.gate": false,
        }});
        let q = quantization(&cfg).unwrap();
        assert_eq!((q.group_size, q.bits, q.overrides.len()), (64, Some(4), 1));
        assert_eq!(q.overrides["model.embed_tokens"], (32, 8));
        // transformers' name for it, and none at all.
        let q = quantization(
            &serde_json::json!({"quantization_config": {"group_size": 32, "bits": 8}}),
        )
        .unwrap();
        assert_eq!((q.group_size, q.bits), (32, Some(8)));
        assert_eq!(quantization(&serde_json::json!({})).unwrap().bits, None);
        let e = quantization(&serde_json::json!({"quantization": {"bits": 4, "mode": "mxfp4"}}));
        assert!(format!("{:#}", e.err().unwrap()).contains("mxfp4"));
    }
}
