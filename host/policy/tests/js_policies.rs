//! The JavaScript policies (plugins/js, built by scripts/build-js-plugins.sh
//! with componentize-js, which `make test` runs first): the JavaScript
//! `heuristic` and `rejection` decide exactly like the built-ins, and the
//! hostile JavaScript policy's misbehaviours are each contained with the
//! right failure kind.  The components are ~12 MB (SpiderMonkey inside):
//! compiled once (seconds on 2 cores), then loaded from the disk cache under
//! the test target directory.

mod common;
use common::ports::Port;

const JS: Port = Port {
    lang: "JavaScript",
    suffix: "js",
    dir: "js",
    script: "build-js-plugins.sh",
    raise: r#"{"do": "throw"}"#,
};

#[test]
fn js_heuristic_decides_exactly_like_the_rust_heuristic() {
    // The same config errors: JSON.parse alone would take 4.0 and 1e2,
    // which serde refuses (a duplicate key never reaches a policy: the host
    // hands over canonical JSON).
    JS.assert_heuristic(
        1718,
        &[
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
        ],
        &[
            "",
            "{}",
            " { } ",
            r#"{"initial": 4294967295}"#,
            r#"{ "initial" :7 }"#,
        ],
    );
    // a bad config's message reaches the client
    let err = JS
        .host()
        .schedule("heuristic-js", r#"{"k": 3}"#, "m")
        .err()
        .unwrap();
    assert!(err.message.contains("unknown field `k`"), "{err}");
}

#[test]
fn js_rejection_decides_exactly_like_the_rust_rejection() {
    JS.assert_rejection(4243, &[r#"{"x": 1}"#, "[1]", "3", "{", r#"{} x"#]);
}

#[test]
fn hostile_js_policies_are_contained() {
    JS.assert_hostile_contained();
}
