//! Drafters propose the tokens a round verifies. One trait; a model-free
//! n-gram prompt lookup, and a model drafter (a separate draft model sharing
//! the tokenizer, the target itself, or the target's first N layers).
//!
//! MTP heads: a drafter that answers `wants_hidden() == true` is handed the
//! target's last hidden state after each verify (`observe_hidden`), which is
//! what a multi-token-prediction head drafts from. No MTP checkpoint exists
//! for our models, so no drafter implements it yet.
use super::target::Target;
use crate::sampling::{distribution, Distribution, Rng, SamplingParams};
use anyhow::Result;

/// The draft probability of a proposed token.
#[derive(Debug, Clone)]
pub enum DraftProb {
    /// A model-free proposal: q(x) = 1 for its token.
    PointMass,
    /// The draft model's final distribution at that position.
    Dist(Distribution),
}

impl DraftProb {
    pub fn q(&self, token: u32) -> f32 {
        match self {
            DraftProb::PointMass => 1.0,
            DraftProb::Dist(d) => d.p(token),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Draft {
    pub tokens: Vec<u32>,
    pub q: Vec<DraftProb>,
    /// The drafter's own confidence per token, where it has one (the suffix
    /// drafter's match statistics); empty otherwise. Not a probability
    /// acceptance uses: that is `q`.
    pub confidence: Vec<f32>,
}

pub trait Drafter: Send {
    /// The name it was selected by (`ngram`, `self:N`, `model:NAME`).
    fn name(&self) -> String;
    /// Proposes up to `k` tokens continuing `log` (the committed tokens of
    /// the request, prompt included).
    fn propose(
        &mut self,
        log: &[u32],
        k: usize,
        params: &SamplingParams,
        rng: &mut Rng,
    ) -> Result<Draft>;
    /// A round ended: `log_len` committed tokens existed before it, and the
    /// first `accepted` of the drafted tokens were kept.
    fn commit(&mut self, log_len: usize, drafted: usize, accepted: usize) -> Result<()>;
    /// Whether it drafts from the target's hidden state (MTP).
    fn wants_hidden(&self) -> bool {
        false
    }
    fn observe_hidden(&mut self, _hidden: &[f32]) {}
}

/// Prompt lookup: find the latest earlier occurrence of the last n tokens
/// (n from `max_n` down to `min_n`) and propose what followed it.
pub struct NgramDrafter {
    pub min_n: usize,
    pub max_n: usize,
    /// Longest proposal regardless of k.
    pub max_proposal: usize,
}

impl Default for NgramDrafter {
    fn default() -> Self {
        NgramDrafter {
            min_n: 1,
            max_n: 4,
            max_proposal: 64,
        }
    }
}

impl NgramDrafter {
    pub fn lookup(&self, log: &[u32], k: usize) -> Vec<u32> {
        let k = k.min(self.max_proposal);
        if k == 0 {
            return Vec::new();
        }
        for n in (self.min_n..=self.max_n).rev() {
            if log.len() <= n {
                continue;
            }
            let tail = &log[log.len() - n..];
            // Latest match first: recent context predicts best.
            for start in (0..log.len() - n).rev() {
                if &log[start..start + n] == tail {
                    let from = start + n;
                    let end = (from + k).min(log.len());
                    if from < end {
                        return log[from..end].to_vec();
                    }
                }
            }
        }
        Vec::new()
    }
}

impl Drafter for NgramDrafter {
    fn name(&self) -> String {
        "ngram".into()
    }
    fn propose(&mut self, log: &[u32], k: usize, _: &SamplingParams, _: &mut Rng) -> Result<Draft> {
        let tokens = self.lookup(log, k);
        let q = tokens.iter().map(|_| DraftProb::PointMass).collect();
        Ok(Draft {
            tokens,
            q,
            ..Default::default()
        })
    }
    fn commit(&mut self, _: usize, _: usize, _: usize) -> Result<()> {
        Ok(())
    }
}

/// Drafts autoregressively with a model that shares the tokenizer, keeping
/// its own caches in step with the committed log.
pub struct ModelDrafter {
    name: String,
    model: Box<dyn Target>,
}

impl ModelDrafter {
    pub fn new(name: impl Into<String>, model: Box<dyn Target>) -> Self {
        ModelDrafter {
            name: name.into(),
            model,
        }
    }
}

impl Drafter for ModelDrafter {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn propose(
        &mut self,
        log: &[u32],
        k: usize,
        params: &SamplingParams,
        rng: &mut Rng,
    ) -> Result<Draft> {
        let mut draft = Draft::default();
        if k == 0 {
            return Ok(draft);
        }
        let have = self.model.offset().min(log.len().saturating_sub(1));
        self.model.rewind(have)?;
        // Every offset `commit` may keep: a sliding-window cache that wrapped
        // can only go back there from a snapshot (elsewhere none is taken).
        let keepable: Vec<usize> = (log.len()..log.len() + k).collect();
        self.model.prepare_snapshots(&keepable);
        let mut rows = self.model.forward(&log[have..], false)?;
        let mut history = log.to_vec();
        for i in 0..k {
            let logits = rows.pop().expect("one logits row");
            let d = distribution(&logits, params, &history);
            let tok = if params.greedy() {
                d.argmax
            } else {
                d.sample_with(rng.uniform())
            };
            draft.tokens.push(tok);
            draft.q.push(DraftProb::Dist(d));
            history.push(tok);
            if i + 1 < k {
                self.model.prepare_snapshots(&keepable);
                rows = self.model.forward(&[tok], false)?;
            }
        }
        Ok(draft)
    }

    fn commit(&mut self, log_len: usize, drafted: usize, accepted: usize) -> Result<()> {
        // Cached: the log before the round plus the drafts forwarded (all but
        // the last); keep only what the round kept.
        let forwarded = drafted.saturating_sub(1);
        let keep = log_len + accepted.min(forwarded);
        if self.model.offset() > keep {
            self.model.rewind(keep)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ngram_finds_latest_longest_match() {
        let d = NgramDrafter {
            min_n: 1,
            max_n: 3,
            max_proposal: 8,
        };
        // ... 1 2 3 9 ... 1 2 3 7 8 ... then tail 1 2 3 -> the later "7 8" wins.
        let log = [1, 2, 3, 9, 5, 1, 2, 3, 7, 8, 4, 1, 2, 3];
        assert_eq!(d.lookup(&log, 2), vec![7, 8]);
        assert_eq!(d.lookup(&log, 0), Vec::<u32>::new());
        assert_eq!(d.lookup(&[5, 6], 3), Vec::<u32>::new());
        // proposals stop at the end of the log
        assert_eq!(d.lookup(&[4, 5, 4], 5), vec![5, 4]);
    }
}
