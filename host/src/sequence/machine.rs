//! One request as a state machine a scheduler steps: chunked prefill, then
//! rounds whose verify forward may run batched with other requests' rows.
//! A round is a value passed along, never state kept between calls, on
//! one surface: [`Sequence::plan`] gives the planned round (or a head job,
//! drafted with the step's other head jobs and made a plan by
//! [`draft_head_rounds`]), which the caller holds while the verify
//! runs; [`Sequence::read`] takes its rows (the sampling transforms then
//! read every request's together, [`crate::speculation::read_rows`]);
//! [`Sequence::decide`] makes the acceptance's job, whose decision
//! [`Sequence::apply`] commits. [`Sequence::step`] runs one round alone
//! (`super::generate`); the server's scheduler steps many together. Both
//! go through the same calls, so a request's tokens do not depend on
//! which.
use super::prompt_logprobs::PromptLogprobs;
use super::{DoneReason, Emitter, Finished, Settings, Sink, Stats, PREFILL_CHUNK};
use crate::sampling::{token_logprob, Rng, SamplingParams};
use crate::speculation::head::draft_heads;
use crate::speculation::{
    read_one, row_threads, BatchContext, Decided, HeadJob, HiddenRows, MaskedRows, Plan, ReadRows,
    RoundPlan, RoundRequest, SpecState, Speculation, Target, VerifyMode, VerifyRows,
};
use anyhow::{bail, Result};
use specd_text::{StopMatcher, StreamDetokenizer, Tokenizer};
use std::time::Instant;

/// How a request shared steps with others (the `batch_*` stats keys).
#[derive(Debug, Clone, Copy, Default)]
pub struct BatchCounters {
    /// Steps it ran together with at least one other request.
    pub steps: u64,
    /// Most requests in one of its steps, itself included.
    pub max_sequences: u64,
    /// Times its KV cache was dropped to free memory for others (it was
    /// re-prefilled from its committed log when it resumed).
    pub preemptions: u64,
}

pub struct Sequence<'a> {
    prompt_len: usize,
    cached: usize,
    /// Tokens of the log the caches hold (during prefill).
    processed: usize,
    /// Where prefill ends: all but the last prompt token, or after a
    /// preemption all but the last committed token.
    prefill_to: usize,
    settings: Settings,
    max_tokens: usize,
    state: SpecState,
    rng: Rng,
    log: Vec<u32>,
    em: Emitter<'a>,
    near_ties: usize,
    margins: Vec<f32>,
    t0: Instant,
    prompt_seconds: f64,
    t1: Option<Instant>,
    done: Option<DoneReason>,
    /// The prompt's logprobs while its prefill builds them
    /// ([`Settings::prompt_logprobs`]); `None` once sent, or not asked.
    echo: Option<PromptLogprobs>,
    /// Where its drafter reads the target's feature rows (an MTP head):
    /// every forward of its rows returns those of these layer boundaries
    /// ([`Sequence::taps`]).
    taps: Option<Vec<usize>>,
    /// The feature rows its forwards returned since its drafter last read
    /// them (rolled back with the caches): the next round hands them over.
    hidden: Option<HiddenRows>,
    pub batch: BatchCounters,
}

impl<'a> Sequence<'a> {
    /// A request on `target`, whose caches hold `prompt[..cached]` (a
    /// prefix-cache hit; 0 for a fresh start).
    pub fn new(
        target: &mut dyn Target,
        tokenizer: &'a Tokenizer,
        prompt: &[u32],
        cached: usize,
        settings: &Settings,
        spec: Option<Speculation>,
        sink: Box<Sink<'a>>,
    ) -> Result<Sequence<'a>> {
        // Checked once, where the request was built (`crate::request`).
        debug_assert!(settings.params.validate().is_ok());
        if prompt.is_empty() {
            bail!("the prompt is empty");
        }
        if prompt.len() >= settings.context_length {
            bail!(
                "the prompt is {} tokens, over the model's context length of {} tokens",
                prompt.len(),
                settings.context_length
            );
        }
        let room = settings.context_length - prompt.len();
        let max_tokens = settings.max_tokens.map_or(room, |m| m.min(room));
        let t0 = Instant::now();
        // Prefill all but the last prompt token: the first round forwards it.
        let cached = cached.min(prompt.len() - 1);
        let echo = match (&settings.prompt_logprobs, &settings.logprobs) {
            (None, _) => None,
            (Some(_), None) => bail!("the prompt's logprobs need a logprob request"),
            // Its entries come from its own prefill's rows: a cached prefix
            // has none.
            (Some(_), Some(_)) if cached > 0 => bail!(
                "the prompt's logprobs need the whole prompt forwarded, but {cached} tokens came from the prefix cache"
            ),
            (Some(hook), Some((req, _))) => Some(PromptLogprobs::new(prompt, *req, hook.clone())),
        };
        target.rewind(cached)?;
        let mut state = SpecState::new(spec);
        let taps = state.hidden_taps();
        state.constraint = settings.constraint.clone();
        state.mode = verify_mode(settings);
        if settings.record {
            state.trace = Some(Vec::new());
        }
        let mut seq = Sequence {
            prompt_len: prompt.len(),
            cached,
            processed: cached,
            prefill_to: prompt.len() - 1,
            settings: settings.clone(),
            max_tokens,
            state,
            rng: Rng::new(settings.params.seed),
            log: prompt.to_vec(),
            em: Emitter {
                tokenizer,
                detok: StreamDetokenizer::with_skip_special(tokenizer, settings.ends.skip_special),
                stops: StopMatcher::new(settings.stop.iter().cloned()),
                sink,
                emitted: Vec::new(),
                pushed: 0,
                max_tokens,
                ends: settings.ends.clone(),
            },
            near_ties: 0,
            margins: Vec::new(),
            t0,
            prompt_seconds: 0.0,
            t1: None,
            done: None,
            echo,
            taps,
            hidden: None,
            batch: BatchCounters::default(),
        };
        if seq.prefill_left() == 0 {
            // A one-token prompt: its only entry is the first's.
            seq.send_prompt_logprobs();
            seq.start_decode();
        }
        Ok(seq)
    }

    /// Tokens still to prefill (all but the last of the prompt, or of the
    /// committed log after a preemption).
    pub fn prefill_left(&self) -> usize {
        if self.done.is_some() {
            return 0;
        }
        self.prefill_to - self.processed
    }

    /// The next prefill chunk: at most `max` rows (and [`PREFILL_CHUNK`]).
    pub fn prefill_chunk(&self, max: usize) -> &[u32] {
        let n = self.prefill_left().min(max).min(PREFILL_CHUNK);
        &self.log[self.processed..self.processed + n]
    }

    /// Whether the next prefill chunk's logits rows are needed (to build
    /// the prompt's logprobs): then [`Sequence::prefilled_rows`] takes them.
    pub fn wants_prefill_rows(&self) -> bool {
        self.echo.is_some() && self.prefill_left() > 0
    }

    /// The next prefill chunk went into the caches, with its logits `rows`
    /// (one per token of the chunk): they become the prompt's logprob
    /// entries here and are not kept. `hidden`: its feature rows, where
    /// [`Sequence::taps`] asked for them.
    pub fn prefilled_rows(&mut self, rows: &[Vec<f32>], hidden: Option<HiddenRows>) -> Result<()> {
        if let Some(e) = &mut self.echo {
            e.add_rows(
                &self.log[..self.prompt_len],
                self.processed,
                rows,
                &self.settings.params,
            )?;
        }
        self.prefilled(rows.len(), hidden)
    }

    /// Sends the prompt's logprobs once every entry is built.
    fn send_prompt_logprobs(&mut self) {
        if self
            .echo
            .as_ref()
            .is_some_and(|e| e.complete(self.prompt_len))
        {
            self.echo.take().expect("checked").send();
        }
    }

    /// `n` prompt tokens went into the caches (`hidden`: their feature
    /// rows, where [`Sequence::taps`] asked for them).
    pub fn prefilled(&mut self, n: usize, hidden: Option<HiddenRows>) -> Result<()> {
        self.keep_hidden(hidden)?;
        self.processed += n;
        self.send_prompt_logprobs();
        debug_assert!(
            self.echo.is_none() || self.prefill_left() > 0,
            "a prefill that asked for the prompt's logprobs ended without its rows"
        );
        // An empty sink call is the cancellation probe.
        if let Some(r) = self.em.probe() {
            self.done = Some(r);
        }
        if self.prefill_left() == 0 {
            self.start_decode();
        }
        Ok(())
    }

    /// Keeps a forward's feature rows `h` after those kept (where they
    /// follow on) until the next round hands them to its drafter.
    fn keep_hidden(&mut self, h: Option<HiddenRows>) -> Result<()> {
        let (Some(h), Some(_)) = (h, &self.taps) else {
            return Ok(());
        };
        self.hidden = Some(match self.hidden.take() {
            Some(kept) => kept.then(h)?,
            None => h,
        });
        Ok(())
    }

    /// Where its drafter reads the target's feature rows: the layer
    /// boundaries each forward of its rows is to return (empty: the last
    /// layer's output; `None`: it reads none).
    pub fn taps(&self) -> Option<&[usize]> {
        self.taps.as_deref()
    }

    fn start_decode(&mut self) {
        if self.t1.is_some() {
            // Resumed after a preemption: decoding goes on where it was.
            return;
        }
        self.prompt_seconds = self.t0.elapsed().as_secs_f64();
        self.t1 = Some(Instant::now());
        if self.max_tokens == 0 {
            self.done = self.done.or(Some(DoneReason::Length));
        }
    }

    pub fn is_done(&self) -> bool {
        self.done.is_some()
    }

    /// Ready for a round (prefill over, not done).
    pub fn decoding(&self) -> bool {
        self.done.is_none() && self.prefill_left() == 0
    }

    /// Its KV cache was dropped (a preemption): it resumes on a fresh
    /// target by prefilling its committed log but the last token, which
    /// leaves the caches as they were (the kernels are batch-invariant), so
    /// its tokens stay the same.
    pub fn preempt(&mut self) {
        self.prefill_to = self.log.len() - 1;
        self.processed = 0;
        // Its feature rows went with the caches: the re-prefill returns them.
        self.hidden = None;
        self.batch.preemptions += 1;
    }

    /// Tokens its caches hold or will hold once prefilled: what it reserves
    /// of the KV budget.
    pub fn kv_tokens(&self) -> usize {
        self.prefill_to.max(self.log.len() - 1)
    }

    /// Rows its next round may forward at most (1 + draft_max).
    pub fn max_round_rows(&self) -> usize {
        1 + self.state.draft_max()
    }

    /// Ends the request as cancelled (its client left).
    pub fn cancel(&mut self) {
        self.done = Some(DoneReason::Cancelled);
    }

    /// Seconds its policies (schedule and acceptance) have run so far.
    pub fn policy_seconds(&self) -> f64 {
        self.state.counters.policy_seconds
    }

    /// A step this request was part of had `n` requests in all.
    pub fn joined_step(&mut self, n: usize) {
        if n > 1 {
            self.batch.steps += 1;
        }
        self.batch.max_sequences = self.batch.max_sequences.max(n as u64);
    }

    /// Whether plain greedy decoding may run overlapped: no speculation, no
    /// recording, temperature 0 without penalties, and nothing that needs
    /// the rows (logprobs) or masks them (structured output): the overlapped
    /// path copies back only the argmax.
    pub fn can_overlap(&self) -> bool {
        // A request whose drafter read feature rows (its policy failed
        // since) goes on in rounds: the overlapped loop returns none.
        self.decoding()
            && self.state.is_plain()
            && self.taps.is_none()
            && !self.settings.record
            && self.settings.logprobs.is_none()
            && self.settings.constraint.is_none()
            && self.settings.params.plain_greedy()
            && !self.settings.ends.masks()
    }

    /// Plain greedy decoding, overlapped where the target can (the next
    /// forward is queued before the host sees the token it follows from),
    /// until the request ends or `keep_going` says stop. Same tokens, same
    /// stops as rounds; returns false where the target cannot.
    pub fn run_overlapped(
        &mut self,
        target: &mut dyn Target,
        keep_going: &mut dyn FnMut() -> bool,
    ) -> Result<bool> {
        self.joined_step(1);
        let t = Instant::now();
        let pending = *self.log.last().expect("the prompt is not empty");
        let budget = self.max_tokens - self.em.emitted.len();
        let (log, margins, near_ties, done, em) = (
            &mut self.log,
            &mut self.margins,
            &mut self.near_ties,
            &mut self.done,
            &mut self.em,
        );
        let mut each = |tok: u32, margin: f32| -> Result<bool> {
            log.push(tok);
            margins.push(margin);
            *near_ties += usize::from(margin < 0.01);
            *done = em.push(tok).or_else(|| em.probe());
            Ok(done.is_none() && keep_going())
        };
        match target.greedy_overlapped(pending, budget, &mut each) {
            Some(r) => {
                let n = r?;
                self.state.record_plain(n, t.elapsed().as_secs_f64());
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Plans a round (the schedule asked with `batch`, drafts made, or
    /// left to its MTP head: [`Plan::Head`]). Its verify forwards
    /// [`RoundPlan::rows`]; every row's logits are needed where it drafted
    /// ([`RoundPlan::drafted`]), else only the last.
    pub fn plan(&mut self, target: &mut dyn Target, batch: BatchContext) -> Result<Plan> {
        let generated = self.em.emitted.len();
        let req = RoundRequest {
            log: &self.log,
            params: &self.settings.params,
            rng: &mut self.rng,
            generated,
            budget_left: self.max_tokens - generated,
            hidden: self.hidden.take(),
        };
        self.state.plan(target, req, batch)
    }

    /// The planned round's verify `rows` (every row's logits, or their
    /// argmax where [`Sequence::verify_mode`] asked for that), with the
    /// request's stop masks and grammar applied: a batched step then reads
    /// every request's together ([`crate::speculation::read_rows`]), a
    /// request alone its own ([`read_one`]).
    pub fn read(&self, plan: &RoundPlan, rows: VerifyRows) -> Result<MaskedRows> {
        let rows = match rows {
            // Row `i` is the logits of the token after the log and `i` drafts.
            VerifyRows::Logits(mut rows) if self.settings.ends.masks() => {
                let generated = self.log.len() - self.prompt_len;
                for (i, r) in rows.iter_mut().enumerate() {
                    self.settings.ends.mask(r, generated + i, self.em.tokenizer);
                }
                VerifyRows::Logits(rows)
            }
            rows => rows,
        };
        self.state
            .mask_rows(plan, rows, &self.log, &self.settings.params)
    }

    /// The planned round's decision (its acceptance call) over its read
    /// rows, as a job that borrows only the request's host state, so it
    /// can run on another thread beside other requests' ([`Deciding::run`]);
    /// its result goes to [`Sequence::apply`]. `time` is what the verify
    /// cost: in a batched step the schedule is told what a lone forward of
    /// these rows would have cost, while the request's stats count its
    /// share of the step.
    pub fn decide(&mut self, plan: RoundPlan, read: ReadRows, time: VerifyTime) -> Deciding<'_> {
        // What its acceptance calls took so far, per call (0 before the
        // first); a plain round makes none.
        let c = &self.state.counters;
        let estimate = (plan.drafted() > 0).then(|| c.phases.accept / c.spec_rounds.max(1) as f64);
        Deciding {
            state: &mut self.state,
            rng: &mut self.rng,
            params: &self.settings.params,
            plan,
            read,
            time,
            estimate,
        }
    }

    /// Ends the round [`Sequence::decide`] decided: roll back, stream what
    /// was committed.
    pub fn apply(&mut self, target: &mut dyn Target, decided: Decided) -> Result<()> {
        let mut round = self.state.apply(decided, target, &self.log)?;
        self.keep_hidden(round.hidden.take())?;
        if let (Some(hook), Some(t)) = (
            &self.settings.on_round,
            self.state.trace.as_ref().and_then(|t| t.last()),
        ) {
            (hook.0)(t);
        }
        // Record the whole round before streaming any of it.
        let t = Instant::now();
        self.log.extend_from_slice(&round.tokens);
        self.near_ties += round.margins.iter().filter(|&&m| m < 0.01).count();
        self.margins.extend_from_slice(&round.margins);
        for (i, &tok) in round.tokens.iter().enumerate() {
            if let Some((req, hook)) = &self.settings.logprobs {
                // An EOS that ends the request has no entry; under
                // `ignore_eos` it is an emitted token like any other. A
                // request that echoes its prompt's logprobs scores a whole
                // text (lm-eval's loglikelihood: prompt + `max_tokens: 1`,
                // then `[ctxlen:-1]`), so there the ending EOS has its entry
                // too, as vLLM gives it: else the slice drops a prompt token.
                let scored = self.settings.prompt_logprobs.is_some();
                if !self.em.tokenizer.is_eos(tok) || self.settings.ends.ignore_eos || scored {
                    let (Some(row), Some(dist)) = (round.rows.get(i), round.dists.get(i)) else {
                        bail!("logprobs asked of a round that kept no rows");
                    };
                    (hook.0)(&token_logprob(row, dist, tok, req));
                }
            }
            self.done = self.em.push(tok);
            if self.done.is_some() {
                break;
            }
        }
        if self.done.is_none() {
            self.done = self.em.probe();
        }
        self.state.counters.phases.emit += t.elapsed().as_secs_f64();
        Ok(())
    }

    /// What this request's verify copies back ([`Settings::light_rounds`]).
    pub fn verify_mode(&self) -> VerifyMode {
        self.state.mode
    }

    /// One round alone, a step of one: plan (a head job drafted on its
    /// own), verify on `target`, read, decide, apply.
    pub fn step(&mut self, target: &mut dyn Target) -> Result<()> {
        self.joined_step(1);
        let mut plan = match self.plan(target, BatchContext::default())? {
            Plan::Ready(plan) => plan,
            Plan::Head(job) => {
                let turn = HeadTurn {
                    seq: self,
                    target: &mut *target,
                    job,
                };
                let [plan] = draft_head_rounds(vec![turn])
                    .try_into()
                    .unwrap_or_else(|_| unreachable!("one plan per job"));
                plan?
            }
        };
        let t = Instant::now();
        let verified = target.verify(&plan.rows, self.state.mode, self.taps())?;
        let vt = t.elapsed().as_secs_f64();
        self.state.add_forward_times(target.take_forward_times());
        let rows = plan.verified(verified);
        let read = read_one(self.read(&plan, rows)?, row_threads());
        let decided = self.decide(plan, read, VerifyTime::alone(vt)).run()?;
        self.apply(target, decided)
    }

    /// Prompt + committed tokens so far.
    pub fn log(&self) -> &[u32] {
        &self.log
    }

    /// Tokens streamed so far.
    pub fn emitted(&self) -> usize {
        self.em.emitted.len()
    }

    /// Flushes what is held back and builds the outcome (the request must be
    /// done).
    pub fn finish(mut self) -> Finished {
        let done = self.done.unwrap_or(DoneReason::Cancelled);
        if done != DoneReason::Cancelled && self.em.stops.stopped().is_none() {
            let tail = self.em.stops.push(&self.em.detok.flush()).text + &self.em.stops.flush();
            if !tail.is_empty() {
                (self.em.sink)(&tail);
            }
        }
        if self.t1.is_none() {
            self.prompt_seconds = self.t0.elapsed().as_secs_f64();
        }
        let decode_seconds = self.t1.map_or(0.0, |t| t.elapsed().as_secs_f64());
        let trace = self.state.trace.take().unwrap_or_default();
        let counters = if done == DoneReason::Cancelled {
            self.state.counters_now()
        } else {
            self.state.finish()
        };
        let mut stats = Stats::new(self.prompt_len, counters);
        stats.cached_tokens = self.cached;
        stats.generated_tokens = self.em.emitted.len();
        stats.prompt_seconds = self.prompt_seconds;
        stats.decode_seconds = decode_seconds;
        stats.done_reason = done;
        stats.near_ties = self.near_ties;
        stats.batch_steps = self.batch.steps;
        stats.batch_max_sequences = self.batch.max_sequences;
        stats.preemptions = self.batch.preemptions;
        Finished {
            stats,
            context_len: self.prompt_len + self.em.pushed,
            log: self.log,
            emitted: self.em.emitted,
            margins: self.margins,
            trace,
        }
    }
}

/// What the verify of a request's rounds copies back under `settings`:
/// only each row's argmax for light rounds of a plain greedy request that
/// nothing else reads the rows of (logprobs) or masks (a grammar); every
/// row otherwise.
fn verify_mode(settings: &Settings) -> VerifyMode {
    if settings.light_rounds
        && settings.params.plain_greedy()
        && !settings.ends.masks()
        && settings.logprobs.is_none()
        && settings.constraint.is_none()
    {
        VerifyMode::Argmax
    } else {
        VerifyMode::Rows
    }
}

/// A round's decision cut off from the rest of its request
/// ([`Sequence::decide`]).
pub struct Deciding<'s> {
    state: &'s mut SpecState,
    rng: &'s mut Rng,
    params: &'s SamplingParams,
    plan: RoundPlan,
    read: ReadRows,
    time: VerifyTime,
    /// Seconds its acceptance call is expected to take (the request's mean
    /// so far, 0 before its first); `None`: the round makes none (no
    /// drafts).
    pub estimate: Option<f64>,
}

impl Deciding<'_> {
    pub fn run(self) -> Result<Decided> {
        let Deciding {
            state,
            rng,
            params,
            plan,
            read,
            time,
            ..
        } = self;
        let d = state.decide(plan, read, time.lone, params, rng)?;
        state.counters.verify_seconds += time.share - time.lone;
        Ok(d)
    }
}

/// A round its MTP head drafts ([`Plan::Head`]), with its request and the
/// request's target ([`draft_head_rounds`]).
pub struct HeadTurn<'s, 'a> {
    pub seq: &'s mut Sequence<'a>,
    pub target: &'s mut dyn Target,
    pub job: HeadJob,
}

/// Drafts the head rounds of a step together, one head forward per draft
/// step for all of them ([`draft_heads`]; a request alone is a step of
/// one), and makes each its round's plan, cut by its grammar
/// ([`SpecState::finish_head`]). Each round is counted its share of the
/// drafting time, by the tokens it drafted. Per turn, in order, its plan or
/// why its request cannot go on.
pub fn draft_head_rounds(mut turns: Vec<HeadTurn<'_, '_>>) -> Vec<Result<RoundPlan>> {
    let t = Instant::now();
    let mut rounds = Vec::new();
    let mut failed: Vec<Option<anyhow::Error>> = Vec::new();
    for turn in turns.iter_mut() {
        let seq = &mut *turn.seq;
        let (params, rng) = (&seq.settings.params, &mut seq.rng);
        match seq.state.head_round(&turn.job, &seq.log, params, rng) {
            Ok(r) => {
                rounds.push(r);
                failed.push(None);
            }
            Err(e) => failed.push(Some(e)),
        }
    }
    let drafted = match rounds.is_empty() {
        true => Ok(()),
        false => draft_heads(&mut rounds).map_err(|e| format!("{e:#}")),
    };
    let mut drafts = rounds.into_iter().map(|r| r.draft).collect::<Vec<_>>();
    // Each round's share of the drafting, by the tokens it drafted.
    let tokens: usize = drafts.iter().map(|d| d.tokens.len() + 1).sum();
    let seconds = t.elapsed().as_secs_f64() / tokens.max(1) as f64;
    drafts.reverse();
    (turns.into_iter().zip(failed))
        .map(|(turn, failed)| {
            if let Some(e) = failed {
                return Err(e);
            }
            let draft = drafts.pop().expect("a draft per round");
            if let Err(e) = &drafted {
                anyhow::bail!("drafting with the MTP head: {e}");
            }
            let share = seconds * (draft.tokens.len() + 1) as f64;
            (turn.seq.state).finish_head(turn.job, draft, share, turn.target)
        })
        .collect()
}

/// A round's verify time ([`Sequence::decide`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VerifyTime {
    /// What a forward of the round's rows alone costs: what its schedule
    /// is told (its `verify-seconds-by-len`, the round's record, the trace).
    pub lone: f64,
    /// The round's share of the step it ran in: what its stats count (the
    /// shares of a step add up to the step).
    pub share: f64,
}

impl VerifyTime {
    /// A round that ran alone: both are its forward's time.
    pub fn alone(seconds: f64) -> Self {
        VerifyTime {
            lone: seconds,
            share: seconds,
        }
    }
}
