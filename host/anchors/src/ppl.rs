//! `specd bench anchors --ppl FILE`: our perplexity over a text next to
//! llama.cpp's on the same GGUF and text, both with llama-perplexity's
//! protocol (ours: `specd bench ppl`; llama.cpp's: llama-cpp-python's
//! logits of every position, `scripts/anchors.py ppl`).
use crate::anchors::Options;
use crate::python::{ensure, script};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use specd::engine::Engine;
use specd::model::ModelFormat;
use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;

/// What the rows measure over.
pub struct PplOptions {
    pub file: PathBuf,
    pub ctx: usize,
    pub chunks: Option<usize>,
}

/// One engine's perplexity, or why it has none.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PplRow {
    pub engine: String,
    /// How it ran (ours: weights, kernels, KV; llama.cpp: its version).
    pub mode: String,
    pub perplexity: Option<f64>,
    pub stderr: Option<f64>,
    pub tokens_scored: Option<usize>,
    pub chunks: Option<usize>,
    pub seconds: Option<f64>,
    /// llama.cpp's token ids of the text are ours.
    pub same_tokens: Option<bool>,
    pub error: Option<String>,
}

#[derive(Deserialize)]
struct LlamaPpl {
    version: String,
    perplexity: f64,
    stderr: f64,
    tokens_scored: usize,
    chunks: usize,
    seconds: f64,
    same_tokens: bool,
    #[serde(default)]
    backend_note: Option<String>,
}

/// The rows of the engines `o.engines` names (ours, llama.cpp).
pub fn run(
    e: &Engine,
    o: &Options,
    p: &PplOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<PplRow>> {
    let want = |n: &str| o.engines.iter().any(|x| x == n);
    let mut rows = Vec::new();
    if want("ours") {
        let proto = specd_tools::ppl::Protocol {
            ctx: p.ctx,
            chunks: p.chunks,
            top_k: 1,
        };
        let r = specd_tools::ppl::run(e, &p.file, &proto, None, None, &mut |m| {
            progress(&format!("ours: {m}"))
        })?;
        rows.push(PplRow {
            engine: "ours".into(),
            mode: r.mode,
            perplexity: Some(r.perplexity),
            stderr: Some(r.perplexity_stderr),
            tokens_scored: Some(r.tokens_scored),
            chunks: Some(r.chunks),
            seconds: Some(r.seconds),
            same_tokens: None,
            error: None,
        });
    }
    if want("llama.cpp") {
        rows.push(match llama_cpp(e, o, p, progress) {
            Ok(r) => r,
            Err(err) => PplRow {
                engine: "llama.cpp".into(),
                mode: String::new(),
                perplexity: None,
                stderr: None,
                tokens_scored: None,
                chunks: None,
                seconds: None,
                same_tokens: None,
                error: Some(format!("{err:#}")),
            },
        });
    }
    Ok(rows)
}

fn llama_cpp(
    e: &Engine,
    o: &Options,
    p: &PplOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<PplRow> {
    anyhow::ensure!(
        e.format == ModelFormat::Gguf,
        "llama.cpp reads GGUF files: {} is not one",
        e.path.display()
    );
    if let Err((err, hint)) = ensure(o, "llama.cpp", progress) {
        anyhow::bail!("{err} (install: {hint})");
    }
    let text = std::fs::read_to_string(&p.file)
        .with_context(|| format!("reading {}", p.file.display()))?;
    let cfg = serde_json::json!({
        "model": e.path.display().to_string(),
        "file": p.file.display().to_string(),
        "ctx": p.ctx,
        "chunks": p.chunks,
        "threads": o.threads,
        "tokens": e.tokenizer.encode_prompt(&text)?,
    });
    progress("llama.cpp: perplexity");
    let mut child = script(o, "llama.cpp", "ppl")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("running {}", o.python.display()))?;
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(cfg.to_string().as_bytes())
        .context("writing llama.cpp's config")?;
    let out = child.wait_with_output().context("waiting for llama.cpp")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .with_context(|| format!("llama.cpp gave no result ({})", out.status))?;
    let r: LlamaPpl = match serde_json::from_str(last) {
        Ok(r) if out.status.success() => r,
        _ => {
            let err: serde_json::Value = serde_json::from_str(last).unwrap_or_default();
            anyhow::bail!(
                "llama.cpp failed ({}): {}",
                out.status,
                err["error"].as_str().unwrap_or(last)
            )
        }
    };
    Ok(PplRow {
        engine: "llama.cpp".into(),
        mode: match r.backend_note {
            Some(n) => format!("llama-cpp-python {}, f16 KV; {n}", r.version),
            None => format!("llama-cpp-python {}, f16 KV", r.version),
        },
        perplexity: Some(r.perplexity),
        stderr: Some(r.stderr),
        tokens_scored: Some(r.tokens_scored),
        chunks: Some(r.chunks),
        seconds: Some(r.seconds),
        same_tokens: Some(r.same_tokens),
        error: None,
    })
}

/// The rows as a table, with our perplexity over llama.cpp's.
pub fn table(p: &PplOptions, rows: &[PplRow]) -> String {
    let mut s = format!(
        "perplexity over {} (llama-perplexity's protocol, chunks of {} tokens, second half scored)\n\n| engine | mode | perplexity | tokens scored | seconds |\n|---|---|---|---|---|\n",
        p.file.display(),
        p.ctx
    );
    for r in rows {
        match (&r.error, r.perplexity) {
            (None, Some(ppl)) => {
                s += &format!(
                    "| {} | {} | {:.4} +/- {:.4} | {} | {:.1} |\n",
                    r.engine,
                    r.mode,
                    ppl,
                    r.stderr.unwrap_or(0.0),
                    r.tokens_scored.unwrap_or(0),
                    r.seconds.unwrap_or(0.0)
                )
            }
            (err, _) => {
                s += &format!(
                    "| {} | could not run: {} | | | |\n",
                    r.engine,
                    err.as_deref().unwrap_or("no result")
                )
            }
        }
    }
    let ppl = |n: &str| {
        rows.iter()
            .find(|r| r.engine == n)
            .and_then(|r| r.perplexity)
    };
    if let (Some(a), Some(b)) = (ppl("ours"), ppl("llama.cpp")) {
        s += &format!("\nours / llama.cpp: {:.4}\n", a / b);
    }
    if let Some(false) = rows.iter().find_map(|r| r.same_tokens) {
        s += "note: llama.cpp's token ids of the text differ from ours\n";
    }
    s
}
