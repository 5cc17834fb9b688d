//! `specd debug`: hidden commands that dump numbers for the end-to-end tests
//! (tests/py/test_foundation.py) and for debugging a model by hand.
//!
//! - `specd debug logits [--model M] [--chat] [--ids 1,2,3] --json OUT [PROMPT]`
//!   writes `{"prompt_ids": [...], "logits": [...]}`: the float32 logits of
//!   the last prompt position, i.e. the first generated position; with
//!   `--all`, `[[...], ...]`: every prompt position's, from one forward.
//! - `specd debug generate [--model M] [--chat] [--max-tokens N] --json OUT PROMPT`
//!   greedy decoding without speculation; writes the prompt ids, the
//!   generated ids (end of generation included when reached) and the text.
//! - `specd debug tokenize [--model M] --input TEXTS.json --json OUT`: the
//!   prompt token ids (BOS as the model adds it) of each text, loading only
//!   the tokenizer.
//! - `specd debug mtp [--model M] [--head DIR] --ids 1,2,3 [--logits] --json OUT`
//!   an MTP head's first-step rows over the ids (the target's features
//!   from one forward): `{"argmax": [...]}` (target ids), with `--logits`
//!   every row's logits over the draft vocabulary too.
//! - `specd debug random-model [--arch llama|llama3|qwen2|qwen3|phi3|gemma3|gemma2|...]
//!   [--shape tiny|small|1b|gemma2-2b|qwen2.5-1.5b|qwen3-1.7b|phi3-mini-8l] [--seed N]
//!   [--gguf] --out PATH` writes a
//!   random-weight checkpoint of that architecture (`model::random`): a
//!   4-bit HF directory, or with `--gguf` a GGUF file as llama.cpp's
//!   converter names it (Q4_1, Q8_0 embedding).
//! - `specd debug weights --gguf FILE --tensor NAME --out OUT [--rows N]`
//!   loads one tensor the way the model loader does (decoded, packed for
//!   the kernels) and writes the weights the kernels run on, read back from
//!   the packed layout, as little-endian float32 `[rows, cols]`.
use super::generate::{load_engine, prompt_of, SpecArgs};
use super::Load;
use super::ModelArg;
use crate::engine::Engine;
use crate::model::llama::{self, Outputs, Seq};
use crate::model::Logits;
use crate::sampling::SamplingParams;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use std::path::{Path, PathBuf};

#[derive(Subcommand)]
pub enum DebugCmd {
    /// Last-position logits of a prompt, as JSON.
    Logits(LogitsArgs),
    /// Greedy token ids (no speculation), as JSON.
    Generate(GenIdsArgs),
    /// One GGUF tensor as the kernels hold it, read back as float32.
    Weights(WeightsArgs),
    /// Token ids of texts (a JSON list of strings), as the model's prompt
    /// encoding makes them; writes a JSON list of id lists.
    Tokenize(TokenizeArgs),
    /// Writes a random-weight checkpoint of an architecture and a named
    /// shape (4-bit HF directory, or a Q4_1 GGUF).
    RandomModel(RandomModelArgs),
    /// An MTP head's first-step rows over token ids: per position i, its
    /// logits argmax (a target token id) reading the target's feature f_i
    /// and x_{i+1}, as JSON.
    Mtp(MtpArgs),
}

#[derive(Args)]
pub struct MtpArgs {
    #[command(flatten)]
    model: ModelArg,
    /// The head directory; without it, the model's shipped head.
    #[arg(long)]
    head: Option<PathBuf>,
    /// Comma-separated token ids (at least two).
    #[arg(long, value_delimiter = ',', required = true)]
    ids: Vec<u32>,
    /// Also write every row's logits (over the draft vocabulary).
    #[arg(long)]
    logits: bool,
    #[arg(long)]
    json: PathBuf,
}

#[derive(Args)]
pub struct RandomModelArgs {
    /// `llama`, `llama3` (Llama 3.2's rope scaling), `qwen2`, `qwen3`, `phi3`,
    /// `gemma3`, `gemma2`, `phi3.5`, `phi4-mini`, `qwen2-yarn`, `granite`,
    /// `smollm3` or `olmo2`.
    #[arg(long, default_value = "llama")]
    arch: String,
    /// `tiny`, `small`, `1b`, `gemma2-2b`, `qwen2.5-1.5b`, `qwen3-1.7b` or
    /// `phi3-mini-8l` (host/model/src/random.rs).
    #[arg(long, default_value = "tiny")]
    shape: String,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write a GGUF file (Q4_1 weights, Q8_0 embedding) instead of a
    /// 4-bit HF directory.
    #[arg(long)]
    gguf: bool,
    /// The directory (config.json, model.safetensors, tokenizer) or, with
    /// `--gguf`, the file to write.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
pub struct TokenizeArgs {
    #[command(flatten)]
    model: ModelArg,
    /// A JSON file holding a list of strings.
    #[arg(long)]
    input: PathBuf,
    #[arg(long)]
    json: PathBuf,
}

#[derive(Args)]
pub struct WeightsArgs {
    /// The GGUF file.
    #[arg(long)]
    gguf: PathBuf,
    /// The tensor's name, e.g. `blk.0.ffn_down.weight`.
    #[arg(long)]
    tensor: String,
    /// Only the first N rows.
    #[arg(long)]
    rows: Option<usize>,
    /// Where to write the float32 values.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
pub struct LogitsArgs {
    #[command(flatten)]
    model: ModelArg,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// Comma-separated prompt token ids instead of PROMPT.
    #[arg(long, value_delimiter = ',')]
    ids: Option<Vec<u32>>,
    /// Every position's logits (one row per prompt token), not the last only.
    #[arg(long)]
    all: bool,
    /// Where to write the JSON.
    #[arg(long)]
    json: PathBuf,
    prompt: Option<String>,
}

#[derive(Args)]
pub struct GenIdsArgs {
    #[command(flatten)]
    model: ModelArg,
    #[arg(long)]
    chat: bool,
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    #[arg(long)]
    json: PathBuf,
    prompt: String,
}

fn engine(model: &str, load: Load) -> Result<Engine> {
    load_engine(model, &SpecArgs::default(), load)
}

fn write_json(path: &Path, v: &serde_json::Value) -> Result<()> {
    std::fs::write(path, serde_json::to_string(v)?)
        .with_context(|| format!("writing {}", path.display()))
}

pub fn run(cmd: DebugCmd, load: Load) -> Result<()> {
    match cmd {
        DebugCmd::Mtp(a) => mtp_rows(a, load),
        DebugCmd::Logits(a) => {
            let engine = engine(&a.model.model, load)?;
            let ids = match (&a.ids, &a.prompt) {
                (Some(ids), None) => ids.clone(),
                (None, Some(p)) => engine.encode(&prompt_of(a.chat, None, p))?,
                _ => bail!("give either PROMPT or --ids"),
            };
            if ids.is_empty() {
                bail!("the prompt is empty");
            }
            if ids.len() >= engine.context_length() {
                bail!(
                    "the prompt is {} tokens, over the model's context length of {} tokens",
                    ids.len(),
                    engine.context_length()
                );
            }
            let vocab = engine.model.config.vocab_size as u32;
            if let Some(bad) = ids.iter().find(|&&t| t >= vocab) {
                bail!("token id {bad} is outside the vocabulary ({vocab})");
            }
            let mut caches = engine.model.new_caches();
            let which = if a.all { Logits::All } else { Logits::Last };
            let m = &engine.model;
            let mut seq = [Seq {
                caches: &mut caches,
                rows: ids.len() as i32,
                logits: Some(which),
            }];
            let logits = m
                .forward(
                    &llama::ids(&ids)?,
                    m.layer_count(),
                    &mut seq,
                    &mut Outputs::none(),
                )?
                .logits()?;
            let logits = logits.as_type(specd_mlx::Dtype::Float32)?;
            logits.eval()?;
            let v = logits.to_vec_f32()?;
            let logits = match a.all {
                true => serde_json::json!(v.chunks(vocab as usize).collect::<Vec<_>>()),
                false => serde_json::json!(v),
            };
            write_json(
                &a.json,
                &serde_json::json!({ "prompt_ids": ids, "logits": logits }),
            )
        }
        DebugCmd::Tokenize(a) => {
            let path = crate::store::Store::default().resolve(&a.model.model, true)?;
            let format = crate::model::ModelFormat::detect(&path)?;
            let tok = crate::engine::load_tokenizer(&path, format)?;
            let text = std::fs::read_to_string(&a.input)
                .with_context(|| format!("reading {}", a.input.display()))?;
            let texts: Vec<String> = serde_json::from_str(&text)
                .with_context(|| format!("{} is not a JSON list of strings", a.input.display()))?;
            let ids = texts
                .iter()
                .map(|t| tok.encode_prompt(t))
                .collect::<Result<Vec<_>>>()?;
            write_json(&a.json, &serde_json::json!(ids))
        }
        DebugCmd::Weights(a) => {
            let (t, _) = crate::model::load::read_gguf(&a.gguf, load.weights)?;
            let base = a.tensor.strip_suffix(".weight").unwrap_or(&a.tensor);
            let lin = t.linear(base)?.pack(false)?;
            let [n, k] = lin.shape();
            let rows = a.rows.unwrap_or(n as usize).min(n as usize) as i32;
            let ids: Vec<u32> = (0..rows as u32).collect();
            let w = lin.rows(&specd_mlx::Array::from_u32(&ids, &[rows])?)?;
            let v = w.as_type(specd_mlx::Dtype::Float32)?.to_vec_f32()?;
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            std::fs::write(&a.out, bytes)
                .with_context(|| format!("writing {}", a.out.display()))?;
            let kind = match &lin {
                crate::model::Linear::Quantized(q) => format!(
                    "{}-bit, groups of {}, {} scales",
                    q.bits,
                    q.group_size,
                    if q.f32_scales { "float32" } else { "float16" }
                ),
                crate::model::Linear::Dense(_) => "float32".into(),
            };
            eprintln!("{}: {rows} of {n} rows of {k}, {kind}", a.tensor);
            Ok(())
        }
        DebugCmd::Generate(a) => {
            let engine = engine(&a.model.model, load)?;
            let prompt = engine.encode(&prompt_of(a.chat, None, &a.prompt))?;
            let params = SamplingParams {
                temperature: 0.0,
                ..Default::default()
            };
            let settings = engine.settings(params, Some(a.max_tokens), Vec::new());
            let mut text = String::new();
            let mut sink = |s: &str| {
                text.push_str(s);
                true
            };
            let fin = engine.generate(Some(""), &prompt, &settings, None, &mut sink)?;
            let generated = &fin.log[prompt.len()..];
            write_json(
                &a.json,
                &serde_json::json!({
                    "prompt_ids": prompt,
                    "generated_ids": generated,
                    "text": text,
                    "done_reason": fin.stats.done_reason.as_str(),
                    // Per generated token, the top-2 logit margin it was
                    // chosen at (a later run may differ where it is < 0.01).
                    "margins": fin.margins,
                }),
            )
        }
        DebugCmd::RandomModel(a) => {
            use crate::model::random;
            let shape = random::Shape::named(&a.shape)?;
            let family = random::Family::named(&a.arch)?;
            random::write_model(shape, family, a.seed, &a.out, a.gguf)?;
            eprintln!(
                "wrote a random {} {} ({:.2}M parameters, {}) to {}",
                shape.name,
                family.name(),
                shape.parameters() as f64 / 1e6,
                if a.gguf { "Q4_1 GGUF" } else { "4-bit" },
                a.out.display()
            );
            Ok(())
        }
    }
}

/// `specd debug mtp`: one target forward over the ids, then one head forward
/// over its rows (what a drafter's catch-up runs).
fn mtp_rows(a: MtpArgs, load: Load) -> Result<()> {
    let mut engine = engine(&a.model.model, load)?;
    if let Some(dir) = &a.head {
        engine.add_draft_head("debug", dir)?;
    }
    let key = if a.head.is_some() { "debug" } else { "" };
    let head = engine
        .heads
        .get(key)
        .context("the model has no shipped MTP head: pass --head DIR")?
        .clone();
    let ids = &a.ids;
    if ids.len() < 2 {
        bail!("give at least two token ids");
    }
    let m = &engine.model;
    let mut caches = m.new_caches();
    let context = &ids[..ids.len() - 1];
    let mut seq = [Seq {
        caches: &mut caches,
        rows: context.len() as i32,
        logits: None,
    }];
    let mut out = Outputs::tapped(head.taps());
    let x = m.embed(&llama::ids(context)?)?;
    let h = m.layers(m.layer_count(), x, &mut seq, &mut out)?;
    // What the head reads: the last layer's rows, or its taps side by side.
    let features = match head.taps() {
        [] => h,
        _ => out.taps.features()?,
    };
    let mut head_caches = head.new_caches();
    let rows = head.forward(&ids[1..], &features, &mut head_caches, Logits::All)?;
    let best = specd_mlx::ops::argmax(&rows.logits, -1, false)?.as_type(specd_mlx::Dtype::Int32)?;
    let logits = rows.logits.as_type(specd_mlx::Dtype::Float32)?;
    specd_mlx::eval(&[&best, &logits])?;
    let argmax: Vec<u32> = (best.to_vec_i32()?.into_iter())
        .map(|i| head.target_id(i as usize))
        .collect();
    let mut out = serde_json::json!({ "argmax": argmax });
    if a.logits {
        let v = logits.to_vec_f32()?;
        let n = logits.dim(1) as usize;
        out["logits"] = serde_json::json!(v.chunks(n).collect::<Vec<_>>());
    }
    write_json(&a.json, &out)
}
