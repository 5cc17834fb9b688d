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
    /// Gemma 3: every `n`-th layer is global, the others local (windowed);
    /// `None`: every layer uses `sliding_window` as it is.
    #[serde(default)]
    pub sliding_window_pattern: Option<usize>,
    /// Gemma 3: the rope base of the local layers (`rope_theta` is the
    /// global layers').
    #[serde(default)]
    pub rope_local_theta: Option<f32>,
}

impl LlamaConfig {
    /// From GGUF metadata (numbers as decimal text, as specd-mlx returns them).
    pub fn from_gguf(meta: &HashMap<String, String>, has_output: bool) -> Result<Self> {
        let arch = meta
            .get("general.architecture")
            .map(String::as_str)
            .unwrap_or("llama");
        if !matches!(arch, "llama" | "gemma3") {
            bail!("unsupported GGUF architecture {arch:?} (specd runs llama and gemma3)");
        }
        let num = |k: &str| -> Result<f64> {
            let key = format!("{arch}.{k}");
            let v = meta
                .get(&key)
                .with_context(|| format!("GGUF metadata lacks {key}"))?;
            v.parse::<f64>()
                .with_context(|| format!("GGUF metadata {key} = {v:?} is not a number"))
        };
        let heads = num("attention.head_count")? as usize;
        let hidden = num("embedding_length")? as usize;
        let vocab = match num("vocab_size") {
            Ok(v) => v as usize,
            Err(_) => 0, // filled from the embedding's shape by the loader
        };
        let head_dim = num("rope.dimension_count")
            .map(|v| v as usize)
            .unwrap_or(hidden / heads.max(1));
        let gemma = arch == "gemma3";
        // Gemma 3 (llama.cpp's reading of its GGUF): head dim from
        // attention.key_length, a global layer every 6th, local rope base
        // 10000, NEOX (rotate-half) rope on unpermuted q/k.
        let head_dim = if gemma {
            num("attention.key_length")? as usize
        } else {
            head_dim
        };
        Ok(LlamaConfig {
            arch: if gemma { Arch::Gemma3 } else { Arch::Llama },
            hidden_size: hidden,
            num_hidden_layers: num("block_count")? as usize,
            num_attention_heads: heads,
            num_key_value_heads: num("attention.head_count_kv")
                .map(|v| v as usize)
                .unwrap_or(heads),
            head_dim,
            intermediate_size: num("feed_forward_length")? as usize,
            vocab_size: vocab,
            rms_norm_eps: num("attention.layer_norm_rms_epsilon").unwrap_or(1e-5) as f32,
            rope_theta: num("rope.freq_base").unwrap_or(10000.0) as f32,
            rope_traditional: !gemma,
            max_position_embeddings: num("context_length").map(|v| v as usize).unwrap_or(2048),
            tie_word_embeddings: !has_output,
            sliding_window: if gemma {
                Some(num("attention.sliding_window")? as usize)
            } else {
                None
            },
            sliding_window_pattern: gemma.then_some(6),
            rope_local_theta: gemma.then_some(10000.0),
        })
    }

    /// From a Hugging Face config.json.
    pub fn from_hf_json(text: &str) -> Result<Self> {
        let v: serde_json::Value = serde_json::from_str(text).context("config.json is not JSON")?;
        let model_type = v["model_type"].as_str().unwrap_or("llama");
        if !matches!(model_type, "llama" | "mistral") {
            bail!("unsupported model_type {model_type:?} (specd runs llama-family models)");
        }
        let get = |k: &str| -> Result<u64> {
            v[k].as_u64()
                .with_context(|| format!("config.json lacks integer {k}"))
        };
        let heads = get("num_attention_heads")? as usize;
        let hidden = get("hidden_size")? as usize;
        Ok(LlamaConfig {
            arch: Arch::Llama,
            hidden_size: hidden,
            num_hidden_layers: get("num_hidden_layers")? as usize,
            num_attention_heads: heads,
            num_key_value_heads: get("num_key_value_heads")
                .map(|x| x as usize)
                .unwrap_or(heads),
            head_dim: get("head_dim")
                .map(|x| x as usize)
                .unwrap_or(hidden / heads.max(1)),
            intermediate_size: get("intermediate_size")? as usize,
            vocab_size: get("vocab_size")? as usize,
            rms_norm_eps: v["rms_norm_eps"].as_f64().unwrap_or(1e-5) as f32,
            rope_theta: v["rope_theta"].as_f64().unwrap_or(10000.0) as f32,
            rope_traditional: false,
            max_position_embeddings: get("max_position_embeddings")
                .map(|x| x as usize)
                .unwrap_or(2048),
            tie_word_embeddings: v["tie_word_embeddings"].as_bool().unwrap_or(false),
            sliding_window: v["sliding_window"].as_u64().map(|w| w as usize),
            sliding_window_pattern: None,
            rope_local_theta: None,
        })
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
        if self.arch == Arch::Gemma3 {
            // mlx-lm's gemma3_text ModelArgs (and transformers' Gemma3TextConfig).
            return serde_json::json!({
                "architectures": ["Gemma3ForCausalLM"],
                "model_type": "gemma3_text",
                "hidden_size": self.hidden_size,
                "num_hidden_layers": self.num_hidden_layers,
                "num_attention_heads": self.num_attention_heads,
                "num_key_value_heads": self.num_key_value_heads,
                "head_dim": self.head_dim,
                "intermediate_size": self.intermediate_size,
                "vocab_size": self.vocab_size,
                "rms_norm_eps": self.rms_norm_eps,
                "rope_theta": self.rope_theta,
                "rope_local_base_freq": self.rope_local_theta.unwrap_or(10000.0),
                "query_pre_attn_scalar": self.head_dim,
                "sliding_window": self.sliding_window,
                "sliding_window_pattern": self.sliding_window_pattern,
                "max_position_embeddings": self.max_position_embeddings,
                "rope_scaling": null,
                "hidden_activation": "gelu_pytorch_tanh",
                "tie_word_embeddings": true,
                "torch_dtype": "float32",
                "bos_token_id": bos,
                "eos_token_id": eos_json,
            });
        }
        serde_json::json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
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
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "attention_bias": false,
            "mlp_bias": false,
            "torch_dtype": "float32",
            "bos_token_id": bos,
            "eos_token_id": eos_json,
        })
    }
}
