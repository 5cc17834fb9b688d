//! Pipelined batched decoding. While every running request decodes plain
//! greedy (nothing to sample, draft, trace, constrain or report logprobs
//! of), nothing waits and the KV budget holds, the scheduler queues the
//! next step on the device before it reads the current one, its tokens the
//! device's argmax of the current step's rows: building the next graph and
//! the host's work on this step's tokens overlap the forward, as
//! [`crate::speculation::Target::greedy_pipelined`] does for a request
//! alone. The forward is the unpipelined step's, so the tokens are too.
//!
//! A queued step is a guess that every request in it goes on. Where one
//! ends (EOS, a stop string, a cancelled client) its row in the step ahead
//! is dropped; where the device broke an exact tie otherwise than the
//! host's rule (the first index), the row forwarded the wrong token and is
//! dropped too, and the request's caches rewound: its next step forwards
//! the host's token. Requests retire only after the step they were in was
//! read, so no cache is handed on while a queued step still writes it.
use super::{Scheduler, StepReport};
use crate::sampling::argmax_margin;
use crate::speculation::target::queue_batch_greedy;
use crate::speculation::Target;
use anyhow::{anyhow, Result};
use specd_mlx::Array;
use std::time::Instant;

/// A batched step of plain greedy decoding in flight.
pub(super) struct Ahead {
    /// Its requests, in row order (`Active::id`).
    ids: Vec<u64>,
    /// Per row, whether the token it forwards is the request's committed
    /// one (false: dropped when read).
    valid: Vec<bool>,
    /// `[n, vocab]` and their argmax `[n]`, queued.
    logits: Array,
    next: Array,
}

impl<'e> Scheduler<'e> {
    /// Whether the running requests may decode pipelined for one more step
    /// after the current one: two or more, exactly `ids` where a step is
    /// in flight, every one plain greedy with two tokens or more left (the
    /// step ahead is needed unless it ends otherwise), nothing waiting, and
    /// room in the KV budget for two more rows each.
    fn may_pipeline(&self, ids: Option<&[u64]>, quiet: &mut dyn FnMut() -> bool) -> bool {
        if self.active.len() < 2
            || !self.waiting.is_empty()
            || self.engine.model.config.sliding_window.is_some()
        {
            return false;
        }
        if let Some(ids) = ids {
            if ids.len() != self.active.len()
                || ids.iter().zip(&self.active).any(|(i, a)| *i != a.id)
            {
                return false;
            }
        }
        let ready = self
            .active
            .iter()
            .all(|a| a.failed.is_none() && a.seq.can_pipeline() && a.seq.tokens_left() >= 2);
        if !ready {
            return false;
        }
        if let Some(budget) = self.limits.kv_budget {
            let peak: usize = self
                .active
                .iter()
                .map(|a| (a.seq.kv_tokens() + 2) * a.per_token)
                .sum();
            if peak > budget {
                return false;
            }
        }
        quiet()
    }

    /// Queues one step of the running requests (in `active` order) whose
    /// rows forward `ids` `[n]`.
    fn queue_ahead(&mut self, ids: &Array) -> Result<Ahead> {
        let engine = self.engine;
        let mut targets: Vec<_> = self.active.iter_mut().map(|a| &mut a.target).collect();
        let (logits, next) = queue_batch_greedy(&engine.model, &mut targets, ids)?;
        Ok(Ahead {
            ids: self.active.iter().map(|a| a.id).collect(),
            valid: vec![true; self.active.len()],
            logits,
            next,
        })
    }

    /// Reads the pipelined step in flight (queuing the next one first where
    /// [`Scheduler::may_pipeline`]), or starts pipelining when it may.
    /// `None`: this step runs unpipelined.
    pub(super) fn step_ahead(
        &mut self,
        quiet: &mut dyn FnMut() -> bool,
        t0: Instant,
    ) -> Option<StepReport> {
        let cur = match self.ahead.take() {
            Some(cur) => cur,
            None => {
                if !self.may_pipeline(None, quiet) {
                    return None;
                }
                let pending: Vec<u32> = self.active.iter().map(|a| a.seq.pending_token()).collect();
                let queued = Array::from_u32(&pending, &[pending.len() as i32])
                    .map_err(anyhow::Error::from)
                    .and_then(|ids| self.queue_ahead(&ids));
                match queued {
                    Ok(a) => a,
                    Err(e) => {
                        self.fail_rows(&self.active.iter().map(|a| a.id).collect::<Vec<_>>(), &e);
                        self.retire();
                        return Some(StepReport::default());
                    }
                }
            }
        };
        // The step after this one goes on the device before this one is
        // read, if every request in it goes on as it is.
        let mut ahead = None;
        if cur.valid.iter().all(|v| *v) && self.may_pipeline(Some(&cur.ids), quiet) {
            match self.queue_ahead(&cur.next) {
                Ok(a) => ahead = Some(a),
                Err(e) => {
                    // Both steps wrote the caches: nobody in them can go on.
                    self.fail_rows(&cur.ids, &e);
                    self.retire();
                    return Some(StepReport::default());
                }
            }
        }
        let read = (|| -> Result<(Vec<f32>, Vec<u32>)> {
            Ok((cur.logits.to_vec_f32()?, cur.next.to_vec_u32()?))
        })();
        let (logits, fed) = match read {
            Ok(r) => r,
            Err(e) => {
                let mut ids = cur.ids.clone();
                ids.extend(ahead.iter().flat_map(|a| a.ids.iter().copied()));
                self.fail_rows(&ids, &e);
                self.retire();
                return Some(StepReport::default());
            }
        };
        let vocab = logits.len() / cur.ids.len().max(1);
        let n = cur.valid.iter().filter(|v| **v).count();
        let seconds = t0.elapsed().as_secs_f64();
        for (row, (id, valid)) in cur.ids.iter().zip(&cur.valid).enumerate() {
            let Some(a) = self.active.iter_mut().find(|a| a.id == *id) else {
                continue;
            };
            if !valid {
                // Its row forwarded a token it did not commit.
                if let Err(e) = a.target.rewind(a.seq.cached_len()) {
                    a.failed = Some(e);
                }
                continue;
            }
            let (tok, margin) = argmax_margin(&logits[row * vocab..(row + 1) * vocab]);
            let goes_on = a.seq.commit_step_token(tok, margin, seconds / n as f64, n);
            if let Some(next) = ahead.as_mut() {
                // The row ahead forwarded the device's argmax.
                next.valid[row] = goes_on && fed[row] == tok;
            }
        }
        let queued_next = ahead.is_some();
        self.ahead = ahead;
        self.retire();
        // Nobody left to read the step ahead for.
        if let Some(a) = &self.ahead {
            if !a
                .ids
                .iter()
                .any(|id| self.active.iter().any(|x| x.id == *id))
            {
                self.ahead = None;
            }
        }
        Some(StepReport {
            sequences: n,
            rows: cur.ids.len(),
            seconds: t0.elapsed().as_secs_f64(),
            queued_next,
            ..Default::default()
        })
    }

    /// Fails the running requests `ids` with `e` (their caches may hold part
    /// of a step).
    fn fail_rows(&mut self, ids: &[u64], e: &anyhow::Error) {
        let msg = format!("{e:#}");
        for a in self.active.iter_mut().filter(|a| ids.contains(&a.id)) {
            a.failed = Some(anyhow!("the batched forward failed: {msg}"));
        }
        self.ahead = None;
    }
}
