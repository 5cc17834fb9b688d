//! Pipelined batched decoding. While every running request decodes greedy
//! one row per step (plain requests, and speculative ones whose schedule
//! asked no drafts or whose drafter had none: what `throughput` answers in
//! a full batch), nothing waits and the KV budget holds, the scheduler
//! queues the next step on the device before it reads the current one,
//! each row's token the device's argmax of the request's row in the
//! current step: building the next graph and the host's work on this
//! step's tokens overlap the forward, as
//! [`crate::speculation::Target::greedy_pipelined`] does for a request
//! alone. The forward is the unpipelined step's, so the tokens are too.
//!
//! Policies are asked as in unpipelined steps, never ahead of their
//! inputs: a speculative request's round is planned (its schedule asked)
//! after the step before it was read, and only then bound to the row
//! already queued for it. The queued row is a guess that the round is one
//! row and commits the device's argmax. Where it is not (the round drafted,
//! the request ended, or the device broke an exact tie otherwise than the
//! host's rule, the first index) the row is dropped when read, the
//! request's caches rewound, and the steps go on unpipelined, where a
//! round already planned is verified as planned. Requests retire only
//! after the step they were in was read, so no cache is handed on while a
//! queued step still writes it.
use super::{Scheduler, StepReport};
use crate::pipeline::VerifyTime;
use crate::speculation::target::queue_batch_greedy;
use crate::speculation::{BatchContext, RowArgmax, Target, VerifyMode, VerifyRows};
use anyhow::{anyhow, Result};
use specd_mlx::Array;
use std::time::Instant;

/// A batched step of one greedy row per request, in flight.
pub(super) struct Ahead {
    /// Its requests, in row order (`Active::id`).
    ids: Vec<u64>,
    /// Per row, whether the token it forwards is the request's committed
    /// one and, for a speculative request, its planned round's one row
    /// (false: dropped when read).
    valid: Vec<bool>,
    /// `[n, vocab]` and their argmax `[n]`, queued.
    logits: Array,
    next: Array,
}

impl<'e> Scheduler<'e> {
    /// Whether the running requests may decode pipelined for one more step
    /// after the current one: two or more, exactly `ids` where a step is
    /// in flight, every one greedy with one-row rounds
    /// ([`crate::pipeline::Sequence::can_pipeline_batched`]) and two tokens
    /// or more left (the step ahead is needed unless it ends otherwise),
    /// nothing waiting, and room in the KV budget for two more rows each.
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
        let ready = self.active.iter().all(|a| {
            a.failed.is_none() && a.seq.can_pipeline_batched() && a.seq.tokens_left() >= 2
        });
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

    /// Plans the next round of every speculative request, in admission
    /// order, for a step of one row each; true where every one planned one
    /// row. A request whose plan drafted keeps it for an unpipelined step.
    fn plan_one_row_rounds(&mut self) -> bool {
        let n = self.active.len() as u32;
        let mut one_row = true;
        for (i, a) in self.active.iter_mut().enumerate() {
            if !a.seq.speculates() {
                continue;
            }
            let ctx = BatchContext {
                batch_sequences: n,
                batch_rows_planned: i as u32,
            };
            match a.seq.plan(&mut a.target, ctx) {
                Ok((rows, _)) => one_row &= rows.len() == 1,
                Err(e) => {
                    a.failed = Some(e);
                    one_row = false;
                }
            }
        }
        one_row
    }

    /// Reads the pipelined step in flight (queuing the next one first where
    /// [`Scheduler::may_pipeline`]), or starts pipelining when it may.
    /// `None`: this step runs unpipelined.
    pub(super) fn step_ahead(
        &mut self,
        quiet: &mut dyn FnMut() -> bool,
        t0: Instant,
    ) -> Option<StepReport> {
        let policy_before: f64 = self.active.iter().map(|a| a.seq.policy_seconds()).sum();
        let cur = match self.ahead.take() {
            Some(cur) => cur,
            None => {
                if !self.may_pipeline(None, quiet) || !self.plan_one_row_rounds() {
                    return None;
                }
                let pending: Vec<u32> = self.active.iter().map(|a| a.seq.pending_token()).collect();
                let queued = Array::from_u32(&pending, &[pending.len() as i32])
                    .map_err(anyhow::Error::from)
                    .and_then(|ids| self.queue_ahead(&ids));
                match queued {
                    Ok(a) => a,
                    Err(e) => {
                        let ids: Vec<u64> = self.active.iter().map(|a| a.id).collect();
                        return Some(self.failed_step(&ids, &e));
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
                // Both steps wrote the caches: nobody in them can go on.
                Err(e) => return Some(self.failed_step(&cur.ids, &e)),
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
                return Some(self.failed_step(&ids, &e));
            }
        };
        let vocab = logits.len() / cur.ids.len().max(1);
        let n = cur.valid.iter().filter(|v| **v).count();
        let seconds = t0.elapsed().as_secs_f64();
        let split = self.curve.split(seconds, n, n);
        let time = VerifyTime {
            lone: split.lone(1),
            share: split.of(1),
        };
        let mut planned = 0u32;
        for (row, (id, valid)) in cur.ids.iter().zip(&cur.valid).enumerate() {
            let Some(a) = self.active.iter_mut().find(|a| a.id == *id) else {
                continue;
            };
            if !valid {
                // Its row forwarded a token it did not commit, or the
                // round it planned is not that one row.
                if let Err(e) = a.target.rewind(a.seq.cached_len()) {
                    a.failed = Some(e);
                }
                continue;
            }
            let logits = &logits[row * vocab..(row + 1) * vocab];
            let row_argmax = RowArgmax::of(logits);
            let goes_on = if a.seq.speculates() {
                let rows = match a.seq.verify_mode() {
                    VerifyMode::Argmax => VerifyRows::Argmax(vec![row_argmax]),
                    VerifyMode::Rows => VerifyRows::Logits(vec![logits.to_vec()]),
                };
                a.seq.joined_step(n);
                match a.seq.complete(&mut a.target, rows, time) {
                    Ok(()) => !a.seq.is_done(),
                    Err(e) => {
                        a.failed = Some(e);
                        false
                    }
                }
            } else {
                a.seq
                    .commit_step_token(row_argmax.argmax, row_argmax.margin, time.share, n)
            };
            let Some(next) = ahead.as_mut() else {
                continue;
            };
            // The row ahead forwarded the device's argmax: it stands for
            // the request's next round where that round is one row of the
            // token committed.
            let mut ok = goes_on && fed[row] == a.seq.pending_token();
            if ok && a.seq.speculates() {
                let ctx = BatchContext {
                    batch_sequences: next.ids.len() as u32,
                    batch_rows_planned: planned,
                };
                ok = match a.seq.plan(&mut a.target, ctx) {
                    Ok((rows, _)) => rows.len() == 1,
                    Err(e) => {
                        a.failed = Some(e);
                        false
                    }
                };
            }
            planned += 1;
            next.valid[row] = ok;
        }
        let queued_next = ahead.is_some();
        self.ahead = ahead;
        let policy_seconds = self
            .active
            .iter()
            .map(|a| a.seq.policy_seconds())
            .sum::<f64>()
            - policy_before;
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
            policy_seconds,
            ..Default::default()
        })
    }

    /// Fails the running requests `ids` with `e` (their caches may hold
    /// part of a step) and retires them.
    fn failed_step(&mut self, ids: &[u64], e: &anyhow::Error) -> StepReport {
        let msg = format!("{e:#}");
        for a in self.active.iter_mut().filter(|a| ids.contains(&a.id)) {
            a.failed = Some(anyhow!("the batched forward failed: {msg}"));
        }
        self.ahead = None;
        self.retire();
        StepReport::default()
    }
}
