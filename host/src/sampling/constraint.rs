//! Structured output: constrained decoding against a JSON schema with
//! llguidance (the grammar engine llama.cpp, vLLM and SGLang use). It was
//! chosen because it computes a token mask from the tokenizer's trie in
//! microseconds, compiles JSON schemas itself, and can check a run of drafted
//! tokens and roll back, which speculation needs:
//!
//! - drafts that break the grammar are cut before verify
//!   ([`Constraint::valid_prefix`]);
//! - each verify row is masked with the grammar's state after the drafts
//!   before it, so the acceptance policy sees the masked target distribution
//!   ([`Constraint::mask_rows`]);
//! - plain decoding masks its one row the same way, so greedy constrained
//!   speculation is token-identical to greedy constrained plain decoding.
use anyhow::{anyhow, Context, Result};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use specd_text::Tokenizer;
use std::sync::Arc;

/// What the output must be.
#[derive(Debug, Clone, PartialEq)]
pub enum JsonFormat {
    /// Any JSON object (OpenAI `json_object`, Ollama `"json"`).
    Object,
    /// A value valid against this JSON schema.
    Schema(Value),
    /// Text of this Lark grammar (llguidance's dialect, JSON schemas inline
    /// as `%json {...}`): a forced tool call in the template's format.
    Grammar(String),
}

/// The grammar engine for one tokenizer: built once, shared by requests.
pub struct Grammars {
    factory: ParserFactory,
    eos: Vec<u32>,
}

impl Grammars {
    /// `vocab` is the model's (row) vocabulary size, which may exceed the
    /// tokenizer's.
    pub fn new(tok: &Tokenizer, vocab: usize) -> Result<Self> {
        let eos = *tok
            .eos_ids()
            .first()
            .ok_or_else(|| anyhow!("the tokenizer has no end-of-generation token"))?;
        let words: Vec<Vec<u8>> = (0..vocab as u32)
            .map(|id| {
                let b = tok.token_bytes(id);
                // Special and unused ids are marked so that no text matches them.
                if tok.is_special(id) || b.is_empty() {
                    let mut w = vec![0xff];
                    w.extend_from_slice(format!("<[{id}]>").as_bytes());
                    w
                } else {
                    b
                }
            })
            .collect();
        let info = TokRxInfo::new(vocab as u32, eos);
        let trie = TokTrie::from(&info, &words);
        let env: llguidance::toktrie::TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).context("building the grammar engine")?;
        // Its diagnostics go to our errors, not to stderr.
        factory.set_stderr_log_level(0);
        Ok(Grammars {
            factory,
            eos: tok.eos_ids(),
        })
    }

    /// A fresh constraint for one request.
    pub fn constraint(&self, format: &JsonFormat) -> Result<Constraint> {
        let (grammar, what) = match format {
            JsonFormat::Grammar(g) => (TopLevelGrammar::from_lark(g.clone()), "the tool grammar"),
            JsonFormat::Object | JsonFormat::Schema(_) => {
                let mut schema = match format {
                    JsonFormat::Schema(s) => s.clone(),
                    _ => serde_json::json!({"type": "object"}),
                };
                // Compact JSON: free whitespace lets a small model pad forever.
                if let Some(o) = schema.as_object_mut() {
                    o.entry("x-guidance")
                        .or_insert_with(|| serde_json::json!({"whitespace_flexible": false}));
                }
                (TopLevelGrammar::from_json_schema(schema), "the JSON schema")
            }
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| anyhow!("{what} is not usable: {e}"))?;
        let m = Matcher::new(Ok(parser));
        if let Some(e) = m.get_error() {
            return Err(anyhow!("{what} is not usable: {e}"));
        }
        Ok(Constraint {
            m,
            eos: self.eos.clone(),
        })
    }
}

/// One request's grammar state: it has consumed exactly the committed tokens.
pub struct Constraint {
    m: Matcher,
    eos: Vec<u32>,
}

/// A request's constraint as its sequence's settings carry it.
#[derive(Clone, Debug)]
pub struct SharedConstraint(pub Arc<std::sync::Mutex<Constraint>>);

impl SharedConstraint {
    pub fn new(c: Constraint) -> Self {
        SharedConstraint(Arc::new(std::sync::Mutex::new(c)))
    }
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Constraint> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Constraint")
    }
}

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("structured output: {e}")
}

impl Constraint {
    /// How many of `drafts` the grammar allows in a row from here.
    pub fn valid_prefix(&mut self, drafts: &[u32]) -> Result<usize> {
        if drafts.is_empty() || self.m.is_stopped() {
            return Ok(0);
        }
        let n = self.m.validate_tokens(drafts).map_err(err)?;
        // An end-of-generation token the grammar allows ends the request:
        // nothing after it can be committed.
        Ok(drafts[..n]
            .iter()
            .position(|t| self.eos.contains(t))
            .map_or(n, |i| i + 1))
    }

    /// Masks `rows[i]` (raw logits) with the grammar's state after
    /// `drafts[..i]`: disallowed tokens get -inf. `drafts` must be a valid
    /// prefix; the state is left as it was.
    pub fn mask_rows(&mut self, rows: &mut [Vec<f32>], drafts: &[u32]) -> Result<()> {
        let mut consumed = 0;
        for (i, row) in rows.iter_mut().enumerate() {
            let mask = self.m.compute_mask_or_eos().map_err(err)?;
            for (t, x) in row.iter_mut().enumerate() {
                if !mask.is_allowed(t as u32) {
                    *x = f32::NEG_INFINITY;
                }
            }
            // An end-of-generation draft (allowed once the grammar is
            // complete) is not fed: the matcher takes no token past its end.
            if let Some(&d) = drafts.get(i).filter(|d| !self.eos.contains(d)) {
                self.m.consume_token(d).map_err(err)?;
                consumed += 1;
            }
        }
        if consumed > 0 {
            self.m.rollback(consumed).map_err(err)?;
        }
        Ok(())
    }

    /// Advances past committed tokens (an end-of-generation token ends the
    /// request anyway and is not fed).
    pub fn commit(&mut self, tokens: &[u32]) -> Result<()> {
        for &t in tokens {
            if self.eos.contains(&t) || self.m.is_stopped() {
                break;
            }
            self.m.consume_token(t).map_err(err)?;
        }
        Ok(())
    }

    /// Whether the grammar is complete (only the end may follow).
    pub fn is_stopped(&self) -> bool {
        self.m.is_stopped()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn drafts_are_cut_where_the_grammar_breaks_and_rows_are_masked() {
        let p = crate::store::default_model().expect("the default model (specd pull)");
        let tok = Tokenizer::from_gguf_file(&p).unwrap();
        let vocab = tok.vocab_size();
        let g = Grammars::new(&tok, vocab).unwrap();
        let schema = json!({"type": "object", "properties": {"c": {"enum": ["red", "blue"]}},
                            "required": ["c"], "additionalProperties": false});
        let mut c = g.constraint(&JsonFormat::Schema(schema)).unwrap();
        let good = tok.encode(r#"{"c":"red"}"#, false).unwrap();
        assert_eq!(c.valid_prefix(&good).unwrap(), good.len());
        let bad = tok.encode(r#"{"c":"green"}"#, false).unwrap();
        let n = c.valid_prefix(&bad).unwrap();
        assert!(n < bad.len() && bad[..n] == good[..n], "{n}");
        // Row i is masked with the state after drafts[..i]; the state is kept.
        let mut rows = vec![vec![0.0f32; vocab]; 2];
        c.mask_rows(&mut rows, &good[..1]).unwrap();
        assert!(rows[0][good[0] as usize].is_finite());
        assert!(rows[1][good[1] as usize].is_finite());
        assert!(rows[0].iter().filter(|x| x.is_finite()).count() < vocab / 2);
        assert_eq!(c.valid_prefix(&good).unwrap(), good.len());
        // Committing the whole answer completes the grammar: only the end follows.
        c.commit(&good).unwrap();
        assert!(c.is_stopped());
        let mut row = vec![vec![0.0f32; vocab]];
        c.mask_rows(&mut row, &[]).unwrap();
        let allowed: Vec<usize> = (0..vocab).filter(|&i| row[0][i].is_finite()).collect();
        assert_eq!(allowed.len(), 1);
        assert!(tok.is_eos(allowed[0] as u32));
        assert!(g
            .constraint(&JsonFormat::Schema(json!({"type": "nonsense"})))
            .is_err());
        // A forced tool call: the tag, the call's JSON, the closing tag.
        let lark = "start: \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: %json {\"type\": \"object\", \"properties\": {\"name\": {\"const\": \"f\"}}, \"required\": [\"name\"], \"additionalProperties\": false, \"x-guidance\": {\"whitespace_flexible\": false}}\n";
        let mut c = g.constraint(&JsonFormat::Grammar(lark.into())).unwrap();
        let call = tok
            .encode("<tool_call>\n{\"name\":\"f\"}\n</tool_call>", false)
            .unwrap();
        assert_eq!(c.valid_prefix(&call).unwrap(), call.len());
        let wrong = tok.encode("<tool_call>\n{\"name\":\"g\"}", false).unwrap();
        assert!(c.valid_prefix(&wrong).unwrap() < wrong.len());
        // A draft that completes the call and then ends (as an n-gram
        // drafter copying the template's example does) is valid and masks.
        let eos = tok.eos_ids()[0];
        let mut with_end = call.clone();
        with_end.extend([eos, call[0]]);
        assert_eq!(c.valid_prefix(&with_end).unwrap(), call.len() + 1);
        let mut rows = vec![vec![0.0f32; vocab]; call.len() + 2];
        c.mask_rows(&mut rows, &with_end[..call.len() + 1]).unwrap();
        assert!(rows[call.len()][eos as usize].is_finite());
        c.commit(&call).unwrap();
        assert!(c.is_stopped());
    }
}
