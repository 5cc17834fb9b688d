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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::LogprobMode;
    use std::sync::Mutex;

    /// Rows over a 4-token vocabulary, each peaked on `peak`.
    fn row(peak: usize) -> Vec<f32> {
        (0..4).map(|i| if i == peak { 3.0 } else { 0.0 }).collect()
    }

    #[test]
    fn chunks_build_one_entry_per_token_once_and_a_gap_is_an_error() {
        let prompt = [1u32, 2, 3, 0, 2];
        let got = Arc::new(Mutex::new(None));
        let g = got.clone();
        let hook = PromptLogprobHook(Arc::new(move |v| *g.lock().unwrap() = Some(v)));
        let req = LogprobRequest {
            top: 2,
            mode: LogprobMode::Raw,
        };
        let params = SamplingParams::default();
        let mut p = PromptLogprobs::new(&prompt, req, hook);
        assert!(!p.complete(prompt.len()));
        assert!(p.add_rows(&prompt, 2, &[row(0)], &params).is_err(), "a gap");
        p.add_rows(&prompt, 0, &[row(2), row(3)], &params).unwrap();
        // A chunk forwarded again (after a preemption) adds only what is new.
        p.add_rows(&prompt, 0, &[row(2), row(3), row(0)], &params)
            .unwrap();
        assert!(!p.complete(prompt.len()));
        p.add_rows(&prompt, 3, &[row(1)], &params).unwrap();
        assert!(p.complete(prompt.len()));
        assert!(
            p.add_rows(&prompt, 4, &[row(1)], &params).is_err(),
            "past the prompt"
        );
        p.send();
        let v = got.lock().unwrap().take().expect("sent");
        assert_eq!(v.iter().map(|t| t.token).collect::<Vec<_>>(), prompt);
        assert!(v[0].logprob.is_nan() && v[0].top.is_empty());
        // Each row's peak is the next token but the last (row(1) before 2).
        for t in &v[1..4] {
            assert_eq!(t.top[0].0, t.token);
            assert_eq!(t.logprob, t.top[0].1);
        }
        assert!(v[4].logprob < v[4].top[0].1, "{:?}", v[4]);
    }
}
