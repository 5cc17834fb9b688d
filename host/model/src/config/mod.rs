//! Model hyper-parameters (llama family, and Gemma 3's extras), read from
//! GGUF metadata or HF config.json.
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// The forward a model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Arch {
    #[default]
    Llama,
    /// Gemma 3 ([`super::gemma3`]): q/k norms, GeGLU, post-norms, scaled
    /// embedding, local (sliding-window) and global layers.
    Gemma3,
    /// Gemma 2 ([`super::gemma2`]): Gemma 3's layer without q/k norms, with
    /// soft-capped attention scores and logits, `query_pre_attn_scalar`,
    /// local (even) and global (odd) layers.
    Gemma2,
    /// OLMo 2 ([`super::olmo2`]): llama's weights with its two norms after
    /// attention and after the MLP (none before), q/k RMS norms over the
    /// whole projection (not per head).
    Olmo2,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlamaConfig {
    #[serde(default)]
    pub arch: Arch,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    /// GGUF stores q/k permuted for interleaved ("traditional") rope; HF
    /// checkpoints use the rotate-half layout.
    pub rope_traditional: bool,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Attention window, where the model uses one (rotating caches).
    #[serde(default)]
    pub sliding_window: Option<usize>,
    /// Biases on the q/k/v projections (Qwen2; `attention_bias` elsewhere).
    #[serde(default)]
    pub qkv_bias: bool,
    /// A bias on the output projection (`attention_bias` in llama/Qwen3).
    #[serde(default)]
    pub o_bias: bool,
    /// RMS norms over each q and k head before rope (Qwen3, Gemma 3).
    #[serde(default)]
    pub qk_norm: bool,
    /// Gemma 3: every `n`-th layer is global, the others local (windowed);
    /// `None`: every layer uses `sliding_window` as it is.
    #[serde(default)]
    pub sliding_window_pattern: Option<usize>,
    /// Gemma 3: the rope base of the local layers (`rope_theta` is the
    /// global layers').
    #[serde(default)]
    pub rope_local_theta: Option<f32>,
    /// Divisors of the rope frequencies, one per rotated pair: a scaled
    /// rope ([`crate::llama::rope`]; Llama 3.x's `llama3` scaling, a GGUF's
    /// `rope_freqs.weight`). `None`: the plain rope.
    #[serde(default)]
    pub rope_freq_factors: Option<Vec<f32>>,
    /// Gemma 2: attention scores capped as `cap tanh(s / cap)` before the
    /// softmax (`attn_logit_softcapping`).
    #[serde(default)]
    pub attn_logit_softcapping: Option<f32>,
    /// Gemma 2: logits capped as `cap tanh(l / cap)`
    /// (`final_logit_softcapping`).
    #[serde(default)]
    pub final_logit_softcapping: Option<f32>,
    /// Gemma 2: attention scores scaled by 1 / sqrt(this) instead of
    /// 1 / sqrt(head_dim).
    #[serde(default)]
    pub query_pre_attn_scalar: Option<f32>,
    /// The values of each head the rope rotates, the first ones (Phi-4-mini's
    /// `partial_rotary_factor`; GGUF `phi3.rope.dimension_count`). `None`:
    /// the whole head.
    #[serde(default)]
    pub rope_dims: Option<usize>,
    /// What a longrope or yarn scaling multiplies the rotated values of q
    /// and k by (GGUF `rope.scaling.attn_factor`). The loader folds its
    /// square into the q projection's rotated rows (or q norm), so the
    /// forward never reads it. `None`: 1.
    #[serde(default)]
    pub rope_attn_factor: Option<f32>,
    /// Granite 3's multipliers (`None`: a plain llama).
    #[serde(default)]
    pub granite: Option<GraniteScales>,
    /// The layers whose attention runs without rope (SmolLM3's NoPE
    /// layers: HF `no_rope_layers` entries 0; in a GGUF every 4th layer,
    /// llama.cpp's fixed `n_no_rope_layer_step`). Empty: every layer ropes.
    #[serde(default)]
    pub no_rope_layers: Vec<usize>,
}

/// Granite 3's scales (mlx-lm's granite.py; GGUF `granite.embedding_scale`,
/// `.residual_scale`, `.attention.scale`, `.logit_scale`). The forward
/// multiplies the embedding rows by `embedding`; the loader folds the
/// others into weights: `residual` into the o and down projections (what
/// each adds to the residual stream), `attention` (the softmax scale in
/// place of 1 / sqrt(head_dim)) into q, 1 / `logits` into the final norm.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GraniteScales {
    pub embedding: f32,
    pub residual: f32,
    pub attention: f32,
    pub logits: f32,
}

/// The HF `model_type`s specd runs, all through the llama forward with the
/// options above.
/// `mimo` is Qwen2 with MTP layers (read as a draft head,
/// [`crate::mtp::MtpHead::from_mimo_checkpoint`]).
pub const SUPPORTED_MODEL_TYPES: &[&str] = &[
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "mimo",
    "phi3",
    "gemma3_text",
    "gemma2",
    "granite",
    "smollm3",
    "olmo2",
];

/// The GGUF `general.architecture`s specd runs, as llama.cpp's converter
/// writes them.
pub const SUPPORTED_GGUF_ARCHS: &[&str] = &[
    "llama", "qwen2", "qwen3", "phi3", "gemma3", "gemma2", "granite", "smollm3", "olmo2",
];

/// Where a source keeps the shape every llama-family config states: the
/// hidden size, layers, heads, key/value heads (default: as many as heads),
/// the MLP's width and the norms' epsilon (default 1e-5).
struct ShapeKeys {
    hidden: &'static str,
    layers: &'static str,
    heads: &'static str,
    kv_heads: &'static str,
    ffn: &'static str,
    eps: &'static str,
}

/// A Hugging Face config.json's names for the shape (every `model_type`).
const HF_SHAPE: ShapeKeys = ShapeKeys {
    hidden: "hidden_size",
    layers: "num_hidden_layers",
    heads: "num_attention_heads",
    kv_heads: "num_key_value_heads",
    ffn: "intermediate_size",
    eps: "rms_norm_eps",
};

/// SmolLM3's layers without rope from its config.json (mlx-lm's
/// smollm3.py): `no_rope_layers`, one entry a layer, 1 ropes and 0 does
/// not; without it, every `no_rope_layer_interval`-th layer (default 4).
fn smollm3_no_rope_layers(v: &serde_json::Value, layers: usize) -> Result<Vec<usize>> {
    if let Some(list) = v["no_rope_layers"].as_array() {
        if list.len() != layers {
            bail!(
                "config.json's no_rope_layers has {} entries for {layers} layers",
                list.len()
            );
        }
        let mut out = Vec::new();
        for (i, e) in list.iter().enumerate() {
            match e.as_u64() {
                Some(0) => out.push(i),
                Some(1) => {}
                _ => bail!("config.json's no_rope_layers[{i}] = {e} is not 0 or 1"),
            }
        }
        return Ok(out);
    }
    let step = match &v["no_rope_layer_interval"] {
        serde_json::Value::Null => 4,
        n => n.as_u64().filter(|&n| n > 0).with_context(|| {
            format!("config.json's no_rope_layer_interval {n} is not a positive integer")
        })? as usize,
    };
    Ok((0..layers).filter(|i| (i + 1) % step == 0).collect())
}

impl LlamaConfig {
    /// Gemma 3's embedding scale: sqrt(hidden) rounded to bfloat16 (mlx-lm:
    /// `mx.array(hidden ** 0.5, mx.bfloat16)`): for 640, 25.25 rather than
    /// 25.298.
    /// Gemma 2's is sqrt(hidden) in float32 (mlx-lm's gemma2.py and
    /// llama.cpp).
    pub fn embed_scale(&self) -> f32 {
        if self.arch == Arch::Gemma2 {
            return (self.hidden_size as f32).sqrt();
        }
        let s = (self.hidden_size as f32).sqrt().to_bits();
        // Round to nearest even at bit 16.
        let r = s + 0x7fff + ((s >> 16) & 1);
        f32::from_bits(r & 0xffff_0000)
    }

    /// The attention scores' scale: 1 / sqrt(`query_pre_attn_scalar`)
    /// where a Gemma 2 states one, else 1 / sqrt(head_dim).
    pub fn attn_scale(&self) -> f32 {
        let s = self.query_pre_attn_scalar.unwrap_or(self.head_dim as f32);
        (1.0 / (s as f64).sqrt()) as f32
    }

    /// What the embedding rows are multiplied by: Gemma 2/3's sqrt(hidden),
    /// Granite's embedding multiplier; `None`: nothing.
    pub fn embedding_scale(&self) -> Option<f32> {
        match (self.arch, self.granite) {
            (Arch::Gemma3 | Arch::Gemma2, _) => Some(self.embed_scale()),
            (_, Some(g)) if g.embedding != 1.0 => Some(g.embedding),
            _ => None,
        }
    }

    /// Bytes of KV cache one token takes at `value_bytes` per value (4:
    /// float32): keys and values, every layer. The model reports its own
    /// ([`crate::Llama::kv_bytes_per_token`]); the scheduler only adds.
    pub fn kv_bytes_per_token(&self, value_bytes: usize) -> usize {
        self.num_hidden_layers * 2 * self.num_key_value_heads * self.head_dim * value_bytes
    }

    /// The fields [`ShapeKeys`] names, read with `int` and `float`; every
    /// other field as a plain llama's, for the caller to set.
    fn shape(
        k: &ShapeKeys,
        int: &dyn Fn(&str) -> Result<usize>,
        float: &dyn Fn(&str) -> Option<f64>,
    ) -> Result<LlamaConfig> {
        let (hidden, heads) = (int(k.hidden)?, int(k.heads)?);
        Ok(LlamaConfig {
            arch: Arch::Llama,
            hidden_size: hidden,
            num_hidden_layers: int(k.layers)?,
            num_attention_heads: heads,
            num_key_value_heads: int(k.kv_heads).unwrap_or(heads),
            head_dim: hidden / heads.max(1),
            intermediate_size: int(k.ffn)?,
            vocab_size: 0,
            rms_norm_eps: float(k.eps).unwrap_or(1e-5) as f32,
            rope_theta: 10000.0,
            rope_traditional: false,
            max_position_embeddings: 2048,
            tie_word_embeddings: false,
            sliding_window: None,
            qkv_bias: false,
            o_bias: false,
            qk_norm: false,
            sliding_window_pattern: None,
            rope_local_theta: None,
            rope_freq_factors: None,
            attn_logit_softcapping: None,
            final_logit_softcapping: None,
            query_pre_attn_scalar: None,
            rope_dims: None,
            rope_attn_factor: None,
            granite: None,
            no_rope_layers: Vec::new(),
        })
    }

    /// From GGUF metadata (numbers as decimal text, as specd-mlx returns them).
    pub fn from_gguf(meta: &HashMap<String, String>, has_output: bool) -> Result<Self> {
        let arch = meta
            .get("general.architecture")
            .map(String::as_str)
            .unwrap_or("llama");
        if !SUPPORTED_GGUF_ARCHS.contains(&arch) {
            bail!(
                "unsupported GGUF architecture {arch:?} (specd runs {})",
                SUPPORTED_GGUF_ARCHS.join(", ")
            );
        }
        let num = |k: &str| -> Result<f64> {
            let key = format!("{arch}.{k}");
            let v = meta
                .get(&key)
                .with_context(|| format!("GGUF metadata lacks {key}"))?;
            v.parse::<f64>()
                .with_context(|| format!("GGUF metadata {key} = {v:?} is not a number"))
        };
        let shape = LlamaConfig::shape(
            &ShapeKeys {
                hidden: "embedding_length",
                layers: "block_count",
                heads: "attention.head_count",
                kv_heads: "attention.head_count_kv",
                ffn: "feed_forward_length",
                eps: "attention.layer_norm_rms_epsilon",
            },
            &|k| Ok(num(k)? as usize),
            &|k| num(k).ok(),
        )?;
        let vocab = match num("vocab_size") {
            Ok(v) => v as usize,
            Err(_) => 0, // filled from the embedding's shape by the loader
        };
        if arch == "gemma2" {
            return Self::from_gemma2_gguf(shape, &num, has_output, vocab);
        }
        let gemma = arch == "gemma3";
        // Gemma 3 (llama.cpp's reading of its GGUF): head dim from
        // attention.key_length, a global layer every 6th, local rope base
        // 10000, NEOX (rotate-half) rope on unpermuted q/k, q/k norms.
        // Qwen2 (q/k/v biases) and Qwen3 (q/k norms, its own head size)
        // are NEOX on unpermuted q/k too: llama.cpp's converter permutes
        // llama's q/k only.
        let head_dim = match num("attention.key_length") {
            Ok(v) => v as usize,
            Err(_) if gemma => bail!("GGUF metadata lacks gemma3.attention.key_length"),
            Err(_) if arch == "phi3" => shape.head_dim,
            Err(_) => num("rope.dimension_count").map_or(shape.head_dim, |v| v as usize),
        };
        // Phi-4-mini rotates the first rope.dimension_count values of each
        // head (llama.cpp's n_rot); elsewhere the whole head.
        let mut rope_dims = None;
        if let Ok(n) = num("rope.dimension_count") {
            let n = n as usize;
            if arch == "phi3" && n < head_dim && n > 0 && n.is_multiple_of(2) {
                rope_dims = Some(n);
            } else if n != head_dim {
                bail!("GGUF metadata {arch}.rope.dimension_count {n} is not the head size {head_dim} (specd rotates whole heads, or an even part of them for phi3)");
            }
        }
        let context = num("context_length").map_or(2048, |v| v as usize);
        let rope_theta = num("rope.freq_base").unwrap_or(10000.0) as f32;
        // YaRN (Qwen 2.5's long-context files): ggml's rope with
        // ext_factor 1 and its attention factor (1 + 0.1 ln factor) times
        // the file's own.
        let scaling_type = meta.get(&format!("{arch}.rope.scaling.type"));
        let file_attn = num("rope.scaling.attn_factor").ok();
        let factor = num("rope.scaling.factor")
            .ok()
            .filter(|&f| f != 0.0 && f != 1.0);
        let dims = rope_dims.unwrap_or(head_dim);
        let (rope_freq_factors, rope_attn_factor) = match (scaling_type.map(String::as_str), factor) {
            (Some("yarn"), Some(factor)) => {
                let original = num("rope.scaling.original_context_length")?;
                let beta = |k: &str, d: f64| num(k).unwrap_or(d);
                let f = crate::llama::rope::yarn(
                    factor,
                    original,
                    beta("rope.scaling.yarn_beta_fast", 32.0),
                    beta("rope.scaling.yarn_beta_slow", 1.0),
                    dims,
                    rope_theta,
                );
                let m = if factor > 1.0 { 1.0 + 0.1 * factor.ln() } else { 1.0 };
                (Some(f), Some(m * file_attn.unwrap_or(1.0)))
            }
            (_, None) => (None, file_attn),
            // llama.cpp's default type: positions scaled by 1 / factor.
            (None | Some("linear"), Some(f)) => (Some(vec![f as f32; dims / 2]), file_attn),
            (Some(t), _) => bail!("GGUF rope scaling {arch}.rope.scaling.type = {t:?} is not supported (specd runs none, linear and yarn; llama3 as rope_freqs.weight, longrope as rope_factors_long/short)"),
        };
        Ok(LlamaConfig {
            arch: match arch {
                "gemma3" => Arch::Gemma3,
                "olmo2" => Arch::Olmo2,
                _ => Arch::Llama,
            },
            head_dim,
            vocab_size: vocab,
            rope_theta,
            // llama.cpp's converter permutes q/k of llama, Granite and
            // SmolLM3 (its LlamaModel subclasses).
            rope_traditional: matches!(arch, "llama" | "granite" | "smollm3"),
            // SmolLM3: llama.cpp reads no key for its NoPE layers; every
            // 4th layer ((i + 1) % 4 == 0) skips the rope.
            no_rope_layers: match arch {
                "smollm3" => (0..shape.num_hidden_layers)
                    .filter(|i| (i + 1) % 4 == 0)
                    .collect(),
                _ => Vec::new(),
            },
            qkv_bias: arch == "qwen2",
            max_position_embeddings: context,
            rope_freq_factors,
            rope_attn_factor: rope_attn_factor.filter(|&a| a != 1.0).map(|a| a as f32),
            rope_dims,
            tie_word_embeddings: !has_output,
            // Gemma 3's local layers; every layer of a Phi-3.
            sliding_window: match arch {
                "gemma3" => Some(num("attention.sliding_window")? as usize),
                // 0: none (llama.cpp's converter writes Phi-4-mini's so).
                "phi3" => num("attention.sliding_window")
                    .ok()
                    .map(|w| w as usize)
                    .filter(|&w| w > 0),
                _ => None,
            },
            sliding_window_pattern: gemma.then_some(6),
            rope_local_theta: gemma.then_some(10000.0),
            qk_norm: gemma || arch == "qwen3" || arch == "olmo2",
            granite: match arch {
                "granite" => Some(GraniteScales {
                    embedding: num("embedding_scale").unwrap_or(1.0) as f32,
                    residual: num("residual_scale").unwrap_or(1.0) as f32,
                    attention: num("attention.scale").unwrap_or(1.0 / (head_dim as f64).sqrt())
                        as f32,
                    logits: num("logit_scale").unwrap_or(1.0) as f32,
                }),
                _ => None,
            },
            ..shape
        })
    }

    /// From a Hugging Face config.json: `model_type` picks the options
    /// (following mlx-lm's llama.py, qwen2.py and qwen3.py; mistral is
    /// llama there). Anything the forward would silently get wrong (rope
    /// scaling, MLP biases, Qwen's per-layer sliding windows) is an error.
    pub fn from_hf_json(text: &str) -> Result<Self> {
        let v: serde_json::Value = serde_json::from_str(text).context("config.json is not JSON")?;
        let model_type = match &v["model_type"] {
            serde_json::Value::Null => "llama",
            t => t
                .as_str()
                .context("config.json's model_type is not a string")?,
        };
        if !SUPPORTED_MODEL_TYPES.contains(&model_type) {
            bail!(
                "unsupported model_type {model_type:?} in config.json (specd runs {})",
                SUPPORTED_MODEL_TYPES.join(", ")
            );
        }
        if model_type == "gemma3_text" {
            return Self::from_gemma3_json(&v);
        }
        if model_type == "gemma2" {
            return Self::from_gemma2_json(&v);
        }
        // MiMo's trunk is Qwen2's.
        let model_type = if model_type == "mimo" {
            "qwen2"
        } else {
            model_type
        };
        let qwen = model_type.starts_with("qwen");
        // OLMo 2: llama's config; its layer differs ([`Arch::Olmo2`]).
        let olmo2 = model_type == "olmo2";
        // Phi-3 is llama with fused q/k/v and gate/up tensors (split at
        // load, [`crate::llama::phi3`]) and a window on every layer;
        // Phi-4-mini rotates part of each head (below).
        let get = |k: &str| -> Result<u64> {
            v[k].as_u64()
                .with_context(|| format!("config.json lacks integer {k}"))
        };
        let flag = |k: &str| -> Result<bool> {
            match &v[k] {
                serde_json::Value::Null => Ok(false),
                b => b
                    .as_bool()
                    .with_context(|| format!("config.json's {k} is not a boolean")),
            }
        };
        // One kind of attention in every layer; interleaved local and
        // global layers are another architecture.
        if let Some(kinds) = v["layer_types"].as_array() {
            let known = |k: &serde_json::Value| {
                matches!(k.as_str(), Some("full_attention" | "sliding_attention"))
            };
            if let Some(k) = kinds
                .iter()
                .find(|&k| !known(k) || Some(k) != kinds.first())
            {
                bail!("config.json's layer_types entry {k} is not supported (specd runs the same attention in every layer)");
            }
        }
        if flag("mlp_bias")? {
            bail!("config.json's mlp_bias = true is not supported");
        }
        let shape = LlamaConfig::shape(&HF_SHAPE, &|k| Ok(get(k)? as usize), &|k| v[k].as_f64())?;
        let head_dim = match model_type {
            // Qwen2 has no head_dim of its own (HF and mlx-lm both divide).
            "qwen2" => shape.head_dim,
            // Qwen3's may differ from hidden / heads; mlx-lm requires it.
            "qwen3" => get("head_dim")? as usize,
            _ => get("head_dim").map_or(shape.head_dim, |x| x as usize),
        };
        // mlx-lm's phi3: int(head_dim * partial_rotary_factor) values.
        let rope_dims = match v["partial_rotary_factor"].as_f64() {
            Some(f) if f != 1.0 && model_type == "phi3" => {
                let n = (head_dim as f64 * f) as usize;
                if n == 0 || n > head_dim || !n.is_multiple_of(2) {
                    bail!("config.json's partial_rotary_factor {f} gives {n} rotated values of {head_dim}, not an even part");
                }
                Some(n)
            }
            Some(f) if f != 1.0 => {
                bail!("config.json's partial_rotary_factor {f} is not supported for {model_type} (specd rotates whole heads there)")
            }
            _ => None,
        };
        let attention_bias = flag("attention_bias")?;
        let no_rope_layers = match model_type {
            "smollm3" => smollm3_no_rope_layers(&v, shape.num_hidden_layers)?,
            _ => Vec::new(),
        };
        let granite = match model_type {
            "granite" => {
                let f = |k: &str| -> Result<f32> {
                    Ok(v[k]
                        .as_f64()
                        .with_context(|| format!("config.json lacks the number {k}"))?
                        as f32)
                };
                Some(GraniteScales {
                    embedding: f("embedding_multiplier")?,
                    residual: f("residual_multiplier")?,
                    attention: f("attention_multiplier")?,
                    logits: f("logits_scaling")?,
                })
            }
            _ => None,
        };
        // Qwen configs carry a sliding_window that applies only with
        // use_sliding_window, and then only above max_window_layers.
        let sliding_window = if qwen {
            if flag("use_sliding_window")? {
                bail!("config.json's use_sliding_window = true is not supported for {model_type}");
            }
            None
        } else {
            v["sliding_window"].as_u64().map(|w| w as usize)
        };
        let rope_theta = v["rope_theta"]
            .as_f64()
            .or_else(|| v["rope_parameters"]["rope_theta"].as_f64());
        let rope_theta = match (rope_theta, model_type) {
            (Some(t), _) => t as f32,
            (None, "qwen2") => 1_000_000.0,
            (None, "qwen3") => bail!("config.json lacks rope_theta"),
            (None, _) => 10000.0,
        };
        let max_position_embeddings =
            get("max_position_embeddings").map_or(if qwen { 32768 } else { 2048 }, |x| x as usize);
        // transformers >= 5 nests the scaling under rope_parameters.
        let rope = crate::llama::rope::RopeShape {
            dims: rope_dims.unwrap_or(head_dim),
            base: rope_theta,
            context: max_position_embeddings,
            original: get("original_max_position_embeddings")
                .ok()
                .map(|x| x as usize),
        };
        let mut scaling = crate::llama::rope::Scaling::default();
        for key in ["rope_scaling", "rope_parameters"] {
            if let Some(s) = v[key].as_object() {
                let s = crate::llama::rope::scaling_from_hf(s, &rope)
                    .with_context(|| format!("config.json's {key}"))?;
                if s.factors.is_some() {
                    scaling = s;
                }
            }
        }
        Ok(LlamaConfig {
            head_dim,
            vocab_size: get("vocab_size")? as usize,
            rope_theta,
            rope_freq_factors: scaling.factors,
            rope_attn_factor: scaling.attn_factor.filter(|&a| a != 1.0),
            rope_dims,
            granite,
            rope_traditional: flag("rope_traditional")?,
            max_position_embeddings,
            // Unsaid, the file decides: without lm_head the head is tied.
            tie_word_embeddings: flag("tie_word_embeddings")?,
            sliding_window,
            qkv_bias: model_type == "qwen2" || attention_bias,
            o_bias: model_type != "qwen2" && attention_bias,
            qk_norm: model_type == "qwen3" || olmo2,
            arch: if olmo2 { Arch::Olmo2 } else { Arch::Llama },
            no_rope_layers,
            ..shape
        })
    }

    /// A Gemma 3 text config.json (`gemma3_text`, as `specd convert`
    /// writes it and mlx-lm's gemma3_text.py reads it). What this forward
    /// does not run (a scaled rope on the global layers, soft-capping, an
    /// attention scale other than 1 / sqrt(head_dim), another activation)
    /// is an error.
    fn from_gemma3_json(v: &serde_json::Value) -> Result<Self> {
        let get = |k: &str| -> Result<u64> {
            v[k].as_u64()
                .with_context(|| format!("config.json lacks integer {k}"))
        };
        let shape = LlamaConfig::shape(&HF_SHAPE, &|k| Ok(get(k)? as usize), &|k| {
            v[k].as_f64().or((k == "rms_norm_eps").then_some(1e-6))
        })?;
        let head_dim = get("head_dim").map_or(256, |x| x as usize);
        if let Some(s) = v["query_pre_attn_scalar"].as_f64() {
            if s != head_dim as f64 {
                bail!("config.json's query_pre_attn_scalar {s} is not head_dim {head_dim} (specd scales attention by 1 / sqrt(head_dim))");
            }
        }
        for key in [
            "rope_scaling",
            "attn_logit_softcapping",
            "final_logit_softcapping",
        ] {
            if !v[key].is_null() {
                bail!(
                    "config.json's {key} = {} is not supported for gemma3_text",
                    v[key]
                );
            }
        }
        match v["hidden_activation"].as_str() {
            None | Some("gelu_pytorch_tanh") => {}
            Some(a) => {
                bail!("config.json's hidden_activation {a:?} is not supported (gelu_pytorch_tanh)")
            }
        }
        let pattern = get("sliding_window_pattern")
            .map_or(6, |p| p as usize)
            .max(1);
        // Newer configs state each layer's kind: it must be the pattern's.
        if let Some(kinds) = v["layer_types"].as_array() {
            for (i, k) in kinds.iter().enumerate() {
                let want = match (i + 1) % pattern {
                    0 => "full_attention",
                    _ => "sliding_attention",
                };
                if k.as_str() != Some(want) {
                    bail!("config.json's layer_types[{i}] = {k} is not every {pattern}th layer global");
                }
            }
        }
        let rope_theta = v["rope_theta"]
            .as_f64()
            .or_else(|| v["rope_global_base_freq"].as_f64())
            .unwrap_or(1_000_000.0);
        Ok(LlamaConfig {
            arch: Arch::Gemma3,
            head_dim,
            vocab_size: get("vocab_size")? as usize,
            rope_theta: rope_theta as f32,
            rope_local_theta: Some(v["rope_local_base_freq"].as_f64().unwrap_or(10000.0) as f32),
            rope_traditional: false,
            max_position_embeddings: get("max_position_embeddings").map_or(32768, |x| x as usize),
            tie_word_embeddings: v["tie_word_embeddings"].as_bool().unwrap_or(true),
            sliding_window: Some(get("sliding_window").map_or(512, |x| x as usize)),
            sliding_window_pattern: Some(pattern),
            qk_norm: true,
            ..shape
        })
    }

    /// A Gemma 2 GGUF as llama.cpp reads it (`LLM_ARCH_GEMMA2`): the head
    /// size from `attention.key_length`, NEOX rope on unpermuted q/k (base
    /// 10000 unless stated), a window on the even layers (`set_swa_pattern(2)`),
    /// the soft-caps (50 and 30 where unstated, as llama.cpp's defaults),
    /// and llama.cpp's attention scale: 1 / sqrt(head size), but
    /// 1 / sqrt(hidden / heads) for the 46-layer 27B (its
    /// `query_pre_attn_scalar`, which the file does not carry).
    fn from_gemma2_gguf(
        shape: LlamaConfig,
        num: &dyn Fn(&str) -> Result<f64>,
        has_output: bool,
        vocab: usize,
    ) -> Result<Self> {
        let head_dim = num("attention.key_length")? as usize;
        if let Ok(n) = num("rope.dimension_count") {
            if n as usize != head_dim {
                bail!("GGUF metadata gemma2.rope.dimension_count {n} is not the head size {head_dim} (specd rotates whole heads)");
            }
        }
        let scalar = match shape.num_hidden_layers {
            46 => shape.hidden_size / shape.num_attention_heads.max(1),
            _ => head_dim,
        };
        // A cap of 0 would divide by zero: no cap.
        let cap =
            |k: &str, default: f64| Some(num(k).unwrap_or(default) as f32).filter(|&c| c != 0.0);
        Ok(LlamaConfig {
            arch: Arch::Gemma2,
            head_dim,
            vocab_size: vocab,
            rope_theta: num("rope.freq_base").unwrap_or(10000.0) as f32,
            max_position_embeddings: num("context_length").map_or(8192, |v| v as usize),
            tie_word_embeddings: !has_output,
            sliding_window: Some(num("attention.sliding_window")? as usize),
            sliding_window_pattern: Some(2),
            attn_logit_softcapping: cap("attn_logit_softcapping", 50.0),
            final_logit_softcapping: cap("final_logit_softcapping", 30.0),
            query_pre_attn_scalar: Some(scalar as f32),
            ..shape
        })
    }

    /// A Gemma 2 config.json (`gemma2`, as transformers' Gemma2Config and
    /// mlx-lm's gemma2.py read it): soft-caps of 50 and 30 where unstated
    /// (transformers' defaults; `null`: none), `query_pre_attn_scalar`
    /// (default 256), a window of `sliding_window` on the even layers.
    /// A scaled rope or another activation is an error.
    fn from_gemma2_json(v: &serde_json::Value) -> Result<Self> {
        let get = |k: &str| -> Result<u64> {
            v[k].as_u64()
                .with_context(|| format!("config.json lacks integer {k}"))
        };
        let shape = LlamaConfig::shape(&HF_SHAPE, &|k| Ok(get(k)? as usize), &|k| {
            v[k].as_f64().or((k == "rms_norm_eps").then_some(1e-6))
        })?;
        let head_dim = get("head_dim").map_or(256, |x| x as usize);
        if !v["rope_scaling"].is_null() {
            bail!(
                "config.json's rope_scaling = {} is not supported for gemma2",
                v["rope_scaling"]
            );
        }
        for key in ["hidden_activation", "hidden_act"] {
            match v[key].as_str() {
                None | Some("gelu_pytorch_tanh") => {}
                Some(a) => {
                    bail!("config.json's {key} {a:?} is not supported (gelu_pytorch_tanh)")
                }
            }
        }
        // Unstated: transformers' default; null: no cap.
        let cap = |key: &str, default: f64| -> Result<Option<f32>> {
            match v.get(key) {
                None => Ok(Some(default as f32)),
                Some(serde_json::Value::Null) => Ok(None),
                Some(c) => match c.as_f64() {
                    Some(0.0) => Ok(None),
                    Some(c) => Ok(Some(c as f32)),
                    None => bail!("config.json's {key} {c} is not a number"),
                },
            }
        };
        // Newer configs state each layer's kind: it must be Gemma 2's.
        if let Some(kinds) = v["layer_types"].as_array() {
            for (i, k) in kinds.iter().enumerate() {
                let want = match i % 2 {
                    0 => "sliding_attention",
                    _ => "full_attention",
                };
                if k.as_str() != Some(want) {
                    bail!("config.json's layer_types[{i}] = {k} is not Gemma 2's (even layers sliding, odd ones full)");
                }
            }
        }
        Ok(LlamaConfig {
            arch: Arch::Gemma2,
            head_dim,
            vocab_size: get("vocab_size")? as usize,
            rope_theta: v["rope_theta"].as_f64().unwrap_or(10000.0) as f32,
            rope_traditional: false,
            max_position_embeddings: get("max_position_embeddings").map_or(8192, |x| x as usize),
            tie_word_embeddings: v["tie_word_embeddings"].as_bool().unwrap_or(true),
            sliding_window: Some(get("sliding_window").map_or(4096, |x| x as usize)),
            sliding_window_pattern: Some(2),
            attn_logit_softcapping: cap("attn_logit_softcapping", 50.0)?,
            final_logit_softcapping: cap("final_logit_softcapping", 30.0)?,
            query_pre_attn_scalar: Some(v["query_pre_attn_scalar"].as_f64().unwrap_or(256.0) as f32),
            ..shape
        })
    }

    /// The values of each head the rope rotates.
    pub fn rotary_dims(&self) -> usize {
        self.rope_dims.unwrap_or(self.head_dim)
    }

    /// Whether layer `i` attends through the sliding window (rotating cache).
    pub fn is_local(&self, i: usize) -> bool {
        match (self.sliding_window, self.sliding_window_pattern) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(_), Some(p)) => !(i + 1).is_multiple_of(p.max(1)),
        }
    }

    /// The rope base of layer `i`.
    pub fn rope_base(&self, i: usize) -> f32 {
        match self.rope_local_theta {
            Some(b) if self.is_local(i) => b,
            _ => self.rope_theta,
        }
    }

    /// The config.json a converted HF directory carries.
    pub fn to_hf_json(&self, eos: &[u32], bos: Option<u32>) -> serde_json::Value {
        let eos_json = if eos.len() == 1 {
            serde_json::json!(eos[0])
        } else {
            serde_json::json!(eos)
        };
        let mut v = serde_json::json!({
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "torch_dtype": "float32",
            "bos_token_id": bos,
            "eos_token_id": eos_json,
        });
        let arch = if self.arch == Arch::Gemma3 {
            // mlx-lm's gemma3_text ModelArgs (and transformers' Gemma3TextConfig).
            serde_json::json!({
                "architectures": ["Gemma3ForCausalLM"],
                "model_type": "gemma3_text",
                "rope_local_base_freq": self.rope_local_theta.unwrap_or(10000.0),
                "query_pre_attn_scalar": self.head_dim,
                "sliding_window": self.sliding_window,
                "sliding_window_pattern": self.sliding_window_pattern,
                "rope_scaling": null,
                "hidden_activation": "gelu_pytorch_tanh",
                "tie_word_embeddings": true,
            })
        } else {
            serde_json::json!({
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "tie_word_embeddings": self.tie_word_embeddings,
                "hidden_act": "silu",
                "attention_bias": false,
                "mlp_bias": false,
            })
        };
        if let (Some(v), serde_json::Value::Object(arch)) = (v.as_object_mut(), arch) {
            v.extend(arch);
        }
        v
    }
}

#[cfg(test)]
mod tests;
