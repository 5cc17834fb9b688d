//! Hostile and misfit components, written in the component text format
//! inside the tests: each is refused with a clear message or contained as a
//! PolicyError within bounded time, and the host keeps serving.

mod common;
use common::*;
use specd_policy::{CheckError, Correction, PolicyErrorKind, RegistryError};
use std::time::{Duration, Instant};

/// After any failure the same host still serves a normal request.
fn host_still_serves() {
    let mut s = host()
        .schedule("heuristic-transient", "{}", "after-hostile")
        .unwrap();
    assert_eq!(s.next_draft_length(&input(0, 16, &[])).unwrap(), 4);
    s.finish();
    let mut a = host().acceptance("greedy", "{}", 100).unwrap();
    assert_eq!(
        a.decide(&[pos(1, 0.5, 1.0, 1, 0.0, 0.0)]).unwrap().accepted,
        1
    );
}

fn add(name: &str, wat: &ScheduleWat) -> String {
    let bytes = wat.build();
    let info = host()
        .add(name, &bytes)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(info.exports.schedule && !info.exports.acceptance);
    info.sha256
}

#[test]
fn the_template_itself_is_a_valid_policy() {
    add(
        "wat-ok",
        &ScheduleWat {
            next: "(i32.const 3)",
            ..Default::default()
        },
    );
    let mut s = host().schedule("wat-ok", "{}", "m").unwrap();
    assert_eq!(s.next_draft_length(&input(0, 16, &[])).unwrap(), 3);
    // the input reaches the guest: answer max-draft
    add(
        "wat-echo-max",
        &ScheduleWat {
            next: "(local.get $max)",
            ..Default::default()
        },
    );
    let mut s = host().schedule("wat-echo-max", "{}", "m").unwrap();
    assert_eq!(
        s.next_draft_length(&input(0, 11, &[(1, 1), (2, 0)]))
            .unwrap(),
        11
    );
    s.finish();
}

#[test]
fn infinite_loop_times_out() {
    add(
        "wat-loop",
        &ScheduleWat {
            next: "(loop $l (br $l)) (i32.const 0)",
            ..Default::default()
        },
    );
    let mut s = host().schedule("wat-loop", "{}", "m").unwrap();
    let t = Instant::now();
    let err = s.next_draft_length(&input(0, 16, &[])).unwrap_err();
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(err.kind, PolicyErrorKind::Timeout, "{err}");
    assert_eq!(err.policy, "wat-loop");
    assert!(err.message.contains("fuel"), "{err}");
    // the object is spent: the same error again, immediately
    assert_eq!(s.next_draft_length(&input(1, 16, &[])).unwrap_err(), err);
    // serializes as the stats' policy_failure
    let json = serde_json::to_value(&err).unwrap();
    assert_eq!(json["kind"], "timeout");
    assert_eq!(json["policy"], "wat-loop");
    host_still_serves();
}

#[test]
fn infinite_loop_in_create_and_in_start_code_time_out() {
    add(
        "wat-loop-create",
        &ScheduleWat {
            create: "(loop $l (br $l)) (i32.const 0)",
            ..Default::default()
        },
    );
    let t = Instant::now();
    let err = host().schedule("wat-loop-create", "{}", "m").err().unwrap();
    assert_eq!(err.kind, PolicyErrorKind::Timeout, "{err}");
    add(
        "wat-loop-start",
        &ScheduleWat {
            core_extra: "(func $spin (loop $l (br $l))) (start $spin)",
            ..Default::default()
        },
    );
    let err = host().schedule("wat-loop-start", "{}", "m").err().unwrap();
    assert_eq!(err.kind, PolicyErrorKind::Timeout, "{err}");
    assert!(t.elapsed() < Duration::from_secs(10));
    host_still_serves();
}

#[test]
fn unbounded_memory_growth_hits_the_cap() {
    add(
        "wat-grow",
        &ScheduleWat {
            next: "(loop $l (drop (memory.grow (i32.const 16))) (br $l)) (i32.const 0)",
            ..Default::default()
        },
    );
    let mut s = host().schedule("wat-grow", "{}", "m").unwrap();
    let t = Instant::now();
    let err = s.next_draft_length(&input(0, 16, &[])).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(err.kind, PolicyErrorKind::MemoryLimit, "{err}");
    assert!(err.message.contains("memory"), "{err}");
    host_still_serves();
}

#[test]
fn a_trap_is_contained() {
    add(
        "wat-trap",
        &ScheduleWat {
            next: "(unreachable)",
            ..Default::default()
        },
    );
    let mut s = host().schedule("wat-trap", "{}", "m").unwrap();
    let err = s.next_draft_length(&input(0, 16, &[])).unwrap_err();
    assert_eq!(err.kind, PolicyErrorKind::Trap, "{err}");
    assert!(err.message.contains("unreachable"), "{err}");
    // a trap in create
    add(
        "wat-trap-create",
        &ScheduleWat {
            create: "(unreachable)",
            ..Default::default()
        },
    );
    let err = host().schedule("wat-trap-create", "{}", "m").err().unwrap();
    assert_eq!(err.kind, PolicyErrorKind::Trap, "{err}");
    // an out-of-bounds access
    add(
        "wat-oob",
        &ScheduleWat {
            next: "(i32.load (i32.const -8))",
            ..Default::default()
        },
    );
    let err = host()
        .schedule("wat-oob", "{}", "m")
        .unwrap()
        .next_draft_length(&input(0, 16, &[]))
        .unwrap_err();
    assert_eq!(err.kind, PolicyErrorKind::Trap, "{err}");
    // a bad result pointer handed back to the host
    add(
        "wat-bad-ptr",
        &ScheduleWat {
            create: "(i32.const -4)",
            ..Default::default()
        },
    );
    let err = host().schedule("wat-bad-ptr", "{}", "m").err().unwrap();
    assert_eq!(err.kind, PolicyErrorKind::Trap, "{err}");
    // failures are counted
    let m = host().metrics();
    assert!(m.failures["trap"] >= 3, "{m:?}");
    host_still_serves();
}

#[test]
fn out_of_range_answers_are_refused() {
    add(
        "wat-too-long",
        &ScheduleWat {
            next: "(i32.add (local.get $max) (i32.const 1))",
            ..Default::default()
        },
    );
    let mut s = host().schedule("wat-too-long", "{}", "m").unwrap();
    let err = s.next_draft_length(&input(0, 16, &[])).unwrap_err();
    assert_eq!(err.kind, PolicyErrorKind::InvalidAnswer, "{err}");
    assert!(
        err.message.contains("17") && err.message.contains("16"),
        "{err}"
    );

    // acceptance: more accepted than drafted, a token outside the vocabulary
    let store_decision = |accepted: &str, tag: u32, token: u32| {
        format!(
            "(i32.store (i32.const 128) {accepted}) (i32.store8 (i32.const 132) (i32.const {tag})) (i32.store (i32.const 136) (i32.const {token})) (i32.const 128)"
        )
    };
    let too_many = AcceptanceWat {
        create: ACCEPT_CREATE_OK,
        decide: &store_decision("(i32.add (local.get $len) (i32.const 1))", 0, 0),
    }
    .build();
    host().add("wat-accept-too-many", &too_many).unwrap();
    let mut a = host().acceptance("wat-accept-too-many", "{}", 100).unwrap();
    let err = a
        .decide(&[pos(1, 0.5, 1.0, 1, 0.0, 0.0), pos(2, 0.5, 1.0, 2, 0.0, 0.0)])
        .unwrap_err();
    assert_eq!(err.kind, PolicyErrorKind::InvalidAnswer, "{err}");
    assert!(err.message.contains("accepted 3 of 2"), "{err}");

    let bad_token = AcceptanceWat {
        create: ACCEPT_CREATE_OK,
        decide: &store_decision("(i32.const 0)", 2, 100),
    }
    .build();
    host().add("wat-accept-bad-token", &bad_token).unwrap();
    let mut a = host()
        .acceptance("wat-accept-bad-token", "{}", 100)
        .unwrap();
    let err = a.decide(&[pos(1, 0.5, 1.0, 1, 0.0, 0.0)]).unwrap_err();
    assert_eq!(err.kind, PolicyErrorKind::InvalidAnswer, "{err}");
    assert!(err.message.contains("100"), "{err}");
    // the same token is fine with a bigger vocabulary
    let mut a = host()
        .acceptance("wat-accept-bad-token", "{}", 101)
        .unwrap();
    assert_eq!(
        a.decide(&[pos(1, 0.5, 1.0, 1, 0.0, 0.0)])
            .unwrap()
            .correction,
        Correction::Token(100)
    );

    // an invalid variant tag is a trap in the host's lifting, contained
    let bad_tag = AcceptanceWat {
        create: ACCEPT_CREATE_OK,
        decide: &store_decision("(i32.const 0)", 7, 0),
    }
    .build();
    host().add("wat-accept-bad-tag", &bad_tag).unwrap();
    let err = host()
        .acceptance("wat-accept-bad-tag", "{}", 100)
        .unwrap()
        .decide(&[pos(1, 0.5, 1.0, 1, 0.0, 0.0)])
        .unwrap_err();
    assert_eq!(err.kind, PolicyErrorKind::Trap, "{err}");
    host_still_serves();
}

#[test]
fn missing_export_is_refused() {
    let bytes = ScheduleWat {
        export: "acme:policy/schedule@0.1.0",
        ..Default::default()
    }
    .build();
    let err = host().check(&bytes).unwrap_err();
    assert!(matches!(err, CheckError::MissingExport { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("specd:policy/schedule@0.1.0") && msg.contains("acme:policy/schedule@0.1.0"),
        "{msg}"
    );
    // an empty component
    let err = host()
        .check(&wat::parse_str("(component)").unwrap())
        .unwrap_err();
    assert!(err.to_string().contains("it exports: nothing"), "{err}");
    // uploading it is a 400
    let err = host().add("no-export", &bytes).unwrap_err();
    assert_eq!(err.http_status(), 400);
    // a method missing from the interface
    let bytes = ScheduleWat {
        carry: None,
        ..Default::default()
    }
    .build();
    let err = host().check(&bytes).unwrap_err();
    assert!(matches!(err, CheckError::Mismatch { .. }), "{err}");
    assert!(err.to_string().contains("carry"), "{err}");
    host_still_serves();
}

#[test]
fn a_different_wit_version_is_refused() {
    // (0.2.0 is implemented too since contract 0.2: an unknown version.)
    let bytes = ScheduleWat {
        export: "specd:policy/schedule@0.3.0",
        ..Default::default()
    }
    .build();
    let err = host().check(&bytes).unwrap_err();
    assert!(matches!(err, CheckError::WrongVersion { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("specd:policy/schedule@0.3.0") && msg.contains("specd:policy@0.1.0"),
        "{msg}"
    );
    host_still_serves();
}

#[test]
fn a_forbidden_import_is_refused_by_name() {
    let bytes = ScheduleWat {
        component_extra: r#"(import "evil:net/socket@1.0.0" (instance (export "connect" (func (param "host" string)))))"#,
        ..Default::default()
    }
    .build();
    let err = host().check(&bytes).unwrap_err();
    assert!(matches!(err, CheckError::ForbiddenImport { .. }), "{err}");
    assert!(err.to_string().contains("`evil:net/socket@1.0.0`"), "{err}");
    // a WASI interface specd does not provide (wasi:http) is refused by name too
    let bytes = ScheduleWat {
        component_extra: r#"(import "wasi:http/outgoing-handler@0.2.0" (instance))"#,
        ..Default::default()
    }
    .build();
    let err = host().check(&bytes).unwrap_err();
    assert!(
        err.to_string().contains("wasi:http/outgoing-handler@0.2.0"),
        "{err}"
    );
    host_still_serves();
}

#[test]
fn not_a_component_is_refused() {
    assert_eq!(host().check(b"hello").unwrap_err(), CheckError::NotWasm);
    let core = wat::parse_str("(module (func (export \"f\")))").unwrap();
    let err = host().check(&core).unwrap_err();
    assert_eq!(err, CheckError::NotAComponent);
    assert!(err.to_string().contains("not a component"));
    let mut broken = ScheduleWat::default().build();
    broken.truncate(broken.len() / 2);
    assert!(matches!(
        host().check(&broken).unwrap_err(),
        CheckError::Invalid(_)
    ));
    let err = host()
        .add("big", &vec![0u8; host().config().max_component_bytes + 1])
        .unwrap_err();
    assert!(
        matches!(err, RegistryError::Invalid(CheckError::TooLarge { .. })),
        "{err}"
    );
}

#[test]
fn many_failing_requests_do_not_exhaust_the_host() {
    add(
        "wat-trap-many",
        &ScheduleWat {
            next: "(unreachable)",
            ..Default::default()
        },
    );
    // more requests than pool slots: instances are returned when requests end
    for _ in 0..(host().config().max_instances + 20) {
        let mut s = host().schedule("wat-trap-many", "{}", "m").unwrap();
        assert!(s.next_draft_length(&input(0, 16, &[])).is_err());
    }
    host_still_serves();
}

/// One component per misfit kind, each refused by `check` for its own
/// reason.  With `$SPECD_MISFITS_DIR` set they are also written there, to
/// try `specd policy check` on by hand:
///     SPECD_MISFITS_DIR=/tmp/misfits cargo test --release -p specd-policy --test hostile -- misfits
#[test]
fn misfits_are_refused_each_for_its_own_reason() {
    let mut truncated = ScheduleWat::default().build();
    truncated.truncate(truncated.len() / 2);
    let files: Vec<(&str, Vec<u8>)> = vec![
        ("ok", ScheduleWat::default().build()),
        ("not-wasm", b"hello, world".to_vec()),
        ("core-module", wat::parse_str("(module (func (export \"f\")))").unwrap()),
        ("truncated", truncated),
        ("too-large", {
            let mut b = ScheduleWat::default().build();
            b.resize(host().config().max_component_bytes + 1, 0);
            b
        }),
        (
            "wrong-version",
            ScheduleWat {
                export: "specd:policy/schedule@0.3.0",
                ..Default::default()
            }
            .build(),
        ),
        (
            "missing-export",
            ScheduleWat {
                export: "acme:policy/schedule@0.1.0",
                ..Default::default()
            }
            .build(),
        ),
        ("empty", wat::parse_str("(component)").unwrap()),
        (
            "forbidden-import",
            ScheduleWat {
                component_extra: r#"(import "evil:net/socket@1.0.0" (instance (export "connect" (func (param "host" string)))))"#,
                ..Default::default()
            }
            .build(),
        ),
        (
            "wasi-http",
            ScheduleWat {
                component_extra: r#"(import "wasi:http/outgoing-handler@0.2.0" (instance))"#,
                ..Default::default()
            }
            .build(),
        ),
        (
            "mismatch",
            ScheduleWat {
                carry: None,
                ..Default::default()
            }
            .build(),
        ),
    ];
    for (name, bytes) in &files {
        let got = host().check(bytes);
        let fits = matches!(
            (*name, &got),
            ("ok", Ok(_))
                | ("not-wasm", Err(CheckError::NotWasm))
                | ("core-module", Err(CheckError::NotAComponent))
                | ("truncated", Err(CheckError::Invalid(_)))
                | ("too-large", Err(CheckError::TooLarge { .. }))
                | ("wrong-version", Err(CheckError::WrongVersion { .. }))
                | (
                    "missing-export" | "empty",
                    Err(CheckError::MissingExport { .. })
                )
                | (
                    "forbidden-import" | "wasi-http",
                    Err(CheckError::ForbiddenImport { .. })
                )
                | ("mismatch", Err(CheckError::Mismatch { .. }))
        );
        assert!(fits, "{name}: {got:?}");
    }
    if let Some(dir) = std::env::var_os("SPECD_MISFITS_DIR") {
        let dir = std::path::PathBuf::from(dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in files {
            std::fs::write(dir.join(format!("{name}.wasm")), bytes).unwrap();
        }
    }
}
