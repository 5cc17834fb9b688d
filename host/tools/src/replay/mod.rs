//! Offline replay of recorded speculation rounds (`specd replay`).
//!
//! A trace (`--record FILE`, see [`specd::trace`]) holds, per round, what the
//! policies saw and answered, with the measured timings.  Replay feeds those
//! rounds to other policies without a model:
//!
//! - the schedule's input is rebuilt each round from the *replayed* history
//!   (recent rounds, Laplace-smoothed per-position acceptance, EMA timings —
//!   exactly as [`specd::speculation`] builds it), so a schedule sees the
//!   consequences of its own answers;
//! - its answer k' is capped by what the drafter proposed in the recording
//!   (only `drafted` positions are known): a larger k' is truncated and
//!   counted (`truncated_rounds`);
//! - a schedule with contract 0.2's per-token hook is asked after each
//!   recorded draft token, as the drafter asked it (only where the recorded
//!   drafter drafted token by token: its positions carry draft statistics).
//!   It sees the recorded step (the traced `draft_steps`, or the same
//!   numbers read from the recorded position) with its own k', and a
//!   `false` cuts the round's drafts there;
//! - the acceptance policy decides on the recorded `positions[..k']`
//!   (target p, draft q, argmax, entropy and the host's uniforms), giving n';
//! - the round commits n' + 1 tokens and costs, in the timing model,
//!   `k' * draft_seconds_per_token + verify(k')`, where verify(j) is the
//!   median recorded verify time of j drafts (unmeasured lengths
//!   interpolated as the `throughput` schedule does) and a plain step costs
//!   verify(0).  The modelled speedup is (tokens / time) / (1 / verify(0)).
//!
//! Assumption: round i of the replay sees round i's recorded positions even
//! when an earlier replayed round kept fewer or more tokens than the
//! recording (the text would then differ; acceptance statistics of the
//! positions do not depend on it much).  With the recorded policies (and
//! their configs) the replay is the recording: every k and decision is
//! reproduced, which the report checks (`matches_recording`).
use anyhow::{bail, Result};
use serde::Serialize;
use specd::speculation::RoundTrace;
use specd::speculation::ScheduleHistory;
use specd::trace::Recorded;
use specd_policy::{Acceptance, Decision, DraftStep, PolicyHost, Position, Schedule};
use std::time::Instant;

/// Draft limit when a trace does not show it: the default.
use specd::options::DEFAULT_DRAFT_MAX;

/// Which policies to replay.
#[derive(Debug, Clone, Default)]
pub struct ReplayPolicies {
    /// None: the recorded schedule.
    pub schedule: Option<String>,
    pub schedule_config: String,
    /// None: the recorded acceptance policy.
    pub acceptance: Option<String>,
    pub acceptance_config: String,
    /// None: inferred from the trace (the largest `max_draft` seen).
    pub draft_max: Option<usize>,
}

/// The cost model built from a trace's measured timings.
#[derive(Debug, Clone, Serialize)]
pub struct TimingModel {
    /// Total draft seconds / total drafted tokens.
    pub draft_seconds_per_token: f64,
    /// `[j]` = median verify seconds of rounds that verified j drafts (0 = none recorded).
    pub verify_seconds_by_len: Vec<f64>,
    /// verify(0): the plain step.
    pub plain_step_seconds: f64,
    /// False when no plain step was recorded (verify(0) is then extrapolated
    /// from the shortest measured length, which overstates it).
    pub plain_step_measured: bool,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// Verify cost of k drafts from partial measurements, exactly as the
/// `throughput` schedule estimates it.
pub use specd_policy::logic::estimate_verify;

impl TimingModel {
    pub fn from_rounds<'a>(rounds: impl IntoIterator<Item = &'a RoundTrace>) -> Result<Self> {
        let mut by_len: Vec<Vec<f64>> = Vec::new();
        let (mut dsec, mut dtok) = (0.0, 0u64);
        for r in rounds {
            let j = r.drafted as usize;
            if by_len.len() <= j {
                by_len.resize(j + 1, Vec::new());
            }
            if r.verify_seconds.is_finite() && r.verify_seconds > 0.0 {
                by_len[j].push(r.verify_seconds);
            }
            if r.drafted > 0 {
                dsec += r.draft_seconds;
                dtok += r.drafted as u64;
            }
        }
        let verify_seconds_by_len: Vec<f64> = by_len
            .iter_mut()
            .map(|v| if v.is_empty() { 0.0 } else { median(v) })
            .collect();
        let Some(plain) = estimate_verify(&verify_seconds_by_len, 0) else {
            bail!("the trace holds no verify timings");
        };
        Ok(TimingModel {
            draft_seconds_per_token: if dtok > 0 { dsec / dtok as f64 } else { 0.0 },
            plain_step_measured: verify_seconds_by_len.first().is_some_and(|t| *t > 0.0),
            verify_seconds_by_len,
            plain_step_seconds: plain,
        })
    }

    pub fn verify(&self, k: usize) -> f64 {
        estimate_verify(&self.verify_seconds_by_len, k).unwrap_or(self.plain_step_seconds)
    }

    /// Modelled seconds of a round that drafts k.
    pub fn round_seconds(&self, k: usize) -> f64 {
        if k == 0 {
            self.plain_step_seconds
        } else {
            k as f64 * self.draft_seconds_per_token + self.verify(k)
        }
    }

    /// A round's cost in plain steps (1.0 exactly for k = 0).
    pub fn round_cost(&self, k: usize) -> f64 {
        self.round_seconds(k) / self.plain_step_seconds
    }
}

/// One replayed round (for charts and the JSON report).
#[derive(Debug, Clone, Serialize)]
pub struct ReplayedRound {
    pub request: usize,
    pub round: u32,
    /// The schedule's answer (after the max-draft clamp).
    pub k: u32,
    /// Drafts the replay could use: min(k, recorded drafted).
    pub drafted: u32,
    pub accepted: u32,
    pub recorded_k: u32,
    pub recorded_accepted: u32,
}

/// What one policy pair did on a trace.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    pub schedule: String,
    pub schedule_config: String,
    pub acceptance: String,
    pub acceptance_config: String,
    /// Schedule and acceptance are the recorded ones.
    pub recorded_policies: bool,
    pub requests: usize,
    pub rounds: u64,
    /// Rounds that verified at least one draft.
    pub spec_rounds: u64,
    pub drafted: u64,
    pub accepted: u64,
    /// Committed tokens: accepted drafts + one correction/bonus per round.
    pub tokens: u64,
    pub acceptance_rate: f64,
    pub mean_draft: f64,
    pub accepted_per_round: f64,
    pub tokens_per_round: f64,
    /// Rounds whose k exceeded the recorded drafts (truncated to them).
    pub truncated_rounds: u64,
    pub modelled_seconds: f64,
    /// Modelled tokens/s over plain decoding (1 / verify(0)).
    pub modelled_speedup: f64,
    /// Rounds where k or the decision differed from the recording.
    pub decision_mismatches: u64,
    /// Every k and every decision equal to the recording's.
    pub matches_recording: bool,
    pub first_mismatch: Option<String>,
    /// A policy failed (trap, timeout, invalid answer): plain from there.
    pub policy_failures: Vec<String>,
    pub replay_seconds: f64,
    pub rounds_per_second: f64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub per_round: Vec<ReplayedRound>,
}

/// The draft limit a recording ran with: exact from any round where the
/// budget did not bind, else the largest seen (default 16 with no evidence).
pub fn infer_draft_max(rec: &Recorded) -> usize {
    let mut seen = 0usize;
    for r in &rec.rounds {
        if let Some(i) = &r.schedule_input {
            if (i.max_draft as u64) < (i.budget_left as u64).saturating_sub(1) {
                return i.max_draft as usize;
            }
            seen = seen.max(i.max_draft as usize);
        }
    }
    if seen == 0 {
        DEFAULT_DRAFT_MAX
    } else {
        seen
    }
}

/// Replays every request of `recs` under one policy pair.  `keep_rounds`
/// keeps the per-round answers in the report (charts).
pub fn replay(
    host: &PolicyHost,
    recs: &[Recorded],
    policies: &ReplayPolicies,
    timing: &TimingModel,
    keep_rounds: bool,
) -> Result<ReplayReport> {
    if recs.is_empty() {
        bail!("the trace holds no requests");
    }
    let first = &recs[0].header;
    let schedule_name = policies
        .schedule
        .clone()
        .unwrap_or_else(|| first.schedule.clone());
    let acceptance_name = policies
        .acceptance
        .clone()
        .unwrap_or_else(|| first.acceptance.clone());
    let recorded_policies = recs
        .iter()
        .all(|r| r.header.schedule == schedule_name && r.header.acceptance == acceptance_name);
    let mut rep = ReplayReport {
        schedule: schedule_name.clone(),
        schedule_config: policies.schedule_config.clone(),
        acceptance: acceptance_name.clone(),
        acceptance_config: policies.acceptance_config.clone(),
        recorded_policies,
        requests: recs.len(),
        rounds: 0,
        spec_rounds: 0,
        drafted: 0,
        accepted: 0,
        tokens: 0,
        acceptance_rate: 0.0,
        mean_draft: 0.0,
        accepted_per_round: 0.0,
        tokens_per_round: 0.0,
        truncated_rounds: 0,
        modelled_seconds: 0.0,
        modelled_speedup: 0.0,
        decision_mismatches: 0,
        matches_recording: false,
        first_mismatch: None,
        policy_failures: Vec::new(),
        replay_seconds: 0.0,
        rounds_per_second: 0.0,
        per_round: Vec::new(),
    };
    let mut cost_in_plain_steps = 0.0f64;
    let t0 = Instant::now();
    for (ri, rec) in recs.iter().enumerate() {
        let draft_max = policies.draft_max.unwrap_or_else(|| infer_draft_max(rec));
        // One schedule instance per drafter source (as the live round
        // keeps them: `suffix+mtp`'s suffix and head rounds apart), made
        // when its source first drafts; all dropped once a policy fails.
        let mut instances: Vec<Option<Box<dyn Schedule>>> = Vec::new();
        let mut policies_failed = false;
        let mut acceptance: Option<Box<dyn Acceptance>> = Some(
            host.acceptance(&acceptance_name, &policies.acceptance_config, u32::MAX)
                .map_err(|e| anyhow::anyhow!("acceptance {acceptance_name:?}: {e}"))?,
        );
        let speculating = rec.header.drafter != "none";
        // The request's token budget: generated + budget_left as first seen.
        let budget: u64 = rec
            .rounds
            .iter()
            .find_map(|r| {
                r.schedule_input
                    .as_ref()
                    .map(|i| i.generated as u64 + i.budget_left as u64)
            })
            .unwrap_or_else(|| rec.rounds.iter().map(|r| r.tokens.len() as u64).sum());
        let mut hist = ScheduleHistory::new(draft_max);
        let mut generated = 0u64;
        for (i, r) in rec.rounds.iter().enumerate() {
            let budget_left = budget.saturating_sub(generated);
            if budget_left == 0 {
                break;
            }
            let round_no = i as u32;
            let failures_before = rep.policy_failures.len();
            let source = r.source as usize;
            if instances.len() <= source {
                instances.resize_with(source + 1, || None);
            }
            if instances[source].is_none() && !policies_failed {
                let key = match source {
                    0 => rec.header.model.clone(),
                    s => format!("{}#source={s}", rec.header.model),
                };
                instances[source] = Some(
                    host.schedule(&schedule_name, &policies.schedule_config, &key)
                        .map_err(|e| anyhow::anyhow!("schedule {schedule_name:?}: {e}"))?,
                );
            }
            let mut schedule = instances[source].take();
            // 1. The schedule.
            let mut k = 0usize;
            if speculating && schedule.is_some() {
                let max_draft = draft_max.min(budget_left.saturating_sub(1) as usize);
                if max_draft > 0 {
                    let mut input = hist.input(
                        round_no,
                        generated as usize,
                        budget_left as usize,
                        max_draft,
                        r.source as usize,
                    );
                    if let Some(rec_input) = &r.schedule_input {
                        input.batch_sequences = rec_input.batch_sequences;
                        input.batch_rows_planned = rec_input.batch_rows_planned;
                    }
                    match schedule
                        .as_mut()
                        .expect("checked")
                        .next_draft_length(&input)
                    {
                        Ok(v) => k = (v as usize).min(max_draft),
                        Err(e) => {
                            rep.policy_failures
                                .push(format!("request {ri} round {i}: {e}"));
                            schedule = None;
                            acceptance = None;
                        }
                    }
                }
            }
            // 2. What the recording can tell about k drafts.
            let mut kd = k.min(r.drafted as usize).min(r.positions.len());
            // Truncated: the recorded drafter stopped at the recorded k (or
            // the recorded schedule stopped it), so it might have proposed
            // more; when it proposed fewer than asked otherwise, it had no
            // more to offer (same as in the recording).
            let recorded_stop = r.draft_steps.last().is_some_and(|s| !s.go_on);
            let mut hook_answers: Vec<bool> = Vec::new();
            // 2b. The per-token hook, on a stepwise drafter's recorded steps.
            let stepwise = r
                .positions
                .first()
                .is_some_and(|p| p.draft_entropy.is_some())
                || !r.draft_steps.is_empty();
            if kd > 0 && stepwise {
                if let Some(s) = schedule.as_mut().filter(|s| s.has_draft_hook()) {
                    for j in 0..k - 1 {
                        let step = match r.draft_steps.get(j) {
                            Some(h) => DraftStep {
                                k: k as u32,
                                ..h.step
                            },
                            None => match r.positions.get(j) {
                                Some(p) if j < kd => DraftStep {
                                    index: j as u32,
                                    token: p.token,
                                    q: p.q,
                                    entropy: p.draft_entropy.unwrap_or(0.0),
                                    top1: p.draft_top1.unwrap_or(1.0),
                                    k: k as u32,
                                },
                                _ => break,
                            },
                        };
                        match s.continue_drafting(&step) {
                            Ok(go_on) => {
                                hook_answers.push(go_on);
                                if !go_on {
                                    kd = kd.min(j + 1);
                                    break;
                                }
                            }
                            Err(e) => {
                                rep.policy_failures
                                    .push(format!("request {ri} round {i}: {e}"));
                                hook_answers.clear();
                                kd = 0;
                                break;
                            }
                        }
                    }
                    if rep.policy_failures.len() > failures_before {
                        schedule = None;
                        acceptance = None;
                    }
                }
            }
            let stopped_here = hook_answers.last() == Some(&false);
            if kd < k && !stopped_here && (r.drafted >= r.k || recorded_stop) {
                rep.truncated_rounds += 1;
            }
            // 3. Acceptance on the recorded positions.
            let mut decision: Option<Decision> = None;
            if kd > 0 {
                if let Some(a) = acceptance.as_mut() {
                    let positions: &[Position] = &r.positions[..kd];
                    match a.decide(positions) {
                        Ok(d) if (d.accepted as usize) <= kd => decision = Some(d),
                        Ok(d) => {
                            rep.policy_failures.push(format!(
                                "request {ri} round {i}: accepted {} of {kd} drafts",
                                d.accepted
                            ));
                            schedule = None;
                            acceptance = None;
                        }
                        Err(e) => {
                            rep.policy_failures
                                .push(format!("request {ri} round {i}: {e}"));
                            schedule = None;
                            acceptance = None;
                        }
                    }
                }
            }
            let n = decision.map(|d| d.accepted as usize).unwrap_or(0);
            // The instance goes back for its source's next round; a failed
            // policy ends speculation for the rest of the request.
            match schedule {
                Some(s) if !policies_failed => instances[source] = Some(s),
                _ => {
                    policies_failed = true;
                    instances.clear();
                }
            }
            // 4. Compare with the recording (k, every hook answer, the decision).
            let recorded_answers: Vec<bool> = r.draft_steps.iter().map(|h| h.go_on).collect();
            if (k as u32) != r.k || hook_answers != recorded_answers || decision != r.decision {
                rep.decision_mismatches += 1;
                if rep.first_mismatch.is_none() {
                    rep.first_mismatch = Some(format!(
                        "request {ri} round {i}: k {k} vs recorded {}, draft hook {hook_answers:?} vs recorded {recorded_answers:?}, decision {:?} vs recorded {:?}",
                        r.k, decision, r.decision
                    ));
                }
            }
            // 5. Timings fed back to the schedule: the recorded ones where the
            //    round is the recorded one, else the model's.
            let (dt, vt) = if kd == r.drafted as usize {
                (r.draft_seconds, r.verify_seconds)
            } else {
                let per_tok = if r.drafted > 0 {
                    r.draft_seconds / r.drafted as f64
                } else {
                    timing.draft_seconds_per_token
                };
                (kd as f64 * per_tok, timing.verify(kd))
            };
            hist.push(kd, n, dt, vt, r.source as usize);
            // 6. Totals.
            rep.rounds += 1;
            if kd > 0 {
                rep.spec_rounds += 1;
                rep.drafted += kd as u64;
                rep.accepted += n as u64;
            }
            rep.tokens += n as u64 + 1;
            generated += n as u64 + 1;
            cost_in_plain_steps += timing.round_cost(kd);
            rep.modelled_seconds += timing.round_seconds(kd);
            if keep_rounds {
                rep.per_round.push(ReplayedRound {
                    request: ri,
                    round: round_no,
                    k: k as u32,
                    drafted: kd as u32,
                    accepted: n as u32,
                    recorded_k: r.k,
                    recorded_accepted: r.accepted,
                });
            }
        }
    }
    rep.replay_seconds = t0.elapsed().as_secs_f64();
    rep.rounds_per_second = rep.rounds as f64 / rep.replay_seconds.max(1e-9);
    let rounds = rep.rounds.max(1) as f64;
    rep.acceptance_rate = if rep.drafted > 0 {
        rep.accepted as f64 / rep.drafted as f64
    } else {
        0.0
    };
    rep.mean_draft = rep.drafted as f64 / rounds;
    rep.accepted_per_round = rep.accepted as f64 / rounds;
    rep.tokens_per_round = rep.tokens as f64 / rounds;
    // tokens / (cost in plain steps): 1.0 exactly when every round is plain.
    rep.modelled_speedup = if cost_in_plain_steps > 0.0 {
        rep.tokens as f64 / cost_in_plain_steps
    } else {
        0.0
    };
    rep.matches_recording = rep.decision_mismatches == 0 && rep.policy_failures.is_empty();
    Ok(rep)
}

/// One line per report, for the terminal.
pub fn table(reports: &[ReplayReport]) -> String {
    let mut s = format!(
        "{:<34} {:<16} {:>7} {:>9} {:>9} {:>8} {:>9} {:>9} {:>10}  {}\n",
        "SCHEDULE",
        "ACCEPTANCE",
        "ROUNDS",
        "MEAN_K",
        "ACC/RND",
        "ACC_RATE",
        "SPEEDUP",
        "TRUNC",
        "ROUNDS/S",
        "MATCHES RECORDING"
    );
    for r in reports {
        let sched = if r.schedule_config.is_empty() {
            r.schedule.clone()
        } else {
            format!("{} {}", r.schedule, r.schedule_config)
        };
        let acc = if r.acceptance_config.is_empty() {
            r.acceptance.clone()
        } else {
            format!("{} {}", r.acceptance, r.acceptance_config)
        };
        let matches = if r.matches_recording {
            "yes (every k and decision)".to_string()
        } else {
            format!("no ({} rounds differ)", r.decision_mismatches)
        };
        s.push_str(&format!(
            "{:<34} {:<16} {:>7} {:>9.2} {:>9.2} {:>8.3} {:>8.3}x {:>9} {:>10.0}  {}\n",
            sched,
            acc,
            r.rounds,
            r.mean_draft,
            r.accepted_per_round,
            r.acceptance_rate,
            r.modelled_speedup,
            r.truncated_rounds,
            r.rounds_per_second,
            matches
        ));
    }
    s
}

pub mod charts;
