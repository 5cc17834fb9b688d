//! Startup cost: `PolicyHost::new` + `list` + the first schedule and acceptance.
//!     cargo run --release -p specd-policy --example startup [SCHEDULE ACCEPTANCE]
//! Run it twice: the first run in a fresh `$SPECD_HOME` compiles and fills the
//! on-disk cache (`$SPECD_HOME/policies/cache`), the second loads from it.
use specd_policy::{HostConfig, PolicyHost};
use std::time::Instant;

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (s, a) = match args.as_slice() {
        [s, a, ..] => (s.as_str(), a.as_str()),
        _ => ("heuristic", "greedy"),
    };
    let t0 = Instant::now();
    let t = Instant::now();
    let host = PolicyHost::new(HostConfig::default())?;
    let new_ms = ms(t);
    let t = Instant::now();
    let n = host.list().len();
    let list_ms = ms(t);
    let t = Instant::now();
    let sched = host.schedule(s, "{}", "bench")?;
    let sched_ms = ms(t);
    let t = Instant::now();
    let acc = host.acceptance(a, "{}", 49152)?;
    let acc_ms = ms(t);
    let total = ms(t0);
    drop((sched, acc));
    let t = Instant::now();
    let _again = host.schedule(s, "{}", "bench")?;
    let again_us = t.elapsed().as_secs_f64() * 1e6;
    println!(
        "PolicyHost::new {new_ms:.1} ms | list ({n} policies) {list_ms:.2} ms | first schedule {s} {sched_ms:.1} ms | first acceptance {a} {acc_ms:.1} ms | total {total:.1} ms | second schedule {again_us:.0} us"
    );
    Ok(())
}
