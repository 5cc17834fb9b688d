//! The speculation round: the schedule picks k, the drafter proposes, the
//! target verifies all drafts in one forward, the acceptance policy decides,
//! the caches roll back to what was kept. Policies are reached through the
//! `specd_policy` traits (WASM components in production, scripted in tests);
//! the host validates and owns all randomness.
pub mod draft;
pub mod drafter;
pub mod head;
pub mod history;
pub mod mtp;
pub mod rows;
pub mod stats;
pub mod suffix;
pub mod target;

pub use draft::{Draft, DraftProb};
pub use drafter::{DraftReq, Drafter, ModelDrafter, NgramDrafter};
pub use head::MtpDrafter;
pub use history::ScheduleHistory;
pub use rows::{read_one, read_rows, MaskedRows, ReadRows, RowArgmax, VerifyRows};
pub use stats::{ForwardTimes, PolicyFailure, RoundPhases, SpecCounters};
pub use suffix::SuffixDrafter;
pub use target::{HiddenRows, LlamaTarget, Target, Verified, VerifyMode};

use crate::options::DrafterSpec;
use crate::sampling::{Distribution, Rng, SamplingParams, SharedConstraint};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use specd_policy::{
    Acceptance, Correction, Decision, DraftStep, PolicyError, Position, Schedule, ScheduleInput,
};
use std::time::Instant;

/// The policies and drafter of one request.
pub struct Speculation {
    pub drafter: Box<dyn Drafter>,
    /// What `drafter` was built from: the KV budget counts a model
    /// drafter's cache ([`crate::scheduler::KvRates::per_token`]).
    pub drafter_spec: DrafterSpec,
    pub schedule: Box<dyn Schedule>,
    /// For a drafter of several sources ([`Drafter::sources`]), one more
    /// instance of the schedule per further source: each sizes the rounds
    /// of its own source, from that source's rounds alone (a suffix match
    /// and a head's guess are accepted at very different rates).
    pub source_schedules: Vec<Box<dyn Schedule>>,
    pub acceptance: Box<dyn Acceptance>,
    pub draft_max: usize,
}

impl Speculation {
    /// The drafter, and the schedule instance of `source`.
    fn parts(&mut self, source: usize) -> (&mut Box<dyn Drafter>, &mut Box<dyn Schedule>) {
        let schedule = match source {
            0 => &mut self.schedule,
            s => &mut self.source_schedules[s - 1],
        };
        (&mut self.drafter, schedule)
    }
}

/// What one round committed.
#[derive(Debug, Clone, Default)]
pub struct RoundOutcome {
    /// Accepted drafts, then the correction or bonus token.
    pub tokens: Vec<u32>,
    pub drafted: usize,
    pub accepted: usize,
    /// Top-2 logit margin of the target at each committed position.
    pub margins: Vec<f32>,
    /// The target's raw logits and final distribution at each committed
    /// position (moved out, not copied: what logprobs are computed from);
    /// empty after an argmax-only verify ([`VerifyRows::Argmax`]), which
    /// only requests that read no logprobs get.
    pub rows: Vec<Vec<f32>>,
    pub dists: Vec<Distribution>,
    /// The verify's feature rows of what was kept (where its drafter reads
    /// them: [`RoundRequest::hidden`] of the next round), rolled back with
    /// the caches: the rows of rejected drafts are dropped with them.
    pub hidden: Option<HiddenRows>,
}

/// What one round showed the policies and what they answered: a line of a
/// trace file (`--record`), replayed offline by `specd replay`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RoundTrace {
    pub round: u32,
    /// What the schedule saw (absent when it was not asked: no speculation,
    /// or no room to draft).
    pub schedule_input: Option<ScheduleInput>,
    /// Its answer.
    pub k: u32,
    /// Tokens the drafter actually proposed (<= k).
    pub drafted: u32,
    /// Contract 0.2's per-token hook: what the schedule was asked after
    /// each draft token, and what it answered (empty when it was not asked:
    /// a 0.1 schedule, or a drafter that does not draft token by token).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub draft_steps: Vec<HookCall>,
    /// What the acceptance policy saw, one entry per draft.
    pub positions: Vec<Position>,
    pub decision: Option<Decision>,
    pub accepted: u32,
    /// Committed this round: accepted drafts, then the correction or bonus.
    pub tokens: Vec<u32>,
    pub draft_seconds: f64,
    pub verify_seconds: f64,
    pub policy_seconds: f64,
    /// Which of a combining drafter's sources drafted (`suffix+mtp`: 0
    /// suffix, 1 the head; 0 for every other drafter).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub source: u32,
}

fn is_zero(x: &u32) -> bool {
    *x == 0
}

/// One `continue-drafting` call: the step the schedule saw and its answer.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HookCall {
    #[serde(flatten)]
    pub step: DraftStep,
    /// true = draft on, false = stop after this token.
    #[serde(rename = "continue")]
    pub go_on: bool,
}

/// Per-request speculation state: the policies (until one fails) and what
/// the schedule is told about past rounds.
pub struct SpecState {
    /// Rounds recorded when tracing.
    pub trace: Option<Vec<RoundTrace>>,
    spec: Option<Speculation>,
    pub counters: SpecCounters,
    history: ScheduleHistory,
    /// The batch context of the last round's step: the host-side numbers
    /// contract 0.2 hands the schedule (`batch-sequences`,
    /// `batch-rows-planned`).
    pub batch: BatchContext,
    /// Structured output: drafts are cut to what the grammar allows and
    /// every verify row is masked before the policies see it.
    pub constraint: Option<SharedConstraint>,
    /// What a round's verify copies back (the sequence sets it from the
    /// request: argmax-only rows for plain greedy requests).
    pub mode: VerifyMode,
}

impl SpecState {
    pub fn new(spec: Option<Speculation>) -> Self {
        let mut counters = SpecCounters::default();
        if let Some(s) = &spec {
            counters.drafter = s.drafter.name();
            counters.schedule = s.schedule.name().to_string();
            counters.acceptance = s.acceptance.name().to_string();
        } else {
            counters.drafter = "none".into();
        }
        let n = spec.as_ref().map(|s| s.draft_max + 1).unwrap_or(1);
        counters.draft_max = n - 1;
        SpecState {
            trace: None,
            spec,
            counters,
            history: ScheduleHistory::new(n - 1),
            batch: BatchContext::default(),
            constraint: None,
            mode: VerifyMode::default(),
        }
    }

    /// Ends speculation for the rest of the request (plain decoding from
    /// here, which is always correct) and records why.
    fn fail(&mut self, e: PolicyError) {
        tracing::warn!(policy = %e.policy, kind = %e.kind, "policy failed, decoding plainly: {}", e.message);
        self.counters.policy_failure = Some(PolicyFailure::from(&e));
        self.count_policy_output();
        self.spec = None;
    }

    /// Policy output dropped past the log cap, read from the policies (they
    /// count it) when they are let go: at a failure, or at the end.
    fn count_policy_output(&mut self) {
        if let Some(s) = &self.spec {
            self.counters.policy_output_dropped = s.schedule.output_dropped()
                + s.source_schedules
                    .iter()
                    .map(|x| x.output_dropped())
                    .sum::<u64>()
                + s.acceptance.output_dropped();
        }
    }

    /// Most drafts a round may verify (0 without speculation).
    pub fn draft_max(&self) -> usize {
        self.spec.as_ref().map_or(0, |s| s.draft_max)
    }

    /// Where its drafter reads the target's hidden states (each forward must
    /// return them, [`RoundRequest::hidden`]): the layer boundaries it reads
    /// ([`Drafter::hidden_taps`]).
    pub fn hidden_taps(&self) -> Option<Vec<usize>> {
        self.spec.as_ref().and_then(|s| s.drafter.hidden_taps())
    }

    /// No speculation: every round is one plain step.
    pub fn is_plain(&self) -> bool {
        self.spec.is_none()
    }

    /// Counts `n` plain steps taken outside rounds (the overlapped greedy
    /// loop), `seconds` in all.
    pub fn record_plain(&mut self, n: usize, seconds: f64) {
        self.counters.rounds += n as u64;
        self.counters.verify_seconds += seconds;
    }

    /// Hands carried state back to the schedule's host (normal end only).
    pub fn finish(mut self) -> SpecCounters {
        self.count_policy_output();
        if let Some(s) = self.spec.take() {
            s.schedule.finish();
            for x in s.source_schedules {
                x.finish();
            }
        }
        self.counters
    }

    /// The counters of a request that ends without `finish` (cancelled):
    /// nothing is carried.
    pub fn counters_now(&mut self) -> SpecCounters {
        self.count_policy_output();
        self.counters.clone()
    }

    /// Counts a verify forward's parts into the round phases.
    pub fn add_forward_times(&mut self, f: ForwardTimes) {
        let p = &mut self.counters.phases;
        p.build += f.build;
        p.device += f.device;
        p.readback += f.readback;
    }

    /// A round up to its verify: the schedule picks k, the drafter
    /// drafts, the target is told which offsets to snapshot. The verify
    /// forward of [`RoundPlan::rows`] (all logits rows when it drafted) may
    /// then run batched with other requests' rows; its rows are read
    /// ([`SpecState::mask_rows`], [`read_rows`]), decided
    /// ([`SpecState::decide`]) and applied ([`SpecState::apply`]). A round
    /// an MTP head drafts (where the schedule has no per-token hook) comes
    /// back as a [`HeadJob`]: its caller drafts every head job of its step
    /// together ([`head::draft_heads`]; a request alone is a step of one),
    /// then [`SpecState::finish_head`] makes it a plan.
    pub fn plan(
        &mut self,
        target: &mut dyn Target,
        req: RoundRequest<'_>,
        batch: BatchContext,
    ) -> Result<Plan> {
        let RoundRequest {
            log,
            params,
            rng,
            generated,
            budget_left,
            hidden,
        } = req;
        let before = log.len() - 1;
        debug_assert_eq!(
            target.offset(),
            before,
            "caches hold all but the last committed token"
        );
        let round_no = self.counters.rounds as u32;
        let policy_before = self.counters.policy_seconds;
        let mut traced_input = None;
        self.batch = batch;

        // 1. k from the schedule (never more than the budget can use): the
        //    instance of the source that drafts this round, told its rounds.
        let mut k = 0usize;
        let mut source = 0usize;
        if let Some(spec) = self.spec.as_mut() {
            let max_draft = spec.draft_max.min(budget_left.saturating_sub(1));
            if max_draft > 0 {
                let t = Instant::now();
                source = spec.drafter.source(log, max_draft, params, rng)?;
                anyhow::ensure!(
                    source <= spec.source_schedules.len(),
                    "the drafter named source {source} of {}",
                    spec.source_schedules.len() + 1
                );
                let st = t.elapsed().as_secs_f64();
                self.counters.draft_seconds += st;
                self.counters.phases.draft += st;
                let mut input =
                    self.history
                        .input(round_no, generated, budget_left, max_draft, source);
                input.batch_sequences = batch.batch_sequences;
                input.batch_rows_planned = batch.batch_rows_planned;
                if self.trace.is_some() {
                    traced_input = Some(input.clone());
                }
                let t = Instant::now();
                let r = self
                    .spec
                    .as_mut()
                    .expect("checked")
                    .parts(source)
                    .1
                    .next_draft_length(&input);
                let st = t.elapsed().as_secs_f64();
                self.counters.policy_seconds += st;
                self.counters.phases.schedule += st;
                // Validated by the policy host (`specd_policy::validate`).
                match r {
                    Ok(v) => k = v as usize,
                    Err(e) => self.fail(e),
                }
            }
        }

        // 2. Draft.  A drafter that drafts token by token asks a schedule
        //    with the hook (contract 0.2) after each token whether to go on.
        let mut draft = Draft::default();
        let mut dt = 0.0;
        let mut draft_steps = Vec::new();
        // A drafter that reads the target's hidden states reads those of
        // every forward, whether it drafts this round or not.
        if let Some(spec) = (self.spec.as_mut()).filter(|s| s.drafter.hidden_taps().is_some()) {
            if let Some(h) = hidden {
                let t = Instant::now();
                spec.drafter.observe_hidden(log, h)?;
                dt += t.elapsed().as_secs_f64();
            }
        }
        let mut by_head = false;
        if k > 0 {
            let spec = self.spec.as_mut().expect("k > 0 only with a speculation");
            let (drafter, schedule) = spec.parts(source);
            by_head = !schedule.has_draft_hook() && drafter.head_drafter(source).is_some();
        }
        if k > 0 && !by_head {
            let spec = self.spec.as_mut().expect("k > 0 only with a speculation");
            let (drafter, schedule) = spec.parts(source);
            let t = Instant::now();
            let mut hook_seconds = 0.0;
            let mut hook_error = None;
            let has_hook = schedule.has_draft_hook();
            let tracing = self.trace.is_some();
            let mut ask = |step: &DraftStep| {
                let t = Instant::now();
                let r = schedule.continue_drafting(step);
                hook_seconds += t.elapsed().as_secs_f64();
                match r {
                    Ok(go_on) => {
                        if tracing {
                            draft_steps.push(HookCall { step: *step, go_on });
                        }
                        go_on
                    }
                    Err(e) => {
                        hook_error = Some(e);
                        false
                    }
                }
            };
            let mut req = DraftReq::new(log, k, params, &mut *rng);
            req.source = source;
            if has_hook {
                req.hook = Some(&mut ask);
            }
            drafter.draft(std::slice::from_mut(&mut req))?;
            draft = req.draft;
            draft.truncate(k);
            // Time in the hook is policy time, not drafting.
            dt += (t.elapsed().as_secs_f64() - hook_seconds).max(0.0);
            self.counters.policy_seconds += hook_seconds;
            self.counters.phases.schedule += hook_seconds;
            if let Some(e) = hook_error {
                // The schedule failed mid-draft: nothing drafted is verified
                // (this round is a plain step, and so is the rest).
                self.fail(e);
                draft = Draft::default();
                k = 0;
            }
        }
        let mut plan = RoundPlan {
            rows: vec![log[before]],
            round_no,
            policy_before,
            traced_input,
            k,
            draft: Draft::default(),
            draft_seconds: 0.0,
            draft_steps,
            source,
            hidden: None,
        };
        if by_head {
            self.counters.draft_seconds += dt;
            self.counters.phases.draft += dt;
            plan.draft_seconds = dt;
            return Ok(Plan::Head(HeadJob { plan }));
        }
        self.set_draft(&mut plan, draft, dt, target)?;
        Ok(Plan::Ready(plan))
    }

    /// Sets what the verify forwards (step 3 of a round): the pending
    /// token, then `draft` as the request's grammar allows it; `seconds`
    /// more drafting.
    fn set_draft(
        &mut self,
        plan: &mut RoundPlan,
        mut draft: Draft,
        seconds: f64,
        target: &mut dyn Target,
    ) -> Result<()> {
        self.counters.draft_seconds += seconds;
        self.counters.phases.draft += seconds;
        plan.draft_seconds += seconds;
        if let Some(c) = &self.constraint {
            let n = c.lock().valid_prefix(&draft.tokens)?;
            draft.truncate(n);
        }
        draft.truncate(plan.k);
        let kd = draft.tokens.len();
        plan.rows.truncate(1);
        plan.rows.extend_from_slice(&draft.tokens);
        if kd > 0 {
            let before = target.offset();
            let keep: Vec<usize> = (1..=kd + 1).map(|i| before + i).collect();
            target.prepare_snapshots(&keep);
        }
        plan.draft = draft;
        Ok(())
    }

    /// The head drafting of `job`: its head drafter and what it drafts
    /// from (the request's `log`, `params` and `rng`).
    pub fn head_round<'a>(
        &'a mut self,
        job: &HeadJob,
        log: &'a [u32],
        params: &'a SamplingParams,
        rng: &'a mut Rng,
    ) -> Result<head::HeadRound<'a>> {
        let drafter = (self.spec.as_mut())
            .and_then(|s| s.drafter.head_drafter(job.plan.source))
            .context("a head job of a request without an MTP head drafter")?;
        Ok(head::HeadRound {
            drafter,
            log,
            k: job.plan.k,
            params,
            rng,
            hook: None,
            draft: Draft::default(),
        })
    }

    /// The plan of `job` with what its head drafted (`seconds`: its share
    /// of that drafting): cut by the grammar, its rows and snapshots, as
    /// [`SpecState::plan`] ends a round it drafts itself.
    pub fn finish_head(
        &mut self,
        job: HeadJob,
        draft: Draft,
        seconds: f64,
        target: &mut dyn Target,
    ) -> Result<RoundPlan> {
        let mut plan = job.plan;
        self.set_draft(&mut plan, draft, seconds, target)?;
        Ok(plan)
    }

    /// The first half of reading a round's `rows`: checks them against the
    /// plan and applies the request's grammar; [`read_rows`] then applies
    /// the sampling transforms, a batched step's requests together.
    pub fn mask_rows(
        &self,
        plan: &RoundPlan,
        rows: VerifyRows,
        log: &[u32],
        params: &SamplingParams,
    ) -> Result<MaskedRows> {
        let kd = plan.draft.tokens.len();
        anyhow::ensure!(
            rows.len() == if kd > 0 { kd + 1 } else { 1 },
            "the verify returned {} rows for {kd} drafts",
            rows.len()
        );
        let t = Instant::now();
        let rows = match rows {
            VerifyRows::Logits(mut rows) => {
                if let Some(c) = &self.constraint {
                    c.lock().mask_rows(&mut rows, &plan.draft.tokens)?;
                }
                VerifyRows::Logits(rows)
            }
            VerifyRows::Argmax(a) => {
                // Only what a plain greedy distribution is: no transform
                // to apply, no mask, nothing sampled.
                anyhow::ensure!(
                    params.plain_greedy() && self.constraint.is_none(),
                    "argmax-only verify rows for a request whose rows need transforms"
                );
                VerifyRows::Argmax(a)
            }
        };
        let seconds = t.elapsed().as_secs_f64();
        Ok(MaskedRows::new(
            rows,
            &plan.draft.tokens,
            log,
            params,
            seconds,
        ))
    }

    /// A round's decision: the acceptance policy's answer over the read
    /// rows and the token it implies. It touches only this
    /// request's host state (its policies' stores, counters, RNG), never
    /// the target, so a batched step decides its requests on several
    /// threads and then applies them ([`SpecState::apply`]) one by one.
    pub fn decide(
        &mut self,
        plan: RoundPlan,
        read: ReadRows,
        verify_seconds: f64,
        params: &SamplingParams,
        rng: &mut Rng,
    ) -> Result<Decided> {
        let draft = &plan.draft;
        let kd = draft.tokens.len();
        anyhow::ensure!(
            read.dists.len() == if kd > 0 { kd + 1 } else { 1 },
            "{} rows read for {kd} drafts",
            read.dists.len()
        );
        let vt = verify_seconds;
        self.counters.verify_seconds += vt;
        let ReadRows {
            mut rows,
            dists,
            seconds,
        } = read;
        self.counters.phases.rows += seconds;

        // 4. Decide.
        let mut out = RoundOutcome {
            drafted: kd,
            ..Default::default()
        };
        let mut decision = None;
        let mut traced_positions = Vec::new();
        if kd > 0 {
            let positions: Vec<Position> = (0..kd)
                .map(|i| {
                    let tok = draft.tokens[i];
                    Position {
                        token: tok,
                        p: dists.p(i, tok),
                        q: draft.q[i].q(tok),
                        target_argmax: dists.argmax(i),
                        entropy: dists.entropy(i),
                        uniform: rng.uniform(),
                        draft_entropy: draft.entropy.get(i).copied(),
                        draft_top1: draft.top1.get(i).copied(),
                        confidence: draft.confidence.get(i).copied(),
                    }
                })
                .collect();
            if self.trace.is_some() {
                traced_positions = positions.clone();
            }
            let t = Instant::now();
            let r = match self.spec.as_mut() {
                Some(s) => s.acceptance.decide(&positions),
                // The schedule cannot fail after drafting, but a plan is
                // only data: never panic on one.
                None => Err(PolicyError::new(
                    "acceptance",
                    specd_policy::PolicyErrorKind::InvalidAnswer,
                    "no speculation to decide with",
                )),
            };
            let at = t.elapsed().as_secs_f64();
            self.counters.policy_seconds += at;
            self.counters.phases.accept += at;
            // Validated by the policy host (`specd_policy::validate`).
            match r {
                Ok(d) => decision = Some(d),
                Err(e) => self.fail(e),
            }
        }
        let next = match decision {
            None => {
                // A plain step (or a failed policy: keep none of the drafts).
                out.accepted = 0;
                dists.sample(0, params, rng)
            }
            Some(d) => {
                let n = d.accepted as usize;
                out.accepted = n;
                out.tokens.extend_from_slice(&draft.tokens[..n]);
                out.margins.extend((0..n).map(|i| dists.margin(i)));
                if n == kd {
                    dists.sample(kd, params, rng)
                } else {
                    match d.correction {
                        Correction::Token(t) => t,
                        Correction::TargetSample => dists.sample(n, params, rng),
                        Correction::Residual => {
                            dists.residual(n, &draft.q[n], draft.tokens[n], params, rng)
                        }
                    }
                }
            }
        };
        out.margins.push(dists.margin(out.accepted));
        out.tokens.push(next);
        rows.truncate(out.tokens.len());
        out.rows = rows;
        out.dists = dists.into_committed(out.tokens.len());
        Ok(Decided {
            plan,
            out,
            decision,
            traced_positions,
            verify_seconds: vt,
        })
    }

    /// Ends a decided round: roll the target back to what `d` kept, tell
    /// the drafter, count, trace.
    pub fn apply(
        &mut self,
        d: Decided,
        target: &mut dyn Target,
        log: &[u32],
    ) -> Result<RoundOutcome> {
        let before = log.len() - 1;
        let Decided {
            plan,
            out,
            decision,
            traced_positions,
            verify_seconds: vt,
        } = d;
        let RoundPlan {
            round_no,
            policy_before,
            traced_input,
            k,
            draft_seconds: dt,
            draft_steps,
            source,
            hidden,
            ..
        } = plan;
        let kd = out.drafted;
        let mut out = out;

        // 5. Roll back to what was kept: the pending token plus accepted
        //    drafts (the verify's feature rows with the caches).
        let t = Instant::now();
        let kept = before + 1 + out.accepted;
        target.rewind(kept)?;
        out.hidden = hidden.map(|h| h.before(kept)).transpose()?;
        if let Some(c) = &self.constraint {
            c.lock().commit(&out.tokens)?;
        }
        if let Some(spec) = self.spec.as_mut() {
            if kd > 0 {
                spec.drafter.commit(log.len(), kd, out.accepted)?;
            }
        }
        self.counters.phases.rollback += t.elapsed().as_secs_f64();
        self.counters.phases.rounds += 1;
        self.counters.phases.drafts.round(k, kd, out.accepted);

        // 6. What the schedule learns.
        self.counters.rounds += 1;
        if kd > 0 {
            self.counters.spec_rounds += 1;
            self.counters.drafted += kd as u64;
            self.counters.accepted += out.accepted as u64;
            let h = &mut self.counters.accepted_histogram;
            if h.len() <= out.accepted {
                h.resize(out.accepted + 1, 0);
            }
            h[out.accepted] += 1;
        }
        self.history.push(kd, out.accepted, dt, vt, source);
        if let Some(trace) = self.trace.as_mut() {
            trace.push(RoundTrace {
                round: round_no,
                schedule_input: traced_input,
                k: k as u32,
                drafted: kd as u32,
                draft_steps,
                positions: traced_positions,
                decision,
                accepted: out.accepted as u32,
                tokens: out.tokens.clone(),
                draft_seconds: dt,
                verify_seconds: vt,
                policy_seconds: self.counters.policy_seconds - policy_before,
                source: source as u32,
            });
        }
        Ok(out)
    }
}

/// Where a request's round sits in a batched step: what its schedule is
/// told as the batch context (contract 0.2's `batch-sequences` and
/// `batch-rows-planned`; both 0 outside the scheduler, in
/// `sequence::generate`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchContext {
    /// Requests in this step, itself included (`batch-sequences`).
    pub batch_sequences: u32,
    /// Rows already planned for this step by the requests asked before it,
    /// plus every prefill row (`batch-rows-planned`).
    pub batch_rows_planned: u32,
}

/// A round decided, not yet applied ([`SpecState::decide`]).
pub struct Decided {
    plan: RoundPlan,
    out: RoundOutcome,
    decision: Option<Decision>,
    traced_positions: Vec<Position>,
    verify_seconds: f64,
}

/// What a round reads of its request: the committed `log` (the target's
/// caches hold all but its last token), the sampling parameters and the
/// request's RNG, how many tokens it generated and how many it may still
/// (`budget_left` >= 1), and the target's feature rows its drafter has not
/// read (those of the forwards since its last round, as they came back
/// from them, rolled back with the caches; `None`: none, or its drafter
/// reads none).
pub struct RoundRequest<'a> {
    pub log: &'a [u32],
    pub params: &'a SamplingParams,
    pub rng: &'a mut Rng,
    pub generated: usize,
    pub budget_left: usize,
    pub hidden: Option<HiddenRows>,
}

impl RoundRequest<'_> {
    /// The same request for a call that does not keep it.
    pub fn reborrow(&mut self) -> RoundRequest<'_> {
        RoundRequest {
            log: self.log,
            params: self.params,
            rng: self.rng,
            generated: self.generated,
            budget_left: self.budget_left,
            hidden: self.hidden.take(),
        }
    }
}

/// A round planned up to its verify ([`SpecState::plan`]).
pub struct RoundPlan {
    /// What the verify forwards: the pending token, then the drafts.
    pub rows: Vec<u32>,
    round_no: u32,
    policy_before: f64,
    traced_input: Option<ScheduleInput>,
    k: usize,
    draft: Draft,
    draft_seconds: f64,
    draft_steps: Vec<HookCall>,
    /// Which of the drafter's sources drafted ([`Drafter::source`]).
    source: usize,
    /// The verify's feature rows, where its drafter reads them
    /// ([`RoundPlan::verified`]).
    hidden: Option<HiddenRows>,
}

/// What [`SpecState::plan`] gives: a round ready for its verify, or one
/// whose draft an MTP head makes, with the other head jobs of its step.
pub enum Plan {
    Ready(RoundPlan),
    Head(HeadJob),
}

/// A round waiting for its MTP head's draft ([`SpecState::head_round`],
/// then [`SpecState::finish_head`]; a step's together,
/// `sequence::draft_head_rounds`).
pub struct HeadJob {
    plan: RoundPlan,
}

impl HeadJob {
    /// The k its schedule asked for: the head drafts at most that many.
    pub fn asked(&self) -> usize {
        self.plan.k
    }
}

impl RoundPlan {
    /// Drafts the verify checks (then every row's logits are needed).
    pub fn drafted(&self) -> usize {
        self.draft.tokens.len()
    }

    /// Its verify came back as `v`: the rows go on to be read, the feature
    /// rows stay with the round until it is applied (then those of what was
    /// kept go to [`RoundOutcome::hidden`]).
    pub fn verified(&mut self, v: Verified) -> VerifyRows {
        self.hidden = v.hidden;
        v.rows
    }
}

/// Threads a round's rows are read on: the kernels' (the forward is done
/// by then, so they are free).
pub fn row_threads() -> usize {
    specd_mlx::kernels::threads().max(1) as usize
}

#[cfg(test)]
mod tests;
