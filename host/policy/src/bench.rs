//! Policy-call benchmark (for `specd bench` and `examples/bench.rs`).

use crate::{
    native, Acceptance, PolicyError, PolicyHost, Position, RoundRecord, Schedule, ScheduleInput,
};
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// What [`bench_policy_calls`] measured.  Times are means.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchReport {
    pub schedule: String,
    pub acceptance: String,
    pub requests: u32,
    pub rounds_per_request: u32,
    /// Drafted tokens per acceptance call.
    pub positions_per_decide: u32,
    /// Per-request instantiation (Store + instance + `create`), microseconds.
    pub schedule_instantiate_us: f64,
    pub acceptance_instantiate_us: f64,
    /// One `next-draft-length` / `decide` call through the component, nanoseconds.
    pub schedule_ns_per_call: f64,
    pub acceptance_ns_per_call: f64,
    /// Both calls of one round, nanoseconds.
    pub policy_ns_per_round: f64,
    /// The same policies as native Rust (when `native` has them), nanoseconds.
    pub native_schedule_ns_per_call: Option<f64>,
    pub native_acceptance_ns_per_call: Option<f64>,
}

fn scripted_input(round: u32, max_draft: u32) -> ScheduleInput {
    let recent = (0..round.min(32))
        .map(|i| RoundRecord {
            drafted: 4 + (i % 5),
            accepted: (i * 7) % 5,
            draft_seconds: 1e-4,
            verify_seconds: 8e-3,
        })
        .collect();
    ScheduleInput {
        round,
        generated: round * 3,
        budget_left: 10_000,
        max_draft,
        recent,
        position_acceptance: (0..max_draft).map(|i| 0.9 - 0.03 * i as f64).collect(),
        draft_seconds_per_token: 1e-4,
        verify_seconds_by_len: (0..=max_draft).map(|j| 8e-3 + 4e-4 * j as f64).collect(),
    }
}

fn scripted_positions(round: u32, k: u32) -> Vec<Position> {
    (0..k)
        .map(|i| {
            let token = 100 + (round * 31 + i * 17) % 1000;
            Position {
                token,
                p: 0.7,
                q: 0.8,
                target_argmax: if (round + i) % 6 == 5 {
                    token + 1
                } else {
                    token
                },
                entropy: 1.2,
                uniform: ((round * 13 + i * 7) % 100) as f32 / 100.0,
            }
        })
        .collect()
}

fn run_rounds(
    s: &mut dyn Schedule,
    a: &mut dyn Acceptance,
    rounds: u32,
    k: u32,
) -> Result<(f64, f64), PolicyError> {
    let inputs: Vec<ScheduleInput> = (0..rounds).map(|r| scripted_input(r, 16)).collect();
    let positions: Vec<Vec<Position>> = (0..rounds).map(|r| scripted_positions(r, k)).collect();
    let t = Instant::now();
    for input in &inputs {
        std::hint::black_box(s.next_draft_length(input)?);
    }
    let sched = t.elapsed().as_nanos() as f64 / rounds.max(1) as f64;
    let t = Instant::now();
    for p in &positions {
        std::hint::black_box(a.decide(p)?);
    }
    let acc = t.elapsed().as_nanos() as f64 / rounds.max(1) as f64;
    Ok((sched, acc))
}

/// Measures per-request instantiation and per-call cost of a schedule and an
/// acceptance policy on scripted rounds (`requests` requests of `rounds`
/// rounds, 6 drafted tokens per decide), and the native baselines of the
/// same names when they exist.  Build with `--release` for meaningful numbers.
pub fn bench_policy_calls(
    host: &PolicyHost,
    schedule: &str,
    acceptance: &str,
    requests: u32,
    rounds: u32,
) -> Result<BenchReport, PolicyError> {
    let requests = requests.max(1);
    let k = 6;
    // Warm up (first instantiation touches fresh pool slots).
    for _ in 0..3 {
        let s = host.schedule(schedule, "{}", "bench")?;
        let _ = host.acceptance(acceptance, "{}", 50_000)?;
        drop(s);
    }
    let (mut si, mut ai, mut sc, mut ac) = (0.0, 0.0, 0.0, 0.0);
    for _ in 0..requests {
        let t = Instant::now();
        let mut s = host.schedule(schedule, "{}", "bench")?;
        si += t.elapsed().as_nanos() as f64;
        let t = Instant::now();
        let mut a = host.acceptance(acceptance, "{}", 50_000)?;
        ai += t.elapsed().as_nanos() as f64;
        let (x, y) = run_rounds(s.as_mut(), a.as_mut(), rounds, k)?;
        sc += x;
        ac += y;
    }
    let n = requests as f64;
    let native_pair = native::schedule(schedule, "{}", None)
        .ok()
        .zip(native::acceptance(acceptance, "{}", 50_000).ok());
    let (ns, na) = match native_pair {
        Some((mut s, mut a)) => {
            let (mut x, mut y) = (0.0, 0.0);
            for _ in 0..requests {
                let (p, q) = run_rounds(s.as_mut(), a.as_mut(), rounds, k)?;
                x += p;
                y += q;
            }
            (Some(x / n), Some(y / n))
        }
        None => (None, None),
    };
    Ok(BenchReport {
        schedule: schedule.to_string(),
        acceptance: acceptance.to_string(),
        requests,
        rounds_per_request: rounds,
        positions_per_decide: k,
        schedule_instantiate_us: si / n / 1e3,
        acceptance_instantiate_us: ai / n / 1e3,
        schedule_ns_per_call: sc / n,
        acceptance_ns_per_call: ac / n,
        policy_ns_per_round: (sc + ac) / n,
        native_schedule_ns_per_call: ns,
        native_acceptance_ns_per_call: na,
    })
}
