//! The checks a request passes before it is queued, as TGI's router
//! validates before its queue: the prompt encoded and held to the model's
//! context length and the server's `max_prompt_tokens`, its KV cache to the
//! server's budget, its output format compiled to a grammar. A request that
//! fails one is refused on the HTTP side (400); the model thread gets only
//! requests that passed, with their token ids and grammar, and only admits
//! them.
//!
//! What only the engine can resolve (a policy or draft model by name) is
//! still refused by the worker when it builds the request's speculation.
use super::config::ServerConfig;
use crate::engine::{Engine, Prompt};
use crate::request::ValidatedRequest;
use crate::sampling::{Constraint, Grammars};
use crate::scheduler::KvRates;
use specd_text::{ChatTemplate, Tokenizer};
use std::sync::{Arc, OnceLock};

/// A request that passed [`Validator::check`]: what the worker admits.
pub struct Checked {
    pub req: ValidatedRequest,
    /// The prompt's token ids (chat messages through the model's template).
    pub prompt: Vec<u32>,
    /// Its output format as a grammar, where it asked for one.
    pub constraint: Option<Constraint>,
}

/// Everything the checks need of the served model and the server's limits,
/// taken from the engine once it is loaded; `Send + Sync`, used on the
/// HTTP side.
pub struct Validator {
    tokenizer: Arc<Tokenizer>,
    template: Arc<ChatTemplate>,
    vocab_size: usize,
    context_length: usize,
    max_prompt_tokens: Option<usize>,
    kv_budget: Option<usize>,
    kv: KvRates,
    /// Built at the first request that needs it.
    grammars: OnceLock<Result<Grammars, String>>,
}

impl Validator {
    pub fn new(engine: &Engine, cfg: &ServerConfig) -> Validator {
        Validator {
            tokenizer: engine.tokenizer.clone(),
            template: engine.template.clone(),
            vocab_size: engine.model.config.vocab_size,
            context_length: engine.context_length(),
            max_prompt_tokens: cfg.limits.max_prompt_tokens,
            kv_budget: cfg.batch.kv_budget,
            kv: KvRates::of(engine),
            grammars: OnceLock::new(),
        }
    }

    /// The served model's tokenizer (`/tokenize`, echoed token ids).
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// The served model's chat template (`/tokenize` of messages).
    pub fn template(&self) -> &Arc<ChatTemplate> {
        &self.template
    }

    /// The model's context length.
    pub fn context_length(&self) -> usize {
        self.context_length
    }

    pub fn encode(&self, prompt: &Prompt) -> anyhow::Result<Vec<u32>> {
        crate::engine::encode(&self.template, &self.tokenizer, prompt)
    }

    fn grammars(&self) -> Result<&Grammars, String> {
        self.grammars
            .get_or_init(|| {
                Grammars::new(&self.tokenizer, self.vocab_size).map_err(|e| format!("{e:#}"))
            })
            .as_ref()
            .map_err(|e| e.clone())
    }

    /// The request's prompt encoded and checked, and its grammar built; the
    /// message of a refusal is what the client gets with a 400.
    pub fn check(&self, req: ValidatedRequest) -> Result<Checked, String> {
        let prompt = self
            .encode(&req.prompt)
            .map_err(|e| format!("cannot encode the prompt: {e:#}"))?;
        if prompt.is_empty() {
            return Err("the prompt is empty".into());
        }
        let ctx = self.context_length;
        if prompt.len() >= ctx {
            return Err(format!(
                "the prompt is {} tokens, over the model's context length of {ctx} tokens",
                prompt.len()
            ));
        }
        if let Some(max) = self.max_prompt_tokens.filter(|&m| prompt.len() > m) {
            return Err(format!(
                "the prompt is {} tokens, over this server's limit of {max} prompt tokens (max_prompt_tokens)",
                prompt.len()
            ));
        }
        if let Some(budget) = self.kv_budget {
            // A model drafter's cache grows with the target's: counted too.
            let drafter = req.spec.drafter_or_default();
            let need = crate::scheduler::kv::held_bytes(prompt.len(), self.kv.per_token(&drafter));
            if need > budget {
                return Err(format!(
                    "the prompt is {} tokens, whose KV cache ({need} bytes{}) is over this server's kv_budget of {budget} bytes",
                    prompt.len(),
                    if crate::scheduler::drafter_holds_kv(&drafter) {
                        format!(", the {drafter} drafter's included")
                    } else {
                        String::new()
                    }
                ));
            }
        }
        let constraint = match &req.format {
            Some(f) => Some(
                self.grammars()?
                    .constraint(f)
                    .map_err(|e| format!("{e:#}"))?,
            ),
            None => None,
        };
        Ok(Checked {
            req,
            prompt,
            constraint,
        })
    }
}
