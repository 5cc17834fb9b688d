//! The prompt's logprobs (completions' `echo`), built from the request's own
//! prefill: a prefill chunk of a request that asks for them keeps its rows'
//! logits, and each row becomes its entry (the next prompt token's logprob
//! and the top alternatives) before the next chunk runs. Only entries are
//! kept, never a whole prompt's rows x vocabulary floats, and no forward
//! runs besides the prefill: in a batched step the chunk shares the step's
//! forward with the other requests' rows.
use crate::sampling::{distribution, token_logprob, LogprobRequest, SamplingParams, TokenLogprob};
use anyhow::{ensure, Result};
use std::sync::Arc;

/// Called once with the prompt's entries, when its prefill is over (before
/// any generated token's logprobs).
#[derive(Clone)]
pub struct PromptLogprobHook(pub Arc<dyn Fn(Vec<TokenLogprob>) + Send + Sync>);

impl std::fmt::Debug for PromptLogprobHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PromptLogprobHook")
    }
}

/// The entries of a prompt so far.
pub(crate) struct PromptLogprobs {
    req: LogprobRequest,
    hook: PromptLogprobHook,
    /// One per prompt token from the first: the first has nothing before it
    /// (NaN, which JSON writes as null); entry `p + 1` comes from row `p`.
    entries: Vec<TokenLogprob>,
}

impl PromptLogprobs {
    pub(crate) fn new(prompt: &[u32], req: LogprobRequest, hook: PromptLogprobHook) -> Self {
        let mut entries = Vec::with_capacity(prompt.len());
        entries.push(TokenLogprob {
            token: prompt[0],
            logprob: f32::NAN,
            top: Vec::new(),
        });
        PromptLogprobs { req, hook, entries }
    }

    /// The logits `rows` of prompt positions `from..`: each becomes the entry
    /// of the token after it, under `params`' transforms (penalties see the
    /// prompt up to the row's position, as when the token is generated).
    /// Rows already turned into entries (a chunk forwarded again after a
    /// preemption) are skipped.
    pub(crate) fn add_rows(
        &mut self,
        prompt: &[u32],
        from: usize,
        rows: &[Vec<f32>],
        params: &SamplingParams,
    ) -> Result<()> {
        ensure!(
            from < self.entries.len(),
            "prompt rows from position {from} leave a gap after {} entries",
            self.entries.len()
        );
        for (i, row) in rows.iter().enumerate() {
            let p = from + i;
            if p + 1 < self.entries.len() {
                continue;
            }
            ensure!(p + 1 < prompt.len(), "a prompt row past the prompt");
            let d = distribution(row, params, &prompt[..=p]);
            self.entries
                .push(token_logprob(row, &d, prompt[p + 1], &self.req));
        }
        Ok(())
    }

    /// Whether every prompt token of `prompt_len` has its entry.
    pub(crate) fn complete(&self, prompt_len: usize) -> bool {
        self.entries.len() == prompt_len
    }

    /// Hands the entries to the hook.
    pub(crate) fn send(self) {
        (self.hook.0)(self.entries)
    }
}
