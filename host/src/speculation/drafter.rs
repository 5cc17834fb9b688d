//! Drafters propose the tokens a round verifies. One trait; a model-free
//! n-gram prompt lookup, and a model drafter (a separate draft model sharing
//! the tokenizer, the target itself, or the target's first N layers).
//!
//! A round's draft is a value, [`DraftReq`]: what to draft from, the
//! schedule's hook, the source, and the draft left in it.
//!
//! MTP heads ([`super::mtp`]): a drafter that names `hidden_taps` is
//! handed the target's hidden states before each round (`observe_hidden`),
//! which is what a multi-token-prediction head drafts from.
use super::draft::{draw, draw_on, Draft, DraftHook};
use super::head::MtpDrafter;
use super::target::{HiddenRows, Target};
use crate::sampling::{Rng, SamplingParams};
use anyhow::Result;
use specd_policy::DraftStep;

/// One request's draft of a round: what a drafter drafts from, and the
/// draft it leaves.
pub struct DraftReq<'a> {
    /// The committed tokens of the request, the prompt included (the last
    /// not yet forwarded).
    pub log: &'a [u32],
    /// The most tokens to draft.
    pub k: usize,
    pub params: &'a SamplingParams,
    pub rng: &'a mut Rng,
    /// The schedule's per-token hook (contract 0.2): a drafter that drafts
    /// token by token (a model forward each) asks it after each token but
    /// the k-th and stops when it answers false; the others have nothing
    /// to save and draft at once. `None`: the schedule has no hook.
    pub hook: Option<DraftHook<'a>>,
    /// Which of the drafter's sources drafts it ([`Drafter::source`]).
    pub source: usize,
    /// What it drafted (at most `k` tokens).
    pub draft: Draft,
}

impl<'a> DraftReq<'a> {
    /// A request for up to `k` tokens continuing `log`, with no hook, from
    /// the drafter's first source.
    pub fn new(log: &'a [u32], k: usize, params: &'a SamplingParams, rng: &'a mut Rng) -> Self {
        DraftReq {
            log,
            k,
            params,
            rng,
            hook: None,
            source: 0,
            draft: Draft::default(),
        }
    }
}

pub trait Drafter: Send {
    /// The name it was selected by (`ngram`, `self:N`, `model:NAME`).
    fn name(&self) -> String;
    /// Drafts each request of `reqs` into its `draft`. The default drafts
    /// them one by one ([`Drafter::draft_one`]).
    fn draft(&mut self, reqs: &mut [DraftReq<'_>]) -> Result<()> {
        reqs.iter_mut().try_for_each(|r| self.draft_one(r))
    }
    /// Drafts one request ([`Drafter::draft`]).
    fn draft_one(&mut self, req: &mut DraftReq<'_>) -> Result<()>;
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
    /// Where it drafts from the target's hidden states (MTP): the target's
    /// layer boundaries whose rows it reads ([`crate::model::llama::Taps`];
    /// empty: the last layer's output). Each forward of its request then
    /// returns those rows, and each round hands the drafter those of the
    /// positions kept since the last ([`Drafter::observe_hidden`]). `None`:
    /// it reads none.
    fn hidden_taps(&self) -> Option<Vec<usize>> {
        None
    }
    /// The target's rows of positions it forwarded since the last call
    /// (`log`: the committed tokens, the last not yet forwarded).
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
    fn draft_one(&mut self, req: &mut DraftReq<'_>) -> Result<()> {
        req.draft = Draft::point_mass(self.lookup(req.log, req.k));
        Ok(())
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

    fn draft_one(&mut self, req: &mut DraftReq<'_>) -> Result<()> {
        req.draft = Draft::default();
        let (log, k) = (req.log, req.k);
        if k == 0 {
            return Ok(());
        }
        let mut always = |_: &DraftStep| true;
        let hook: DraftHook<'_> = match req.hook.as_mut() {
            Some(h) => &mut **h,
            None => &mut always,
        };
        let draft = &mut req.draft;
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
            let picked = draw(&logits, &logits, req.params, &history, req.rng);
            let tok = picked.0;
            if !draw_on(draft, &mut history, picked, k, hook) {
                break;
            }
            self.model.prepare_snapshots(&keepable);
            rows = self.model.forward(&[tok], false)?;
        }
        Ok(())
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
    fn a_batch_drafts_each_request_as_alone() {
        let mut d = NgramDrafter::default();
        let params = SamplingParams::default();
        let (mut r1, mut r2) = (Rng::new(0), Rng::new(1));
        let a = [2, 3, 4, 5, 6, 2, 3];
        let b = [7, 8, 9, 7, 8];
        let mut reqs = [
            DraftReq::new(&a, 3, &params, &mut r1),
            DraftReq::new(&b, 2, &params, &mut r2),
        ];
        d.draft(&mut reqs).unwrap();
        assert_eq!(reqs[0].draft.tokens, d.lookup(&a, 3));
        assert_eq!(reqs[1].draft.tokens, vec![9, 7]);
        assert!(reqs.iter().all(|r| r.draft.q.len() == r.draft.tokens.len()));
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
