//! Continuous batching: one scheduler owns the model and runs steps. At
//! each step boundary requests are admitted and finished ones retired; a
//! step's rows are every active request's rows (a prefill chunk, one row for
//! a plain step, 1 + k for a speculative round) in one forward through the
//! matmuls, with attention per request over its own caches
//! ([`forward_batch`]). Everything else stays per request: drafter,
//! policies (their own WASM stores), sampling, RNG, stops, budget. With the
//! batch-invariant kernels a request's tokens are those it gets alone.
//! A request asking for its prompt's logprobs (`echo`) gets its prefill
//! chunks' logits rows back from the step's forward and turns them into
//! entries chunk by chunk ([`crate::sequence::prompt_logprobs`]); it skips
//! the prefix-cache lookup, since a cached prefix has no rows.
//!
//! Memory: admission reserves a request's prompt plus a share of the KV
//! budget (not its worst case); caches grow step by step. When a step would
//! pass the budget, the most recently admitted request is preempted: its KV
//! is dropped, it goes back to the front of the line, and it is re-prefilled
//! from its committed log when it resumes (same tokens, later). A request
//! running alone is never preempted. A model drafter's cache (`self:N`,
//! `model:NAME`) follows the committed log, so a request with one reserves
//! and holds its bytes per token too ([`KvRates::per_token`]); a
//! preempted request's drafter cache is not dropped (it is rewound when the
//! request resumes) and is not counted while it waits.
use crate::engine::Engine;
use crate::model::LlamaConfig;
use crate::model::Logits;
use crate::options::DrafterSpec;
use crate::sequence::PREFILL_CHUNK;
use crate::sequence::{Deciding, Finished, Sequence, Settings, Sink, VerifyTime};
use crate::speculation::head::draft_heads;
use crate::speculation::target::{forward_batch_verify, StepRows};
use crate::speculation::{read_rows, row_threads, Decided, Target as _, VerifyMode, VerifyRows};
use crate::speculation::{BatchContext, LlamaTarget, RoundPlan, Speculation};
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

/// Bytes of KV cache one token takes: float32 keys and values, every layer
/// (the model's own accounting, [`LlamaConfig::kv_bytes_per_token`]).
pub fn kv_bytes_per_token(c: &LlamaConfig) -> usize {
    c.kv_bytes_per_token(4)
}

/// Bytes of KV cache one token of a request takes: the target's, plus its
/// drafter's when the drafter is a model: `self:N` holds the target's first
/// N layers, `model:NAME` that draft model's. Model-free drafters (n-gram,
/// suffix) and no drafter hold no KV.
/// What the served model's KV caches take a token, read once from the
/// engine: the target's, and each draft model's. A request's bytes a token
/// ([`KvRates::per_token`]) is the one rule the scheduler and the server's
/// validation before the queue both use.
#[derive(Debug, Clone)]
pub struct KvRates {
    target: usize,
    layers: usize,
    drafts: Vec<(String, usize)>,
    /// Each draft head's (`""`: the shipped one).
    heads: Vec<(String, usize)>,
}

impl KvRates {
    pub fn of(engine: &Engine) -> KvRates {
        KvRates {
            target: engine.model.kv_bytes_per_token(),
            layers: engine.model.config.num_hidden_layers,
            drafts: engine
                .drafts
                .iter()
                .map(|(n, m)| (n.clone(), m.kv_bytes_per_token()))
                .collect(),
            heads: engine
                .heads
                .iter()
                .map(|(n, h)| (n.clone(), h.kv_bytes_per_token()))
                .collect(),
        }
    }

    /// Bytes a token of a request with `drafter`: the target's, plus the
    /// drafter's own cache where it keeps one (`self:N`: the first N
    /// layers'; a draft model: its own).
    pub fn per_token(&self, drafter: &DrafterSpec) -> usize {
        let draft = match drafter {
            DrafterSpec::SelfLayers(n) => self.target * (*n).min(self.layers) / self.layers.max(1),
            DrafterSpec::Model(name) => self
                .drafts
                .iter()
                .find(|(n, _)| n == name)
                .map_or(0, |(_, b)| *b),
            DrafterSpec::Mtp(name) | DrafterSpec::SuffixMtp(name) => {
                let name = name.as_deref().unwrap_or("");
                self.heads
                    .iter()
                    .find(|(n, _)| n == name)
                    .map_or(0, |(_, b)| *b)
            }
            DrafterSpec::None | DrafterSpec::Ngram { .. } | DrafterSpec::Suffix => 0,
        };
        self.target + draft
    }
}

/// What a request's drafter was built from ([`DrafterSpec::None`] without
/// speculation).
pub fn drafter_of(spec: &Option<Speculation>) -> &DrafterSpec {
    spec.as_ref()
        .map_or(&DrafterSpec::None, |s| &s.drafter_spec)
}

/// Whether `drafter` holds a KV cache of its own (counted in
/// [`KvRates::per_token`]).
pub fn drafter_holds_kv(drafter: &DrafterSpec) -> bool {
    matches!(
        drafter,
        DrafterSpec::SelfLayers(_)
            | DrafterSpec::Model(_)
            | DrafterSpec::Mtp(_)
            | DrafterSpec::SuffixMtp(_)
    )
}

/// The default KV budget: a quarter of the memory the caches live in, the
/// GPU's where MLX runs on one (CUDA, Metal builds), else the machine's
/// (4 GiB where it cannot be read).
pub fn default_kv_budget() -> usize {
    let gpu = specd_mlx::gpu_memory() as usize;
    if gpu > 0 {
        return gpu / 4;
    }
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
    /// KV bytes per token of its caches, its drafter's included.
    per_token: usize,
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
    /// Of them, prefill rows.
    pub prefill_rows: usize,
    pub seconds: f64,
    /// The step ran one request alone, overlapped.
    pub overlapped: bool,
    /// Requests preempted before it.
    pub preempted: usize,
    /// Seconds the requests' policies (schedule and acceptance calls) ran
    /// in it, summed over its requests.
    pub policy_seconds: f64,
    /// Threads its rounds' acceptance decisions ran on (0: no round).
    pub decision_threads: usize,
    /// Rounds whose MTP heads drafted together, one head forward per draft
    /// step for all of them.
    pub head_rounds: usize,
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
    /// KV bytes a token: the target's (the reserved share is in these) and
    /// each drafter's, read once.
    kv: KvRates,
    /// What one more row adds to a step, learnt from the steps run.
    curve: StepCurve,
    /// What a prefill row costs the requests decoding beside it.
    prefill_cost: PrefillCost,
    /// Acceptance-call seconds per step from which decisions run on
    /// several threads, and how many ([`decide_all`]).
    decide_parallel_from: f64,
    decide_threads: usize,
}

impl<'e> Scheduler<'e> {
    pub fn new(engine: &'e Engine, limits: BatchLimits) -> Self {
        Scheduler {
            engine,
            limits,
            active: Vec::new(),
            waiting: VecDeque::new(),
            next_id: 0,
            kv: KvRates::of(engine),
            curve: StepCurve::default(),
            prefill_cost: PrefillCost::default(),
            decide_parallel_from: DECIDE_PARALLEL_FROM,
            decide_threads: row_threads(),
        }
    }

    /// Spreads a step's acceptance decisions over up to `threads` threads
    /// once they are expected to take `seconds` together (default: 150 µs,
    /// the kernels' threads; 0 s: whenever two requests decide). Results
    /// do not depend on it.
    pub fn with_parallel_decisions(mut self, seconds: f64, threads: usize) -> Self {
        (self.decide_parallel_from, self.decide_threads) = (seconds, threads);
        self
    }

    /// Starts from `fit`, the step-cost fit another scheduler learnt (its
    /// [`Scheduler::take_fit`]): a server's one scheduler keeps its fit for
    /// its lifetime, and a benchmark that runs several schedulers in turn
    /// measures that steady state only if they hand it on.
    pub fn with_fit(mut self, fit: StepFit) -> Self {
        (self.curve, self.prefill_cost) = (fit.rounds, fit.prefill);
        self
    }

    /// The step-cost fit learnt so far (this scheduler starts over).
    pub fn take_fit(&mut self) -> StepFit {
        StepFit {
            rounds: std::mem::take(&mut self.curve),
            prefill: std::mem::take(&mut self.prefill_cost),
        }
    }

    /// Prefill rows this step may take while `decoding` requests decode
    /// beside them. With none, all of `--step-tokens`: only time to first
    /// token waits, and requests that arrive together share their first
    /// slice. Otherwise each of those streams waits for the step (a request
    /// whose prompt is read waits for its first token), and on a CPU a
    /// 512-row chunk costs over a second, so the chunk is held to what
    /// keeps the step within [`STALL_STEPS`] of their step alone
    /// ([`PrefillCost`]): the new prompt goes on a little slower and no
    /// stream stalls. (Holding back only beside requests that had streamed
    /// 8 tokens let 8 long prompts arriving together stall the first
    /// streams for whole slices: p99 gap 1.6 s, against 70 ms.)
    fn prefill_budget(&self, decoding: usize) -> usize {
        self.prefill_cost
            .rows(decoding > 0, self.limits.step_tokens)
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
            .map(|a| (a.seq.kv_tokens() + 1) * a.per_token)
            .sum()
    }

    /// Tokens of KV a request reserves besides its own: a share of the
    /// budget, so admission does not fill it with prompts alone.
    fn share_tokens(&self) -> usize {
        self.limits.kv_budget.map_or(0, |b| {
            b / (2 * self.limits.max_sequences.max(1) * self.kv.target.max(1))
        })
    }

    /// Whether `bytes` more fit in the budget.
    fn fits(&self, bytes: usize) -> bool {
        self.limits
            .kv_budget
            .is_none_or(|b| self.kv_bytes() + bytes <= b)
    }

    /// Starts or resumes waiting requests, in order, while they fit: each
    /// reserves its tokens, a share of the budget and one round's rows. The
    /// first always starts when nothing runs.
    fn start_waiting(&mut self) {
        while self.active.len() < self.limits.max_sequences.max(1) {
            let Some(front) = self.waiting.front() else {
                break;
            };
            let (tokens, per_token) = match front {
                Waiting::Fresh(a) => (a.prompt.len(), self.kv.per_token(drafter_of(&a.spec))),
                Waiting::Preempted(a) => (a.seq.kv_tokens() + a.seq.max_round_rows(), a.per_token),
            };
            let need = tokens * per_token + self.share_tokens() * self.kv.target;
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
    /// Drafts the step's head rounds (those [`Sequence::plan`] left
    /// undrafted) together: one head forward per draft step for all of
    /// them ([`draft_heads`]), then each round's rows. Returns how many.
    fn draft_heads(&mut self, planned: &mut [Option<Planned>]) -> usize {
        let t = Instant::now();
        let mut rounds = Vec::new();
        let mut which = Vec::new();
        for (i, (a, p)) in self.active.iter_mut().zip(planned.iter()).enumerate() {
            if let Some(Planned {
                work: Work::Round(plan),
                ..
            }) = p
            {
                if let Some(r) = a.seq.head_round(plan) {
                    rounds.push(r);
                    which.push(i);
                }
            }
        }
        if rounds.is_empty() {
            return 0;
        }
        let drafted = draft_heads(&mut rounds).map_err(|e| format!("{e:#}"));
        let drafts: Vec<_> = rounds.into_iter().map(|r| r.draft).collect();
        // Each round's share of the drafting, by the tokens it drafted.
        let tokens: usize = drafts.iter().map(|d| d.tokens.len() + 1).sum();
        let seconds = t.elapsed().as_secs_f64() / tokens as f64;
        for (i, draft) in which.iter().zip(drafts) {
            let a = &mut self.active[*i];
            let p = &mut planned[*i];
            let Some(Planned {
                work: Work::Round(plan),
                logits,
            }) = p
            else {
                continue;
            };
            let share = seconds * (draft.tokens.len() + 1) as f64;
            let r = match &drafted {
                Ok(()) => a.seq.finish_head_round(plan, draft, share, &mut a.target),
                Err(e) => Err(anyhow::anyhow!("drafting with the MTP head: {e}")),
            };
            match r {
                Ok(()) if plan.drafted() > 0 => *logits = Some(Logits::All),
                Ok(()) => {}
                Err(e) => {
                    a.failed = Some(e);
                    *p = None;
                }
            }
        }
        which.len()
    }

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
                .map(|a| (a.seq.kv_tokens() + Self::step_rows(a)) * a.per_token)
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
            if a.seq.wants_hidden() {
                a.target.keep_hidden(&a.seq.hidden_taps());
            }
            self.waiting.push_front(Waiting::Preempted(a));
            n += 1;
        }
        n
    }

    pub fn running(&self) -> usize {
        self.active.len()
    }

    /// Requests admitted but not running: waiting for KV room, or preempted.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
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
        let per_token = self.kv.per_token(drafter_of(&a.spec));
        // A request asking for its prompt's logprobs builds them from its own
        // prefill's rows, so it skips the prefix-cache lookup and prefills
        // the whole prompt (what it leaves in the cache is kept as usual).
        let (mut target, cached) = if a.settings.prompt_logprobs.is_some() {
            (LlamaTarget::new(self.engine.model.clone()), 0)
        } else {
            self.engine.target_for(a.tenant.as_deref(), &a.prompt)
        };
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
                per_token,
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
        if self.active.len() == 1
            && self.waiting.is_empty()
            && self.active[0].seq.can_overlap()
            && quiet()
        {
            let a = &mut self.active[0];
            match a.seq.run_overlapped(&mut a.target, quiet) {
                Ok(true) => {
                    report.sequences = 1;
                    report.overlapped = true;
                    report.seconds = t0.elapsed().as_secs_f64();
                    self.retire();
                    return report;
                }
                Ok(false) => {}
                Err(e) => a.failed = Some(e),
            }
        }

        let policy_before: f64 = self.active.iter().map(|a| a.seq.policy_seconds()).sum();
        // Who is in the step: every request ready for a round, and those in
        // prefill while the step's prefill rows last.
        let decoding = self.active.iter().filter(|a| a.seq.decoding()).count();
        let mut prefill_budget = self.prefill_budget(decoding);
        let mut chunks: Vec<Option<Planned>> = Vec::with_capacity(self.active.len());
        let mut rows_planned = 0usize;
        for a in &self.active {
            let left = a.seq.prefill_left();
            if a.failed.is_none() && left > 0 && prefill_budget > 0 {
                let c = a.seq.prefill_chunk(prefill_budget).to_vec();
                prefill_budget -= c.len();
                rows_planned += c.len();
                // The prompt's logprobs come from this forward's rows.
                let logits = a.seq.wants_prefill_rows().then_some(Logits::All);
                chunks.push(Some(Planned {
                    logits,
                    work: Work::Prefill(c),
                }));
            } else {
                chunks.push(None);
            }
        }
        let in_step = decoding + chunks.iter().flatten().count();
        // Rounds are planned in admission order; each schedule sees the batch.
        let mut planned: Vec<Option<Planned>> = Vec::with_capacity(self.active.len());
        for (a, chunk) in self.active.iter_mut().zip(chunks) {
            if chunk.is_some() {
                planned.push(chunk);
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
            // With others in the step, a head's round is drafted below,
            // with the other requests' head rounds.
            a.seq.defer_heads(decoding > 1);
            match a.seq.plan(&mut a.target, ctx) {
                Ok(round) => {
                    // A head round not drafted yet counts every row it asked.
                    rows_planned += match round.deferred_head() {
                        true => round.asked() + 1,
                        false => round.rows.len(),
                    };
                    let which = if round.drafted() > 0 {
                        Logits::All
                    } else {
                        Logits::Last
                    };
                    planned.push(Some(Planned {
                        logits: Some(which),
                        work: Work::Round(Box::new(round)),
                    }));
                }
                Err(e) => {
                    a.failed = Some(e);
                    planned.push(None);
                }
            }
        }
        report.head_rounds = self.draft_heads(&mut planned);
        let n = planned.iter().flatten().count();
        if n == 0 {
            self.retire();
            return report;
        }

        // One forward over every row. A round reads back what it would
        // alone: a plain greedy one only its rows' argmax and margin.
        let modes: Vec<VerifyMode> = self
            .active
            .iter()
            .zip(&planned)
            .filter_map(|(a, p)| {
                p.as_ref().map(|p| match p.work {
                    Work::Round(_) => a.seq.verify_mode(),
                    Work::Prefill(_) => VerifyMode::Rows,
                })
            })
            .collect();
        let t = Instant::now();
        let result = {
            let mut parts: Vec<StepRows<'_>> = self
                .active
                .iter_mut()
                .zip(&planned)
                .filter_map(|(a, p)| {
                    p.as_ref().map(|p| StepRows {
                        target: &mut a.target,
                        tokens: p.tokens(),
                        logits: p.logits,
                    })
                })
                .collect();
            forward_batch_verify(&self.engine.model, &mut parts, &modes)
        };
        let vt = t.elapsed().as_secs_f64();
        let total_rows: usize = planned.iter().flatten().map(|p| p.tokens().len()).sum();
        let rounds: Vec<usize> = planned
            .iter()
            .flatten()
            .filter_map(|p| match &p.work {
                Work::Round(r) => Some(r.rows.len()),
                Work::Prefill(_) => None,
            })
            .collect();
        let split = self.curve.split(vt, total_rows, rounds.len());
        // The curve is learnt from rounds only: a prefill row skips the
        // vocabulary head, so it costs less than a verify row and would
        // make drafts look cheaper than they are.
        let prefill_rows = total_rows - rounds.iter().sum::<usize>();
        report.sequences = n;
        report.rows = total_rows;
        report.prefill_rows = prefill_rows;
        if prefill_rows == 0 {
            self.curve.add(total_rows, vt);
            self.prefill_cost.decode_step(vt);
        } else {
            self.prefill_cost
                .prefill_step(vt, prefill_rows, !rounds.is_empty());
        }
        match result {
            Ok(rows) => {
                let mut rows = rows.into_iter();
                // Rounds' rows are masked one request at a time, then
                // read (the sampling transforms) all together.
                // The planned rounds leave `planned` here: each is masked,
                // read, decided and applied as it passes along.
                let mut masked = Vec::new();
                for (i, (a, p)) in self.active.iter_mut().zip(planned).enumerate() {
                    let Some(p) = p else { continue };
                    let r = rows.next().expect("one result per part");
                    a.seq.joined_step(n);
                    match p.work {
                        Work::Prefill(tokens) => {
                            let kept = match (p.logits, r) {
                                (None, _) => {
                                    a.seq.prefilled(tokens.len());
                                    Ok(())
                                }
                                (Some(_), VerifyRows::Logits(rows)) => a.seq.prefilled_rows(&rows),
                                (Some(_), VerifyRows::Argmax(_)) => {
                                    Err(anyhow!("a prefill chunk got argmax rows, not its logits"))
                                }
                            };
                            if let Err(e) = kept {
                                a.failed = Some(e.context("the prompt's logprobs"));
                            }
                        }
                        Work::Round(round) => match a.seq.mask_rows(&round, r) {
                            Ok(m) => masked.push((i, round, m)),
                            Err(e) => a.failed = Some(e),
                        },
                    }
                }
                let (rounds, masked): (Vec<_>, Vec<_>) =
                    masked.into_iter().map(|(i, r, m)| ((i, r), m)).unzip();
                let read = read_rows(masked, row_threads());
                // Every round decided (the acceptance calls, on several
                // threads where they are dear), then applied in order.
                let mut jobs = Vec::with_capacity(rounds.len());
                let mut active = self.active.iter_mut().enumerate();
                for ((i, round), r) in rounds.into_iter().zip(read) {
                    let a = active.find(|(j, _)| *j == i).expect("in admission order").1;
                    let rows = round.rows.len();
                    let time = VerifyTime {
                        lone: split.lone(rows),
                        share: split.of(rows),
                    };
                    jobs.push((i, a.seq.deciding(*round, r, time)));
                }
                let (who, jobs): (Vec<usize>, Vec<_>) = jobs.into_iter().unzip();
                let (decided, threads) =
                    decide_all(jobs, self.decide_threads, self.decide_parallel_from);
                report.decision_threads = threads;
                for (i, d) in who.into_iter().zip(decided) {
                    let a = &mut self.active[i];
                    if let Err(e) = d.and_then(|d| a.seq.apply_decided(&mut a.target, d)) {
                        a.failed = Some(e);
                    }
                }
            }
            Err(e) => {
                // Their caches may hold part of the step: none can go on.
                let msg = format!("{e:#}");
                for (a, p) in self.active.iter_mut().zip(planned) {
                    if p.is_some() {
                        a.failed = Some(anyhow!("the batched forward failed: {msg}"));
                    }
                }
            }
        }
        report.policy_seconds = self
            .active
            .iter()
            .map(|a| a.seq.policy_seconds())
            .sum::<f64>()
            - policy_before;
        report.seconds = t0.elapsed().as_secs_f64();
        self.retire();
        report
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
const DECIDE_PARALLEL_FROM: f64 = 150e-6;

/// A request's rows in a step.
struct Planned {
    /// Which rows' logits come back: a round's; for a prefill chunk none,
    /// or all where they build the prompt's logprobs.
    logits: Option<Logits>,
    work: Work,
}

/// What a request's rows in a step are for.
enum Work {
    /// A chunk of its prompt (or of its log, re-prefilled after a
    /// preemption).
    Prefill(Vec<u32>),
    /// A round: its verify rows are [`RoundPlan::rows`]; the round passes
    /// on to masking, deciding and applying once the forward is done.
    Round(Box<RoundPlan>),
}

impl Planned {
    fn tokens(&self) -> &[u32] {
        match &self.work {
            Work::Prefill(t) => t,
            Work::Round(r) => &r.rows,
        }
    }
}

/// What a scheduler learnt of its steps' cost ([`Scheduler::take_fit`]).
#[derive(Debug, Default, Clone)]
pub struct StepFit {
    rounds: StepCurve,
    prefill: PrefillCost,
}

/// What a step's prefill rows cost the requests decoding beside them,
/// learnt from the steps run: a step is taken as its decoding rows' step
/// alone plus a cost per prefill row. That cost grows with the prompt's
/// context (its rows attend to every row before them), so it is a running
/// average of the latest steps, not a fit over all of them.
#[derive(Debug, Default, Clone)]
struct PrefillCost {
    /// The forward seconds of the latest step that carried no prefill.
    decode: Option<f64>,
    /// Forward seconds a prefill row adds.
    row: Option<f64>,
}

impl PrefillCost {
    fn decode_step(&mut self, seconds: f64) {
        self.decode = Some(seconds);
    }

    /// A step of `seconds` with `rows` prefill rows, and decoding rows
    /// where `decoding`.
    fn prefill_step(&mut self, seconds: f64, rows: usize, decoding: bool) {
        let per = match (decoding, self.decode, self.row) {
            (false, _, _) => seconds / rows as f64,
            (true, Some(d), _) => (seconds - d) / rows as f64,
            // The decoding rows' share unknown: the row cost stands, and
            // the rest of the step is theirs.
            (true, None, Some(r)) => {
                self.decode = Some((seconds - r * rows as f64).max(0.0));
                return;
            }
            (true, None, None) => return,
        };
        if per.is_finite() && per > 0.0 {
            self.row = Some(self.row.map_or(per, |r| 0.5 * r + 0.5 * per));
        }
    }

    /// Prefill rows for a step with requests `decoding` or not, within
    /// `cap` (`--step-tokens`): at least [`MIN_SHARED_PREFILL`] beside
    /// decoding, and [`UNFITTED_SHARED_PREFILL`] until both costs are known.
    fn rows(&self, decoding: bool, cap: usize) -> usize {
        let cap = cap.max(1);
        if !decoding {
            return cap;
        }
        let rows = match (self.decode, self.row) {
            (Some(d), Some(r)) => ((STALL_STEPS - 1.0) * d / r).floor().min(cap as f64) as usize,
            _ => UNFITTED_SHARED_PREFILL,
        };
        rows.max(MIN_SHARED_PREFILL).min(cap)
    }
}

/// How many decode-only steps a step with a shared prefill chunk may cost
/// ([`Scheduler::prefill_budget`]).
const STALL_STEPS: f64 = 4.0;
/// The fewest prefill rows a step beside decoding requests takes.
const MIN_SHARED_PREFILL: usize = 16;
/// The prefill rows beside decoding requests before any step was timed.
const UNFITTED_SHARED_PREFILL: usize = 64;

/// The cost curve of a batched step, `seconds ≈ c + slope * rows`, fitted
/// online (exponentially decayed least squares over the steps run), so a
/// step's time can be split by what each request's rows added to it.
#[derive(Debug, Default, Clone)]
struct StepCurve {
    /// Decayed sums: weight, rows, rows², seconds, rows * seconds.
    w: f64,
    r: f64,
    rr: f64,
    t: f64,
    rt: f64,
}

/// How much the newest step weighs against the fit so far.
const CURVE_DECAY: f64 = 0.95;

impl StepCurve {
    fn add(&mut self, rows: usize, seconds: f64) {
        let (r, t) = (rows as f64, seconds);
        for (s, x) in [
            (&mut self.w, 1.0),
            (&mut self.r, r),
            (&mut self.rr, r * r),
            (&mut self.t, t),
            (&mut self.rt, r * t),
        ] {
            *s = *s * CURVE_DECAY + x;
        }
    }

    /// The fitted line's seconds at zero rows: the part of a step no row
    /// adds (`None` until the slope is known, or where the fit puts it at or
    /// below 0).
    fn intercept(&self) -> Option<f64> {
        let m = self.slope()?;
        Some((self.t - m * self.r) / self.w).filter(|c| c.is_finite() && *c > 0.0)
    }

    /// Seconds one more row adds, once steps of different sizes were seen.
    fn slope(&self) -> Option<f64> {
        if self.w < 2.0 {
            return None;
        }
        let (mr, mt) = (self.r / self.w, self.t / self.w);
        let var = self.rr / self.w - mr * mr;
        // Rows that barely varied say nothing about the slope.
        (var > 0.25)
            .then(|| (self.rt / self.w - mr * mt) / var)
            .filter(|m| m.is_finite() && *m > 0.0)
    }

    /// Splits a step of `seconds` over `rows` rows among its `rounds`
    /// decoding requests (prefill rows are the rest).
    fn split(&self, seconds: f64, rows: usize, rounds: usize) -> StepSplit {
        let line = self.intercept().zip(self.slope());
        let slope = match self.slope() {
            // The marginal row never costs more than the step's average
            // row (the curve has a positive intercept), so every share
            // below stays positive.
            Some(m) if rounds > 0 && rows > 0 => m.min(seconds / rows as f64),
            // Nothing learnt yet: each request is charged the whole step,
            // as a request alone is.
            _ => {
                return StepSplit {
                    whole: seconds,
                    base: seconds,
                    slope: 0.0,
                    rows,
                    line,
                }
            }
        };
        StepSplit {
            whole: seconds,
            base: (seconds - slope * (rows - rounds) as f64) / rounds as f64,
            slope,
            rows,
            line,
        }
    }
}

/// A step's time as each request's rounds see it. Its stats count its
/// share ([`StepSplit::of`]): the step split with one row each, plus the
/// marginal cost of its other rows; alone (one request, no prefill) that
/// is the whole step, as before batching. Its schedule is told the lone
/// forward of its rows ([`StepSplit::lone`]) and reads what they cost in
/// this step from the batch context (`throughput`: its share of the step
/// plus what its draft rows add, so drafting pays in a small batch and
/// rarely in a large one); fixed-k schedules ignore timings and keep their
/// solo rounds.
#[derive(Debug, Clone, Copy)]
struct StepSplit {
    whole: f64,
    base: f64,
    slope: f64,
    /// Rows of the whole step.
    rows: usize,
    /// The fitted step line (intercept, seconds per row), where known.
    line: Option<(f64, f64)>,
}

impl StepSplit {
    /// The verify seconds of a round of `rows` rows.
    fn of(&self, rows: usize) -> f64 {
        if self.slope == 0.0 {
            return self.whole;
        }
        self.base + self.slope * rows.saturating_sub(1) as f64
    }

    /// What a forward of `rows` rows alone would have cost: the fitted line
    /// at `rows`, scaled by how this step ran against the line at its own
    /// rows (so a slow step reads slow). Before a line is known, the step
    /// in proportion to the rows (exact for a request alone; in a batch it
    /// leaves out the fixed part, so drafts read dear, the safe side).
    /// This is what schedules are told: alone and in batches of every size
    /// it is on one scale, and the batch context (contract 0.2) tells a
    /// schedule what the rows cost in this step.
    fn lone(&self, rows: usize) -> f64 {
        let all = self.rows.max(1) as f64;
        match self.line {
            Some((c, m)) => (c + m * rows as f64) * self.whole / (c + m * all),
            None => self.whole * rows as f64 / all,
        }
    }
}

#[cfg(test)]
mod step_curve_tests {
    use super::*;

    /// Alone a prompt takes whole `--step-tokens` chunks; beside decoding
    /// requests, what keeps the step within STALL_STEPS of theirs alone.
    #[test]
    fn a_prefill_chunk_beside_decoding_keeps_the_step_near_theirs() {
        let mut c = PrefillCost::default();
        assert_eq!(c.rows(false, 512), 512);
        assert_eq!(c.rows(true, 512), UNFITTED_SHARED_PREFILL);
        // A prompt alone: 512 rows in 1.2 s.
        c.prefill_step(1.2, 512, false);
        assert_eq!(
            c.rows(true, 512),
            UNFITTED_SHARED_PREFILL,
            "no decode step seen"
        );
        // Eight streams decode at 24 ms a step: (4 - 1) * 24 / 2.34 rows.
        c.decode_step(0.024);
        assert_eq!(c.rows(true, 512), 30);
        assert_eq!(c.rows(false, 512), 512);
        // A longer context makes rows dearer: 5 ms a row beside them.
        c.prefill_step(0.024 + 30.0 * 0.005, 30, true);
        let r = 0.5 * (1.2 / 512.0) + 0.5 * 0.005;
        assert_eq!(c.rows(true, 512), (3.0 * 0.024 / r) as usize);
        // One stream at 7 ms: 3 * 7 / 3.7 rows, raised to the floor.
        c.decode_step(0.007);
        assert_eq!(c.rows(true, 512), MIN_SHARED_PREFILL);
        // Never above `--step-tokens`, however small.
        assert_eq!(c.rows(true, 8), 8);
        assert_eq!(c.rows(true, 0), 1);
        // Where rows are nearly free (a GPU), whole chunks.
        let mut g = PrefillCost::default();
        g.prefill_step(0.02, 512, false);
        g.decode_step(0.01);
        assert_eq!(g.rows(true, 512), 512);
    }

    /// A first shared step, with no decode step timed yet, gives the
    /// decoding rows what the known row cost leaves of it.
    #[test]
    fn a_first_shared_step_learns_the_decoding_rows_share() {
        let mut c = PrefillCost::default();
        c.prefill_step(0.5, 200, false);
        c.prefill_step(0.007 + 64.0 * 0.0025, 64, true);
        assert!((c.decode.unwrap() - 0.007).abs() < 1e-12);
        assert_eq!(c.rows(true, 512), MIN_SHARED_PREFILL);
        // With nothing known, a shared step teaches nothing.
        let mut n = PrefillCost::default();
        n.prefill_step(0.2, 64, true);
        assert!(n.decode.is_none() && n.row.is_none());
    }

    /// Steps on the line `0.01 + 0.003 * rows`.
    fn learnt() -> StepCurve {
        let mut c = StepCurve::default();
        for rows in [1, 8, 3, 16, 2, 9, 12, 5] {
            c.add(rows, 0.01 + 0.003 * rows as f64);
        }
        c
    }

    #[test]
    fn the_slope_is_learnt_from_steps_of_different_sizes() {
        let m = learnt().slope().expect("rows varied");
        assert!((m - 0.003).abs() < 1e-9, "{m}");
        let mut flat = StepCurve::default();
        for _ in 0..10 {
            flat.add(8, 0.04);
        }
        assert_eq!(flat.slope(), None, "one size says nothing about the slope");
        assert_eq!(StepCurve::default().slope(), None);
    }

    #[test]
    fn the_split_adds_up_to_the_step_and_charges_draft_rows_their_margin() {
        let c = learnt();
        // 8 requests: six plain rounds, two with 4 drafts (5 rows each).
        let rows = [1, 1, 1, 1, 1, 1, 5, 5];
        let total: usize = rows.iter().sum();
        let step = 0.01 + 0.003 * total as f64;
        let s = c.split(step, total, rows.len());
        let sum: f64 = rows.iter().map(|&r| s.of(r)).sum();
        assert!((sum - step).abs() < 1e-12, "{sum} vs {step}");
        assert!((s.of(5) - s.of(1) - 4.0 * 0.003).abs() < 1e-12);
        assert!(
            s.of(1) < step / 2.0,
            "a plain round pays its share, not the step"
        );
        // Alone, a round is charged the whole step, whatever it drafted.
        let alone = c.split(0.022, 4, 1);
        assert!((alone.of(4) - 0.022).abs() < 1e-12);
        // Before anything is learnt, every round is charged the whole step.
        let fresh = StepCurve::default().split(0.05, 9, 3);
        assert_eq!((fresh.of(1), fresh.of(5)), (0.05, 0.05));
    }

    #[test]
    fn schedules_are_told_the_lone_forward_of_their_rows() {
        let c = learnt();
        let line = |rows: usize| 0.01 + 0.003 * rows as f64;
        // A step on the line: each round reads what its rows cost alone.
        let s = c.split(line(14), 14, 8);
        for r in [1, 5, 14] {
            assert!((s.lone(r) - line(r)).abs() < 1e-12, "{r}");
        }
        // A step twice as slow as the line reads twice as slow.
        let slow = c.split(2.0 * line(14), 14, 8);
        assert!((slow.lone(3) - 2.0 * line(3)).abs() < 1e-12);
        // Alone, the whole step, learnt or not.
        assert!((c.split(0.021, 4, 1).lone(4) - 0.021).abs() < 1e-12);
        assert!((StepCurve::default().split(0.021, 4, 1).lone(4) - 0.021).abs() < 1e-12);
        // Nothing learnt, in a batch: the step in proportion to the rows.
        let fresh = StepCurve::default().split(0.04, 8, 8);
        assert!((fresh.lone(1) - 0.005).abs() < 1e-12);
    }

    #[test]
    fn shares_stay_positive_when_the_slope_overshoots() {
        let mut c = StepCurve::default();
        for (rows, t) in [(1, 0.001), (20, 0.5), (2, 0.002), (21, 0.6)] {
            c.add(rows, t);
        }
        let s = c.split(0.05, 10, 2);
        assert!(s.of(1) > 0.0 && s.of(9) > 0.0);
        assert!((s.of(1) + s.of(9) - 0.05).abs() < 1e-12);
    }
}
