//! The standard specd policies as plain Rust.
//!
//! This crate is the logic inside the built-in policy components (each
//! component under `plugins/rust/` is a thin wit-bindgen shim over one type
//! here, see [`schedule_component!`] and [`acceptance_component!`]) and the
//! native baselines of the host (`specd_policy::native`), so both decide the
//! same way by construction.  The reference semantics each policy follows are
//! stated on its type.  Nothing here knows about WebAssembly.
//!
//! `no_std` + `alloc`, so that the components need no WASI at all: Rust's
//! `std` on wasm32-wasip2 imports WASI (stderr for panic messages,
//! environment, exit), and a component with no imports is the smallest
//! possible sandbox.
#![no_std]

extern crate alloc;

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

/// Rounds of [`ScheduleInput::recent`] a schedule sees: the host passes at
/// most the last this many (the WIT promises a bounded window).
pub const RECENT_WINDOW: usize = 32;

// The contract types: those of WIT `specd:policy@0.2.0` (`wit/0.2/policy.wit`
// documents every field).  These are the one Rust form of them: the host's
// policy traits, traces and native baselines use them as they are, and the
// components convert the wit-bindgen types into them at their boundary.
// Contract 0.1.0 (`wit/policy.wit`) is the same without the fields marked
// "0.2": the host adapts 0.1 components into these types at one place
// (`specd_policy`'s `wasm.rs`), where the 0.2 fields are dropped.

/// One finished round (WIT `round-record`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RoundRecord {
    pub drafted: u32,
    pub accepted: u32,
    pub draft_seconds: f64,
    pub verify_seconds: f64,
}

/// What a schedule sees each round (WIT `schedule-input`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ScheduleInput {
    /// Index of the round about to run (0 = first round of the request).
    pub round: u32,
    /// Tokens generated so far in this request.
    pub generated: u32,
    /// Tokens the request may still generate.
    pub budget_left: u32,
    /// Largest valid answer this round.
    pub max_draft: u32,
    /// Most recent rounds, oldest first; the last one is round `round - 1`.
    /// Only the last [`RECENT_WINDOW`] reach the policy.
    pub recent: Vec<RoundRecord>,
    /// P(draft i accepted | drafts 0..i accepted), estimated so far.
    pub position_acceptance: Vec<f64>,
    /// Measured drafter seconds per drafted token (0 = unknown).
    pub draft_seconds_per_token: f64,
    /// `[j]` = measured seconds of a target forward of j + 1 new tokens
    /// (j = 0 ..= max_draft); 0 = not measured yet.
    pub verify_seconds_by_len: Vec<f64>,
    /// 0.2: requests in this round's batched step, itself included (0 = not batched).
    #[serde(default)]
    pub batch_sequences: u32,
    /// 0.2: rows the step already holds when the schedule is asked (0 = not batched).
    #[serde(default)]
    pub batch_rows_planned: u32,
}

/// 0.2: one token a drafter drafting token by token just drafted (WIT
/// `draft-step`), handed to [`ScheduleLogic::continue_drafting`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DraftStep {
    /// Index in this round's draft (0 = first); asked only while index + 1 < k.
    pub index: u32,
    pub token: u32,
    /// Draft probability of `token` (the q acceptance sees).
    pub q: f32,
    /// Entropy (nats) of the draft distribution.
    pub entropy: f32,
    /// Largest probability of the draft distribution.
    pub top1: f32,
    /// This round's k (the upper bound).
    pub k: u32,
}

impl ScheduleInput {
    /// The rounds a policy is shown: the last [`RECENT_WINDOW`] of `recent`.
    pub fn recent_window(&self) -> &[RoundRecord] {
        &self.recent[self.recent.len().saturating_sub(RECENT_WINDOW)..]
    }
}

/// One drafted position (WIT `position`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Position {
    pub token: u32,
    /// Target probability of `token`.
    pub p: f32,
    /// Draft probability of `token` (1 for a point-mass drafter).
    pub q: f32,
    pub target_argmax: u32,
    /// Entropy (nats) of the target distribution here.
    pub entropy: f32,
    /// Host-drawn uniform in [0, 1).
    pub uniform: f32,
    /// 0.2: entropy (nats) of the draft distribution (none without one).
    #[serde(default)]
    pub draft_entropy: Option<f32>,
    /// 0.2: largest probability of the draft distribution (none without one).
    #[serde(default)]
    pub draft_top1: Option<f32>,
    /// 0.2: the drafter's own confidence (suffix drafter), none otherwise.
    #[serde(default)]
    pub confidence: Option<f32>,
}

/// What follows the accepted drafts when not all were accepted (WIT `correction`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Correction {
    /// Sample norm(max(0, p - q)) at the first rejected position.
    Residual,
    /// Sample the target distribution at the first rejected position.
    TargetSample,
    /// Emit exactly this token (validated < vocab_size).
    Token(u32),
}

/// An acceptance answer (WIT `decision`).  After a full accept
/// (`accepted == positions.len()`) the host draws the bonus token itself and
/// ignores `correction`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub accepted: u32,
    pub correction: Correction,
}

/// A draft-length schedule (one value per request).
pub trait ScheduleLogic: Sized {
    fn create(config: &str, carried: Option<&[u8]>) -> Result<Self, String>;
    fn next_draft_length(&mut self, input: &ScheduleInput) -> u32;
    /// 0.2: whether to draft the token after `step` (a schedule that does
    /// not stop early keeps the default, true).
    fn continue_drafting(&mut self, _step: &DraftStep) -> bool {
        true
    }
    fn carry(&self) -> Option<Vec<u8>> {
        None
    }
}

/// An acceptance rule (one value per request).
pub trait AcceptanceLogic: Sized {
    fn create(config: &str, vocab_size: u32) -> Result<Self, String>;
    fn decide(&mut self, positions: &[Position]) -> Decision;
}

/// Parses a JSON config object; empty text means `{}`. Unknown keys are errors.
pub fn parse_config<T: for<'de> Deserialize<'de>>(config: &str) -> Result<T, String> {
    let text = if config.trim().is_empty() {
        "{}"
    } else {
        config
    };
    if !text.trim_start().starts_with('{') {
        return Err(format!("bad config {config:?}: expected a JSON object"));
    }
    serde_json::from_str(text).map_err(|e| format!("bad config {config:?}: {e}"))
}

// ---------------------------------------------------------------- schedules

/// `constant`: always k (config `{"k": 4}`), clipped to `max-draft`.
#[derive(Clone, Debug)]
pub struct Constant {
    pub k: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConstantConfig {
    #[serde(default = "default_initial")]
    k: u32,
}

fn default_initial() -> u32 {
    4
}

impl ScheduleLogic for Constant {
    fn create(config: &str, _carried: Option<&[u8]>) -> Result<Self, String> {
        let c: ConstantConfig = parse_config(config)?;
        Ok(Constant { k: c.k })
    }
    fn next_draft_length(&mut self, input: &ScheduleInput) -> u32 {
        self.k.min(input.max_draft)
    }
}

/// `heuristic` / `heuristic-transient`: Hugging Face transformers'
/// `num_assistant_tokens_schedule = "heuristic"`.
///
/// k starts at `initial` (config `{"initial": 4}`).  Before every round but the
/// first, the previous round (the last element of `recent`) updates it: +2
/// when every drafted token was accepted, -1 otherwise (never below 1); a
/// round that drafted nothing changes nothing.  k is kept within
/// [1, max-draft] and the answer is k (0 only when max-draft is 0).
///
/// `heuristic` carries k across requests (4 bytes, little-endian u32, handed
/// back by `carry` and read by the next request's `create`), as HF keeps it on
/// the assistant model; `heuristic-transient` starts every request at
/// `initial`.
#[derive(Clone, Debug)]
pub struct Heuristic {
    pub k: u32,
    pub transient: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HeuristicConfig {
    #[serde(default = "default_initial")]
    initial: u32,
}

impl Heuristic {
    pub fn new(config: &str, carried: Option<&[u8]>, transient: bool) -> Result<Self, String> {
        let c: HeuristicConfig = parse_config(config)?;
        if c.initial == 0 {
            return Err("bad config: initial must be >= 1".into());
        }
        let mut k = c.initial;
        if !transient {
            if let Some(&[a, b, c, d]) = carried {
                k = u32::from_le_bytes([a, b, c, d]).max(1);
            }
        }
        Ok(Heuristic { k, transient })
    }
}

impl ScheduleLogic for Heuristic {
    fn create(config: &str, carried: Option<&[u8]>) -> Result<Self, String> {
        Heuristic::new(config, carried, false)
    }
    fn next_draft_length(&mut self, input: &ScheduleInput) -> u32 {
        if input.round > 0 {
            if let Some(last) = input.recent.last() {
                if last.drafted > 0 {
                    if last.accepted >= last.drafted {
                        self.k = self.k.saturating_add(2);
                    } else {
                        self.k = self.k.saturating_sub(1).max(1);
                    }
                }
            }
        }
        if input.max_draft == 0 {
            return 0;
        }
        self.k = self.k.clamp(1, input.max_draft);
        self.k
    }
    fn carry(&self) -> Option<Vec<u8>> {
        (!self.transient).then(|| self.k.to_le_bytes().to_vec())
    }
}

/// The transient variant as its own type (for the component shims).
#[derive(Clone, Debug)]
pub struct HeuristicTransient(pub Heuristic);

impl ScheduleLogic for HeuristicTransient {
    fn create(config: &str, carried: Option<&[u8]>) -> Result<Self, String> {
        Heuristic::new(config, carried, true).map(HeuristicTransient)
    }
    fn next_draft_length(&mut self, input: &ScheduleInput) -> u32 {
        self.0.next_draft_length(input)
    }
}

/// `throughput`: the k that maximizes expected tokens per second.
///
/// For each k in 0..=K, K = min(max-draft, budget-left - 1):
///
///     tokens(k) = 1 + a0 + a0*a1 + ... + a0*...*a(k-1)   (accepted drafts + the correction/bonus token)
///     cost(k)   = k * draft-seconds-per-token + verify(k)
///
/// with a_i = position-acceptance[i] (clamped to [0, 1]; `prior`, default 0.6,
/// where the host has no estimate) and verify(k) = verify-seconds-by-len[k],
/// where unmeasured lengths are interpolated linearly between measured ones
/// and extrapolated from the last two (a single measured length of j + 1
/// rows, j > 0 or in a batched step, is taken as proportional to the rows:
/// the next round is plain and measures the intercept; flat, 16 drafts would
/// look as cheap as none).  The answer is the k with the highest tokens(k) /
/// cost(k), the smallest on ties; 0 (a plain step) when speculation does not
/// pay.  With no verify timing at all yet, or alone with only plain rounds
/// measured, it answers min(`initial` / n, K) in a step of n requests (n = 1
/// alone; config `{"initial": 4, "prior": 0.6}`).
///
/// In a batched step (contract 0.2's `batch-sequences` >= 2) verify(k) is
/// replaced by this request's share of the step, [`batch_share`]: the
/// step's cost split over its requests plus the marginal cost of the k draft
/// rows.  The host reports a batched round's verify time as the lone
/// forward of its rows would cost (from its fit of step time against total
/// rows), so timings measured alone and in batches of any size stay on one
/// scale; the batch context alone decides how costly a draft row is now.
/// After [`PROBE_AFTER`] plain answers in a row it drafts 2 (a probe) until
/// a round has drafted (a drafter may have nothing to propose), and waits
/// twice as long before each further probe of the request; in a batched
/// step of n requests it waits n times as long.
///
/// It learns across requests through its carried state (see
/// [`ThroughputCarry`]): per draft position, the rounds that reached it and
/// kept it, and the timing it measured (plain-step seconds, seconds per
/// extra verify row alone and in batched steps, drafter seconds per
/// token).  A request's first rounds then start from what earlier requests
/// saw instead of `initial` and the prior, which matters most for short
/// requests: a request of 48 tokens otherwise ends before it has measured
/// its own acceptance.
///
/// - Acceptance: a_i blends this request's estimate with the carried one,
///   weighted by the rounds behind each: (n_i * own_i + m_i * carried_i) /
///   (n_i + m_i), n_i the rounds of this request that reached position i,
///   m_i the carried rounds (scaled down at `create` to at most
///   [`CARRY_WEIGHT`] at position 0, so a request's own rounds soon
///   dominate; in a batched step of b requests m_i / b, since a wrong
///   carried guess then slows all b). Before its own first round at i a
///   request takes the carried estimate alone, and in a batched step
///   blends it with `prior` weighing one round.
/// - Timing: where this request has measured fewer than two verify lengths,
///   the unmeasured ones come from the carried line (plain + k * per-row,
///   anchored on its one measured length when it has one) instead of
///   `initial` or a flat line.  With two or more, lengths below the
///   shortest measured follow the slope of the two shortest (not flat).
///   The per-row slope is carried twice, as learnt alone and as learnt in
///   batched steps, and each regime reads only its own: alone a few rows
///   ride on one stream of the weights, while in a step that already holds
///   8 rows each further row adds its full compute (0.3 against 0.9 ms a
///   row, int8 on a 2-core Xeon), so the lone slope made drafts look three
///   times cheaper than they were in a batch of 8 and it drafted at 0.2
///   acceptance there.  With no batched slope known, a batched request
///   takes its one measured length as proportional to the rows (plain
///   rounds; a probe measures the slope).
///
/// Without carried state it decides exactly as described in the first
/// paragraph.  Concurrent requests each carry the state they started from
/// plus their own rounds; the last to finish is what the next request
/// starts from.
#[derive(Clone, Debug)]
pub struct Throughput {
    pub initial: u32,
    pub prior: f64,
    /// Rounds in a row it answered 0; after `probe_after` it drafts a
    /// little again, so one bad early round cannot switch speculation off for
    /// the rest of the request (with k = 0 nothing new is ever measured).
    pub zeros: u32,
    /// Plain answers in a row before the next probe: [`PROBE_AFTER`],
    /// doubled after each probe (a probe in a batch of many costs rows
    /// that rarely pay).
    pub probe_after: u32,
    /// A probe was answered and has not drafted yet: a drafter with
    /// nothing to propose (an n-gram without a match) drafts nothing, which
    /// measures nothing, so the probe goes on until a round drafted.
    pub probing: bool,
    /// What earlier requests left (counts scaled at `create`); fixed for
    /// the request.
    pub carry: ThroughputCarry,
    /// What this request saw: its rounds' counts and its latest timing,
    /// carried on together with `carry`.
    pub own: ThroughputCarry,
}

/// Consecutive plain rounds before a probe (the first; then doubled).
pub const PROBE_AFTER: u32 = 8;

/// Most carried rounds (at draft position 0) a request starts from: the
/// weight of what earlier requests saw against this request's own rounds.
pub const CARRY_WEIGHT: f64 = 8.0;

/// Draft positions carried at most.
const CARRY_POSITIONS: usize = 32;

/// `throughput`'s carried state: format version 1 byte; positions n (1
/// byte); n times reached and kept (f32 LE each); then plain-step seconds,
/// seconds per extra verify row alone, drafter seconds per token and (from
/// version 2) seconds per extra verify row in a batched step (f64 LE each,
/// 0 = unknown).  Version 1 bytes decode with no batched slope; bytes in
/// any other shape are ignored.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ThroughputCarry {
    pub reached: Vec<f64>,
    pub kept: Vec<f64>,
    pub plain_seconds: f64,
    /// Learnt alone: a verify of a few rows is bound by streaming the
    /// weights, so its rows come cheap.
    pub row_seconds: f64,
    pub draft_seconds: f64,
    /// Learnt in batched steps, where the step's rows already make it
    /// compute-bound and each further row costs several times more (int8 on
    /// a 2-core Xeon: 0.3 ms a row alone, 0.9 ms at 8 rows).  Kept apart,
    /// so a slope learnt alone never makes drafts look cheap in a batch.
    pub batch_row_seconds: f64,
}

const THROUGHPUT_CARRY_VERSION: u8 = 2;

/// A timing: the newer where known (> 0).
fn newer(new: f64, old: f64) -> f64 {
    if new > 0.0 {
        new
    } else {
        old
    }
}

impl ThroughputCarry {
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let (&version, rest) = bytes.split_first()?;
        let (&n, rest) = rest.split_first()?;
        let n = n as usize;
        let timings = match version {
            1 => 3,
            THROUGHPUT_CARRY_VERSION => 4,
            _ => return None,
        };
        if rest.len() != n * 8 + 8 * timings {
            return None;
        }
        let f32_at = |i: usize| {
            let v = f32::from_le_bytes([rest[i], rest[i + 1], rest[i + 2], rest[i + 3]]) as f64;
            (v.is_finite() && v >= 0.0).then_some(v)
        };
        let f64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&rest[i..i + 8]);
            let v = f64::from_le_bytes(b);
            if v.is_finite() && v >= 0.0 {
                v
            } else {
                0.0
            }
        };
        let mut c = ThroughputCarry::default();
        for i in 0..n {
            let (r, k) = (f32_at(8 * i)?, f32_at(8 * i + 4)?);
            c.reached.push(r);
            c.kept.push(k.min(r));
        }
        c.plain_seconds = f64_at(8 * n);
        c.row_seconds = f64_at(8 * n + 8);
        c.draft_seconds = f64_at(8 * n + 16);
        if timings > 3 {
            c.batch_row_seconds = f64_at(8 * n + 24);
        }
        Some(c)
    }

    pub fn encode(&self) -> Vec<u8> {
        let n = self.reached.len().min(CARRY_POSITIONS);
        let mut out = Vec::with_capacity(2 + n * 8 + 32);
        out.push(THROUGHPUT_CARRY_VERSION);
        out.push(n as u8);
        for i in 0..n {
            out.extend_from_slice(&(self.reached[i] as f32).to_le_bytes());
            out.extend_from_slice(&(self.kept[i] as f32).to_le_bytes());
        }
        for v in [
            self.plain_seconds,
            self.row_seconds,
            self.draft_seconds,
            self.batch_row_seconds,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out
    }

    /// Scales the counts so that position 0 holds at most `weight` rounds
    /// (the ratios, i.e. the acceptance estimates, stay).
    fn scale_to(&mut self, weight: f64) {
        let first = self.reached.first().copied().unwrap_or(0.0);
        if first > weight {
            let f = weight / first;
            self.reached.iter_mut().for_each(|x| *x *= f);
            self.kept.iter_mut().for_each(|x| *x *= f);
        }
    }

    /// The carried acceptance at `i` and its weight in rounds.
    fn acceptance(&self, i: usize) -> Option<(f64, f64)> {
        let r = *self.reached.get(i)?;
        // Laplace-smoothed as the host's estimate is.
        (r > 0.0).then(|| ((self.kept[i] + 1.0) / (r + 2.0), r))
    }

    /// Counts one finished round as the host does: a position is reached
    /// when every draft before it was kept.
    fn add_round(&mut self, drafted: u32, accepted: u32) {
        let n = (drafted as usize).min(CARRY_POSITIONS);
        if self.reached.len() < n {
            self.reached.resize(n, 0.0);
            self.kept.resize(n, 0.0);
        }
        for i in 0..n {
            self.reached[i] += 1.0;
            if (i as u32) < accepted {
                self.kept[i] += 1.0;
            } else {
                break;
            }
        }
    }

    /// Seconds per extra verify row learnt in a step of `batch` requests'
    /// kind (alone, or batched), 0 where unknown.
    fn row_slope(&self, batch: u32) -> f64 {
        match batch >= 2 {
            true => self.batch_row_seconds,
            false => self.row_seconds,
        }
    }

    /// The slope of `batch`'s kind, to set.
    fn row_slope_mut(&mut self, batch: u32) -> &mut f64 {
        match batch >= 2 {
            true => &mut self.batch_row_seconds,
            false => &mut self.row_seconds,
        }
    }

    /// Both sets of counts together; the timing `other` measured where
    /// it did, else `self`'s.
    fn plus(&self, other: &ThroughputCarry) -> ThroughputCarry {
        let n = self.reached.len().max(other.reached.len());
        let at = |v: &[f64], i: usize| v.get(i).copied().unwrap_or(0.0);
        ThroughputCarry {
            reached: (0..n)
                .map(|i| at(&self.reached, i) + at(&other.reached, i))
                .collect(),
            kept: (0..n)
                .map(|i| at(&self.kept, i) + at(&other.kept, i))
                .collect(),
            plain_seconds: newer(other.plain_seconds, self.plain_seconds),
            row_seconds: newer(other.row_seconds, self.row_seconds),
            draft_seconds: newer(other.draft_seconds, self.draft_seconds),
            batch_row_seconds: newer(other.batch_row_seconds, self.batch_row_seconds),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ThroughputConfig {
    #[serde(default = "default_initial")]
    initial: u32,
    #[serde(default = "default_prior")]
    prior: f64,
}

fn default_prior() -> f64 {
    0.6
}

/// Verify cost of k drafts (k + 1 new tokens) from possibly partial measurements.
pub fn estimate_verify(measured: &[f64], k: usize) -> Option<f64> {
    let known = |j: usize| {
        measured
            .get(j)
            .copied()
            .filter(|t| t.is_finite() && *t > 0.0)
    };
    if let Some(t) = known(k) {
        return Some(t);
    }
    let below: Vec<usize> = (0..k.min(measured.len()))
        .filter(|&j| known(j).is_some())
        .collect();
    let above = (k + 1..measured.len()).find(|&j| known(j).is_some());
    match (below.last(), above) {
        (Some(&lo), Some(hi)) => {
            let (tl, th) = (known(lo)?, known(hi)?);
            Some(tl + (th - tl) * (k - lo) as f64 / (hi - lo) as f64)
        }
        (Some(&lo), None) => {
            let tl = known(lo)?;
            if below.len() >= 2 {
                let lo2 = below[below.len() - 2];
                let slope = ((tl - known(lo2)?) / (lo - lo2) as f64).max(0.0);
                Some(tl + slope * (k - lo) as f64)
            } else {
                Some(tl)
            }
        }
        (None, Some(hi)) => known(hi),
        (None, None) => None,
    }
}

/// The measured lengths of `measured` (seconds > 0), shortest first.
fn measured_lengths(measured: &[f64]) -> Vec<(usize, f64)> {
    measured
        .iter()
        .enumerate()
        .filter(|(_, t)| t.is_finite() && **t > 0.0)
        .map(|(j, t)| (j, *t))
        .collect()
}

impl Throughput {
    /// Verify seconds of every k in 0..=kmax (`None`: nothing to go on), for
    /// a request in a step of `batch` requests.
    fn verify_curve(&self, measured: &[f64], kmax: u32, batch: u32) -> Option<Vec<f64>> {
        let own = measured_lengths(measured);
        let plain = self.carry.plain_seconds;
        let row = self.carry.row_slope(batch);
        match own.as_slice() {
            // One length: the carried slope through it, never below a
            // tenth of it (a slope learnt in a bigger batch must not make
            // the plain step look free).
            [(j, t)] if row > 0.0 => Some(
                (0..=kmax)
                    .map(|k| (t + row * (k as f64 - *j as f64)).max(0.1 * t))
                    .collect(),
            ),
            [] if plain > 0.0 && row > 0.0 => {
                Some((0..=kmax).map(|k| plain + row * k as f64).collect())
            }
            // Two or more lengths: this request's own line; below the
            // shortest measured it goes on down with the slope of the two
            // shortest (flat there would make drafting look free).
            [(lo, tl), (next, tn), ..] => {
                let slope = ((tn - tl) / (next - lo) as f64).max(0.0);
                (0..=kmax)
                    .map(|k| {
                        let k = k as usize;
                        if k < *lo {
                            Some((tl - slope * (lo - k) as f64).max(0.1 * tl))
                        } else {
                            estimate_verify(measured, k)
                        }
                    })
                    .collect()
            }
            // Nothing carried, alone, only plain rounds measured: nothing to
            // go on (`initial`, which measures a second length).
            [(0, _)] if batch < 2 => None,
            // Nothing carried, one length of j + 1 rows: each row taken as
            // a (j + 1)-th of it (the compute-bound worst case), so the
            // next round is plain and measures the line's intercept. Flat,
            // 16 drafts would look as cheap as none: on a CPU that round
            // costs 7 plain steps, and in a batched step every request
            // would draft its maximum at once.
            [(j, t)] => Some(
                (0..=kmax)
                    .map(|k| t * (k as f64 + 1.0) / (*j as f64 + 1.0))
                    .collect(),
            ),
            // Nothing carried, nothing measured: unknown.
            _ => None,
        }
    }

    /// Remembers this request's timing for the requests after it.
    fn learn_timing(&mut self, input: &ScheduleInput) {
        let own = measured_lengths(&input.verify_seconds_by_len);
        if let (Some(&(lo, tl)), Some(&(hi, th))) = (own.first(), own.last()) {
            if hi > lo {
                *self.own.row_slope_mut(input.batch_sequences) =
                    ((th - tl) / (hi - lo) as f64).max(0.0);
            }
            // Only longer rounds measured: back down the slope known best.
            let row = newer(
                self.own.row_slope(input.batch_sequences),
                self.carry.row_slope(input.batch_sequences),
            );
            self.own.plain_seconds = if lo == 0 {
                tl
            } else {
                (tl - row * lo as f64).max(0.1 * tl)
            };
        }
        let d = input.draft_seconds_per_token;
        if d.is_finite() && d > 0.0 {
            self.own.draft_seconds = d;
        }
    }

    /// a_i: this request's estimate blended with the carried one.
    fn acceptance(&self, input: &ScheduleInput, i: usize) -> f64 {
        let clean = |a: f64| {
            if a.is_finite() {
                a.clamp(0.0, 1.0)
            } else {
                self.prior
            }
        };
        let own = input.position_acceptance.get(i).copied().map(clean);
        let n = self.own.reached.get(i).copied().unwrap_or(0.0);
        // The carried estimate is what other prompts saw: acting on it when
        // it is wrong for this one costs every request of a batched step,
        // so in a step of b requests it weighs b times less against this
        // request's own rounds.
        let b = input.batch_sequences.max(1) as f64;
        match (own, self.carry.acceptance(i)) {
            (Some(a), Some((c, m))) if n > 0.0 => (n * a + m / b * c) / (n + m / b),
            // No round of its own yet: alone the carried estimate is the
            // best guess; in a batched step it is hedged with the prior,
            // weighing one round, for the same reason (a request of 8
            // carried rounds then sits halfway between them in a step of
            // 8: lone grounded prompts' 0.83 made fresh chat requests
            // draft rows that were kept 12-22% of the time).
            (_, Some((c, m))) if b > 1.0 => (m / b * c + self.prior) / (m / b + 1.0),
            (_, Some((c, _))) => c,
            (Some(a), None) => a,
            (None, None) => self.prior,
        }
    }
}

/// The seconds of a round with k drafts as this request's share of a
/// batched step, from `verify` (the lone-forward seconds of k drafts, k =
/// 0 ..= kmax) and the batch context; `verify` itself outside a batch.
///
/// A step of R rows costs about what a lone forward of R rows costs,
/// verify(R - 1), extrapolated along the curve's slope m past its end. The
/// step is shared by `batch-sequences` = n requests, so a plain round's
/// share is T0 / n with T0 = verify(0) + m (R - 1), and k drafts add to the
/// step exactly what they add to a lone forward, verify(k) - verify(0).
/// Maximizing tokens(k) / (T0 / n + verify(k) - verify(0)) then drafts only
/// when the extra tokens per extra second of the step beat the batch's own
/// rate (n tokens per T0): in a batch of 8 a draft row has to be kept far
/// more often than alone to pay for the 8 streams it slows down.
///
/// R is `batch-rows-planned` (the rows asked before this request, prefill
/// chunks included) plus this request's own row, and at least n (every
/// request in the step forwards one row or more).
pub fn batch_share(verify: &[f64], input: &ScheduleInput) -> Vec<f64> {
    let n = input.batch_sequences as usize;
    let (Some(&plain), Some(&last)) = (verify.first(), verify.last()) else {
        return verify.to_vec();
    };
    if n < 2 || verify.len() < 2 {
        return verify.to_vec();
    }
    let slope = ((last - plain) / (verify.len() - 1) as f64).max(0.0);
    let rows = (input.batch_rows_planned as usize + 1).max(n);
    let step = plain + slope * (rows - 1) as f64;
    verify
        .iter()
        .map(|v| step / n as f64 + (v - plain).max(0.0))
        .collect()
}

impl ScheduleLogic for Throughput {
    fn create(config: &str, carried: Option<&[u8]>) -> Result<Self, String> {
        let c: ThroughputConfig = parse_config(config)?;
        if !(0.0..=1.0).contains(&c.prior) {
            return Err("bad config: prior must be within [0, 1]".into());
        }
        let mut carry = carried
            .and_then(ThroughputCarry::decode)
            .unwrap_or_default();
        carry.scale_to(CARRY_WEIGHT);
        Ok(Throughput {
            initial: c.initial,
            prior: c.prior,
            zeros: 0,
            probe_after: PROBE_AFTER,
            probing: false,
            carry,
            own: ThroughputCarry::default(),
        })
    }
    fn next_draft_length(&mut self, input: &ScheduleInput) -> u32 {
        // The previous round (as `heuristic` reads it): counted for the
        // blend and for the requests after this one.
        if input.round > 0 {
            if let Some(last) = input.recent.last() {
                self.own.add_round(last.drafted, last.accepted);
                if last.drafted > 0 {
                    self.probing = false;
                }
            }
        }
        self.learn_timing(input);
        let kmax = input.max_draft.min(input.budget_left.saturating_sub(1));
        if kmax == 0 {
            return 0;
        }
        let batch = input.batch_sequences.max(1);
        let Some(verify) = self.verify_curve(&input.verify_seconds_by_len, kmax, batch) else {
            // Nothing measured or carried (alone: or only plain rounds):
            // `initial`, shared by the batch (a first guess in a step of n
            // slows all n streams).
            return (self.initial / batch).min(kmax);
        };
        let draft =
            if input.draft_seconds_per_token.is_finite() && input.draft_seconds_per_token > 0.0 {
                input.draft_seconds_per_token
            } else {
                self.carry.draft_seconds
            };
        let verify = batch_share(&verify, input);
        let mut best = (0u32, f64::NEG_INFINITY);
        let (mut tokens, mut reach) = (1.0f64, 1.0f64);
        for k in 0..=kmax {
            if k > 0 {
                reach *= self.acceptance(input, (k - 1) as usize);
                tokens += reach;
            }
            let cost = k as f64 * draft + verify[k as usize];
            let rate = tokens / cost;
            if rate > best.1 * (1.0 + 1e-9) {
                best = (k, rate);
            }
        }
        if best.0 == 0 {
            if self.probing {
                return 2.min(kmax);
            }
            self.zeros += 1;
            // A probe's rows slow every request of a batched step, so in a
            // step of n it waits n times as long (one probe per
            // `probe_after` steps of the batch, not per request).
            if self.zeros >= self.probe_after.saturating_mul(batch) {
                self.probing = true;
                self.zeros = 0;
                self.probe_after = self.probe_after.saturating_mul(2);
                return 2.min(kmax);
            }
        } else {
            self.zeros = 0;
        }
        best.0
    }
    fn carry(&self) -> Option<Vec<u8>> {
        Some(self.carry.plus(&self.own).encode())
    }
}

/// `adaedl` (contract 0.2): AdaEDL's early draft stopping (Agrawal et al.
/// 2024, "AdaEDL: Early Draft Stopping for Speculative Decoding of Large
/// Language Models via an Entropy-based Lower Bound on Token Acceptance
/// Probability").
///
/// Every round asks for k = min(`max`, max-draft) (config
/// `{"max": 8, "gamma": 1.0, "threshold": 0.4}`); while a model drafter
/// drafts, after each draft token with draft entropy H (nats) it estimates
/// a lower bound on that token's acceptance probability,
///
///     bound = 1 - sqrt(gamma * H)
///
/// and stops drafting when the bound falls below `threshold` (the token
/// itself is still verified).  With a drafter that is not asked token by
/// token (n-gram, suffix) it is `constant` with k = `max`.
#[derive(Clone, Debug)]
pub struct AdaEdl {
    pub max: u32,
    pub gamma: f32,
    pub threshold: f32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AdaEdlConfig {
    #[serde(default = "default_adaedl_max")]
    max: u32,
    #[serde(default = "default_adaedl_gamma")]
    gamma: f32,
    #[serde(default = "default_adaedl_threshold")]
    threshold: f32,
}

fn default_adaedl_max() -> u32 {
    8
}
fn default_adaedl_gamma() -> f32 {
    1.0
}
fn default_adaedl_threshold() -> f32 {
    0.4
}

impl AdaEdl {
    /// The entropy-based lower bound on acceptance of a token drawn from a
    /// draft distribution of entropy `entropy` (nats).
    pub fn bound(&self, entropy: f32) -> f32 {
        if entropy.is_nan() {
            // Nothing known about the draft: no bound (stop drafting).
            return f32::NEG_INFINITY;
        }
        1.0 - libm::sqrtf(self.gamma * entropy.max(0.0))
    }
}

impl ScheduleLogic for AdaEdl {
    fn create(config: &str, _carried: Option<&[u8]>) -> Result<Self, String> {
        let c: AdaEdlConfig = parse_config(config)?;
        if c.max == 0 {
            return Err("bad config: max must be >= 1".into());
        }
        if !(c.gamma.is_finite() && c.gamma > 0.0) {
            return Err("bad config: gamma must be finite and > 0".into());
        }
        if !(0.0..=1.0).contains(&c.threshold) {
            return Err("bad config: threshold must be within [0, 1]".into());
        }
        Ok(AdaEdl {
            max: c.max,
            gamma: c.gamma,
            threshold: c.threshold,
        })
    }
    fn next_draft_length(&mut self, input: &ScheduleInput) -> u32 {
        self.max.min(input.max_draft)
    }
    fn continue_drafting(&mut self, step: &DraftStep) -> bool {
        self.bound(step.entropy) >= self.threshold
    }
}

/// `bandit` (contract 0.2): UCB1 (Auer et al. 2002) over draft lengths.
///
/// The arms are the k in `arms` (config `{"arms": [0, 1, 2, 3, 4, 6, 8],
/// "c": 0.5}`; 0 is a plain decoding step, so a drafter that does not pay
/// can be switched off; each answer is clipped to max-draft).  Each round's
/// reward is the tokens it committed per unit of cost, in plain decoding
/// steps:
///
///     reward = (accepted + 1) / ((draft-seconds + verify-seconds) / verify(0))
///
/// with verify(0) the measured plain-step time (as `throughput` estimates
/// it), so plain decoding earns about 1 and speculation that pays earns
/// more; before any timing is known the reward is (accepted + 1) /
/// (drafted + 1).  An arm never played is played first (in order); then the
/// answer is the arm with the largest mean + c * sqrt(ln N / n).  A round's
/// reward is credited when the schedule is next asked (the last round of a
/// request is not).
///
/// It learns across requests: `carry` hands back every arm's count and
/// reward sum (format: 1 version byte, then per arm k and n as u32 LE and
/// the sum as f64 LE), which the next request's `create` resumes from when
/// its arms are the same.
#[derive(Clone, Debug)]
pub struct Bandit {
    pub arms: Vec<u32>,
    pub c: f64,
    pub plays: Vec<u32>,
    pub sums: Vec<f64>,
    /// The arm answered last round, credited at the next call.
    pub pending: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BanditConfig {
    #[serde(default = "default_arms")]
    arms: Vec<u32>,
    #[serde(default = "default_bandit_c")]
    c: f64,
}

fn default_arms() -> Vec<u32> {
    alloc::vec![0, 1, 2, 3, 4, 6, 8]
}
fn default_bandit_c() -> f64 {
    0.5
}

const BANDIT_CARRY_VERSION: u8 = 1;

impl Bandit {
    fn decode(&mut self, bytes: &[u8]) {
        let n = self.arms.len();
        if bytes.len() != 1 + n * 16 || bytes[0] != BANDIT_CARRY_VERSION {
            return;
        }
        let mut plays = Vec::with_capacity(n);
        let mut sums = Vec::with_capacity(n);
        for (i, chunk) in bytes[1..].chunks_exact(16).enumerate() {
            let k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            if k != self.arms[i] {
                return;
            }
            plays.push(u32::from_le_bytes([chunk[4], chunk[5], chunk[6], chunk[7]]));
            let mut f = [0u8; 8];
            f.copy_from_slice(&chunk[8..16]);
            let sum = f64::from_le_bytes(f);
            sums.push(if sum.is_finite() { sum } else { 0.0 });
        }
        self.plays = plays;
        self.sums = sums;
    }

    /// The reward of a finished round (see the type's docs).
    pub fn reward(&self, last: &RoundRecord, input: &ScheduleInput) -> f64 {
        let tokens = last.accepted as f64 + 1.0;
        let cost = last.draft_seconds.max(0.0) + last.verify_seconds.max(0.0);
        match estimate_verify(&input.verify_seconds_by_len, 0) {
            Some(plain) if cost.is_finite() && cost > 0.0 => tokens / (cost / plain),
            _ => tokens / (last.drafted as f64 + 1.0),
        }
    }
}

impl ScheduleLogic for Bandit {
    fn create(config: &str, carried: Option<&[u8]>) -> Result<Self, String> {
        let c: BanditConfig = parse_config(config)?;
        if c.arms.is_empty() || c.arms.len() > 32 {
            return Err("bad config: arms must list 1 to 32 draft lengths".into());
        }
        if !(c.c.is_finite() && c.c >= 0.0) {
            return Err("bad config: c must be finite and >= 0".into());
        }
        let n = c.arms.len();
        let mut b = Bandit {
            arms: c.arms,
            c: c.c,
            plays: alloc::vec![0; n],
            sums: alloc::vec![0.0; n],
            pending: None,
        };
        if let Some(bytes) = carried {
            b.decode(bytes);
        }
        Ok(b)
    }
    fn next_draft_length(&mut self, input: &ScheduleInput) -> u32 {
        if let (Some(arm), Some(last)) = (self.pending.take(), input.recent.last()) {
            let r = self.reward(last, input);
            if r.is_finite() {
                self.plays[arm] = self.plays[arm].saturating_add(1);
                self.sums[arm] += r;
            }
        }
        if input.max_draft == 0 {
            return 0;
        }
        let arm = match self.plays.iter().position(|&n| n == 0) {
            Some(i) => i,
            None => {
                let total: f64 = self.plays.iter().map(|&n| n as f64).sum();
                let ln = libm::log(total.max(1.0));
                let mut best = (0usize, f64::NEG_INFINITY);
                for i in 0..self.arms.len() {
                    let n = self.plays[i] as f64;
                    let score = self.sums[i] / n + self.c * libm::sqrt(ln / n);
                    if score > best.1 {
                        best = (i, score);
                    }
                }
                best.0
            }
        };
        self.pending = Some(arm);
        self.arms[arm].min(input.max_draft)
    }
    fn carry(&self) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(1 + self.arms.len() * 16);
        out.push(BANDIT_CARRY_VERSION);
        for i in 0..self.arms.len() {
            out.extend_from_slice(&self.arms[i].to_le_bytes());
            out.extend_from_slice(&self.plays[i].to_le_bytes());
            out.extend_from_slice(&self.sums[i].to_le_bytes());
        }
        Some(out)
    }
}

// --------------------------------------------------------------- acceptance

/// `greedy`: accept drafts while each equals the target argmax (the
/// temperature-0 rule).  Correction at the first mismatch: the target argmax
/// as an explicit token (config `{"correction": "argmax"}`, the default), so
/// the output is exactly greedy decoding of the target whatever the sampling
/// settings; `{"correction": "sample"}` asks the host for a target sample
/// instead.
#[derive(Clone, Debug)]
pub struct Greedy {
    pub sample: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GreedyConfig {
    #[serde(default)]
    correction: Option<String>,
}

impl AcceptanceLogic for Greedy {
    fn create(config: &str, _vocab_size: u32) -> Result<Self, String> {
        let c: GreedyConfig = parse_config(config)?;
        let sample = match c.correction.as_deref() {
            None | Some("argmax") => false,
            Some("sample") => true,
            Some(other) => {
                return Err(format!(
                    "bad config: correction {other:?} (argmax or sample)"
                ))
            }
        };
        Ok(Greedy { sample })
    }
    fn decide(&mut self, positions: &[Position]) -> Decision {
        for (i, p) in positions.iter().enumerate() {
            if p.token != p.target_argmax {
                let correction = if self.sample {
                    Correction::TargetSample
                } else {
                    Correction::Token(p.target_argmax)
                };
                return Decision {
                    accepted: i as u32,
                    correction,
                };
            }
        }
        Decision {
            accepted: positions.len() as u32,
            correction: Correction::TargetSample,
        }
    }
}

/// `rejection`: speculative sampling (Leviathan et al. 2023, Chen et al.
/// 2023).  Draft i is accepted iff `uniform * q < p`, i.e. with probability
/// min(1, p/q) (always when q = 0 < p, never when p = 0); the first rejected
/// position is corrected from the residual norm(max(0, p - q)), which the host
/// samples.  Lossless: the output follows the target distribution.
#[derive(Clone, Debug)]
pub struct Rejection;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EmptyConfig {}

impl AcceptanceLogic for Rejection {
    fn create(config: &str, _vocab_size: u32) -> Result<Self, String> {
        let _: EmptyConfig = parse_config(config)?;
        Ok(Rejection)
    }
    fn decide(&mut self, positions: &[Position]) -> Decision {
        for (i, p) in positions.iter().enumerate() {
            if p.uniform * p.q >= p.p {
                return Decision {
                    accepted: i as u32,
                    correction: Correction::Residual,
                };
            }
        }
        Decision {
            accepted: positions.len() as u32,
            correction: Correction::Residual,
        }
    }
}

/// `typical`: Medusa's typical acceptance (Cai et al. 2024).  Draft i is
/// accepted iff p(x) > min(epsilon, delta * exp(-entropy)) (config
/// `{"epsilon": 0.09, "delta": 0.3}`, Medusa's posterior_threshold and
/// posterior_alpha); the first rejected position is corrected with a target
/// sample.  LOSSY: the output no longer follows the target distribution (it
/// favours plausible drafts); at temperature 0 (one-hot p) it equals greedy.
#[derive(Clone, Debug)]
pub struct Typical {
    pub epsilon: f32,
    pub delta: f32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TypicalConfig {
    #[serde(default = "default_epsilon")]
    epsilon: f32,
    #[serde(default = "default_delta")]
    delta: f32,
}

fn default_epsilon() -> f32 {
    0.09
}
fn default_delta() -> f32 {
    0.3
}

impl Typical {
    /// The acceptance threshold at a position with this target entropy.
    pub fn threshold(&self, entropy: f32) -> f32 {
        self.epsilon.min(self.delta * libm::expf(-entropy))
    }
}

impl AcceptanceLogic for Typical {
    fn create(config: &str, _vocab_size: u32) -> Result<Self, String> {
        let c: TypicalConfig = parse_config(config)?;
        if !(c.epsilon.is_finite() && c.delta.is_finite() && c.epsilon >= 0.0 && c.delta >= 0.0) {
            return Err("bad config: epsilon and delta must be finite and >= 0".into());
        }
        Ok(Typical {
            epsilon: c.epsilon,
            delta: c.delta,
        })
    }
    fn decide(&mut self, positions: &[Position]) -> Decision {
        for (i, p) in positions.iter().enumerate() {
            if p.p <= self.threshold(p.entropy) {
                return Decision {
                    accepted: i as u32,
                    correction: Correction::TargetSample,
                };
            }
        }
        Decision {
            accepted: positions.len() as u32,
            correction: Correction::TargetSample,
        }
    }
}

// ------------------------------------------------------- component shims

/// The `no_std` runtime of a component: a global allocator (dlmalloc over
/// `memory.grow`) and a panic handler that traps.  Expanded by
/// [`schedule_component!`] and [`acceptance_component!`]; the cdylib needs
/// `#![no_std]`, `extern crate alloc;` and a `dlmalloc` dependency with the
/// `global` feature.
#[macro_export]
macro_rules! component_runtime {
    () => {
        // memcpy, memcmp, memset, ... come from the target's bundled wasi-libc
        // (pure functions: they import nothing).
        #[cfg(target_arch = "wasm32")]
        #[link(name = "c")]
        extern "C" {}
        #[global_allocator]
        static ALLOC: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;
        // The canonical ABI allocates arguments through `cabi_realloc`; it must
        // use the Rust allocator (the generated code frees with it).
        // wit-bindgen leaves it to wasi-libc on wasm32-wasip2, whose malloc
        // is a different heap, so it is defined here.
        #[cfg(target_arch = "wasm32")]
        #[no_mangle]
        unsafe extern "C" fn cabi_realloc(
            old_ptr: *mut u8,
            old_len: usize,
            align: usize,
            new_len: usize,
        ) -> *mut u8 {
            use ::alloc::alloc::{alloc, realloc, Layout};
            let ptr = if old_len == 0 {
                if new_len == 0 {
                    return align as *mut u8;
                }
                alloc(Layout::from_size_align_unchecked(new_len, align))
            } else {
                realloc(
                    old_ptr,
                    Layout::from_size_align_unchecked(old_len, align),
                    new_len,
                )
            };
            if ptr.is_null() {
                ::core::arch::wasm32::unreachable()
            }
            ptr
        }
        #[cfg(target_arch = "wasm32")]
        #[panic_handler]
        fn panic(_: &::core::panic::PanicInfo) -> ! {
            ::core::arch::wasm32::unreachable()
        }
    };
}

/// Makes a component exporting `specd:policy/schedule@0.1.0` from a
/// [`ScheduleLogic`] type.  Use in a `#![no_std]` `cdylib` crate depending on
/// `wit-bindgen`, `dlmalloc` and this crate, with the WIT at
/// `$manifest/../../../wit`:
///
/// ```ignore
/// #![no_std]
/// extern crate alloc;
/// specd_policy_logic::schedule_component!(specd_policy_logic::Heuristic);
/// ```
#[macro_export]
macro_rules! schedule_component {
    // `$batch`: the batch context `(sequences, rows planned)` from the input
    // `$i`; `$extra`: the exports a later contract adds.
    (@with $logic:ty, $wit:literal, |$i:ident| $batch:expr, { $($extra:tt)* }) => {
        $crate::component_runtime!();
        wit_bindgen::generate!({ path: $wit, world: "schedule-policy" });
        use exports::specd::policy::schedule as wit_schedule;
        struct Component;
        struct State(::core::cell::RefCell<$logic>);
        impl wit_schedule::Guest for Component {
            type Scheduler = State;
        }
        impl wit_schedule::GuestScheduler for State {
            fn create(
                config: ::alloc::string::String,
                carried: Option<::alloc::vec::Vec<u8>>,
            ) -> Result<wit_schedule::Scheduler, ::alloc::string::String> {
                let logic = <$logic as $crate::ScheduleLogic>::create(&config, carried.as_deref())?;
                Ok(wit_schedule::Scheduler::new(State(::core::cell::RefCell::new(logic))))
            }
            fn next_draft_length(&self, $i: wit_schedule::ScheduleInput) -> u32 {
                let (batch_sequences, batch_rows_planned) = $batch;
                let input = $crate::ScheduleInput {
                    round: $i.round,
                    generated: $i.generated,
                    budget_left: $i.budget_left,
                    max_draft: $i.max_draft,
                    recent: $i
                        .recent
                        .iter()
                        .map(|r| $crate::RoundRecord {
                            drafted: r.drafted,
                            accepted: r.accepted,
                            draft_seconds: r.draft_seconds,
                            verify_seconds: r.verify_seconds,
                        })
                        .collect(),
                    position_acceptance: $i.position_acceptance,
                    draft_seconds_per_token: $i.draft_seconds_per_token,
                    verify_seconds_by_len: $i.verify_seconds_by_len,
                    batch_sequences,
                    batch_rows_planned,
                };
                $crate::ScheduleLogic::next_draft_length(&mut *self.0.borrow_mut(), &input)
            }
            fn carry(&self) -> Option<::alloc::vec::Vec<u8>> {
                $crate::ScheduleLogic::carry(&*self.0.borrow())
            }
            $($extra)*
        }
        export!(Component);
    };
    ($logic:ty) => {
        // Contract 0.1 has no batch context and no per-token hook.
        $crate::schedule_component!(@with $logic, "../../../wit", |i| (0, 0), {});
    };
}

/// Makes a component exporting `specd:policy/acceptance@0.1.0` from an
/// [`AcceptanceLogic`] type (see [`schedule_component!`]).
#[macro_export]
macro_rules! acceptance_component {
    (@with $logic:ty, $wit:literal, |$p:ident| $draft:expr) => {
        $crate::component_runtime!();
        wit_bindgen::generate!({ path: $wit, world: "acceptance-policy" });
        use exports::specd::policy::acceptance as wit_acceptance;
        struct Component;
        struct State(::core::cell::RefCell<$logic>);
        impl wit_acceptance::Guest for Component {
            type Acceptor = State;
        }
        impl wit_acceptance::GuestAcceptor for State {
            fn create(config: ::alloc::string::String, vocab_size: u32) -> Result<wit_acceptance::Acceptor, ::alloc::string::String> {
                let logic = <$logic as $crate::AcceptanceLogic>::create(&config, vocab_size)?;
                Ok(wit_acceptance::Acceptor::new(State(::core::cell::RefCell::new(logic))))
            }
            fn decide(&self, positions: ::alloc::vec::Vec<wit_acceptance::Position>) -> wit_acceptance::Decision {
                let positions: ::alloc::vec::Vec<$crate::Position> = positions
                    .iter()
                    .map(|$p| {
                        let (draft_entropy, draft_top1, confidence) = $draft;
                        $crate::Position {
                            token: $p.token,
                            p: $p.p,
                            q: $p.q,
                            target_argmax: $p.target_argmax,
                            entropy: $p.entropy,
                            uniform: $p.uniform,
                            draft_entropy,
                            draft_top1,
                            confidence,
                        }
                    })
                    .collect();
                let d = $crate::AcceptanceLogic::decide(&mut *self.0.borrow_mut(), &positions);
                wit_acceptance::Decision {
                    accepted: d.accepted,
                    correction: match d.correction {
                        $crate::Correction::Residual => wit_acceptance::Correction::Residual,
                        $crate::Correction::TargetSample => wit_acceptance::Correction::TargetSample,
                        $crate::Correction::Token(t) => wit_acceptance::Correction::Token(t),
                    },
                }
            }
        }
        export!(Component);
    };
    ($logic:ty) => {
        // 0.1 positions have no draft statistics.
        $crate::acceptance_component!(@with $logic, "../../../wit", |p| (None, None, None));
    };
}

/// Makes a component exporting `specd:policy/acceptance@0.2.0` from an
/// [`AcceptanceLogic`] type: as [`acceptance_component!`], but its positions
/// carry the draft distribution's entropy and top-1 and the drafter's
/// confidence; the WIT at `$manifest/../../../wit/0.2`.
#[macro_export]
macro_rules! acceptance_component_v0_2 {
    ($logic:ty) => {
        $crate::acceptance_component!(@with $logic, "../../../wit/0.2",
            |p| (p.draft_entropy, p.draft_top1, p.confidence));
    };
}

/// Makes a component exporting `specd:policy/schedule@0.2.0` (the
/// per-token `continue-drafting` hook, the batch context) from a
/// [`ScheduleLogic`] type; as [`schedule_component!`], with the WIT at
/// `$manifest/../../../wit/0.2`.
#[macro_export]
macro_rules! schedule_component_v0_2 {
    ($logic:ty) => {
        $crate::schedule_component!(@with $logic, "../../../wit/0.2",
            |i| (i.batch_sequences, i.batch_rows_planned), {
            fn continue_drafting(&self, s: wit_schedule::DraftStep) -> bool {
                let step = $crate::DraftStep {
                    index: s.index,
                    token: s.token,
                    q: s.q,
                    entropy: s.entropy,
                    top1: s.top1,
                    k: s.k,
                };
                $crate::ScheduleLogic::continue_drafting(&mut *self.0.borrow_mut(), &step)
            }
        });
    };
}
