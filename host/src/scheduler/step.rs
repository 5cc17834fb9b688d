//! One step over every running request, in three parts: **schedule**
//! (each request's rows: a prefill chunk while the step's prefill rows
//! last, else a round planned by its schedule, the head rounds drafted
//! together), **execute** (one forward over every row) and **update**
//! (each round's rows masked, read, decided and applied; the cost model
//! told what the step took). There is no decoding phase and no prefill
//! phase: a step carries both.
use super::cost::StepSplit;
use super::{Scheduler, StepReport};
use crate::model::Logits;
use crate::sequence::{draft_head_rounds, Deciding, HeadTurn, VerifyTime};
use crate::speculation::target::{forward_batch_verify, StepRows};
use crate::speculation::{read_rows, row_threads, Decided, Verified, VerifyMode, VerifyRows};
use crate::speculation::{BatchContext, HeadJob, MaskedRows, Plan, RoundPlan};
use anyhow::{anyhow, Result};
use std::time::Instant;

/// What the step's forward gave back, and what it took.
struct Executed {
    rows: Result<Vec<Verified>>,
    /// Requests in it.
    sequences: usize,
    seconds: f64,
    /// Rows it forwarded.
    rows_total: usize,
    /// Each round's rows, in order (prefill chunks are the rest).
    round_rows: Vec<usize>,
}

impl<'e> Scheduler<'e> {
    /// One step over every active request. `quiet` says whether nothing
    /// waits to be admitted: a request alone then decodes overlapped (plain
    /// greedy) until something arrives or it ends.
    pub fn step(&mut self, quiet: &mut dyn FnMut() -> bool) -> StepReport {
        let t0 = Instant::now();
        self.retire();
        self.start_waiting();
        let mut report = StepReport {
            preempted: self.preempt_for_step(),
            ..Default::default()
        };
        if self.active.is_empty() {
            return report;
        }
        if self.ran_alone(quiet, &mut report) {
            report.seconds = t0.elapsed().as_secs_f64();
            self.retire();
            return report;
        }
        let policy_before = self.policy_seconds();
        let mut planned = self.schedule();
        report.head_rounds = self.draft_heads(&mut planned);
        if planned.iter().flatten().count() == 0 {
            self.retire();
            return report;
        }
        let done = self.execute(&planned);
        let split = self.learn(&done, &mut report);
        self.update(planned, done, split, &mut report);
        report.policy_seconds = self.policy_seconds() - policy_before;
        report.seconds = t0.elapsed().as_secs_f64();
        self.retire();
        report
    }

    /// A request running alone with nothing waiting decodes overlapped
    /// while `quiet` holds; true when it did.
    fn ran_alone(&mut self, quiet: &mut dyn FnMut() -> bool, report: &mut StepReport) -> bool {
        if !(self.active.len() == 1
            && self.waiting.is_empty()
            && self.active[0].seq.can_overlap()
            && quiet())
        {
            return false;
        }
        let a = &mut self.active[0];
        match a.seq.run_overlapped(&mut a.target, quiet) {
            Ok(true) => {
                report.sequences = 1;
                report.overlapped = true;
                true
            }
            Ok(false) => false,
            Err(e) => {
                a.failed = Some(e);
                false
            }
        }
    }

    fn policy_seconds(&self) -> f64 {
        self.active.iter().map(|a| a.seq.policy_seconds()).sum()
    }

    /// Who is in the step and with which rows: those in prefill while the
    /// step's prefill rows last, then every request ready for a round,
    /// planned in admission order (each schedule sees the batch so far).
    fn schedule(&mut self) -> Vec<Option<Planned>> {
        let decoding = self.active.iter().filter(|a| a.seq.decoding()).count();
        let (chunks, rows) = self.prefill_chunks(self.prefill_budget(decoding));
        let in_step = decoding + chunks.iter().flatten().count();
        self.plan_rounds(chunks, rows, in_step)
    }

    /// Each request's prefill chunk, while `budget` rows last; and the rows.
    fn prefill_chunks(&self, mut budget: usize) -> (Vec<Option<Planned>>, usize) {
        let mut rows = 0;
        let chunks = (self.active.iter())
            .map(|a| {
                if a.failed.is_some() || a.seq.prefill_left() == 0 || budget == 0 {
                    return None;
                }
                let c = a.seq.prefill_chunk(budget).to_vec();
                budget -= c.len();
                rows += c.len();
                // The prompt's logprobs come from this forward's rows.
                let logits = a.seq.wants_prefill_rows().then_some(Logits::All);
                Some(Planned {
                    logits,
                    work: Work::Prefill(c),
                })
            })
            .collect();
        (chunks, rows)
    }

    /// The rounds of the requests without a chunk that decode. A round
    /// its MTP head drafts is a head job until every schedule answered
    /// ([`Scheduler::draft_heads`]).
    fn plan_rounds(
        &mut self,
        chunks: Vec<Option<Planned>>,
        mut rows_planned: usize,
        in_step: usize,
    ) -> Vec<Option<Planned>> {
        let mut planned = Vec::with_capacity(self.active.len());
        for (a, chunk) in self.active.iter_mut().zip(chunks) {
            if chunk.is_some() || a.failed.is_some() || !a.seq.decoding() {
                planned.push(chunk);
                continue;
            }
            let ctx = BatchContext {
                batch_sequences: in_step as u32,
                batch_rows_planned: rows_planned as u32,
            };
            match a.seq.plan(&mut a.target, ctx) {
                Ok(Plan::Ready(round)) => {
                    rows_planned += round.rows.len();
                    planned.push(Some(Planned::round(round)));
                }
                Ok(Plan::Head(job)) => {
                    // A head round not drafted yet counts every row it asked.
                    rows_planned += job.asked() + 1;
                    planned.push(Some(Planned {
                        logits: Some(Logits::Last),
                        work: Work::Head(Box::new(job)),
                    }));
                }
                Err(e) => {
                    a.failed = Some(e);
                    planned.push(None);
                }
            }
        }
        planned
    }

    /// Drafts the step's head jobs together: one head forward per draft
    /// step for all of them ([`draft_head_rounds`]), then each becomes its
    /// round's plan. Returns how many became plans.
    fn draft_heads(&mut self, planned: &mut [Option<Planned>]) -> usize {
        let mut which = Vec::new();
        let mut turns = Vec::new();
        for (i, (a, p)) in self.active.iter_mut().zip(planned.iter_mut()).enumerate() {
            if !matches!(
                p,
                Some(Planned {
                    work: Work::Head(_),
                    ..
                })
            ) {
                continue;
            }
            let Some(Planned {
                work: Work::Head(job),
                ..
            }) = p.take()
            else {
                unreachable!("matched above");
            };
            which.push(i);
            turns.push(HeadTurn {
                seq: &mut a.seq,
                target: &mut a.target,
                job: *job,
            });
        }
        if turns.is_empty() {
            return 0;
        }
        let mut n = 0;
        for (&i, plan) in which.iter().zip(draft_head_rounds(turns)) {
            match plan {
                Ok(plan) => {
                    planned[i] = Some(Planned::round(plan));
                    n += 1;
                }
                Err(e) => self.active[i].failed = Some(e),
            }
        }
        n
    }

    /// One forward over every planned row. A round reads back what it
    /// would alone: a plain greedy one only its rows' argmax and margin.
    fn execute(&mut self, planned: &[Option<Planned>]) -> Executed {
        let modes: Vec<VerifyMode> = (self.active.iter().zip(planned))
            .filter_map(|(a, p)| {
                p.as_ref().map(|p| match p.work {
                    Work::Round(_) | Work::Head(_) => a.seq.verify_mode(),
                    Work::Prefill(_) => VerifyMode::Rows,
                })
            })
            .collect();
        let t = Instant::now();
        let mut parts: Vec<StepRows<'_>> = (self.active.iter_mut().zip(planned))
            .filter_map(|(a, p)| {
                p.as_ref().map(|p| StepRows {
                    target: &mut a.target,
                    tokens: p.tokens(),
                    logits: p.logits,
                    taps: a.seq.taps(),
                })
            })
            .collect();
        let rows = forward_batch_verify(&self.engine.model, &mut parts, &modes);
        Executed {
            rows,
            sequences: parts.len(),
            seconds: t.elapsed().as_secs_f64(),
            rows_total: planned.iter().flatten().map(|p| p.tokens().len()).sum(),
            round_rows: (planned.iter().flatten())
                .filter_map(|p| match &p.work {
                    Work::Round(r) => Some(r.rows.len()),
                    Work::Prefill(_) | Work::Head(_) => None,
                })
                .collect(),
        }
    }

    /// Tells the cost model what the step took; returns the step's time as
    /// each round sees it. The curve is learnt from rounds only: a prefill
    /// row skips the vocabulary head, so it costs less than a verify row
    /// and would make drafts look cheaper than they are.
    fn learn(&mut self, done: &Executed, report: &mut StepReport) -> StepSplit {
        let (vt, total) = (done.seconds, done.rows_total);
        let rounds = done.round_rows.len();
        let split = self.fit.rounds.split(vt, total, rounds);
        let prefill_rows = total - done.round_rows.iter().sum::<usize>();
        report.sequences = done.sequences;
        report.rows = total;
        report.prefill_rows = prefill_rows;
        if prefill_rows == 0 {
            self.fit.rounds.add(total, vt);
            self.fit.prefill.decode_step(vt);
        } else {
            self.fit.prefill.prefill_step(vt, prefill_rows, rounds > 0);
        }
        split
    }

    /// Hands each request its rows: a chunk's are kept (or build the
    /// prompt's logprobs); a round's are masked one request at a time,
    /// read all together, decided (on several threads where the
    /// acceptance calls are dear) and applied in order.
    fn update(
        &mut self,
        planned: Vec<Option<Planned>>,
        done: Executed,
        split: StepSplit,
        report: &mut StepReport,
    ) {
        let rows = match done.rows {
            Ok(rows) => rows,
            Err(e) => {
                // Their caches may hold part of the step: none can go on.
                let msg = format!("{e:#}");
                for (a, p) in self.active.iter_mut().zip(planned) {
                    if p.is_some() {
                        a.failed = Some(anyhow!("the batched forward failed: {msg}"));
                    }
                }
                return;
            }
        };
        let (rounds, masked) = self.take_rows(planned, rows, done.sequences);
        let read = read_rows(masked, row_threads());
        let mut jobs = Vec::with_capacity(rounds.len());
        let mut active = self.active.iter_mut().enumerate();
        for ((i, round), r) in rounds.into_iter().zip(read) {
            let a = active.find(|(j, _)| *j == i).expect("in admission order").1;
            let rows = round.rows.len();
            let time = VerifyTime {
                lone: split.lone(rows),
                share: split.of(rows),
            };
            jobs.push((i, a.seq.decide(*round, r, time)));
        }
        let (who, jobs): (Vec<usize>, Vec<_>) = jobs.into_iter().unzip();
        let (decided, threads) = decide_all(jobs, self.decide_threads, self.decide_parallel_from);
        report.decision_threads = threads;
        for (i, d) in who.into_iter().zip(decided) {
            let a = &mut self.active[i];
            if let Err(e) = d.and_then(|d| a.seq.apply(&mut a.target, d)) {
                a.failed = Some(e);
            }
        }
    }

    /// Each request's part of the step's rows: a prefill chunk's kept
    /// here, a round's masked and handed back with its request's index.
    /// The planned rounds leave `planned` here.
    #[allow(clippy::type_complexity)]
    fn take_rows(
        &mut self,
        planned: Vec<Option<Planned>>,
        rows: Vec<Verified>,
        n: usize,
    ) -> (Vec<(usize, Box<RoundPlan>)>, Vec<MaskedRows>) {
        let mut rows = rows.into_iter();
        let mut rounds = Vec::new();
        let mut masked = Vec::new();
        for (i, (a, p)) in self.active.iter_mut().zip(planned).enumerate() {
            let Some(p) = p else { continue };
            let r = rows.next().expect("one result per part");
            a.seq.joined_step(n);
            match p.work {
                Work::Prefill(tokens) => {
                    let kept = match (p.logits, r.rows) {
                        (None, _) => a.seq.prefilled(tokens.len(), r.hidden),
                        (Some(_), VerifyRows::Logits(rows)) => {
                            a.seq.prefilled_rows(&rows, r.hidden)
                        }
                        (Some(_), VerifyRows::Argmax(_)) => {
                            Err(anyhow!("a prefill chunk got argmax rows, not its logits"))
                        }
                    };
                    if let Err(e) = kept {
                        a.failed = Some(e.context("the prompt's logprobs"));
                    }
                }
                Work::Round(mut round) => {
                    let rows = round.verified(r);
                    match a.seq.read(&round, rows) {
                        Ok(m) => {
                            rounds.push((i, round));
                            masked.push(m);
                        }
                        Err(e) => a.failed = Some(e),
                    }
                }
                // Every head job is drafted (or its request failed) before
                // the forward: one here is a bug, failed, not a panic.
                Work::Head(_) => a.failed = Some(anyhow!("a round reached its verify undrafted")),
            }
        }
        (rounds, masked)
    }
}

/// Runs a step's round decisions ([`Deciding::run`]), in their order: on
/// up to `threads` threads where two or more make an acceptance call and
/// those are expected to take `parallel_from` seconds or more together (a
/// thread costs tens of microseconds to start; a built-in policy decides
/// in about ten, a Python one in about 130), else on this one. Each
/// request's decision reads and writes only its own state, so the threads
/// change no result. Returns the results and the threads they ran on (0:
/// none to run).
fn decide_all(
    jobs: Vec<Deciding<'_>>,
    threads: usize,
    parallel_from: f64,
) -> (Vec<Result<Decided>>, usize) {
    let calls = jobs.iter().filter(|j| j.estimate.is_some()).count();
    let cost = |j: &Deciding<'_>| j.estimate.unwrap_or(0.0);
    let total: f64 = jobs.iter().map(cost).sum();
    let threads = threads.min(calls);
    if threads < 2 || total < parallel_from {
        let n = usize::from(!jobs.is_empty());
        return (jobs.into_iter().map(Deciding::run).collect(), n);
    }
    // Dearest first, each to the least loaded thread.
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by(|&a, &b| cost(&jobs[b]).total_cmp(&cost(&jobs[a])));
    let mut load = vec![0.0f64; threads];
    let mut lanes: Vec<Vec<(usize, Deciding<'_>)>> = (0..threads).map(|_| Vec::new()).collect();
    let mut slots: Vec<Option<Deciding<'_>>> = jobs.into_iter().map(Some).collect();
    for i in order {
        let job = slots[i].take().expect("each job once");
        let t = (0..threads)
            .min_by(|&a, &b| {
                (load[a].total_cmp(&load[b])).then(lanes[a].len().cmp(&lanes[b].len()))
            })
            .expect("threads >= 2");
        load[t] += cost(&job);
        lanes[t].push((i, job));
    }
    let run = |lane: Vec<(usize, Deciding<'_>)>| {
        lane.into_iter()
            .map(|(i, j)| (i, j.run()))
            .collect::<Vec<_>>()
    };
    let mut done: Vec<(usize, Result<Decided>)> = crate::spread::on_threads(lanes, run)
        .into_iter()
        .flatten()
        .collect();
    done.sort_by_key(|(i, _)| *i);
    (done.into_iter().map(|(_, d)| d).collect(), threads)
}

/// Acceptance-call seconds per step from which [`decide_all`] spreads the
/// decisions over threads.
pub(super) const DECIDE_PARALLEL_FROM: f64 = 150e-6;

/// A request's rows in a step.
pub(super) struct Planned {
    /// Which rows' logits come back: a round's; for a prefill chunk none,
    /// or all where they build the prompt's logprobs.
    logits: Option<Logits>,
    work: Work,
}

/// What a request's rows in a step are for.
pub(super) enum Work {
    /// A chunk of its prompt (or of its log, re-prefilled after a
    /// preemption).
    Prefill(Vec<u32>),
    /// A round: its verify rows are [`RoundPlan::rows`]; the round passes
    /// on to reading, deciding and applying once the forward is done.
    Round(Box<RoundPlan>),
    /// A round its MTP head drafts, with the step's other head jobs,
    /// before the forward ([`Scheduler::draft_heads`]).
    Head(Box<HeadJob>),
}

impl Planned {
    /// A planned round: all its logits rows come back when it drafted,
    /// else the last.
    fn round(round: RoundPlan) -> Planned {
        let which = match round.drafted() {
            0 => Logits::Last,
            _ => Logits::All,
        };
        Planned {
            logits: Some(which),
            work: Work::Round(Box::new(round)),
        }
    }

    fn tokens(&self) -> &[u32] {
        match &self.work {
            Work::Prefill(t) => t,
            Work::Round(r) => &r.rows,
            Work::Head(_) => &[],
        }
    }
}
