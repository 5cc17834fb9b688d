//! Policy call benchmark:
//!     cargo run --release -p specd-policy --example bench [--policy-dir DIR]... [--requests N] [SCHEDULE ACCEPTANCE]...
//!
//! `--policy-dir DIR` (repeatable) registers DIR's components first (as
//! `specd serve --policy-dir` does), printing how long each took: a compile
//! the first time, a load from the disk cache (`$SPECD_HOME/policies/cache`)
//! after.  With `SPECD_HOME` set to an empty directory, every component
//! compiles.  Several pairs are measured one after the other in one process
//! (compare them within one run).  The Rust, Python
//! (scripts/build-python-plugins.sh) and JavaScript
//! (scripts/build-js-plugins.sh) ports side by side:
//!     cargo run --release -p specd-policy --example bench -- \
//!         --policy-dir plugins/target/python --policy-dir plugins/target/js \
//!         heuristic rejection heuristic-py rejection-py heuristic-js rejection-js
//!
//! Instances are made ahead of requests (`HostConfig::warm_instances`):
//! `instantiate` is the request path's cost (taking a ready instance, or
//! making one when none is), and `ahead` the cost of making one off the
//! request path (what the pool spends per instance).  `--cold` runs every
//! pair a second time, right after, on a host with making ahead off
//! (`warm_instances: 0`): both in one run.  `--finish` ends each request
//! with `Schedule::finish` (a learning schedule then carries new state,
//! which makes the instances made ahead with the old state stale).
use specd_policy::{
    native, Acceptance, HostConfig, PolicyError, PolicyHost, Position, RoundRecord, Schedule,
    ScheduleInput,
};
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut flag = |name: &str| -> Option<String> {
        let i = args.iter().position(|a| a == name)?;
        let v = args.get(i + 1).cloned();
        args.drain(i..(i + 2).min(args.len()));
        v
    };
    let mut policy_dirs = Vec::new();
    while let Some(dir) = flag("--policy-dir") {
        policy_dirs.push(dir);
    }
    let requests: u32 = flag("--requests").map_or(Ok(200), |v| v.parse())?;
    let switch = |args: &mut Vec<String>, name: &str| -> bool {
        let found = args.iter().any(|a| a == name);
        args.retain(|a| a != name);
        found
    };
    let cold = switch(&mut args, "--cold");
    let finish = switch(&mut args, "--finish");
    let pairs: Vec<(String, String)> = if args.len() >= 2 {
        args.chunks_exact(2)
            .map(|p| (p[0].clone(), p[1].clone()))
            .collect()
    } else {
        [
            ("constant", "greedy"),
            ("heuristic", "rejection"),
            ("throughput", "typical"),
            ("heuristic-c", "greedy"),
        ]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
    };
    let mut hosts = vec![("warm", PolicyHost::new(HostConfig::default())?)];
    if cold {
        let config = HostConfig {
            warm_instances: 0,
            ..HostConfig::default()
        };
        hosts.push(("cold", PolicyHost::new(config)?));
    }
    for (label, host) in &hosts {
        let t = Instant::now();
        for dir in &policy_dirs {
            host.add_dir(std::path::Path::new(dir))?;
        }
        println!(
            "{label} host: {} policies registered (compiled, or loaded from the disk cache) in {:.1} ms",
            host.list().len(),
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    for (s, a) in pairs {
        for (label, host) in &hosts {
            let t = Instant::now();
            drop(host.schedule(&s, "{}", "bench")?);
            drop(host.acceptance(&a, "{}", 50_000)?);
            println!(
                "{s} + {a} ({label}): first request's instantiation (both, and any lazy compile): {:.2} ms",
                t.elapsed().as_secs_f64() * 1e3
            );
            let before = host.metrics();
            let r = bench_policy_calls(host, &s, &a, requests, 64, finish)?;
            let after = host.metrics();
            let hits = after.warm_hits - before.warm_hits;
            let built = after.warm_built - before.warm_built;
            let ahead_us = if built > 0 {
                (after.warm_build_seconds - before.warm_build_seconds) / built as f64 * 1e6
            } else {
                0.0
            };
            println!(
                "{s:>20} + {a:<12} {label:4} instantiate {:7.1} us + {:7.1} us (median {:6.1} + {:6.1}) | ready {hits:4}/{:<4} ahead {ahead_us:7.1} us/instance | call {:6.0} ns + {:6.0} ns (round {:6.0} ns) | native {} + {} ns",
                r.schedule_instantiate_us,
                r.acceptance_instantiate_us,
                r.schedule_instantiate_median_us,
                r.acceptance_instantiate_median_us,
                2 * (requests + 3),
                r.schedule_ns_per_call,
                r.acceptance_ns_per_call,
                r.policy_ns_per_round,
                r.native_schedule_ns_per_call.map_or("-".into(), |v| format!("{v:.0}")),
                r.native_acceptance_ns_per_call.map_or("-".into(), |v| format!("{v:.0}")),
            );
        }
    }
    Ok(())
}

/// What `bench_policy_calls` measured.  Times are means.
#[derive(Clone, Debug)]
struct BenchReport {
    /// Per-request instantiation (Store + instance + `create`), microseconds.
    schedule_instantiate_us: f64,
    acceptance_instantiate_us: f64,
    /// The same, medians.
    schedule_instantiate_median_us: f64,
    acceptance_instantiate_median_us: f64,
    /// One `next-draft-length` / `decide` call through the component, nanoseconds.
    schedule_ns_per_call: f64,
    acceptance_ns_per_call: f64,
    /// Both calls of one round, nanoseconds.
    policy_ns_per_round: f64,
    /// The same policies as native Rust (when `native` has them), nanoseconds.
    native_schedule_ns_per_call: Option<f64>,
    native_acceptance_ns_per_call: Option<f64>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
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
        batch_sequences: 0,
        batch_rows_planned: 0,
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
                ..Default::default()
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
fn bench_policy_calls(
    host: &PolicyHost,
    schedule: &str,
    acceptance: &str,
    requests: u32,
    rounds: u32,
    finish: bool,
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
    let (mut s_all, mut a_all) = (Vec::new(), Vec::new());
    for _ in 0..requests {
        let t = Instant::now();
        let mut s = host.schedule(schedule, "{}", "bench")?;
        let ns = t.elapsed().as_nanos() as f64;
        si += ns;
        s_all.push(ns);
        let t = Instant::now();
        let mut a = host.acceptance(acceptance, "{}", 50_000)?;
        let ns = t.elapsed().as_nanos() as f64;
        ai += ns;
        a_all.push(ns);
        let (x, y) = run_rounds(s.as_mut(), a.as_mut(), rounds, k)?;
        sc += x;
        ac += y;
        if finish {
            s.finish();
        }
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
        schedule_instantiate_us: si / n / 1e3,
        acceptance_instantiate_us: ai / n / 1e3,
        schedule_instantiate_median_us: median(s_all) / 1e3,
        acceptance_instantiate_median_us: median(a_all) / 1e3,
        schedule_ns_per_call: sc / n,
        acceptance_ns_per_call: ac / n,
        policy_ns_per_round: (sc + ac) / n,
        native_schedule_ns_per_call: ns,
        native_acceptance_ns_per_call: na,
    })
}
