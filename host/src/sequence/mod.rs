//! A request's life: chunked prefill, then the decode loop, the only place
//! that emits. Each round's committed tokens are recorded to the token log
//! before any of them streams, so stopping at any point (EOS, stop string,
//! budget, a cancelled client) leaves the caches consistent with the log.
pub mod machine;
pub mod prompt_logprobs;

pub use machine::{draft_head_rounds, BatchCounters, Deciding, HeadTurn, Sequence, VerifyTime};
pub use prompt_logprobs::PromptLogprobHook;

use crate::sampling::{LogprobRequest, SamplingParams, TokenLogprob};
use crate::speculation::{SpecCounters, Speculation, Target, VerifyMode, VerifyRows};
use anyhow::{bail, Result};
use serde::Serialize;
use specd_text::{StopMatcher, StreamDetokenizer, Tokenizer};

pub const PREFILL_CHUNK: usize = 512;

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DoneReason {
    Stop,
    Length,
    Cancelled,
}

impl DoneReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DoneReason::Stop => "stop",
            DoneReason::Length => "length",
            DoneReason::Cancelled => "cancelled",
        }
    }
}

/// The final stats of a request (the stats keys of docs/architecture.md).
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache.
    pub cached_tokens: usize,
    pub generated_tokens: usize,
    pub prompt_seconds: f64,
    pub decode_seconds: f64,
    pub done_reason: DoneReason,
    pub drafter: String,
    pub schedule: String,
    pub acceptance: String,
    pub rounds: u64,
    pub drafted: u64,
    pub accepted: u64,
    pub acceptance_rate: f64,
    pub mean_draft: f64,
    pub mean_accepted: f64,
    pub draft_seconds: f64,
    pub verify_seconds: f64,
    pub policy_seconds: f64,
    pub policy_failure: Option<crate::speculation::PolicyFailure>,
    /// Bytes the policies printed past their output cap (dropped, not logged).
    pub policy_output_dropped: u64,
    /// Where the rounds' time went (not a stats key).
    #[serde(skip)]
    pub phases: crate::speculation::RoundPhases,
    /// Committed positions whose top-2 target logit margin was under 0.01.
    pub near_ties: usize,
    /// Steps the request ran batched with at least one other request.
    pub batch_steps: u64,
    /// Most requests in one of its steps, itself included (1: it ran alone).
    pub batch_max_sequences: u64,
    /// Times its KV cache was dropped for others' (then re-prefilled).
    pub preemptions: u64,
    /// Rounds that verified at least one draft (not a stats key).
    #[serde(skip)]
    pub spec_rounds: u64,
    /// Those rounds by how many drafts they accepted (index: accepted;
    /// not a stats key).
    #[serde(skip)]
    pub accepted_histogram: Vec<u64>,
    /// Most drafts a round could verify (not a stats key).
    #[serde(skip)]
    pub draft_max: usize,
}

impl Stats {
    fn new(prompt_tokens: usize, c: SpecCounters) -> Stats {
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        Stats {
            prompt_tokens,
            cached_tokens: 0,
            generated_tokens: 0,
            prompt_seconds: 0.0,
            decode_seconds: 0.0,
            done_reason: DoneReason::Stop,
            acceptance_rate: ratio(c.accepted as f64, c.drafted as f64),
            mean_draft: ratio(c.drafted as f64, c.spec_rounds as f64),
            mean_accepted: ratio(c.accepted as f64, c.spec_rounds as f64),
            drafter: c.drafter,
            schedule: c.schedule,
            acceptance: c.acceptance,
            rounds: c.rounds,
            drafted: c.drafted,
            accepted: c.accepted,
            draft_seconds: c.draft_seconds,
            verify_seconds: c.verify_seconds,
            policy_seconds: c.policy_seconds,
            policy_failure: c.policy_failure,
            policy_output_dropped: c.policy_output_dropped,
            phases: c.phases,
            spec_rounds: c.spec_rounds,
            accepted_histogram: c.accepted_histogram,
            draft_max: c.draft_max,
            near_ties: 0,
            batch_steps: 0,
            batch_max_sequences: 0,
            preemptions: 0,
        }
    }

    pub fn prompt_tps(&self) -> f64 {
        let n = self.prompt_tokens.saturating_sub(self.cached_tokens);
        // The last prompt token is forwarded by the first decode round: with
        // nothing before it there was no prefill to time.
        if self.prompt_seconds > 0.0 && n > 1 {
            n as f64 / self.prompt_seconds
        } else {
            0.0
        }
    }
    pub fn decode_tps(&self) -> f64 {
        if self.decode_seconds > 0.0 {
            self.generated_tokens as f64 / self.decode_seconds
        } else {
            0.0
        }
    }
}

/// Called after every round with its trace (when recording), e.g. to
/// stream per-round figures to a client as they happen.
#[derive(Clone)]
pub struct RoundHook(pub std::sync::Arc<dyn Fn(&crate::speculation::RoundTrace) + Send + Sync>);

impl std::fmt::Debug for RoundHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RoundHook")
    }
}

/// Called with each emitted token's logprobs, before its text is sunk.
#[derive(Clone)]
pub struct LogprobHook(pub std::sync::Arc<dyn Fn(&TokenLogprob) + Send + Sync>);

impl std::fmt::Debug for LogprobHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LogprobHook")
    }
}

/// How generation may end besides EOS, the budget and the stop strings:
/// vLLM's request extensions, all off by default (what every API did
/// before them).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EndRules {
    /// EOS is an ordinary token: generation goes on to the budget.
    pub ignore_eos: bool,
    /// Tokens generated before EOS or a stop token may be: their logits
    /// are masked until then (vLLM's `min_tokens`); stop strings match only
    /// after them.
    pub min_tokens: usize,
    /// More tokens that end generation as EOS does.
    pub stop_token_ids: Vec<u32>,
    /// The stop string or stop token that ended generation is streamed too.
    pub include_stop: bool,
    /// Special tokens produce no text (vLLM's default); off, they stream
    /// as their text (specd's and Ollama's).
    pub skip_special: bool,
}

impl EndRules {
    /// Whether any rule masks rows: the argmax-only paths cannot run.
    pub fn masks(&self) -> bool {
        self.min_tokens > 0
    }

    /// Masks the tokens that may not come yet in `row`, the logits of the
    /// `generated`-th token (counting from 0).
    pub fn mask(&self, row: &mut [f32], generated: usize, tokenizer: &Tokenizer) {
        if generated >= self.min_tokens {
            return;
        }
        let ends = self.stop_token_ids.iter().copied();
        let eos = if self.ignore_eos {
            Vec::new()
        } else {
            tokenizer.eos_ids()
        };
        for t in ends.chain(eos) {
            if let Some(x) = row.get_mut(t as usize) {
                *x = f32::NEG_INFINITY;
            }
        }
    }
}

/// What a request asks of the decode loop.
#[derive(Debug, Clone)]
pub struct Settings {
    pub params: SamplingParams,
    /// How generation may end besides EOS, the budget and `stop`.
    pub ends: EndRules,
    /// None: until end of generation or the context limit.
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub context_length: usize,
    /// Keep a trace of every round (`--record`).
    pub record: bool,
    /// Told about every round as it ends (needs `record`).
    pub on_round: Option<RoundHook>,
    /// Logprobs of the emitted tokens, to `on_logprob` (requests with
    /// `logprobs` take rounds, never the overlapped argmax-only path).
    pub logprobs: Option<(LogprobRequest, LogprobHook)>,
    /// The prompt's logprobs too (completions' `echo`), under `logprobs`'
    /// request, from the prefill's rows ([`prompt_logprobs`]): such a
    /// request is prefilled from its first token (no prefix-cache hit).
    pub prompt_logprobs: Option<PromptLogprobHook>,
    /// Structured output (rounds only, never the overlapped path).
    pub constraint: Option<crate::sampling::SharedConstraint>,
    /// Light speculative rounds: the verify of a plain greedy request
    /// computes each row's argmax and top-2 margin on the device and copies
    /// back only those, not rows x vocabulary floats (requests that sample,
    /// penalise, ask for logprobs or follow a grammar read the rows as
    /// before). Off: every row is copied back and transformed on the host.
    /// Same tokens, stats, trace and caches either way. Default
    /// [`crate::load::Switches::light_rounds`].
    pub light_rounds: bool,
}

/// The outcome besides the streamed text.
pub struct Finished {
    pub stats: Stats,
    /// Prompt + committed tokens; the target's caches hold all but the last.
    pub log: Vec<u32>,
    /// Tokens streamed (EOS and anything after a stop excluded).
    pub emitted: Vec<u32>,
    /// Rounds as the policies saw them, when `settings.record`.
    pub trace: Vec<crate::speculation::RoundTrace>,
    /// Per committed token (`log[prompt.len()..]`), the target's top-2
    /// logit margin where it was chosen (near-tie diagnostics).
    pub margins: Vec<f32>,
    /// Tokens of `log` up to the one that ended the request ([`Finished::context`]).
    context_len: usize,
}

impl Finished {
    /// The prompt and the tokens generated up to the one that ended the
    /// request (an EOS included): what plain decoding commits. The log
    /// may go on past it, where a speculative round accepted drafts
    /// beyond that token; those were never returned and depend on what
    /// was drafted, so an API that hands tokens back (Ollama's `context`)
    /// hands these.
    pub fn context(&self) -> &[u32] {
        &self.log[..self.context_len.min(self.log.len())]
    }
}

/// Receives text as it is produced; returns false to cancel.
pub type Sink<'a> = dyn FnMut(&str) -> bool + 'a;

/// Streams committed tokens as text: EOS, a stop string, the budget or a
/// cancelled client ends generation.
struct Emitter<'a> {
    tokenizer: &'a Tokenizer,
    detok: StreamDetokenizer<&'a Tokenizer>,
    stops: StopMatcher,
    sink: Box<Sink<'a>>,
    emitted: Vec<u32>,
    /// Tokens pushed: the emitted ones, an EOS, the one a cancelled
    /// client did not take.
    pushed: usize,
    max_tokens: usize,
    ends: EndRules,
}

impl Emitter<'_> {
    /// Streams one token; the reason generation ends with it, if it does.
    fn push(&mut self, tok: u32) -> Option<DoneReason> {
        self.pushed += 1;
        let early = self.emitted.len() < self.ends.min_tokens;
        let ends = (self.tokenizer.is_eos(tok) && !self.ends.ignore_eos)
            || self.ends.stop_token_ids.contains(&tok);
        if ends && !early {
            if self.ends.include_stop {
                // Its text, after whatever the stop matcher held back.
                let text = self.stops.flush() + &self.detok.push(tok) + &self.detok.flush();
                if !text.is_empty() && !(self.sink)(&text) {
                    return Some(DoneReason::Cancelled);
                }
            }
            return Some(DoneReason::Stop);
        }
        self.emitted.push(tok);
        let piece = self.detok.push(tok);
        // Stop strings count from `min_tokens` on (vLLM): before, the
        // text goes out as it comes.
        let out = if self.emitted.len() <= self.ends.min_tokens {
            let text = self.stops.flush() + &piece;
            specd_text::StopOutput {
                text,
                stopped: None,
            }
        } else {
            self.stops.push(&piece)
        };
        let text = match (out.stopped, self.ends.include_stop) {
            (Some(i), true) => out.text + &self.stops.stops()[i],
            _ => out.text,
        };
        if !text.is_empty() && !(self.sink)(&text) {
            return Some(DoneReason::Cancelled);
        }
        if out.stopped.is_some() {
            return Some(DoneReason::Stop);
        }
        (self.emitted.len() >= self.max_tokens).then_some(DoneReason::Length)
    }

    /// The cancellation probe between rounds (an empty sink call).
    fn probe(&mut self) -> Option<DoneReason> {
        (!(self.sink)("")).then_some(DoneReason::Cancelled)
    }
}

/// Runs one request on `target`, whose caches already hold `log[..cached]`
/// (a prefix-cache hit; 0 for a fresh start).
#[allow(clippy::too_many_arguments)]
pub fn generate(
    target: &mut dyn Target,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    cached: usize,
    settings: &Settings,
    spec: Option<Speculation>,
    sink: &mut Sink<'_>,
) -> Result<Finished> {
    let mut seq = Sequence::new(
        target,
        tokenizer,
        prompt,
        cached,
        settings,
        spec,
        Box::new(|s: &str| sink(s)),
    )?;
    while seq.prefill_left() > 0 {
        let chunk = seq.prefill_chunk(PREFILL_CHUNK).to_vec();
        if seq.wants_prefill_rows() {
            let out = target.verify(&chunk, VerifyMode::Rows, seq.taps())?;
            let VerifyRows::Logits(rows) = out.rows else {
                bail!("a prefill chunk got argmax rows, not its logits");
            };
            seq.prefilled_rows(&rows, out.hidden)?;
        } else {
            let hidden = target.prefill(&chunk, seq.taps())?;
            seq.prefilled(chunk.len(), hidden)?;
        }
    }
    // Plain greedy decoding runs overlapped where the target can: the next
    // forward is queued before the host sees the token it follows from.
    // Same tokens, same stops; rounds are not traced one by one there.
    if seq.can_overlap() {
        seq.run_overlapped(target, &mut || true)?;
    }
    while !seq.is_done() {
        seq.step(target)?;
    }
    Ok(seq.finish())
}
