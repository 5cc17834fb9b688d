//! Loading the tokenizer from Hugging Face files: tokenizer.json alone, or a
//! model directory (tokenizer_config.json, chat templates, the eos ids of
//! config.json and generation_config.json).

use super::{push_new, Facts, Tokenizer};
use anyhow::{anyhow, Context, Result};
use serde_json::Value;
use std::path::Path;

fn json_token_str(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(|c| c.as_str()).map(String::from),
        _ => None,
    }
}

fn json_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64())
            .map(|x| x as u32)
            .collect(),
        _ => vec![],
    }
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    if !path.exists() {
        return Ok(None);
    }
    let s =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let v =
        serde_json::from_str(&s).with_context(|| format!("invalid JSON in {}", path.display()))?;
    Ok(Some(v))
}

impl Tokenizer {
    /// Load a tokenizer.json file alone (no config: no chat template, eos ids
    /// from the end-of-generation token names only).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Tokenizer> {
        let path = path.as_ref();
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| anyhow!("cannot load tokenizer {}: {e}", path.display()))?;
        Ok(Self::from_hf_parts(inner, None, None, None))
    }

    /// Load a Hugging Face model directory: tokenizer.json, and where present
    /// tokenizer_config.json (bos/eos/pad/unk tokens, chat_template,
    /// add_bos_token), chat_template.jinja, config.json and
    /// generation_config.json (eos_token_id, int or list).
    pub fn from_hf_dir(dir: impl AsRef<Path>) -> Result<Tokenizer> {
        let dir = dir.as_ref();
        let tj = dir.join("tokenizer.json");
        let inner = tokenizers::Tokenizer::from_file(&tj)
            .map_err(|e| anyhow!("cannot load tokenizer {}: {e}", tj.display()))?;
        let cfg = read_json(&dir.join("tokenizer_config.json"))?;
        let mut eos_extra = vec![];
        for f in ["generation_config.json", "config.json"] {
            if let Some(v) = read_json(&dir.join(f))? {
                push_new(&mut eos_extra, json_ids(v.get("eos_token_id")));
            }
        }
        let jinja = dir.join("chat_template.jinja");
        let template_file = if jinja.exists() {
            Some(
                std::fs::read_to_string(&jinja)
                    .with_context(|| format!("cannot read {}", jinja.display()))?,
            )
        } else {
            None
        };
        let mut t = Self::from_hf_parts(inner, cfg.as_ref(), Some(eos_extra), template_file);
        if t.facts.chat_template.is_none() {
            if let Some(v) = read_json(&dir.join("chat_template.json"))? {
                t.facts.chat_template = v
                    .get("chat_template")
                    .and_then(|c| c.as_str())
                    .map(String::from);
            }
        }
        Ok(t)
    }

    fn from_hf_parts(
        inner: tokenizers::Tokenizer,
        cfg: Option<&Value>,
        eos_extra: Option<Vec<u32>>,
        template_file: Option<String>,
    ) -> Tokenizer {
        let tok_id = |key: &str| -> Option<u32> {
            cfg.and_then(|c| c.get(key))
                .and_then(json_token_str)
                .and_then(|s| inner.token_to_id(&s))
        };
        let bos_id = tok_id("bos_token");
        let mut eos: Vec<u32> = tok_id("eos_token").into_iter().collect();
        push_new(&mut eos, eos_extra.unwrap_or_default());
        let pad_id = tok_id("pad_token");
        let unk_id = tok_id("unk_token");
        let chat_template = template_file.or_else(|| {
            match cfg.and_then(|c| c.get("chat_template")) {
                Some(Value::String(s)) => Some(s.clone()),
                // A list of named templates: take "default" (or the first).
                Some(Value::Array(a)) => a
                    .iter()
                    .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                    .or_else(|| a.first())
                    .and_then(|t| t.get("template"))
                    .and_then(|t| t.as_str())
                    .map(String::from),
                _ => None,
            }
        });
        let model_max_length = cfg
            .and_then(|c| c.get("model_max_length"))
            .and_then(|v| v.as_u64());
        // Whether the post-processor adds BOS/EOS is a fact of tokenizer.json.
        let probe = |add: bool| {
            inner
                .encode("a", add)
                .map(|e| e.get_ids().to_vec())
                .unwrap_or_default()
        };
        let (with, without) = (probe(true), probe(false));
        let add_bos = bos_id.is_some()
            && with.first() == bos_id.as_ref()
            && without.first() != bos_id.as_ref();
        let add_eos = with.len() > without.len() && with.last().is_some_and(|l| eos.contains(l));
        let facts = Facts {
            inner,
            bos_id,
            eos_ids: eos,
            pad_id,
            unk_id,
            add_bos,
            add_eos,
            chat_template,
            model_max_length,
        };
        Tokenizer::assemble(facts, None)
    }
}
