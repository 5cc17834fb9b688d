//! The MTP drafters as drafters: the head drafter ([`MtpDrafter`], in
//! [`super::head`]) behind the [`Drafter`] trait, and `suffix+mtp`, the
//! suffix drafter with the head where it has nothing.
use super::draft::{Draft, DraftHook};
use super::drafter::Drafter;
use super::head::{draft_heads, HeadRound, MtpDrafter};
use super::target::HiddenRows;
use crate::sampling::{Rng, SamplingParams};
use anyhow::Result;

impl Drafter for MtpDrafter {
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
        let mut round = [HeadRound {
            drafter: self,
            log,
            k,
            params,
            rng,
            hook: Some(hook),
            draft: Draft::default(),
        }];
        draft_heads(&mut round)?;
        let [round] = round;
        Ok(round.draft)
    }

    fn commit(&mut self, _: usize, _: usize, _: usize) -> Result<()> {
        // The chained entries go at the next round (`observe_hidden`).
        Ok(())
    }

    fn wants_hidden(&self) -> bool {
        true
    }

    fn hidden_taps(&self) -> Vec<usize> {
        self.head.taps().to_vec()
    }

    fn head_drafter(&mut self, _source: usize) -> Option<&mut MtpDrafter> {
        Some(self)
    }

    fn observe_hidden(&mut self, log: &[u32], hidden: HiddenRows) -> Result<()> {
        self.keep_rows(log, hidden)
    }
}

/// `suffix+mtp`: the suffix drafter's proposal wherever it matched, the
/// head's where it has nothing. Text that repeats (a grounded answer, a
/// code edit) drafts long runs for nothing, accepted far more often than a
/// small head's guesses (0.6-0.8 of suffix drafts against 0.3-0.4 of the
/// shipped head's on the bench suites). So the two are two sources
/// ([`Drafter::source`]): which one drafts is known before the schedule
/// is asked, and each source has its own schedule instance, which sizes k
/// from that source's rounds alone; a round it gives the head k = 0 costs
/// no head forward. The
/// head reads the target's rows every round either way, so it is in step
/// whenever it is asked.
pub struct SuffixThenMtp {
    pub suffix: super::SuffixDrafter,
    pub mtp: MtpDrafter,
    /// This round's suffix proposal (at the round's largest k), found when
    /// the source was decided: the log length it is for, and the draft.
    ahead: Option<(usize, Draft)>,
}

impl SuffixThenMtp {
    /// Source numbers ([`Drafter::source`]).
    pub const SUFFIX: usize = 0;
    pub const HEAD: usize = 1;

    pub fn new(suffix: super::SuffixDrafter, mtp: MtpDrafter) -> Self {
        SuffixThenMtp {
            suffix,
            mtp,
            ahead: None,
        }
    }
}

impl Drafter for SuffixThenMtp {
    fn name(&self) -> String {
        format!("suffix+{}", self.mtp.name())
    }

    fn drafts_stepwise(&self) -> bool {
        true
    }

    fn sources(&self) -> usize {
        2
    }

    fn source(
        &mut self,
        log: &[u32],
        max_draft: usize,
        params: &SamplingParams,
        rng: &mut Rng,
    ) -> Result<usize> {
        // A suffix draft is a walk that k only cuts short: the longest one
        // now, cut to the round's k when proposed.
        let s = self.suffix.propose(log, max_draft, params, rng)?;
        let source = match s.tokens.is_empty() {
            true => Self::HEAD,
            false => Self::SUFFIX,
        };
        self.ahead = Some((log.len(), s));
        Ok(source)
    }

    fn propose_stepwise(
        &mut self,
        log: &[u32],
        k: usize,
        params: &SamplingParams,
        rng: &mut Rng,
        hook: DraftHook<'_>,
    ) -> Result<Draft> {
        let mut s = match self.ahead.take() {
            Some((n, s)) if n == log.len() => s,
            _ => self.suffix.propose(log, k, params, rng)?,
        };
        if !s.tokens.is_empty() {
            s.truncate(k);
            return Ok(s);
        }
        self.mtp.propose_stepwise(log, k, params, rng, hook)
    }

    fn commit(&mut self, log_len: usize, drafted: usize, accepted: usize) -> Result<()> {
        self.suffix.commit(log_len, drafted, accepted)?;
        self.mtp.commit(log_len, drafted, accepted)
    }

    fn wants_hidden(&self) -> bool {
        true
    }

    fn hidden_taps(&self) -> Vec<usize> {
        self.mtp.hidden_taps()
    }

    fn head_drafter(&mut self, source: usize) -> Option<&mut MtpDrafter> {
        (source == Self::HEAD).then_some(&mut self.mtp)
    }

    fn observe_hidden(&mut self, log: &[u32], hidden: HiddenRows) -> Result<()> {
        self.mtp.observe_hidden(log, hidden)
    }
}
