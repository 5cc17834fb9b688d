//! Policy call benchmark:
//!     cargo run --release -p specd-policy --example bench [SCHEDULE ACCEPTANCE]
use specd_policy::{bench_policy_calls, HostConfig, PolicyHost};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let pairs: Vec<(String, String)> = if args.len() >= 2 {
        vec![(args[0].clone(), args[1].clone())]
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
    let t = std::time::Instant::now();
    let host = PolicyHost::new(HostConfig::default())?;
    println!(
        "PolicyHost::new ({} built-ins, each compiled on first use or loaded from the disk cache): {:.1} ms",
        host.list().len(),
        t.elapsed().as_secs_f64() * 1e3
    );
    for (s, a) in pairs {
        let r = bench_policy_calls(&host, &s, &a, 200, 64)?;
        println!(
            "{s:>20} + {a:<10} instantiate {:6.1} us + {:6.1} us | call {:6.0} ns + {:6.0} ns (round {:6.0} ns) | native {} + {} ns",
            r.schedule_instantiate_us,
            r.acceptance_instantiate_us,
            r.schedule_ns_per_call,
            r.acceptance_ns_per_call,
            r.policy_ns_per_round,
            r.native_schedule_ns_per_call.map_or("-".into(), |v| format!("{v:.0}")),
            r.native_acceptance_ns_per_call.map_or("-".into(), |v| format!("{v:.0}")),
        );
    }
    Ok(())
}
