//! `specd list`: the models specd can be pointed at by name — its own
//! store's, Ollama's and the Hugging Face cache's — each described from its
//! header ([`crate::model_files`]): architecture, quantization, size, and
//! whether specd runs it.
use crate::model_files::{describe, human_size};
use crate::store::{hf_cache::HfCache, ollama::OllamaStore, Store, KNOWN};
use anyhow::Result;
use serde_json::json;

/// One line of the listing.
struct Entry {
    name: String,
    source: &'static str,
    path: Option<std::path::PathBuf>,
    architecture: String,
    quantization: String,
    size: Option<u64>,
    /// `yes`, or why not.
    runs: String,
}

fn entry(name: String, source: &'static str, path: std::path::PathBuf) -> Entry {
    let d = describe(&path);
    Entry {
        name,
        source,
        architecture: d.architecture,
        quantization: d.quantization,
        size: Some(d.size),
        runs: match d.runs {
            Ok(()) => "yes".into(),
            Err(e) => format!("no: {e}"),
        },
        path: Some(path),
    }
}

fn missing(name: String, source: &'static str, why: String) -> Entry {
    Entry {
        name,
        source,
        path: None,
        architecture: "-".into(),
        quantization: "-".into(),
        size: None,
        runs: why,
    }
}

pub fn run(as_json: bool) -> Result<()> {
    let store = Store::default();
    let ollama = OllamaStore::from_env();
    let hf = HfCache::from_env();
    let mut all = Vec::new();
    for k in KNOWN {
        let p = store.path_of(k);
        all.push(if p.exists() {
            entry(k.name.into(), "specd", p)
        } else {
            missing(
                k.name.into(),
                "specd",
                format!("not pulled (specd pull {})", k.name),
            )
        });
    }
    for (name, m) in ollama.list() {
        all.push(match m {
            Ok(m) => entry(m.name, "ollama", m.blob),
            Err(e) => missing(name, "ollama", format!("no: {e:#}")),
        });
    }
    for m in hf.list() {
        all.push(entry(m.name, "hf", m.path));
    }
    if as_json {
        let v: Vec<_> = all
            .iter()
            .map(|e| {
                json!({
                    "name": e.name, "source": e.source, "path": e.path,
                    "architecture": e.architecture, "quantization": e.quantization,
                    "size": e.size, "runs": e.runs == "yes",
                    "why_not": (e.runs != "yes").then_some(&e.runs),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        let w = all.iter().map(|e| e.name.len()).max().unwrap_or(4).max(4);
        println!(
            "{:<w$}  {:<12} {:<10} {:>8}  RUNS",
            "NAME", "ARCH", "QUANT", "SIZE"
        );
        for e in &all {
            println!(
                "{:<w$}  {:<12} {:<10} {:>8}  {}",
                e.name,
                e.architecture,
                e.quantization,
                e.size.map_or("-".into(), human_size),
                e.runs
            );
        }
    }
    // Where it looked goes to stderr: stdout stays the listing.
    eprintln!(
        "looked in: specd's store {}; Ollama: {}; Hugging Face: {}",
        crate::store::home().join("models").display(),
        ollama.root.how(),
        hf.root.how()
    );
    Ok(())
}
