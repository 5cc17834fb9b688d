//! Random-weight checkpoints that specd writes itself (`specd debug
//! random-model`): a model of any architecture specd runs ([`Family`]) in
//! the layout of an mlx-community 4-bit directory (config.json with its
//! `quantization` block, model.safetensors, a byte-level tokenizer), or as
//! a GGUF file the way llama.cpp's converter names it (Q4_1 weights, a
//! Q8_0 embedding, float32 norms and biases, the tokenizer in its
//! metadata), so a machine with no model file and no network (the device
//! check, `scripts/device-check.sh`; benchmarks against llama.cpp) can
//! still load a model of a stated shape, decode, serve and speculate.
//!
//! The weights are uniform in +-sqrt(3 / fan_in) from MLX's generator with
//! a fixed seed; the final norm is scaled up so the logits spread over
//! whole units (greedy decoding is well defined, not a run of near-ties)
//! and the special tokens' rows are shrunk so they never win (a generation
//! runs its full length).
use crate::ggml;
use anyhow::{bail, Context, Result};
use specd_mlx::{io, ops, random, Array, Dtype};
use specd_text::gguf::{ggml_type, GgufArray, GgufValue, GgufWriter};
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
/// CPU in seconds), then the trunks of named models, each with the same
/// 32k vocabulary and byte-level tokenizer (files stay small; the trunk is
/// what a step costs): `1b` (Llama 3.2 1B: 1.04B parameters, the speed
/// figure on a GPU), `gemma2-2b` (Gemma 2 2B, head size 256: 2.1B),
/// `qwen2.5-1.5b` (Qwen 2.5 1.5B, 12 heads over 2 kv heads of 128),
/// `qwen3-1.7b` (Qwen 3 1.7B, 16 heads over 8 of 128) and `phi3-mini-8l`
/// (Phi-3 mini's width, 32 heads and 32 kv heads of 96, with 8 of its 32
/// layers). The dims are the models' config.json values.
pub const SHAPES: [Shape; 7] = [
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
    Shape {
        name: "gemma2-2b",
        hidden: 2304,
        layers: 26,
        heads: 8,
        kv_heads: 4,
        head_dim: 256,
        ffn: 9216,
        vocab: 32768,
    },
    Shape {
        name: "qwen2.5-1.5b",
        hidden: 1536,
        layers: 28,
        heads: 12,
        kv_heads: 2,
        head_dim: 128,
        ffn: 8960,
        vocab: 32768,
    },
    Shape {
        name: "qwen3-1.7b",
        hidden: 2048,
        layers: 28,
        heads: 16,
        kv_heads: 8,
        head_dim: 128,
        ffn: 6144,
        vocab: 32768,
    },
    Shape {
        name: "phi3-mini-8l",
        hidden: 3072,
        layers: 8,
        heads: 32,
        kv_heads: 32,
        head_dim: 96,
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

/// The architecture of a random checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Llama,
    /// Llama with Llama 3.2's rope scaling (`rope_scaling: llama3`; in a
    /// GGUF, `rope_freqs.weight`).
    Llama3,
    /// Biases on q, k and v.
    Qwen2,
    /// RMS norms over each q and k head.
    Qwen3,
    /// Gemma 3: q/k norms, post-norms, GeGLU, local and global layers.
    Gemma3,
    /// Gemma 2: post-norms, GeGLU, soft-capped attention and logits, a
    /// window of 4096 on the even layers.
    Gemma2,
    /// Phi-3 (mini 4k): fused q/k/v and gate/up tensors, a window of 2047
    /// on every layer, an untied head.
    Phi3,
    /// Phi-3 with Phi-3.5's `longrope` scaling, over an original context of
    /// [`SCALED_ORIGINAL`] (GGUF: `rope_factors_long`/`_short`).
    Phi35,
    /// Phi-4-mini's rope: `longrope` over 3/4 of each head
    /// (`partial_rotary_factor` 0.75), no window.
    Phi4Mini,
    /// Qwen2 with Qwen 2.5's long-context `yarn` scaling (factor 4 over
    /// [`SCALED_ORIGINAL`]).
    Qwen2Yarn,
    /// Granite 3: llama with embedding, attention and residual
    /// multipliers and a logits scaling ([`GRANITE_SCALES`]).
    Granite,
    /// SmolLM3: llama whose every 4th layer attends without rope.
    SmolLm3,
    /// OLMo 2: norms after attention and the MLP (none before), q/k norms
    /// over the whole projection, an untied head.
    Olmo2,
}

/// Granite 3 2B's multipliers: embedding 12, attention 1/64 (its head
/// size), residual 0.22, logits divided by 8.
const GRANITE_SCALES: (f32, f32, f32, f32) = (12.0, 0.015625, 0.22, 8.0);

pub const FAMILIES: [(&str, Family); 13] = [
    ("llama", Family::Llama),
    ("llama3", Family::Llama3),
    ("qwen2", Family::Qwen2),
    ("qwen3", Family::Qwen3),
    ("phi3", Family::Phi3),
    ("gemma3", Family::Gemma3),
    ("gemma2", Family::Gemma2),
    ("phi3.5", Family::Phi35),
    ("phi4-mini", Family::Phi4Mini),
    ("qwen2-yarn", Family::Qwen2Yarn),
    ("granite", Family::Granite),
    ("smollm3", Family::SmolLm3),
    ("olmo2", Family::Olmo2),
];

/// The original context of the random long-context ropes: short, so the
/// scaling bites at positions a tiny test reaches.
pub const SCALED_ORIGINAL: usize = 32;

impl Family {
    pub fn named(name: &str) -> Result<Family> {
        match FAMILIES.iter().find(|f| f.0 == name) {
            Some(f) => Ok(f.1),
            None => bail!(
                "unknown architecture {name:?} (use {})",
                FAMILIES.map(|f| f.0).join(", ")
            ),
        }
    }

    pub fn name(self) -> &'static str {
        FAMILIES.iter().find(|f| f.1 == self).expect("listed").0
    }

    /// The family whose tensors and options this one has (the
    /// long-context ropes change only the rope).
    fn trunk(self) -> Family {
        match self {
            Family::Phi35 | Family::Phi4Mini => Family::Phi3,
            Family::Qwen2Yarn => Family::Qwen2,
            Family::Granite | Family::SmolLm3 => Family::Llama,
            f => f,
        }
    }

    /// Rotated values per head of `head_dim`.
    fn rope_dims(self, head_dim: usize) -> usize {
        match self {
            Family::Phi4Mini => head_dim * 3 / 4,
            _ => head_dim,
        }
    }

    /// Longrope's (short, long) factors for `dims` rotated values: short
    /// ones near 1, long ones up to 8.
    fn longrope(self, dims: usize) -> Option<(Vec<f32>, Vec<f32>)> {
        let n = dims / 2;
        let lists = (
            (0..n).map(|i| 1.0 + 0.1 * i as f32 / n as f32).collect(),
            (0..n).map(|i| 1.0 + 7.0 * i as f32 / n as f32).collect(),
        );
        matches!(self, Family::Phi35 | Family::Phi4Mini).then_some(lists)
    }

    /// The GGUF `general.architecture`.
    fn gguf_arch(self) -> &'static str {
        if self == Family::Granite {
            return "granite";
        }
        if self == Family::SmolLm3 {
            return "smollm3";
        }
        match self.trunk() {
            Family::Llama | Family::Llama3 => "llama",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Phi3 => "phi3",
            Family::Gemma3 => "gemma3",
            Family::Gemma2 => "gemma2",
            Family::Olmo2 => "olmo2",
            Family::Phi35
            | Family::Phi4Mini
            | Family::Qwen2Yarn
            | Family::Granite
            | Family::SmolLm3 => {
                unreachable!("not a trunk")
            }
        }
    }

    fn rope_theta(self) -> f32 {
        match self.trunk() {
            Family::Llama | Family::Phi3 | Family::Gemma2 => 10000.0,
            Family::Llama3 => 500000.0,
            _ => 1_000_000.0,
        }
    }
}

/// Gemma 2's window (on the even layers) and its attention and final logit
/// soft-caps, as its configs state them.
const GEMMA2_WINDOW: usize = 4096;
const GEMMA2_CAPS: (f32, f32) = (50.0, 30.0);

/// Llama 3.2's rope scaling: factor, low and high frequency factors, the
/// original context.
const LLAMA3_SCALING: (f64, f64, f64, f64) = (32.0, 1.0, 4.0, 8192.0);

/// What a tensor of a random checkpoint holds.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// Uniform in +-sqrt(3 / fan_in), `[out, inp]`.
    Weight,
    /// The embedding: a weight whose special tokens' rows are shrunk.
    Embedding,
    /// A norm's scale, every value the same.
    Norm(f32),
    /// Small uniform values, `[out]`.
    Bias,
}

/// One tensor: its names in each layout, shape and contents.
struct Part {
    hf: String,
    gguf: String,
    out: usize,
    inp: usize,
    kind: Kind,
}

/// The tensors of a `family` checkpoint of `shape`, in the order their
/// random values are drawn (llama's order is the one the first random
/// checkpoints had, so their weights stay as they were).
fn parts(shape: Shape, family: Family) -> Vec<Part> {
    let family = family.trunk();
    let (d, hd) = (shape.hidden, shape.head_dim);
    let (q, kv) = (shape.heads * hd, shape.kv_heads * hd);
    let mut v = Vec::new();
    let mut push = |hf: String, gguf: String, out: usize, inp: usize, kind: Kind| {
        v.push(Part {
            hf,
            gguf,
            out,
            inp,
            kind,
        })
    };
    push(
        "model.embed_tokens".into(),
        "token_embd".into(),
        shape.vocab,
        d,
        Kind::Embedding,
    );
    let gemma = matches!(family, Family::Gemma3 | Family::Gemma2);
    let linears = match family {
        // Phi-3's fused tensors (GGUF: `ffn_up` holds the gate, then up).
        Family::Phi3 => vec![
            ("self_attn.qkv_proj", "attn_qkv", q + 2 * kv, d),
            ("self_attn.o_proj", "attn_output", d, q),
            ("mlp.gate_up_proj", "ffn_up", 2 * shape.ffn, d),
            ("mlp.down_proj", "ffn_down", d, shape.ffn),
        ],
        _ => vec![
            ("self_attn.q_proj", "attn_q", q, d),
            ("self_attn.k_proj", "attn_k", kv, d),
            ("self_attn.v_proj", "attn_v", kv, d),
            ("self_attn.o_proj", "attn_output", d, q),
            ("mlp.gate_proj", "ffn_gate", shape.ffn, d),
            ("mlp.up_proj", "ffn_up", shape.ffn, d),
            ("mlp.down_proj", "ffn_down", d, shape.ffn),
        ],
    };
    for i in 0..shape.layers {
        let (h, g) = (format!("model.layers.{i}"), format!("blk.{i}"));
        for &(hn, gn, out, inp) in &linears {
            push(
                format!("{h}.{hn}"),
                format!("{g}.{gn}"),
                out,
                inp,
                Kind::Weight,
            );
        }
        if family == Family::Qwen2 {
            for (hn, gn, out) in [
                ("self_attn.q_proj", "attn_q", q),
                ("self_attn.k_proj", "attn_k", kv),
                ("self_attn.v_proj", "attn_v", kv),
            ] {
                push(
                    format!("{h}.{hn}.bias"),
                    format!("{g}.{gn}.bias"),
                    out,
                    0,
                    Kind::Bias,
                );
            }
        }
        let mut norms = vec![("input_layernorm", "attn_norm", d)];
        if family == Family::Olmo2 {
            // Its only norms: after attention and the MLP, and over the
            // whole q and k projections.
            norms = vec![
                ("post_attention_layernorm", "post_attention_norm", d),
                ("post_feedforward_layernorm", "post_ffw_norm", d),
                ("self_attn.q_norm", "attn_q_norm", q),
                ("self_attn.k_norm", "attn_k_norm", kv),
            ];
        } else if gemma {
            norms.extend([
                ("post_attention_layernorm", "post_attention_norm", d),
                ("pre_feedforward_layernorm", "ffn_norm", d),
                ("post_feedforward_layernorm", "post_ffw_norm", d),
            ]);
        } else {
            norms.push(("post_attention_layernorm", "ffn_norm", d));
        }
        if matches!(family, Family::Qwen3 | Family::Gemma3) {
            norms.extend([
                ("self_attn.q_norm", "attn_q_norm", hd),
                ("self_attn.k_norm", "attn_k_norm", hd),
            ]);
        }
        for (hn, gn, n) in norms {
            push(
                format!("{h}.{hn}"),
                format!("{g}.{gn}"),
                n,
                0,
                Kind::Norm(1.0),
            );
        }
    }
    // Logits over whole units.
    push(
        "model.norm".into(),
        "output_norm".into(),
        d,
        0,
        Kind::Norm(12.0),
    );
    // llama.cpp's Phi-3 graph reads an `output` tensor of its own; OLMo
    // 2's head is untied as its checkpoints' are.
    if matches!(family, Family::Phi3 | Family::Olmo2) {
        push(
            "lm_head".into(),
            "output".into(),
            shape.vocab,
            d,
            Kind::Embedding,
        );
    }
    v
}

/// Draws the random values of the tensors in order, from `seed`.
struct Draw {
    seed: u64,
    i: u64,
}

impl Draw {
    fn key(&mut self) -> Result<Array> {
        self.i += 1;
        Ok(random::key(
            self.seed.wrapping_mul(1_000_003).wrapping_add(self.i),
        )?)
    }

    fn uniform(&mut self, shape: &[i32], a: f32) -> Result<Array> {
        let u = random::uniform(shape, &self.key()?)?;
        // [0, 1) -> [-a, a)
        Ok(ops::multiply(
            &ops::subtract(&u, &Array::scalar(0.5)?)?,
            &Array::scalar(2.0 * a)?,
        )?)
    }

    /// The float32 values of `p` (a norm: its scale, whatever the layout
    /// stores).
    fn values(&mut self, p: &Part) -> Result<Array> {
        let a = (3.0 / p.inp.max(1) as f32).sqrt();
        Ok(match p.kind {
            Kind::Weight => self.uniform(&[p.out as i32, p.inp as i32], a)?,
            Kind::Embedding => {
                // Special tokens' rows shrunk: they never win.
                let mut rows = vec![1.0f32; p.out];
                for r in rows.iter_mut().skip(p.out - SPECIALS.len()) {
                    *r = 0.05;
                }
                let w = self.uniform(&[p.out as i32, p.inp as i32], a)?;
                ops::multiply(&w, &Array::from_f32(&rows, &[p.out as i32, 1])?)?
            }
            Kind::Norm(s) => Array::from_f32(&vec![s; p.out], &[p.out as i32])?,
            Kind::Bias => self.uniform(&[p.out as i32], 0.5)?,
        })
    }
}

/// Writes the random llama checkpoint of `shape` into `dir`.
pub fn write(shape: Shape, seed: u64, dir: &Path) -> Result<()> {
    write_hf(shape, Family::Llama, seed, dir)
}

/// Writes a random `family` checkpoint of `shape` at `out`: a GGUF file
/// where `gguf`, else an HF directory.
pub fn write_model(shape: Shape, family: Family, seed: u64, out: &Path, gguf: bool) -> Result<()> {
    let divides = matches!(family.trunk(), Family::Qwen2 | Family::Phi3);
    if divides && shape.heads * shape.head_dim != shape.hidden {
        bail!(
            "{}'s head size is hidden / heads; shape {} differs",
            family.name(),
            shape.name
        );
    }
    match gguf {
        true => write_gguf(shape, family, seed, out),
        false => write_hf(shape, family, seed, out),
    }
}

/// The HF directory: 4-bit weights (MLX's groups of 64), float norms and
/// biases, config.json, a byte-level tokenizer.
fn write_hf(shape: Shape, family: Family, seed: u64, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut tensors: Vec<(String, Array)> = Vec::new();
    let mut draw = Draw { seed, i: 0 };
    for p in parts(shape, family) {
        let x = draw.values(&p)?;
        match p.kind {
            Kind::Weight | Kind::Embedding => quantized(&p.hf, x, &mut tensors)?,
            // Gemma's HF norms hold w for a scale of 1 + w.
            Kind::Norm(_) if matches!(family, Family::Gemma3 | Family::Gemma2) => {
                let w = ops::subtract(&x, &Array::scalar(1.0)?)?;
                tensors.push((format!("{}.weight", p.hf), w));
            }
            Kind::Norm(_) => tensors.push((format!("{}.weight", p.hf), x)),
            Kind::Bias => tensors.push((p.hf, x)),
        }
    }
    io::save_safetensors(
        &dir.join("model.safetensors"),
        &tensors,
        &[("format".into(), "mlx".into())],
    )
    .context("writing model.safetensors")?;
    let config = hf_config(shape, family, seed);
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&config)?,
    )?;
    write_tokenizer(dir, shape.vocab)
}

/// config.json of a random checkpoint, as the family's HF configs (and
/// mlx-lm's model classes) state it.
fn hf_config(shape: Shape, family: Family, seed: u64) -> serde_json::Value {
    let eos = (shape.vocab - 1) as u32;
    let mut config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape.hidden,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "intermediate_size": shape.ffn,
        "vocab_size": shape.vocab,
        "rms_norm_eps": 1e-5,
        "rope_theta": family.rope_theta(),
        "max_position_embeddings": 4096,
        "tie_word_embeddings": true,
        "hidden_act": "silu",
        "attention_bias": false,
        "eos_token_id": eos,
        "quantization": {"group_size": GROUP, "bits": BITS},
        "specd_random": {"shape": shape.name, "arch": family.name(), "seed": seed,
            "parameters": shape.parameters()},
    });
    let (factor, low, high, original) = LLAMA3_SCALING;
    let extra = match family.trunk() {
        Family::Llama => serde_json::json!({}),
        Family::Llama3 => serde_json::json!({
            "max_position_embeddings": 131072,
            "rope_scaling": {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                "high_freq_factor": high, "original_max_position_embeddings": original},
        }),
        Family::Qwen2 => serde_json::json!({
            "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "rms_norm_eps": 1e-6,
            "sliding_window": 4096, "use_sliding_window": false,
        }),
        Family::Qwen3 => serde_json::json!({
            "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "rms_norm_eps": 1e-6,
        }),
        Family::Phi3 => serde_json::json!({
            "architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
            "tie_word_embeddings": false, "sliding_window": 2047,
            "original_max_position_embeddings": 4096, "rope_scaling": null,
        }),
        Family::Gemma3 => serde_json::json!({
            "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
            "rms_norm_eps": 1e-6, "hidden_activation": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": shape.head_dim, "rope_local_base_freq": 10000.0,
            "sliding_window": 512, "sliding_window_pattern": 6, "rope_scaling": null,
        }),
        Family::Olmo2 => serde_json::json!({
            "architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2", "rms_norm_eps": 1e-6,
            "tie_word_embeddings": false,
        }),
        Family::Gemma2 => serde_json::json!({
            "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
            "rms_norm_eps": 1e-6, "hidden_activation": "gelu_pytorch_tanh",
            "hidden_act": "gelu_pytorch_tanh", "query_pre_attn_scalar": shape.head_dim,
            "sliding_window": GEMMA2_WINDOW, "attn_logit_softcapping": GEMMA2_CAPS.0,
            "final_logit_softcapping": GEMMA2_CAPS.1, "rope_scaling": null,
        }),
        Family::Phi35
        | Family::Phi4Mini
        | Family::Qwen2Yarn
        | Family::Granite
        | Family::SmolLm3 => {
            unreachable!("not a trunk")
        }
    };
    if let (Some(c), Some(e)) = (config.as_object_mut(), extra.as_object()) {
        c.extend(e.clone());
    }
    let dims = family.rope_dims(shape.head_dim);
    let scaled = match (family, family.longrope(dims)) {
        (_, Some((short, long))) => serde_json::json!({
            "original_max_position_embeddings": SCALED_ORIGINAL,
            "rope_scaling": {"type": "longrope", "short_factor": short, "long_factor": long},
        }),
        (Family::Qwen2Yarn, _) => serde_json::json!({
            "rope_scaling": {"type": "yarn", "factor": 4.0,
                "original_max_position_embeddings": SCALED_ORIGINAL},
        }),
        _ => serde_json::json!({}),
    };
    if let (Some(c), Some(e)) = (config.as_object_mut(), scaled.as_object()) {
        c.extend(e.clone());
    }
    if family == Family::Phi4Mini {
        config["partial_rotary_factor"] = serde_json::json!(0.75);
        config["sliding_window"] = serde_json::Value::Null;
    }
    if family == Family::Granite {
        let (e, a, r, l) = GRANITE_SCALES;
        let g = serde_json::json!({"architectures": ["GraniteForCausalLM"],
            "model_type": "granite", "embedding_multiplier": e, "attention_multiplier": a,
            "residual_multiplier": r, "logits_scaling": l, "mlp_bias": false});
        if let (Some(c), Some(g)) = (config.as_object_mut(), g.as_object()) {
            c.extend(g.clone());
        }
    }
    if family == Family::SmolLm3 {
        // mlx-lm's smollm3.py: 1 ropes, 0 does not; every 4th layer is
        // NoPE, as llama.cpp assumes for a GGUF.
        let n = config["num_hidden_layers"].as_u64().unwrap_or(0);
        let nope: Vec<u64> = (0..n).map(|i| u64::from((i + 1) % 4 != 0)).collect();
        config["architectures"] = serde_json::json!(["SmolLM3ForCausalLM"]);
        config["model_type"] = serde_json::json!("smollm3");
        config["no_rope_layers"] = serde_json::json!(nope);
    }
    config
}

/// The GGUF file: llama.cpp's tensor names and metadata, Q4_1 weights, a
/// Q8_0 embedding (tied head), float32 norms and biases, the tokenizer.
fn write_gguf(shape: Shape, family: Family, seed: u64, path: &Path) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let parts = parts(shape, family);
    let ty = |p: &Part| match p.kind {
        Kind::Embedding => ggml_type::Q8_0,
        Kind::Weight if p.inp.is_multiple_of(32) => ggml_type::Q4_1,
        _ => ggml_type::F32,
    };
    let name = |p: &Part| match p.kind {
        Kind::Bias => p.gguf.clone(),
        _ => format!("{}.weight", p.gguf),
    };
    let dims = |p: &Part| match p.inp {
        0 => vec![p.out as u64],
        inp => vec![inp as u64, p.out as u64],
    };
    let rope_freqs = (family == Family::Llama3).then(|| {
        let (factor, low, high, original) = LLAMA3_SCALING;
        let base = family.rope_theta();
        crate::llama::rope::llama3(factor, low, high, original, shape.head_dim, base)
    });
    // Llama 3's factors, or longrope's two lists.
    let mut factors: Vec<(&str, Vec<f32>)> = rope_freqs
        .into_iter()
        .map(|f| ("rope_freqs.weight", f))
        .collect();
    if let Some((short, long)) = family.longrope(family.rope_dims(shape.head_dim)) {
        factors.push(("rope_factors_long.weight", long));
        factors.push(("rope_factors_short.weight", short));
    }
    let mut table: Vec<(String, Vec<u64>, u32)> =
        parts.iter().map(|p| (name(p), dims(p), ty(p))).collect();
    for (n, f) in &factors {
        table.push((n.to_string(), vec![f.len() as u64], ggml_type::F32));
    }
    let mut w = GgufWriter::create(path, &gguf_metadata(shape, family, seed), table)?;
    let mut draw = Draw { seed, i: 0 };
    for p in &parts {
        let x = draw.values(p)?.to_vec_f32()?;
        let bytes = match ty(p) {
            ggml_type::Q8_0 => ggml::encode_q8_0(&x),
            ggml_type::Q4_1 => ggml::encode_q4_1(&x),
            _ => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        };
        w.tensor(&name(p), &bytes)?;
    }
    for (n, f) in &factors {
        let bytes: Vec<u8> = f.iter().flat_map(|v| v.to_le_bytes()).collect();
        w.tensor(n, &bytes)?;
    }
    w.finish()
}

/// A random GGUF's metadata: the architecture's keys as llama.cpp's
/// converter writes them, and the byte-level tokenizer.
fn gguf_metadata(shape: Shape, family: Family, seed: u64) -> Vec<(String, GgufValue)> {
    let a = family.gguf_arch();
    let u = |x: usize| GgufValue::U32(x as u32);
    let s = |x: &str| GgufValue::String(x.into());
    let mut kv: Vec<(String, GgufValue)> = vec![
        ("general.architecture".into(), s(a)),
        (
            "general.name".into(),
            // Not the architecture's name: llama.cpp's vocabulary loader
            // looks up Phi-3's own tokens (`</s>`, `<unk>`) in a model
            // whose name says phi3 or phi-3, and fails on ours; so the
            // shape `phi3-mini-8l` is named `phi 3-mini-8l` here.
            s(&format!(
                "specd random {} seed {seed}",
                shape.name.replace("phi3", "phi 3")
            )),
        ),
        ("general.file_type".into(), GgufValue::U32(3)), // mostly Q4_1
    ];
    let eps = if family == Family::Llama { 1e-5 } else { 1e-6 };
    let mut arch_kv = vec![
        ("context_length", u(4096)),
        ("embedding_length", u(shape.hidden)),
        ("block_count", u(shape.layers)),
        ("feed_forward_length", u(shape.ffn)),
        ("attention.head_count", u(shape.heads)),
        ("attention.head_count_kv", u(shape.kv_heads)),
        ("attention.layer_norm_rms_epsilon", GgufValue::F32(eps)),
        ("rope.freq_base", GgufValue::F32(family.rope_theta())),
        ("rope.dimension_count", u(family.rope_dims(shape.head_dim))),
        ("attention.key_length", u(shape.head_dim)),
        ("attention.value_length", u(shape.head_dim)),
        ("vocab_size", u(shape.vocab)),
    ];
    match family {
        Family::Gemma3 => arch_kv.push(("attention.sliding_window", u(512))),
        Family::Gemma2 => arch_kv.extend([
            ("attention.sliding_window", u(GEMMA2_WINDOW)),
            ("attn_logit_softcapping", GgufValue::F32(GEMMA2_CAPS.0)),
            ("final_logit_softcapping", GgufValue::F32(GEMMA2_CAPS.1)),
        ]),
        // llama.cpp's converter writes Phi-4-mini's missing window as 0.
        Family::Phi4Mini => arch_kv.push(("attention.sliding_window", u(0))),
        Family::Phi3 | Family::Phi35 => arch_kv.push(("attention.sliding_window", u(2047))),
        _ => {}
    }
    // The long-context ropes as llama.cpp's converter writes them.
    let original = SCALED_ORIGINAL as f64;
    if family.longrope(2).is_some() {
        let attn = crate::llama::rope::longrope_attn_factor(4096, SCALED_ORIGINAL);
        arch_kv.push(("rope.scaling.attn_factor", GgufValue::F32(attn as f32)));
        arch_kv.push(("rope.scaling.original_context_length", u(SCALED_ORIGINAL)));
    }
    if family == Family::Granite {
        let (e, a, r, l) = GRANITE_SCALES;
        arch_kv.extend([
            ("embedding_scale", GgufValue::F32(e)),
            ("attention.scale", GgufValue::F32(a)),
            ("residual_scale", GgufValue::F32(r)),
            ("logit_scale", GgufValue::F32(l)),
        ]);
    }
    if family == Family::Qwen2Yarn {
        arch_kv.extend([
            ("rope.scaling.type", s("yarn")),
            ("rope.scaling.factor", GgufValue::F32(4.0)),
            ("rope.scaling.original_context_length", u(original as usize)),
        ]);
    }
    kv.extend(arch_kv.into_iter().map(|(k, v)| (format!("{a}.{k}"), v)));
    let tokens = vocabulary(shape.vocab);
    let plain = shape.vocab - SPECIALS.len();
    // llama.cpp's token types: 1 normal, 3 control.
    let types = (0..shape.vocab)
        .map(|i| if i < plain { 1 } else { 3 })
        .collect();
    kv.extend([
        ("tokenizer.ggml.model".into(), s("gpt2")),
        ("tokenizer.ggml.pre".into(), s("default")),
        (
            "tokenizer.ggml.tokens".into(),
            GgufValue::Array(GgufArray::String(tokens)),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            GgufValue::Array(GgufArray::I32(types)),
        ),
        (
            "tokenizer.ggml.merges".into(),
            GgufValue::Array(GgufArray::String(vec![])),
        ),
        ("tokenizer.ggml.eos_token_id".into(), u(shape.vocab - 1)),
        ("tokenizer.ggml.padding_token_id".into(), u(plain)),
        (
            "tokenizer.ggml.add_bos_token".into(),
            GgufValue::Bool(false),
        ),
        (
            "tokenizer.chat_template".into(),
            s(specd_text::CHATML_TEMPLATE),
        ),
    ]);
    kv
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

/// The tokens of a byte-level BPE with no merges: the 256 byte tokens,
/// then as many two-byte tokens as the vocabulary has room for
/// (decodable, never produced by encoding), then the special tokens.
fn vocabulary(vocab: usize) -> Vec<String> {
    let bytes = specd_text::tokenizer::bytes_to_unicode();
    let plain = vocab - SPECIALS.len();
    let singles = bytes.iter().map(|b| b.to_string());
    let pairs = bytes
        .iter()
        .flat_map(|a| bytes.iter().map(move |b| format!("{a}{b}")));
    singles
        .chain(pairs)
        .take(plain)
        .chain(SPECIALS.iter().map(|s| s.to_string()))
        .collect()
}

/// [`vocabulary`] as tokenizer.json, ChatML's template.
fn write_tokenizer(dir: &Path, vocab: usize) -> Result<()> {
    let plain = vocab - SPECIALS.len();
    let tokens = vocabulary(vocab);
    let entries: serde_json::Map<String, serde_json::Value> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i.into()))
        .collect();
    let added: Vec<serde_json::Value> = SPECIALS
        .iter()
        .enumerate()
        .map(|(i, t)| {
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
