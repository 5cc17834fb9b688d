//! Drafters propose the tokens a round verifies. One trait; a model-free
//! n-gram prompt lookup, and a model drafter (a separate draft model sharing
//! the tokenizer, the target itself, or the target's first N layers).
//!
//! MTP heads ([`super::mtp`]): a drafter that answers `wants_hidden() ==
//! true` is handed the target's last hidden states before each round
//! (`observe_hidden`), which is what a multi-token-prediction head drafts
//! from.
use super::draft::{draft_on, softmax_stats, Draft, DraftHook, DraftProb};
use super::head::MtpDrafter;
use super::target::{HiddenRows, Target};
use crate::sampling::{distribution, Rng, SamplingParams};
use anyhow::Result;

pub trait Drafter: Send {
    /// The name it was selected by (`ngram`, `self:N`, `model:NAME`).
    fn name(&self) -> String;
    /// Proposes up to `k` tokens continuing `log` (the committed tokens of
    /// the request, prompt included). A drafter implements this or
    /// [`propose_stepwise`](Self::propose_stepwise) (a stepwise one), each
    /// the other's default.
    fn propose(
        &mut self,
        log: &[u32],
        k: usize,
        params: &SamplingParams,
        rng: &mut Rng,
    ) -> Result<Draft> {
        self.propose_stepwise(log, k, params, rng, &mut |_| true)
    }
    /// Whether it drafts token by token (a model forward each), so that
    /// asking the schedule after each token can save work; only such
    /// drafters are given a hook (`propose_stepwise`).
    fn drafts_stepwise(&self) -> bool {
        false
    }
    /// [`propose`](Self::propose), asking `hook` after each draft token but
    /// the k-th and stopping when it answers false.
    fn propose_stepwise(
        &mut self,
        log: &[u32],
        k: usize,
        params: &SamplingParams,
        rng: &mut Rng,
        _hook: DraftHook<'_>,
    ) -> Result<Draft> {
        self.propose(log, k, params, rng)
    }
    /// A round ended: `log_len` committed tokens existed before it, and the
    /// first `accepted` of the drafted tokens were kept.
    fn commit(&mut self, log_len: usize, drafted: usize, accepted: usize) -> Result<()>;
    /// How many sources it drafts from (a drafter that combines several:
    /// each gets its own schedule instance, [`Drafter::source`]).
    fn sources(&self) -> usize {
        1
    }
    /// Which of its sources drafts this round (a drafter that combines
    /// several, as `suffix+mtp`; 0 for every other), decided before the
    /// schedule is asked: that source's schedule instance is asked, and
    /// told that source's rounds ([`super::ScheduleHistory`]), not a blend.
    /// `max_draft` bounds the round's k.
    fn source(
        &mut self,
        _log: &[u32],
        _max_draft: usize,
        _params: &SamplingParams,
        _rng: &mut Rng,
    ) -> Result<usize> {
        Ok(0)
    }
    /// The MTP head drafter of `source`'s rounds, if its rounds draft from
    /// one: a batched step drafts those rounds of its requests together
    /// ([`super::head::draft_heads`]).
    fn head_drafter(&mut self, _source: usize) -> Option<&mut MtpDrafter> {
        None
    }
    /// Whether it drafts from the target's hidden states (MTP): the target
    /// then keeps them, and each round hands the drafter those of the
    /// positions forwarded since the last ([`Drafter::observe_hidden`]).
    fn wants_hidden(&self) -> bool {
        false
    }
    /// The target's layer boundaries whose rows it reads, where it wants
    /// hidden rows ([`crate::model::llama::Taps`]; empty: the last layer's
    /// output).
    fn hidden_taps(&self) -> Vec<usize> {
        Vec::new()
    }
    /// The target's last-layer rows of positions it forwarded since the
    /// last call (`log`: the committed tokens, the last not yet forwarded).
    fn observe_hidden(&mut self, _log: &[u32], _hidden: HiddenRows) -> Result<()> {
        Ok(())
    }
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
            // As `ngram` (crate::options::DEFAULT_DRAFTER).
            min_n: 2,
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
        Ok(Draft::point_mass(self.lookup(log, k)))
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

    fn drafts_stepwise(&self) -> bool {
        true
    }

    fn propose_stepwise(
        &mut self,
        log: &[u32],
        k: usize,
        params: &SamplingParams,
        rng: &mut Rng,
        hook: DraftHook<'_>,
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
        for _ in 0..k {
            let logits = rows.pop().expect("one logits row");
            let d = distribution(&logits, params, &history);
            let tok = d.draw(params, rng);
            let (entropy, top1) = if params.greedy() {
                softmax_stats(&logits)
            } else {
                (d.entropy, d.p(d.argmax))
            };
            history.push(tok);
            if !draft_on(
                &mut draft,
                tok,
                DraftProb::Dist(d),
                (entropy, top1),
                k,
                hook,
            ) {
                break;
            }
            self.model.prepare_snapshots(&keepable);
            rows = self.model.forward(&[tok], false)?;
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

    #[test]
    fn default_ngram_needs_two_matching_tokens() {
        let d = NgramDrafter::default();
        // Only "3" recurs: a one-token match drafts nothing.
        assert_eq!(d.lookup(&[1, 3, 4, 5, 2, 3], 4), Vec::<u32>::new());
        // "2 3" recurs: what followed it.
        assert_eq!(d.lookup(&[2, 3, 4, 5, 6, 2, 3], 3), vec![4, 5, 6]);
    }
}
