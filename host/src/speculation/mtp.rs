//! The MTP drafter: drafts with a head trained on the target's own hidden
//! states ([`crate::model::mtp::MtpHead`]).
//!
//! The target keeps the last layer's rows of every forward
//! ([`Target::keep_hidden`](super::Target::keep_hidden)); before each
//! round the drafter takes them, and when the round drafts it feeds its
//! head one row per committed position it has not read (the feature f_i
//! and the token x_{i+1}): the head's cache then holds every position the
//! target read, and its last row predicts the token after the last
//! committed one. Each further draft
//! token is one head forward over the previous row's output (chained, as
//! DeepSeek's MTP and EAGLE draft). Those chained entries are dropped from
//! the head's cache at the next round, when the target's rows for what was
//! kept replace them.
use super::draft::{Draft, DraftProb};
use super::drafter::{draft_on, softmax_stats, DraftHook, Drafter};
use super::target::HiddenRows;
use crate::cache::LayerCache;
use crate::model::mtp::{HeadRows, MtpHead};
use crate::model::Logits;
use crate::sampling::{distribution, Rng, SamplingParams};
use anyhow::{ensure, Result};
use specd_mlx::Array;
use std::sync::Arc;

pub struct MtpDrafter {
    name: String,
    head: Arc<MtpHead>,
    caches: Vec<Box<dyn LayerCache>>,
    /// The sequence position of the head cache's first entry.
    base: usize,
    /// Positions read with the target's features: the cache holds
    /// `base..fed` (and chained draft entries after, until the next round).
    fed: usize,
    /// The head's last row over the target's features: it predicts the
    /// token at `fed + 1`, and its output feeds the first chained step.
    last: Option<LastRow>,
    /// The target's rows not fed yet (fed when a round drafts).
    /// A run of consecutive chunks, joined when fed: joining them as they
    /// come copied the whole run again every round.
    pending: Vec<HiddenRows>,
}

struct LastRow {
    logits: Vec<f32>,
    hidden: Array,
}

impl MtpDrafter {
    pub fn new(name: impl Into<String>, head: Arc<MtpHead>) -> Self {
        let caches = head.new_caches();
        MtpDrafter {
            name: name.into(),
            head,
            caches,
            base: 0,
            fed: 0,
            last: None,
            pending: Vec::new(),
        }
    }

    /// The cache's offset (positions after `base`) back to `pos`.
    fn rewind_to(&mut self, pos: usize) {
        for c in &mut self.caches {
            let ok = c.rewind(pos - self.base);
            debug_assert!(ok, "a plain KV cache rewinds in place");
        }
    }

    /// The last row of `rows` (whose logits are the last row's): its
    /// logits on the host, its output kept.
    fn last_row(&self, rows: HeadRows) -> Result<LastRow> {
        let t = rows.hidden.dim(1);
        let d = rows.hidden.dim(2);
        let logits = rows.logits;
        let hidden = rows.hidden.slice(&[0, t - 1, 0], &[1, t, d])?;
        specd_mlx::eval(&[&logits, &hidden])?;
        Ok(LastRow {
            logits: logits.to_vec_f32()?,
            hidden,
        })
    }

    /// Feeds the head the target's rows it has not read (one forward over
    /// all of them); its last row predicts the token after the log.
    fn catch_up(&mut self, log: &[u32], hidden: HiddenRows) -> Result<()> {
        if hidden.start < self.base || hidden.start > self.fed {
            // A gap (a prefix from the cache, a preemption, a long stretch
            // without drafts): start over from these rows. Rope is
            // relative, so the head's positions may start anywhere.
            self.caches = self.head.new_caches();
            self.base = hidden.start;
            self.fed = hidden.start;
        }
        self.rewind_to(hidden.start);
        let tokens = &log[hidden.start + 1..hidden.end() + 1];
        let rows = self
            .head
            .forward(tokens, &hidden.rows, &mut self.caches, Logits::Last)?;
        self.fed = hidden.end();
        self.last = Some(self.last_row(rows)?);
        Ok(())
    }

    /// The draft token from the head's logits row, and its statistics.
    fn pick(
        &self,
        row: &[f32],
        params: &SamplingParams,
        history: &[u32],
        rng: &mut Rng,
    ) -> (u32, DraftProb, f32, f32) {
        if params.plain_greedy() {
            // The one-hot distribution at the argmax, without building it
            // over the whole vocabulary (argmax_margin's first-index rule).
            let (best, _) = crate::sampling::argmax_margin(row);
            let (entropy, top1) = softmax_stats(row);
            return (
                self.head.target_id(best as usize),
                DraftProb::PointMass,
                entropy,
                top1,
            );
        }
        // Over the target's vocabulary, ids outside the draft vocabulary
        // impossible: sampled drafts come from the distribution the
        // acceptance is told (q), so rejection sampling stays exact.
        let vocab = self.head.config.target_vocab_size;
        let full: Vec<f32> = match &self.head.draft_ids {
            None => row.to_vec(),
            Some(ids) => {
                let mut full = vec![f32::NEG_INFINITY; vocab];
                for (i, &t) in ids.iter().enumerate() {
                    full[t as usize] = row[i];
                }
                full
            }
        };
        let d = distribution(&full, params, history);
        let tok = d.draw(params, rng);
        let (entropy, top1) = if params.greedy() {
            softmax_stats(row)
        } else {
            (d.entropy, d.p(d.argmax))
        };
        (tok, DraftProb::Dist(d), entropy, top1)
    }
}

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
        let mut draft = Draft::default();
        if k == 0 {
            return Ok(draft);
        }
        if !self.pending.is_empty() {
            let run = std::mem::take(&mut self.pending);
            let rows = run.iter().map(|h| &h.rows).collect::<Vec<_>>();
            let hidden = HiddenRows {
                start: run[0].start,
                rows: specd_mlx::ops::concatenate(&rows, 1)?,
            };
            self.catch_up(log, hidden)?;
        }
        // The head must have read every position the target has: else it
        // predicts for another place (no features came: nothing to draft).
        let Some(last) = self.last.as_ref().filter(|_| self.fed + 1 == log.len()) else {
            return Ok(draft);
        };
        let mut row = last.logits.clone();
        let mut feature = last.hidden.clone();
        self.rewind_to(self.fed);
        let mut history = log.to_vec();
        for _ in 0..k {
            let (tok, q, entropy, top1) = self.pick(&row, params, &history, rng);
            history.push(tok);
            if !draft_on(&mut draft, tok, q, (entropy, top1), k, hook) {
                break;
            }
            let rows = self
                .head
                .forward(&[tok], &feature, &mut self.caches, Logits::Last)?;
            let next = self.last_row(rows)?;
            row = next.logits;
            feature = next.hidden;
        }
        Ok(draft)
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

    fn observe_hidden(&mut self, log: &[u32], hidden: HiddenRows) -> Result<()> {
        // Row i reads f_i and x_{i+1}: the rows must end where the log's
        // last token is (the target holds all but it).
        ensure!(
            hidden.end() < log.len(),
            "hidden rows up to position {} for a log of {} tokens",
            hidden.end(),
            log.len()
        );
        if hidden.is_empty() {
            return Ok(());
        }
        // Kept until a round drafts: a round that drafts nothing (k = 0)
        // costs no head forward.
        let run: usize = self.pending.iter().map(|h| h.len()).sum();
        let follows = self.pending.last().is_some_and(|p| p.end() == hidden.start);
        if !follows || run + hidden.len() > MAX_PENDING {
            self.pending.clear();
        }
        self.pending.push(hidden);
        Ok(())
    }
}

/// Rows kept for the head without a draft beyond this many start its cache
/// afresh from the latest (a long stretch of k = 0 rounds).
const MAX_PENDING: usize = 2048;

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

    fn observe_hidden(&mut self, log: &[u32], hidden: HiddenRows) -> Result<()> {
        self.mtp.observe_hidden(log, hidden)
    }
}
