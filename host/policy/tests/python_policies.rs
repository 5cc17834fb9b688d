//! The Python policies (plugins/python, built by
//! scripts/build-python-plugins.sh with componentize-py, which `make test`
//! runs first): the Python `heuristic` and `rejection` decide exactly like
//! the built-ins, and the hostile Python policy's misbehaviours are each
//! contained with the right failure kind.  The components are ~18 MB
//! (CPython inside): compiled once (tens of seconds on 2 cores), then loaded
//! from the disk cache under the test target directory.

mod common;
use common::*;
use specd_policy::{Correction, Decision, PolicyErrorKind, PolicyHost, Position};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::SystemTime;

/// Where scripts/build-python-plugins.sh writes the components.
fn python_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../plugins/target/python")
}

fn python_file(name: &str) -> Vec<u8> {
    let path = python_dir().join(format!("{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}\nthe Python policies are not built: run scripts/build-python-plugins.sh (`make test` does)",
            path.display()
        )
    })
}

/// Registers the Python components in the shared host, once per test binary
/// (each compiles for seconds; tests running in parallel must not all do it).
fn python() -> &'static PolicyHost {
    static ADDED: OnceLock<()> = OnceLock::new();
    ADDED.get_or_init(|| {
        for name in ["heuristic-py", "rejection-py", "hostile-py"] {
            let info = host()
                .add(name, &python_file(name))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(
                info.imports_wasi,
                "{name}: componentize-py components import WASI"
            );
        }
    });
    host()
}

#[test]
fn python_heuristic_decides_exactly_like_the_rust_heuristic() {
    let host = python();
    let rounds = assert_heuristic_twin("heuristic-py", 24, 1717, |rng| 8 + rng.below(20));
    assert!(rounds >= 300, "{rounds} rounds");
    // the same config errors
    for bad in [
        r#"{"initial": 0}"#,
        r#"{"initial": -1}"#,
        r#"{"initial": 2.5}"#,
        r#"{"initial": 4.0}"#,
        r#"{"initial": true}"#,
        r#"{"initial": "4"}"#,
        r#"{"k": 3}"#,
        r#"{"initial": 2, "k": 3}"#,
        "[1]",
        "3",
        r#"{"initial": 4294967296}"#,
        r#"{"initial": 99999999999}"#,
    ] {
        let p = host
            .schedule("heuristic-py", bad, "m")
            .err()
            .map(|e| e.kind);
        let r = host.schedule("heuristic", bad, "m").err().map(|e| e.kind);
        assert_eq!(p, Some(PolicyErrorKind::Config), "Python accepted {bad}");
        assert_eq!(r, Some(PolicyErrorKind::Config), "Rust accepted {bad}");
    }
    for good in ["", "{}", r#"{"initial": 4294967295}"#] {
        let mut p = host.schedule("heuristic-py", good, "good").unwrap();
        let mut r = host.schedule("heuristic", good, "good").unwrap();
        let i = input(0, 16, &[]);
        assert_eq!(
            p.next_draft_length(&i).unwrap(),
            r.next_draft_length(&i).unwrap(),
            "{good}"
        );
    }
}

#[test]
fn python_rejection_decides_exactly_like_the_rust_rejection() {
    let host = python();
    let mut rng = Lcg(4242);
    let mut py = host.acceptance("rejection-py", "{}", 50_000).unwrap();
    let mut rs = host.acceptance("rejection", "{}", 50_000).unwrap();
    let (mut full, mut partial) = (0, 0);
    for round in 0..300 {
        let k = 1 + rng.below(8);
        let positions: Vec<Position> = (0..k).map(|_| random_position(&mut rng)).collect();
        let (dp, dr): (Decision, Decision) = (
            py.decide(&positions).unwrap(),
            rs.decide(&positions).unwrap(),
        );
        assert_eq!(dp, dr, "round {round}: {positions:?}");
        assert_eq!(dr.correction, Correction::Residual);
        if dr.accepted == k {
            full += 1;
        } else {
            partial += 1;
        }
    }
    // the rounds exercise both outcomes
    assert!(full > 20 && partial > 20, "{full} full, {partial} partial");
    // the same config errors
    for bad in [r#"{"x": 1}"#, "[1]", "3"] {
        let p = host
            .acceptance("rejection-py", bad, 10)
            .err()
            .map(|e| e.kind);
        let r = host.acceptance("rejection", bad, 10).err().map(|e| e.kind);
        assert_eq!(p, Some(PolicyErrorKind::Config), "Python accepted {bad}");
        assert_eq!(r, Some(PolicyErrorKind::Config), "Rust accepted {bad}");
    }
    assert!(host.acceptance("rejection-py", "", 10).is_ok());
}

/// After a failure the host still serves the Python policies.
fn python_still_serves() {
    let mut s = python().schedule("heuristic-py", "{}", "after").unwrap();
    assert_eq!(s.next_draft_length(&input(0, 16, &[])).unwrap(), 4);
    let mut a = python().acceptance("hostile-py", "{}", 100).unwrap();
    assert_eq!(
        a.decide(&[pos(1, 0.5, 1.0, 1, 0.0, 0.0)]).unwrap().accepted,
        1
    );
}

fn hostile_schedule_error(config: &str) -> specd_policy::PolicyError {
    let mut s = python()
        .schedule("hostile-py", config, "m")
        .unwrap_or_else(|e| panic!("{config}: {e}"));
    let err = s.next_draft_length(&input(0, 16, &[])).unwrap_err();
    // spent: the same error again
    assert_eq!(s.next_draft_length(&input(1, 16, &[])).unwrap_err(), err);
    err
}

#[test]
fn hostile_python_policies_are_contained() {
    // well-behaved with no misbehaviour asked for
    let mut s = python().schedule("hostile-py", "{}", "m").unwrap();
    assert_eq!(s.next_draft_length(&input(0, 16, &[])).unwrap(), 2);

    let err = hostile_schedule_error(r#"{"do": "loop"}"#);
    assert_eq!(err.kind, PolicyErrorKind::Timeout, "{err}");
    assert_eq!(err.policy, "hostile-py");
    python_still_serves();

    let err = python()
        .schedule("hostile-py", r#"{"do": "loop-create"}"#, "m")
        .err()
        .unwrap();
    assert_eq!(err.kind, PolicyErrorKind::Timeout, "{err}");
    python_still_serves();

    let err = hostile_schedule_error(r#"{"do": "grow"}"#);
    assert_eq!(err.kind, PolicyErrorKind::MemoryLimit, "{err}");
    assert!(err.message.contains("memory"), "{err}");
    python_still_serves();

    let err = hostile_schedule_error(r#"{"do": "raise"}"#);
    assert_eq!(err.kind, PolicyErrorKind::Trap, "{err}");
    python_still_serves();

    let err = hostile_schedule_error(r#"{"do": "too-long"}"#);
    assert_eq!(err.kind, PolicyErrorKind::InvalidAnswer, "{err}");
    assert!(
        err.message.contains("17") && err.message.contains("16"),
        "{err}"
    );

    let two = [pos(1, 0.5, 1.0, 1, 0.0, 0.0), pos(2, 0.5, 1.0, 2, 0.0, 0.0)];
    let mut a = python()
        .acceptance("hostile-py", r#"{"do": "accept-too-many"}"#, 100)
        .unwrap();
    let err = a.decide(&two).unwrap_err();
    assert_eq!(err.kind, PolicyErrorKind::InvalidAnswer, "{err}");
    assert!(err.message.contains("accepted 3 of 2"), "{err}");
    let mut a = python()
        .acceptance("hostile-py", r#"{"do": "bad-token"}"#, 100)
        .unwrap();
    let err = a.decide(&two).unwrap_err();
    assert_eq!(err.kind, PolicyErrorKind::InvalidAnswer, "{err}");
    assert!(err.message.contains("100"), "{err}");
    python_still_serves();

    let m = python().metrics();
    for kind in ["timeout", "memory_limit", "trap", "invalid_answer"] {
        assert!(m.failures[kind] >= 1, "{kind}: {m:?}");
    }
}

/// Modification times of the compiled components in `dir` (not the
/// temporary files of stores in progress).
fn snapshot(dir: &std::path::Path) -> Vec<(PathBuf, SystemTime)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
                .filter_map(|e| Some((e.path(), e.metadata().ok()?.modified().ok()?)))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn a_second_host_loads_the_python_policies_from_the_disk_cache() {
    python();
    let dir = test_config().cache_dir.unwrap();
    let before = snapshot(&dir);
    assert!(!before.is_empty(), "nothing cached in {}", dir.display());
    // A new host (as a new process would) with the same cache: registering
    // the same components rewrites no cache file (a compile would store a
    // fresh artifact, by rename) and the policy decides the same.
    let second = PolicyHost::new(test_config()).unwrap();
    for name in ["heuristic-py", "rejection-py"] {
        second.add(name, &python_file(name)).unwrap();
    }
    let after = snapshot(&dir);
    for f in &before {
        assert!(
            after.contains(f),
            "{} was rewritten or removed",
            f.0.display()
        );
    }
    let mut s = second
        .schedule("heuristic-py", r#"{"initial": 3}"#, "m")
        .unwrap();
    assert_eq!(s.next_draft_length(&input(0, 16, &[])).unwrap(), 3);
}
