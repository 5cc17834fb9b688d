//! Continuous batching: one scheduler owns the model and runs steps. At
//! each step boundary requests are admitted and finished ones retired; a
//! step's rows are every active request's rows (a prefill chunk, one row for
//! a plain step, 1 + k for a speculative round) in one forward through the
//! matmuls, with attention per request over its own caches
//! ([`forward_batch`]). Everything else stays per request: drafter,
//! policies (their own WASM stores), sampling, RNG, stops, budget. With the
//! batch-invariant kernels a request's tokens are those it gets alone.
//!
//! Memory: admission reserves a request's prompt plus a share of the KV
//! budget (not its worst case); caches grow step by step. When a step would
//! pass the budget, the most recently admitted request is preempted: its KV
//! is dropped, it goes back to the front of the line, and it is re-prefilled
//! from its committed log when it resumes (same tokens, later). A request
//! running alone is never preempted. Drafter caches (`self:N`) are not
//! counted.
use crate::engine::Engine;
use crate::model::LlamaConfig;
use crate::model::Logits;
use crate::pipeline::PREFILL_CHUNK;
use crate::pipeline::{Finished, Sequence, Settings, Sink};
use crate::speculation::target::{forward_batch, StepRows};
use crate::speculation::{BatchContext, LlamaTarget, Speculation};
use anyhow::{anyhow, Result};
use std::collections::VecDeque;
use std::time::Instant;

/// Default most requests in one step.
pub const DEFAULT_MAX_SEQUENCES: usize = 16;
/// Default most prefill rows in one step (decode rows come first).
pub const DEFAULT_STEP_TOKENS: usize = 512;

#[derive(Debug, Clone, Copy)]
pub struct BatchLimits {
    /// Requests running at once (`--max-sequences`); more wait in the queue.
    pub max_sequences: usize,
    /// Rows of prefill one step takes at most besides the decode rows
    /// (`--step-tokens`), so one long prompt never stalls the others.
    pub step_tokens: usize,
    /// Bytes of KV cache the running requests may hold together
    /// (`--kv-budget`); `None`: no bound.
    pub kv_budget: Option<usize>,
}

/// Bytes of KV cache one token takes: float32 keys and values, every layer.
pub fn kv_bytes_per_token(c: &LlamaConfig) -> usize {
    c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * 4
}

/// The default KV budget: a quarter of the machine's memory (4 GiB where
/// it cannot be read).
pub fn default_kv_budget() -> usize {
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
            .map(|kb| kb * 1024)
    });
    total.map_or(4 << 30, |t| t / 4)
}

impl Default for BatchLimits {
    fn default() -> Self {
        BatchLimits {
            max_sequences: DEFAULT_MAX_SEQUENCES,
            step_tokens: DEFAULT_STEP_TOKENS,
            kv_budget: None,
        }
    }
}

/// Called once when a request ends: its outcome, or why it failed.
pub type Done<'e> = Box<dyn FnOnce(Result<Finished>) + 'e>;

/// A request ready to run: checked, its prompt encoded, its speculation
/// built.
pub struct Admitted<'e> {
    /// Its part of the prefix cache; `None`: none.
    pub tenant: Option<String>,
    pub prompt: Vec<u32>,
    pub settings: Settings,
    pub spec: Option<Speculation>,
    /// Receives its text; returns false once the client is gone.
    pub sink: Box<Sink<'e>>,
    pub done: Done<'e>,
}

struct Active<'e> {
    /// Admission order.
    id: u64,
    seq: Sequence<'e>,
    target: LlamaTarget,
    tenant: Option<String>,
    done: Option<Done<'e>>,
    failed: Option<anyhow::Error>,
}

/// What one step did (for metrics).
#[derive(Debug, Clone, Copy, Default)]
pub struct StepReport {
    /// Requests in the step.
    pub sequences: usize,
    /// Rows it forwarded.
    pub rows: usize,
    pub seconds: f64,
    /// The step ran one request alone, pipelined.
    pub pipelined: bool,
    /// Requests preempted before it.
    pub preempted: usize,
}

/// A request waiting to start or to resume. At most `max_sequences` wait:
/// their size does not matter.
#[allow(clippy::large_enum_variant)]
enum Waiting<'e> {
    Fresh(Admitted<'e>),
    /// Preempted: its KV was dropped; it resumes by re-prefilling its log.
    Preempted(Active<'e>),
}

pub struct Scheduler<'e> {
    engine: &'e Engine,
    limits: BatchLimits,
    /// In admission order.
    active: Vec<Active<'e>>,
    /// Admitted but not running (yet, or again), in order.
    waiting: VecDeque<Waiting<'e>>,
    next_id: u64,
    /// KV bytes of one token.
    per_token: usize,
}

impl<'e> Scheduler<'e> {
    pub fn new(engine: &'e Engine, limits: BatchLimits) -> Self {
        Scheduler {
            engine,
            limits,
            active: Vec::new(),
            waiting: VecDeque::new(),
            next_id: 0,
            per_token: kv_bytes_per_token(&engine.model.config),
        }
    }

    pub fn is_idle(&self) -> bool {
        self.active.is_empty() && self.waiting.is_empty()
    }

    /// Whether another request may be admitted (running plus waiting stay
    /// within `max_sequences`; the rest waits in the caller's queue).
    pub fn has_room(&self) -> bool {
        self.active.len() + self.waiting.len() < self.limits.max_sequences.max(1)
    }

    /// KV bytes the running requests hold or have reserved.
    pub fn kv_bytes(&self) -> usize {
        self.active
            .iter()
            .map(|a| (a.seq.kv_tokens() + 1) * self.per_token)
            .sum()
    }

    /// Tokens of KV a request reserves besides its own: a share of the
    /// budget, so admission does not fill it with prompts alone.
    fn share_tokens(&self) -> usize {
        self.limits.kv_budget.map_or(0, |b| {
            b / (2 * self.limits.max_sequences.max(1) * self.per_token.max(1))
        })
    }

    /// Whether `tokens` more fit in the budget.
    fn fits(&self, tokens: usize) -> bool {
        self.limits
            .kv_budget
            .is_none_or(|b| self.kv_bytes() + tokens * self.per_token <= b)
    }

    /// Starts or resumes waiting requests, in order, while they fit: each
    /// reserves its tokens, a share of the budget and one round's rows. The
    /// first always starts when nothing runs.
    fn start_waiting(&mut self) {
        while self.active.len() < self.limits.max_sequences.max(1) {
            let Some(front) = self.waiting.front() else {
                break;
            };
            let need = match front {
                Waiting::Fresh(a) => a.prompt.len(),
                Waiting::Preempted(a) => a.seq.kv_tokens() + a.seq.max_round_rows(),
            } + self.share_tokens();
            if !self.active.is_empty() && !self.fits(need) {
                break;
            }
            match self.waiting.pop_front().expect("a front") {
                Waiting::Fresh(a) => self.start(a),
                Waiting::Preempted(a) => {
                    // Back in its admission place: schedules are asked in that order.
                    let at = self.active.partition_point(|x| x.id < a.id);
                    self.active.insert(at, a);
                }
            }
        }
    }

    /// Rows a request's next step forwards at most.
    fn step_rows(a: &Active<'_>) -> usize {
        match a.seq.prefill_left() {
            0 => a.seq.max_round_rows(),
            n => n.min(PREFILL_CHUNK),
        }
    }

    /// Preempts the most recently admitted requests while the next step
    /// could pass the budget (never the last one running).
    fn preempt_for_step(&mut self) -> usize {
        let Some(budget) = self.limits.kv_budget else {
            return 0;
        };
        let mut n = 0;
        while self.active.len() > 1 {
            let peak: usize = self
                .active
                .iter()
                .map(|a| (a.seq.kv_tokens() + Self::step_rows(a)) * self.per_token)
                .sum();
            if peak <= budget {
                break;
            }
            let newest = (0..self.active.len())
                .max_by_key(|&i| self.active[i].id)
                .expect("not empty");
            let mut a = self.active.remove(newest);
            a.seq.preempt();
            // Dropping the target frees its KV.
            a.target = LlamaTarget::new(self.engine.model.clone());
            self.waiting.push_front(Waiting::Preempted(a));
            n += 1;
        }
        n
    }

    pub fn running(&self) -> usize {
        self.active.len()
    }

    /// Admits a request: it starts at the next step boundary where it fits.
    pub fn admit(&mut self, a: Admitted<'e>) {
        self.waiting.push_back(Waiting::Fresh(a));
        self.start_waiting();
    }

    /// Starts a request. One that cannot start gets its error through
    /// `done` at once.
    fn start(&mut self, a: Admitted<'e>) {
        let id = self.next_id;
        self.next_id += 1;
        let (mut target, cached) = self.engine.target_for(a.tenant.as_deref(), &a.prompt);
        match Sequence::new(
            &mut target,
            &self.engine.tokenizer,
            &a.prompt,
            cached,
            &a.settings,
            a.spec,
            a.sink,
        ) {
            Ok(seq) => self.active.push(Active {
                id,
                seq,
                target,
                tenant: a.tenant,
                done: Some(a.done),
                failed: None,
            }),
            Err(e) => (a.done)(Err(e)),
        }
    }

    /// Ends every request with `why` (after a panic: their caches may be
    /// half updated).
    pub fn fail_all(&mut self, why: &str) {
        for mut a in self.active.drain(..) {
            if let Some(done) = a.done.take() {
                done(Err(anyhow!("{why}")));
            }
        }
        for w in self.waiting.drain(..) {
            match w {
                Waiting::Fresh(a) => (a.done)(Err(anyhow!("{why}"))),
                Waiting::Preempted(mut a) => {
                    if let Some(done) = a.done.take() {
                        done(Err(anyhow!("{why}")));
                    }
                }
            }
        }
    }

    /// Hands finished and failed requests their outcome.
    fn retire(&mut self) {
        let mut i = 0;
        while i < self.active.len() {
            let a = &self.active[i];
            if !(a.seq.is_done() || a.failed.is_some()) {
                i += 1;
                continue;
            }
            let mut a = self.active.remove(i);
            let done = a.done.take().expect("done once");
            match a.failed.take() {
                Some(e) => done(Err(e)),
                None => {
                    let fin = a.seq.finish();
                    self.engine.keep_prefix(a.tenant.as_deref(), a.target, &fin);
                    done(Ok(fin));
                }
            }
        }
    }

    /// One step over every active request. `quiet` says whether nothing
    /// waits to be admitted: a request alone then decodes pipelined (plain
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
        if self.active.len() == 1
            && self.waiting.is_empty()
            && self.active[0].seq.can_pipeline()
            && quiet()
        {
            let a = &mut self.active[0];
            match a.seq.run_pipelined(&mut a.target, quiet) {
                Ok(true) => {
                    report.sequences = 1;
                    report.pipelined = true;
                    report.seconds = t0.elapsed().as_secs_f64();
                    self.retire();
                    return report;
                }
                Ok(false) => {}
                Err(e) => a.failed = Some(e),
            }
        }

        // Who is in the step: every request ready for a round, and those in
        // prefill while the step's prefill rows last.
        let decoding = self.active.iter().filter(|a| a.seq.decoding()).count();
        let mut prefill_budget = self.limits.step_tokens.max(1);
        let mut chunks: Vec<Option<Vec<u32>>> = Vec::with_capacity(self.active.len());
        let mut rows_planned = 0usize;
        for a in &self.active {
            let left = a.seq.prefill_left();
            if a.failed.is_none() && left > 0 && prefill_budget > 0 {
                let c = a.seq.prefill_chunk(prefill_budget).to_vec();
                prefill_budget -= c.len();
                rows_planned += c.len();
                chunks.push(Some(c));
            } else {
                chunks.push(None);
            }
        }
        let in_step = decoding + chunks.iter().flatten().count();
        // Rounds are planned in admission order; each schedule sees the batch.
        let mut planned: Vec<Option<(Vec<u32>, Option<Logits>)>> =
            Vec::with_capacity(self.active.len());
        for (a, chunk) in self.active.iter_mut().zip(chunks) {
            if let Some(c) = chunk {
                planned.push(Some((c, None)));
                continue;
            }
            if a.failed.is_some() || !a.seq.decoding() {
                planned.push(None);
                continue;
            }
            let ctx = BatchContext {
                batch_sequences: in_step as u32,
                batch_rows_planned: rows_planned as u32,
            };
            match a.seq.plan(&mut a.target, ctx) {
                Ok((rows, all)) => {
                    rows_planned += rows.len();
                    let which = if all { Logits::All } else { Logits::Last };
                    planned.push(Some((rows.to_vec(), Some(which))));
                }
                Err(e) => {
                    a.failed = Some(e);
                    planned.push(None);
                }
            }
        }
        let n = planned.iter().flatten().count();
        if n == 0 {
            self.retire();
            return report;
        }

        // One forward over every row.
        let t = Instant::now();
        let result = {
            let mut parts: Vec<StepRows<'_>> = self
                .active
                .iter_mut()
                .zip(&planned)
                .filter_map(|(a, p)| {
                    p.as_ref().map(|(tokens, logits)| StepRows {
                        target: &mut a.target,
                        tokens,
                        logits: *logits,
                    })
                })
                .collect();
            forward_batch(&self.engine.model, &mut parts)
        };
        let vt = t.elapsed().as_secs_f64();
        match result {
            Ok(rows) => {
                let mut rows = rows.into_iter();
                for (a, p) in self.active.iter_mut().zip(&planned) {
                    let Some((tokens, logits)) = p else { continue };
                    let r = rows.next().expect("one result per part");
                    a.seq.joined_step(n);
                    if logits.is_none() {
                        a.seq.prefilled(tokens.len());
                    } else if let Err(e) = a.seq.complete(&mut a.target, r, vt) {
                        a.failed = Some(e);
                    }
                }
            }
            Err(e) => {
                // Their caches may hold part of the step: none can go on.
                let msg = format!("{e:#}");
                for (a, p) in self.active.iter_mut().zip(&planned) {
                    if p.is_some() {
                        a.failed = Some(anyhow!("the batched forward failed: {msg}"));
                    }
                }
            }
        }
        report.sequences = n;
        report.rows = planned.iter().flatten().map(|(t, _)| t.len()).sum();
        report.seconds = t0.elapsed().as_secs_f64();
        self.retire();
        report
    }
}
