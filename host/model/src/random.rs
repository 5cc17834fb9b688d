//! Random-weight checkpoints that specd writes itself (`specd debug
//! random-model`): a llama in the layout of an mlx-community 4-bit
//! directory (config.json with its `quantization` block, model.safetensors,
//! a byte-level tokenizer), so a machine with no model file and no network
//! (the device check, `scripts/device-check.sh`) can still load a model of
//! a stated shape, decode, serve and speculate.
//!
//! The weights are uniform in +-sqrt(3 / fan_in) from MLX's generator with
//! a fixed seed; the final norm is scaled up so the logits spread over
//! whole units (greedy decoding is well defined, not a run of near-ties)
//! and the special tokens' rows are shrunk so they never win (a generation
//! runs its full length).
use anyhow::{bail, Context, Result};
use specd_mlx::{io, ops, random, Array, Dtype};
use std::path::Path;

/// The shape of a random checkpoint.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub name: &'static str,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
}

/// `tiny` (correctness, outputs recorded on a CPU), `small` (speed on a
/// CPU in seconds) and `1b` (Llama 3.2 1B's layers with a 32k vocabulary:
/// 1.04B parameters, the speed figure on a GPU).
pub const SHAPES: [Shape; 3] = [
    Shape {
        name: "tiny",
        hidden: 64,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        ffn: 128,
        vocab: 512,
    },
    Shape {
        name: "small",
        hidden: 256,
        layers: 4,
        heads: 8,
        kv_heads: 4,
        head_dim: 32,
        ffn: 768,
        vocab: 4096,
    },
    Shape {
        name: "1b",
        hidden: 2048,
        layers: 16,
        heads: 32,
        kv_heads: 8,
        head_dim: 64,
        ffn: 8192,
        vocab: 32768,
    },
];

impl Shape {
    pub fn named(name: &str) -> Result<Shape> {
        match SHAPES.iter().find(|s| s.name == name) {
            Some(s) => Ok(*s),
            None => bail!(
                "unknown shape {name:?} (use {})",
                SHAPES.map(|s| s.name).join(", ")
            ),
        }
    }

    /// Parameters, the tied embedding counted once.
    pub fn parameters(&self) -> usize {
        let (d, q, kv) = (
            self.hidden,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
        );
        let layer = d * q * 2 + d * kv * 2 + 3 * d * self.ffn + 2 * d;
        self.vocab * d + self.layers * layer + d
    }
}

const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
const GROUP: i32 = 64;
const BITS: i32 = 4;

/// Writes the random checkpoint of `shape` into `dir`.
pub fn write(shape: Shape, seed: u64, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut tensors: Vec<(String, Array)> = Vec::new();
    let mut next_key = {
        let mut i = 0u64;
        move || {
            i += 1;
            random::key(seed.wrapping_mul(1_000_003).wrapping_add(i))
        }
    };
    let mut uniform = |out: usize, inp: usize| -> Result<Array> {
        let a = (3.0 / inp as f32).sqrt();
        let u = random::uniform(&[out as i32, inp as i32], &next_key()?)?;
        // [0, 1) -> [-a, a)
        Ok(ops::multiply(
            &ops::subtract(&u, &Array::scalar(0.5)?)?,
            &Array::scalar(2.0 * a)?,
        )?)
    };
    let (d, v) = (shape.hidden, shape.vocab);
    // Special tokens' rows shrunk: they never win.
    let mut rows = vec![1.0f32; v];
    for r in rows.iter_mut().skip(v - SPECIALS.len()) {
        *r = 0.05;
    }
    let embed = ops::multiply(&uniform(v, d)?, &Array::from_f32(&rows, &[v as i32, 1])?)?;
    quantized("model.embed_tokens", embed, &mut tensors)?;
    let ones = |scale: f32| -> Result<Array> { Ok(Array::from_f32(&vec![scale; d], &[d as i32])?) };
    let (q, kv) = (
        shape.heads * shape.head_dim,
        shape.kv_heads * shape.head_dim,
    );
    for i in 0..shape.layers {
        let p = format!("model.layers.{i}");
        for (n, out, inp) in [
            ("self_attn.q_proj", q, d),
            ("self_attn.k_proj", kv, d),
            ("self_attn.v_proj", kv, d),
            ("self_attn.o_proj", d, q),
            ("mlp.gate_proj", shape.ffn, d),
            ("mlp.up_proj", shape.ffn, d),
            ("mlp.down_proj", d, shape.ffn),
        ] {
            let w = uniform(out, inp)?;
            quantized(&format!("{p}.{n}"), w, &mut tensors)?;
        }
        tensors.push((format!("{p}.input_layernorm.weight"), ones(1.0)?));
        tensors.push((format!("{p}.post_attention_layernorm.weight"), ones(1.0)?));
    }
    // Logits over whole units.
    tensors.push(("model.norm.weight".into(), ones(12.0)?));
    io::save_safetensors(
        &dir.join("model.safetensors"),
        &tensors,
        &[("format".into(), "mlx".into())],
    )
    .context("writing model.safetensors")?;

    let eos = (v - 1) as u32;
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": d,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "intermediate_size": shape.ffn,
        "vocab_size": v,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": true,
        "hidden_act": "silu",
        "attention_bias": false,
        "eos_token_id": eos,
        "quantization": {"group_size": GROUP, "bits": BITS},
        "specd_random": {"shape": shape.name, "seed": seed, "parameters": shape.parameters()},
    });
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&config)?,
    )?;
    write_tokenizer(dir, v)
}

/// `w` as MLX's 4-bit groups of 64 (`NAME.weight`, `.scales`, `.biases`,
/// float16 as mlx-community's), evaluated now: a 1B model's float weights
/// never all live at once.
fn quantized(name: &str, w: Array, tensors: &mut Vec<(String, Array)>) -> Result<()> {
    let (q, s, b) = ops::quantize(&w, GROUP, BITS)?;
    let parts = [
        (format!("{name}.weight"), q),
        (format!("{name}.scales"), s.as_type(Dtype::Float16)?),
        (format!("{name}.biases"), b.as_type(Dtype::Float16)?),
    ];
    specd_mlx::eval(&parts.iter().map(|p| &p.1).collect::<Vec<_>>())?;
    tensors.extend(parts);
    Ok(())
}

/// A byte-level BPE with no merges: the 256 byte tokens, then as many
/// two-byte tokens as the vocabulary has room for (decodable, never
/// produced by encoding), then the special tokens, ChatML's template.
fn write_tokenizer(dir: &Path, vocab: usize) -> Result<()> {
    let bytes = specd_text::tokenizer::bytes_to_unicode();
    let plain = vocab - SPECIALS.len();
    let singles = bytes.iter().map(|b| b.to_string());
    let pairs = bytes
        .iter()
        .flat_map(|a| bytes.iter().map(move |b| format!("{a}{b}")));
    let mut entries: serde_json::Map<String, serde_json::Value> = singles
        .chain(pairs)
        .take(plain)
        .enumerate()
        .map(|(i, t)| (t, i.into()))
        .collect();
    let added: Vec<serde_json::Value> = SPECIALS
        .iter()
        .enumerate()
        .map(|(i, t)| {
            entries.insert(t.to_string(), (plain + i).into());
            serde_json::json!({"id": plain + i, "content": t, "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let tokenizer = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "vocab": entries, "merges": []},
    });
    std::fs::write(
        dir.join("tokenizer.json"),
        serde_json::to_string(&tokenizer)?,
    )?;
    let config = serde_json::json!({
        "bos_token": null,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "add_bos_token": false,
        "chat_template": specd_text::CHATML_TEMPLATE,
    });
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::to_string_pretty(&config)?,
    )?;
    Ok(())
}
