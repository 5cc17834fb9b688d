//! The MTP drafter: drafts with a head trained on the target's own hidden
//! states ([`crate::model::mtp::MtpHead`]).
//!
//! Every forward of its request returns the last layer's rows
//! ([`super::Verified::hidden`]); each round hands it those of the
//! positions kept since the last ([`super::RoundRequest::hidden`]), and
//! when the round drafts it feeds its
//! head one row per committed position it has not read (the feature f_i
//! and the token x_{i+1}): the head's cache then holds every position the
//! target read, and its last row predicts the token after the last
//! committed one. Each further draft
//! token is one head forward over the previous row's output (chained, as
//! DeepSeek's MTP and EAGLE draft). Those chained entries are dropped from
//! the head's cache at the next round, when the target's rows for what was
//! kept replace them.
use super::draft::{draw, draw_on, softmax_stats, Draft, DraftHook, DraftProb};
use super::target::HiddenRows;
use crate::cache::LayerCache;
use crate::model::mtp::{HeadIn, MtpHead};
use crate::sampling::{Rng, SamplingParams};
use anyhow::{ensure, Result};
use specd_mlx::Array;
use specd_policy::DraftStep;
use std::sync::Arc;

pub struct MtpDrafter {
    pub(super) name: String,
    pub(super) head: Arc<MtpHead>,
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

    /// The target's rows it has not read, as one run, with its cache made
    /// ready to read them (`None`: nothing new).
    fn catch_up_input(&mut self) -> Result<Option<HiddenRows>> {
        if self.pending.is_empty() {
            return Ok(None);
        }
        let run = std::mem::take(&mut self.pending);
        let rows = run.iter().map(|h| &h.rows).collect::<Vec<_>>();
        let hidden = HiddenRows {
            start: run[0].start,
            rows: specd_mlx::ops::concatenate(&rows, 1)?,
        };
        if hidden.start < self.base || hidden.start > self.fed {
            // A gap (a prefix from the cache, a preemption, a long stretch
            // without drafts): start over from these rows. Rope is
            // relative, so the head's positions may start anywhere.
            self.caches = self.head.new_caches();
            self.base = hidden.start;
            self.fed = hidden.start;
        }
        self.rewind_to(hidden.start);
        Ok(Some(hidden))
    }

    /// The draft token from the head's logits row, and its statistics.
    fn pick(
        &self,
        row: &[f32],
        params: &SamplingParams,
        history: &[u32],
        rng: &mut Rng,
    ) -> (u32, DraftProb, (f32, f32)) {
        if params.plain_greedy() {
            // The one-hot distribution at the argmax, without building it
            // over the whole vocabulary (argmax_margin's first-index rule).
            let (best, _) = crate::sampling::argmax_margin(row);
            let (entropy, top1) = softmax_stats(row);
            return (
                self.head.target_id(best as usize),
                DraftProb::PointMass,
                (entropy, top1),
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
        draw(&full, row, params, history, rng)
    }

    /// Keeps the target's rows `hidden` (of `log`'s positions) until a
    /// round drafts ([`super::Drafter::observe_hidden`]).
    pub fn keep_rows(&mut self, log: &[u32], hidden: HiddenRows) -> Result<()> {
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

/// One request's head round, drafted in lockstep with the other head
/// rounds of a batched step ([`draft_heads`]).
pub struct HeadRound<'a> {
    pub drafter: &'a mut MtpDrafter,
    /// The committed tokens, the last not yet forwarded.
    pub log: &'a [u32],
    pub k: usize,
    pub params: &'a SamplingParams,
    pub rng: &'a mut Rng,
    /// Contract 0.2's per-token hook (`None`: the schedule has none).
    pub hook: Option<DraftHook<'a>>,
    /// What it drafted.
    pub draft: Draft,
}

/// Where a round's chain of draft tokens stands.
struct Chain {
    row: Vec<f32>,
    feature: Array,
    history: Vec<u32>,
}

/// Drafts every round of `rounds`, each as it would be drafted alone, with
/// one head forward per step for all the rounds that share a head: first
/// the catch-ups over the target's rows each head has not read, then each
/// chained draft token. Its drafts are left in each round's `draft`.
pub fn draft_heads(rounds: &mut [HeadRound<'_>]) -> Result<()> {
    // 1. The catch-ups: the last row predicts the token after the log.
    let feeds = (rounds.iter_mut())
        .map(|r| match r.k {
            0 => Ok(None),
            _ => r.drafter.catch_up_input(),
        })
        .collect::<Result<Vec<_>>>()?;
    let inputs: Vec<_> = (rounds.iter().zip(&feeds))
        .map(|(r, f)| {
            f.as_ref()
                .map(|h| (r.log[h.start + 1..h.end() + 1].to_vec(), h.rows.clone()))
        })
        .collect();
    let rows = forward_grouped(rounds, &inputs)?;
    for ((r, f), row) in rounds.iter_mut().zip(&feeds).zip(rows) {
        if let (Some(h), Some(row)) = (f, row) {
            r.drafter.fed = h.end();
            r.drafter.last = Some(row);
        }
    }
    // 2. The head must have read every position the target has: else it
    //    predicts for another place (no features came: nothing to draft).
    let mut chains: Vec<Option<Chain>> = (rounds.iter_mut())
        .map(|r| {
            let d = &mut *r.drafter;
            let last = d
                .last
                .as_ref()
                .filter(|_| r.k > 0 && d.fed + 1 == r.log.len())?;
            let chain = Chain {
                row: last.logits.clone(),
                feature: last.hidden.clone(),
                history: r.log.to_vec(),
            };
            d.rewind_to(d.fed);
            Some(chain)
        })
        .collect();
    // 3. The chained tokens, one head forward for every round going on.
    let mut always = |_: &DraftStep| true;
    loop {
        let mut inputs: Vec<Option<(Vec<u32>, Array)>> = vec![None; rounds.len()];
        for ((r, chain), input) in rounds.iter_mut().zip(&mut chains).zip(&mut inputs) {
            let Some(c) = chain.as_mut() else { continue };
            let picked = r.drafter.pick(&c.row, r.params, &c.history, r.rng);
            let tok = picked.0;
            let hook: DraftHook<'_> = match r.hook.as_mut() {
                Some(h) => &mut **h,
                None => &mut always,
            };
            if draw_on(&mut r.draft, &mut c.history, picked, r.k, hook) {
                *input = Some((vec![tok], c.feature.clone()));
            } else {
                *chain = None;
            }
        }
        if inputs.iter().all(Option::is_none) {
            return Ok(());
        }
        let rows = forward_grouped(rounds, &inputs)?;
        for (chain, row) in chains.iter_mut().zip(rows) {
            if let (Some(c), Some(row)) = (chain.as_mut(), row) {
                c.row = row.logits;
                c.feature = row.hidden;
            }
        }
    }
}

/// The head rows of every round given an input (tokens x_{i+1} and their
/// features), one forward per distinct head; per round, its last row (the
/// logits on the host, the output kept), evaluated in one sync.
fn forward_grouped(
    rounds: &mut [HeadRound<'_>],
    inputs: &[Option<(Vec<u32>, Array)>],
) -> Result<Vec<Option<LastRow>>> {
    let mut lasts: Vec<Option<(Array, Array)>> = vec![None; rounds.len()];
    let mut done = vec![false; rounds.len()];
    for i in 0..rounds.len() {
        if done[i] || inputs[i].is_none() {
            continue;
        }
        let head = rounds[i].drafter.head.clone();
        let mut members = Vec::new();
        let mut items = Vec::new();
        for (j, r) in rounds.iter_mut().enumerate().skip(i) {
            if let (Some((tokens, features)), false) = (&inputs[j], done[j]) {
                if Arc::ptr_eq(&r.drafter.head, &head) {
                    members.push(j);
                    items.push(HeadIn {
                        tokens,
                        features,
                        caches: &mut r.drafter.caches,
                    });
                }
            }
        }
        let rows = head.forward_many(&mut items)?;
        for (j, rows) in members.into_iter().zip(rows) {
            let (t, d) = (rows.hidden.dim(1), rows.hidden.dim(2));
            let hidden = rows.hidden.slice(&[0, t - 1, 0], &[1, t, d])?;
            lasts[j] = Some((rows.logits, hidden));
            done[j] = true;
        }
    }
    let all: Vec<&Array> = lasts.iter().flatten().flat_map(|(l, h)| [l, h]).collect();
    specd_mlx::eval(&all)?;
    lasts
        .into_iter()
        .map(|l| {
            l.map(|(logits, hidden)| {
                Ok(LastRow {
                    logits: logits.to_vec_f32()?,
                    hidden,
                })
            })
            .transpose()
        })
        .collect()
}

/// Rows kept for the head without a draft beyond this many start its cache
/// afresh from the latest (a long stretch of k = 0 rounds).
const MAX_PENDING: usize = 2048;
