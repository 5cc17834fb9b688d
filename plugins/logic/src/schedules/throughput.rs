use alloc::string::String;
use alloc::vec::Vec;
use serde::Deserialize;

use super::default_initial;
use crate::contract::{parse_config, ScheduleInput, ScheduleLogic};

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
