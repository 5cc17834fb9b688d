//! The second-language policies: the C twin of `heuristic` decides exactly
//! like the Rust one, and a WASI-importing C policy (wasi-libc, printf) runs
//! under the deny-all WASI, its output captured to the log, unable to read
//! a file.

mod common;
use common::*;
use specd_policy::PolicyErrorKind;
use std::io::Write;
use std::sync::{Arc, Mutex};

#[test]
fn c_heuristic_decides_exactly_like_the_rust_heuristic() {
    assert_heuristic_twin("heuristic-c", 40, 2024, |rng| 1 + rng.below(60));
    // same config errors
    for bad in [
        r#"{"initial": 0}"#,
        r#"{"initial": -1}"#,
        r#"{"initial": 2.5}"#,
        r#"{"k": 3}"#,
        "[1]",
        r#"{"initial": 99999999999}"#,
    ] {
        let c = host()
            .schedule("heuristic-c", bad, "m")
            .err()
            .map(|e| e.kind);
        let r = host().schedule("heuristic", bad, "m").err().map(|e| e.kind);
        assert_eq!(c, Some(PolicyErrorKind::Config), "C accepted {bad}");
        assert_eq!(r, Some(PolicyErrorKind::Config), "Rust accepted {bad}");
    }
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn wasi_printf_policy_runs_sandboxed_and_cannot_read_files() {
    let logs = Captured::default();
    let sink = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let bytes = plugin_file("wasi-demo-c");
    let info = host().check(&bytes).unwrap();
    assert!(info.imports_wasi && info.exports.schedule);
    host().add("wasi-demo", &bytes).unwrap();
    let mut s = host().schedule("wasi-demo", r#"{"x":1}"#, "m").unwrap();
    for round in 0..3 {
        // 1 = no file, no environment, no clock could be reached; round 1
        // sleeps an hour in the guest, which returns at once (frozen time)
        let t = std::time::Instant::now();
        assert_eq!(s.next_draft_length(&input(round, 16, &[])).unwrap(), 1);
        assert!(
            t.elapsed() < std::time::Duration::from_secs(5),
            "round {round} took {:?}",
            t.elapsed()
        );
    }
    s.finish();
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(
        text.contains(r#"wasi-demo: hello from C, config {"x":1}"#),
        "{text}"
    );
    assert!(text.contains("wasi-demo: round 2 -> k 1"), "{text}");
    assert!(text.contains("probes reached mask 0"), "{text}");
    assert!(
        text.contains("stream=\"stdout\"")
            || text.contains("stream=stdout")
            || text.contains("stdout"),
        "{text}"
    );
}

#[test]
fn a_policy_printing_1_mib_keeps_answering_and_the_overflow_is_counted() {
    // Before: past the 16 KiB cap the guest's writes failed and wasi-libc
    // trapped (`unreachable`).  Now the rest is dropped and counted.
    host().add("chatty", &plugin_file("wasi-demo-c")).unwrap();
    let cap = specd_policy::HostConfig::default().log_limit_bytes as u64;
    let mib = 1u64 << 20;
    let config = format!(r#"{{"print":{mib}}}"#); // canonical: as create gets it
    let mut s = host().schedule("chatty", &config, "m").unwrap();
    let mut printed = format!("wasi-demo: hello from C, config {config}\n").len() as u64 + mib;
    assert_eq!(s.output_dropped(), printed - cap, "create printed 1 MiB");
    for round in 0..4 {
        // 1: the probes reached nothing (see wasi_demo.c)
        assert_eq!(s.next_draft_length(&input(round, 16, &[])).unwrap(), 1);
        printed += format!("wasi-demo: round {round} -> k 1\n").len() as u64;
        assert_eq!(s.output_dropped(), printed - cap, "round {round}");
    }
    s.finish();
    // A quiet request of the same policy drops nothing.
    let quiet = host().schedule("chatty", "{}", "m").unwrap();
    assert_eq!(quiet.output_dropped(), 0);
}
