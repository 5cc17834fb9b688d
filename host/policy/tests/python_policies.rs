//! The Python policies (plugins/python, built by
//! scripts/build-python-plugins.sh with componentize-py, which `make test`
//! runs first): the Python `heuristic` and `rejection` decide exactly like
//! the built-ins, and the hostile Python policy's misbehaviours are each
//! contained with the right failure kind.  The components are ~18 MB
//! (CPython inside): compiled once (tens of seconds on 2 cores), then loaded
//! from the disk cache under the test target directory.

mod common;
use common::ports::Port;
use common::*;
use specd_policy::PolicyHost;
use std::path::PathBuf;
use std::time::SystemTime;

const PY: Port = Port {
    lang: "Python",
    suffix: "py",
    dir: "python",
    script: "build-python-plugins.sh",
    raise: r#"{"do": "raise"}"#,
};

#[test]
fn python_heuristic_decides_exactly_like_the_rust_heuristic() {
    PY.assert_heuristic(
        1717,
        &[
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
        ],
        &["", "{}", r#"{"initial": 4294967295}"#],
    );
}

#[test]
fn python_rejection_decides_exactly_like_the_rust_rejection() {
    PY.assert_rejection(4242, &[r#"{"x": 1}"#, "[1]", "3"]);
}

#[test]
fn hostile_python_policies_are_contained() {
    PY.assert_hostile_contained();
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
    PY.host();
    let dir = test_config().cache_dir.unwrap();
    let before = snapshot(&dir);
    assert!(!before.is_empty(), "nothing cached in {}", dir.display());
    // A new host (as a new process would) with the same cache: registering
    // the same components rewrites no cache file (a compile would store a
    // fresh artifact, by rename) and the policy decides the same.
    let second = PolicyHost::new(test_config()).unwrap();
    for name in ["heuristic", "rejection"] {
        second.add(&PY.name(name), &PY.file(name)).unwrap();
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
