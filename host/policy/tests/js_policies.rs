//! The JavaScript policies (plugins/js, built by scripts/build-js-plugins.sh
//! with componentize-js, which `make test` runs first): the JavaScript
//! `heuristic` and `rejection` decide exactly like the built-ins, and the
//! hostile JavaScript policy's misbehaviours are each contained with the
//! right failure kind.  The components are ~12 MB (SpiderMonkey inside):
//! compiled once (seconds on 2 cores), then loaded from the disk cache under
//! the test target directory.

mod common;
use common::*;
use specd_policy::{Correction, Decision, PolicyErrorKind, PolicyHost, Position};
use std::path::PathBuf;
use std::sync::OnceLock;

/// Where scripts/build-js-plugins.sh writes the components.
fn js_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../plugins/target/js")
}

fn js_file(name: &str) -> Vec<u8> {
    let path = js_dir().join(format!("{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}\nthe JavaScript policies are not built: run scripts/build-js-plugins.sh (`make test` does)",
            path.display()
        )
    })
}

/// Registers the JavaScript components in the shared host, once per test
/// binary (each compiles for seconds; parallel tests must not all do it).
fn js() -> &'static PolicyHost {
    static ADDED: OnceLock<()> = OnceLock::new();
    ADDED.get_or_init(|| {
        for name in ["heuristic-js", "rejection-js", "hostile-js"] {
            let info = host()
                .add(name, &js_file(name))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(
                info.imports_wasi,
                "{name}: componentize-js components import WASI"
            );
        }
    });
    host()
}

#[test]
fn js_heuristic_decides_exactly_like_the_rust_heuristic() {
    let host = js();
    let rounds = assert_heuristic_twin("heuristic-js", 24, 1718, |rng| 8 + rng.below(20));
    assert!(rounds >= 300, "{rounds} rounds");
    // the same config errors: JSON.parse alone would take 4.0 and 1e2,
    // which serde refuses (a duplicate key never reaches a policy: the host
    // hands over canonical JSON)
    for bad in [
        r#"{"initial": 0}"#,
        r#"{"initial": -1}"#,
        r#"{"initial": -0}"#,
        r#"{"initial": 2.5}"#,
        r#"{"initial": 4.0}"#,
        r#"{"initial": 1e2}"#,
        r#"{"initial": true}"#,
        r#"{"initial": null}"#,
        r#"{"initial": "4"}"#,
        r#"{"initial": [4]}"#,
        r#"{"k": 3}"#,
        r#"{"initial": 2, "k": 3}"#,
        r#"{"initial": 2"#,
        r#"{"initial": 2} x"#,
        "[1]",
        "3",
        r#"{"initial": 4294967296}"#,
        r#"{"initial": 99999999999}"#,
    ] {
        let j = host
            .schedule("heuristic-js", bad, "m")
            .err()
            .map(|e| e.kind);
        let r = host.schedule("heuristic", bad, "m").err().map(|e| e.kind);
        assert_eq!(
            j,
            Some(PolicyErrorKind::Config),
            "JavaScript accepted {bad}"
        );
        assert_eq!(r, Some(PolicyErrorKind::Config), "Rust accepted {bad}");
    }
    for good in [
        "",
        "{}",
        " { } ",
        r#"{"initial": 4294967295}"#,
        r#"{ "initial" :7 }"#,
    ] {
        let mut j = host.schedule("heuristic-js", good, "good").unwrap();
        let mut r = host.schedule("heuristic", good, "good").unwrap();
        let i = input(0, 16, &[]);
        assert_eq!(
            j.next_draft_length(&i).unwrap(),
            r.next_draft_length(&i).unwrap(),
            "{good}"
        );
    }
    // a bad config's message reaches the client
    let err = host
        .schedule("heuristic-js", r#"{"k": 3}"#, "m")
        .err()
        .unwrap();
    assert!(err.message.contains("unknown field `k`"), "{err}");
}

#[test]
fn js_rejection_decides_exactly_like_the_rust_rejection() {
    let host = js();
    let mut rng = Lcg(4243);
    let mut js = host.acceptance("rejection-js", "{}", 50_000).unwrap();
    let mut rs = host.acceptance("rejection", "{}", 50_000).unwrap();
    let (mut full, mut partial) = (0, 0);
    for round in 0..300 {
        let k = 1 + rng.below(8);
        let positions: Vec<Position> = (0..k).map(|_| random_position(&mut rng)).collect();
        let (dj, dr): (Decision, Decision) = (
            js.decide(&positions).unwrap(),
            rs.decide(&positions).unwrap(),
        );
        assert_eq!(dj, dr, "round {round}: {positions:?}");
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
    for bad in [r#"{"x": 1}"#, "[1]", "3", "{", r#"{} x"#] {
        let j = host
            .acceptance("rejection-js", bad, 10)
            .err()
            .map(|e| e.kind);
        let r = host.acceptance("rejection", bad, 10).err().map(|e| e.kind);
        assert_eq!(
            j,
            Some(PolicyErrorKind::Config),
            "JavaScript accepted {bad}"
        );
        assert_eq!(r, Some(PolicyErrorKind::Config), "Rust accepted {bad}");
    }
    assert!(host.acceptance("rejection-js", "", 10).is_ok());
}

/// After a failure the host still serves the JavaScript policies.
fn js_still_serves() {
    let mut s = js().schedule("heuristic-js", "{}", "after").unwrap();
    assert_eq!(s.next_draft_length(&input(0, 16, &[])).unwrap(), 4);
    let mut a = js().acceptance("hostile-js", "{}", 100).unwrap();
    assert_eq!(
        a.decide(&[pos(1, 0.5, 1.0, 1, 0.0, 0.0)]).unwrap().accepted,
        1
    );
}

fn hostile_schedule_error(config: &str) -> specd_policy::PolicyError {
    let mut s = js()
        .schedule("hostile-js", config, "m")
        .unwrap_or_else(|e| panic!("{config}: {e}"));
    let err = s.next_draft_length(&input(0, 16, &[])).unwrap_err();
    // spent: the same error again
    assert_eq!(s.next_draft_length(&input(1, 16, &[])).unwrap_err(), err);
    err
}

#[test]
fn hostile_js_policies_are_contained() {
    // well-behaved with no misbehaviour asked for
    let mut s = js().schedule("hostile-js", "{}", "m").unwrap();
    assert_eq!(s.next_draft_length(&input(0, 16, &[])).unwrap(), 2);

    let err = hostile_schedule_error(r#"{"do": "loop"}"#);
    assert_eq!(err.kind, PolicyErrorKind::Timeout, "{err}");
    assert_eq!(err.policy, "hostile-js");
    js_still_serves();

    let err = js()
        .schedule("hostile-js", r#"{"do": "loop-create"}"#, "m")
        .err()
        .unwrap();
    assert_eq!(err.kind, PolicyErrorKind::Timeout, "{err}");
    js_still_serves();

    let err = hostile_schedule_error(r#"{"do": "grow"}"#);
    assert_eq!(err.kind, PolicyErrorKind::MemoryLimit, "{err}");
    assert!(err.message.contains("memory"), "{err}");
    js_still_serves();

    let err = hostile_schedule_error(r#"{"do": "throw"}"#);
    assert_eq!(err.kind, PolicyErrorKind::Trap, "{err}");
    js_still_serves();

    let err = hostile_schedule_error(r#"{"do": "too-long"}"#);
    assert_eq!(err.kind, PolicyErrorKind::InvalidAnswer, "{err}");
    assert!(
        err.message.contains("17") && err.message.contains("16"),
        "{err}"
    );

    let two = [pos(1, 0.5, 1.0, 1, 0.0, 0.0), pos(2, 0.5, 1.0, 2, 0.0, 0.0)];
    let mut a = js()
        .acceptance("hostile-js", r#"{"do": "accept-too-many"}"#, 100)
        .unwrap();
    let err = a.decide(&two).unwrap_err();
    assert_eq!(err.kind, PolicyErrorKind::InvalidAnswer, "{err}");
    assert!(err.message.contains("accepted 3 of 2"), "{err}");
    let mut a = js()
        .acceptance("hostile-js", r#"{"do": "bad-token"}"#, 100)
        .unwrap();
    let err = a.decide(&two).unwrap_err();
    assert_eq!(err.kind, PolicyErrorKind::InvalidAnswer, "{err}");
    assert!(err.message.contains("100"), "{err}");
    js_still_serves();

    let m = js().metrics();
    for kind in ["timeout", "memory_limit", "trap", "invalid_answer"] {
        assert!(m.failures[kind] >= 1, "{kind}: {m:?}");
    }
}
