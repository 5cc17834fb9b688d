//! Continuous batching: one scheduler owns the model and runs steps. At
//! each step boundary requests are admitted and finished ones retired; a
//! step's rows are every active request's rows (a prefill chunk, one row for
//! a plain step, 1 + k for a speculative round) in one forward through the
//! matmuls, with attention per request over its own caches
//! ([`crate::speculation::target::forward_batch_verify`]). Everything else stays per request: drafter,
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
//! and holds its bytes per token too ([`kv::KvRates::per_token`]); a
//! preempted request's drafter cache is not dropped (it is rewound when the
//! request resumes) and is not counted while it waits.
//!
//! Its homes: [`admission`] (requests in, while they fit), [`preemption`]
//! (requests out when a step would pass the budget), [`retirement`]
//! (finished and failed requests handed their outcome), [`step`] (one step
//! as schedule -> execute -> update), [`kv`] (the KV rules the server's
//! validation reads too) and [`cost`] (what a step costs, learnt).
pub mod admission;
pub mod cost;
pub mod kv;
pub mod preemption;
pub mod retirement;
pub mod step;

pub use cost::StepFit;
pub use kv::{default_kv_budget, drafter_holds_kv, drafter_of, KvRates};

use crate::engine::Engine;
use crate::sequence::{Finished, Sequence, Settings, Sink};
use crate::speculation::{row_threads, LlamaTarget, Speculation};
use anyhow::Result;
use kv::{held_bytes, KvBudget};
use std::collections::VecDeque;
use step::DECIDE_PARALLEL_FROM;

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
    /// The KV rules, with the rates read once from the engine.
    kv: KvBudget,
    /// What a step costs, learnt from the steps run.
    fit: StepFit,
    /// Acceptance-call seconds per step from which decisions run on
    /// several threads, and how many (`step::decide_all`).
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
            kv: KvBudget::new(KvRates::of(engine), &limits),
            fit: StepFit::default(),
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
        self.fit = fit;
        self
    }

    /// The step-cost fit learnt so far (this scheduler starts over).
    pub fn take_fit(&mut self) -> StepFit {
        std::mem::take(&mut self.fit)
    }

    /// Prefill rows this step may take while `decoding` requests decode
    /// beside them. With none, all of `--step-tokens`: only time to first
    /// token waits, and requests that arrive together share their first
    /// slice. Otherwise each of those streams waits for the step (a request
    /// whose prompt is read waits for its first token), and on a CPU a
    /// 512-row chunk costs over a second, so the chunk is held to what
    /// keeps the step within `cost::STALL_STEPS` of their step alone
    /// (`cost::PrefillCost`): the new prompt goes on a little slower and no
    /// stream stalls. (Holding back only beside requests that had streamed
    /// 8 tokens let 8 long prompts arriving together stall the first
    /// streams for whole slices: p99 gap 1.6 s, against 70 ms.)
    fn prefill_budget(&self, decoding: usize) -> usize {
        self.fit.prefill.rows(decoding > 0, self.limits.step_tokens)
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
            .map(|a| held_bytes(a.seq.kv_tokens(), a.per_token))
            .sum()
    }

    pub fn running(&self) -> usize {
        self.active.len()
    }

    /// Requests admitted but not running: waiting for KV room, or preempted.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }
}
