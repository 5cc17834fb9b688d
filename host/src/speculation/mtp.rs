//! The MTP drafters as drafters: the head drafter ([`MtpDrafter`], in
//! [`super::head`]) behind the [`Drafter`] trait, and `suffix+mtp`, the
//! suffix drafter with the head where it has nothing.
use super::draft::{Draft, DraftHook};
use super::drafter::{DraftReq, Drafter};
use super::head::{draft_heads, HeadRound, MtpDrafter};
use super::target::HiddenRows;
use crate::sampling::{Rng, SamplingParams};
use anyhow::Result;

impl Drafter for MtpDrafter {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn draft_one(&mut self, req: &mut DraftReq<'_>) -> Result<()> {
        let hook = match req.hook.as_mut() {
            Some(h) => {
                let h: DraftHook<'_> = &mut **h;
                Some(h)
            }
            None => None,
        };
        let mut round = [HeadRound {
            drafter: self,
            log: req.log,
            k: req.k,
            params: req.params,
            rng: &mut *req.rng,
            hook,
            draft: Draft::default(),
        }];
        draft_heads(&mut round)?;
        let [round] = round;
        req.draft = round.draft;
        Ok(())
    }

    fn commit(&mut self, _: usize, _: usize, _: usize) -> Result<()> {
        // The chained entries go at the next round (`observe_hidden`).
        Ok(())
    }

    fn hidden_taps(&self) -> Option<Vec<usize>> {
        Some(self.head.taps().to_vec())
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

    fn sources(&self) -> usize {
        2
    }

    fn source(
        &mut self,
        log: &[u32],
        max_draft: usize,
        _params: &SamplingParams,
        _rng: &mut Rng,
    ) -> Result<usize> {
        // A suffix draft is a walk that k only cuts short: the longest one
        // now, cut to the round's k when proposed.
        let s = self.suffix.lookup(log, max_draft);
        let source = match s.tokens.is_empty() {
            true => Self::HEAD,
            false => Self::SUFFIX,
        };
        self.ahead = Some((log.len(), s));
        Ok(source)
    }

    fn draft_one(&mut self, req: &mut DraftReq<'_>) -> Result<()> {
        let ahead = (self.ahead.take()).filter(|(n, _)| *n == req.log.len());
        if req.source == Self::HEAD {
            return self.mtp.draft_one(req);
        }
        // The suffix's source: the walk found when the source was decided
        // (found again if the round was not planned through `source`).
        let mut s = match ahead {
            Some((_, s)) => s,
            None => self.suffix.lookup(req.log, req.k),
        };
        s.truncate(req.k);
        req.draft = s;
        Ok(())
    }

    fn commit(&mut self, log_len: usize, drafted: usize, accepted: usize) -> Result<()> {
        self.suffix.commit(log_len, drafted, accepted)?;
        self.mtp.commit(log_len, drafted, accepted)
    }

    fn hidden_taps(&self) -> Option<Vec<usize>> {
        self.mtp.hidden_taps()
    }

    fn head_drafter(&mut self, source: usize) -> Option<&mut MtpDrafter> {
        (source == Self::HEAD).then_some(&mut self.mtp)
    }

    fn observe_hidden(&mut self, log: &[u32], hidden: HiddenRows) -> Result<()> {
        self.mtp.observe_hidden(log, hidden)
    }
}
