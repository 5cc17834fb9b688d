//! Contract 0.2 beside 0.1 in one host: the per-token drafting hook, the
//! 0.2 built-ins `adaedl` and `bandit` (components against their native
//! logic, their rules, their configs), and learning across requests.

mod common;
use common::*;
use specd_policy::{native, Contract, DraftStep, PolicyErrorKind, RoundRecord, ScheduleInput};

fn step(index: u32, entropy: f32, top1: f32, k: u32) -> DraftStep {
    DraftStep {
        index,
        token: 7 + index,
        q: top1,
        entropy,
        top1,
        k,
    }
}

/// A round of `drafted` drafts, `accepted` kept, with these timings.
fn timed(round: u32, last: Option<(u32, u32, f64, f64)>) -> ScheduleInput {
    ScheduleInput {
        round,
        budget_left: 1000,
        max_draft: 8,
        recent: last
            .map(
                |(drafted, accepted, draft_seconds, verify_seconds)| RoundRecord {
                    drafted,
                    accepted,
                    draft_seconds,
                    verify_seconds,
                },
            )
            .into_iter()
            .collect(),
        // verify(j) = 10 ms + 1 ms per draft
        verify_seconds_by_len: (0..=8).map(|j| 0.010 + 0.001 * j as f64).collect(),
        batch_sequences: 3,
        batch_rows_planned: 17,
        ..Default::default()
    }
}

#[test]
fn v0_1_and_v0_2_components_side_by_side() {
    // 0.1: never asked (it cannot be), always drafts on.
    let mut h = host().schedule("heuristic", "{}", "m").unwrap();
    assert!(!h.has_draft_hook());
    assert_eq!(h.continue_drafting(&step(0, 9.0, 0.01, 4)), Ok(true));
    assert_eq!(h.next_draft_length(&timed(0, None)).unwrap(), 4);
    // 0.2, a user component next to it: asked, and it answers its rule.
    let info = host()
        .add("stop-below", &plugin_file("stop-below"))
        .unwrap();
    assert_eq!(info.exports.contract, Contract::V0_2);
    assert!(info.exports.schedule && !info.exports.acceptance);
    let mut s = host()
        .schedule("stop-below", r#"{"k": 3, "threshold": 0.5}"#, "m")
        .unwrap();
    assert!(s.has_draft_hook());
    assert_eq!(s.next_draft_length(&timed(0, None)).unwrap(), 3);
    assert_eq!(s.continue_drafting(&step(0, 0.1, 0.9, 3)), Ok(true));
    assert_eq!(s.continue_drafting(&step(1, 2.0, 0.2, 3)), Ok(false));
    // A trap in the hook is a policy failure; the schedule is spent.
    let mut t = host()
        .schedule("stop-below", r#"{"trap_at": 1}"#, "m")
        .unwrap();
    assert_eq!(t.continue_drafting(&step(0, 0.1, 0.9, 4)), Ok(true));
    let err = t.continue_drafting(&step(1, 0.1, 0.9, 4)).unwrap_err();
    assert_eq!(err.kind, PolicyErrorKind::Trap, "{err}");
    assert!(err.message.contains("continue-drafting"), "{err}");
    assert_eq!(t.next_draft_length(&timed(1, None)), Err(err));
    // both versions still answer in turn on the same host
    assert_eq!(
        h.next_draft_length(&timed(1, Some((4, 4, 0.0, 0.01))))
            .unwrap(),
        6
    );
    let listed = host().list();
    let contract = |n: &str| {
        listed
            .iter()
            .find(|p| p.name == n)
            .unwrap()
            .exports
            .contract
    };
    assert_eq!(contract("heuristic"), Contract::V0_1);
    assert_eq!(contract("stop-below"), Contract::V0_2);
    // the JSON form (GET /api/policies) names the version
    let json = serde_json::to_value(listed.iter().find(|p| p.name == "adaedl").unwrap()).unwrap();
    assert_eq!(json["exports"]["contract"], "0.2.0");
}

#[test]
fn adaedl_stops_below_the_entropy_bound_as_its_native_logic_does() {
    let config = r#"{"max": 6, "gamma": 0.5, "threshold": 0.4}"#;
    let mut w = host().schedule("adaedl", config, "m").unwrap();
    let mut n = native::schedule("adaedl", config, None).unwrap();
    assert!(w.has_draft_hook());
    // k = max, clipped to max-draft
    assert_eq!(w.next_draft_length(&timed(0, None)).unwrap(), 6);
    let small = ScheduleInput {
        max_draft: 2,
        ..timed(0, None)
    };
    assert_eq!(w.next_draft_length(&small).unwrap(), 2);
    // bound = 1 - sqrt(0.5 H) >= 0.4  <=>  H <= 0.72
    assert_eq!(w.continue_drafting(&step(0, 0.0, 1.0, 6)), Ok(true));
    assert_eq!(w.continue_drafting(&step(0, 0.71, 0.6, 6)), Ok(true));
    assert_eq!(w.continue_drafting(&step(0, 0.73, 0.6, 6)), Ok(false));
    assert_eq!(w.continue_drafting(&step(0, f32::NAN, 0.6, 6)), Ok(false));
    let mut rng = Lcg(17);
    for i in 0..300 {
        let s = step(i % 6, rng.below(3000) as f32 / 1000.0, 0.5, 6);
        assert_eq!(w.continue_drafting(&s), n.continue_drafting(&s), "{s:?}");
    }
    for bad in [
        r#"{"max": 0}"#,
        r#"{"gamma": 0}"#,
        r#"{"gamma": -1}"#,
        r#"{"threshold": 1.5}"#,
        r#"{"k": 4}"#,
        "[1]",
    ] {
        let err = host().schedule("adaedl", bad, "m").err().expect(bad);
        assert_eq!(err.kind, PolicyErrorKind::Config, "{bad}: {err}");
        assert!(err.message.contains("bad config"), "{bad}: {err}");
    }
}

#[test]
fn bandit_plays_every_arm_then_the_best_and_carries_what_it_learned() {
    let config = r#"{"arms": [0, 2, 4], "c": 0.5}"#;
    let model = "bandit-test-model";
    let mut s = host().schedule("bandit", config, model).unwrap();
    // Every arm once, in order; the rewards (tokens per plain-step cost):
    // k=0: 1 / (10 ms / 10 ms) = 1; k=2 all kept: 3 / (14 ms / 10 ms) = 2.1;
    // k=4 none kept: 1 / (18 ms / 10 ms) = 0.56.
    let rounds = [
        (None, 0),
        (Some((0, 0, 0.0, 0.010)), 2),
        (Some((2, 2, 0.002, 0.012)), 4),
        // all played, equal bonuses: the best mean, k = 2
        (Some((4, 0, 0.004, 0.014)), 2),
    ];
    for (i, (last, want)) in rounds.iter().enumerate() {
        let k = s.next_draft_length(&timed(i as u32, *last)).unwrap();
        assert_eq!(k, *want, "round {i}");
    }
    s.finish();
    let carried = host().carried_state("bandit", model, config).unwrap();
    assert_eq!(carried.len(), 1 + 3 * 16);
    // The next request resumes: no arm is new, so it starts on the best.
    let mut next = host().schedule("bandit", config, model).unwrap();
    assert_eq!(next.next_draft_length(&timed(0, None)).unwrap(), 2);
    // Another model starts from scratch (first arm first).
    let mut fresh = host().schedule("bandit", config, "other-model").unwrap();
    assert_eq!(fresh.next_draft_length(&timed(0, None)).unwrap(), 0);

    // The component decides as its native logic, over random rounds.
    let mut w = host().schedule("bandit", "{}", "random-model").unwrap();
    let mut n = native::schedule("bandit", "{}", None).unwrap();
    let mut rng = Lcg(5);
    let mut last = None;
    for round in 0..300 {
        let input = timed(round, last);
        let (kw, kn) = (
            w.next_draft_length(&input).unwrap(),
            n.next_draft_length(&input).unwrap(),
        );
        assert_eq!(kw, kn, "round {round}");
        let accepted = rng.below(kw + 1);
        let verify = 0.010 + 0.001 * kw as f64 + rng.below(1000) as f64 * 1e-6;
        last = Some((kw, accepted, 0.002 * kw as f64, verify));
    }
    for bad in [
        r#"{"arms": []}"#,
        r#"{"c": -1}"#,
        r#"{"arms": [1], "x": 1}"#,
    ] {
        let err = host().schedule("bandit", bad, "m").err().expect(bad);
        assert_eq!(err.kind, PolicyErrorKind::Config, "{bad}: {err}");
    }
}

#[test]
fn the_batch_context_reaches_a_0_2_schedule_and_old_traces_still_read() {
    // stop-below answers 0 once the step holds `max_rows` rows: the input
    // (timed) says 17 rows are planned.
    host()
        .add("stop-below-batch", &plugin_file("stop-below"))
        .unwrap();
    let input = timed(0, None);
    for (max_rows, want) in [(17, 0), (18, 4), (u32::MAX, 4)] {
        let config = format!(r#"{{"k": 4, "max_rows": {max_rows}}}"#);
        let mut s = host().schedule("stop-below-batch", &config, "m").unwrap();
        assert_eq!(s.next_draft_length(&input).unwrap(), want, "{config}");
    }
    // A trace written before 0.2 (no batch fields) still reads, as zeros.
    let mut old = serde_json::to_value(&input).unwrap();
    old.as_object_mut().unwrap().remove("batch_sequences");
    old.as_object_mut().unwrap().remove("batch_rows_planned");
    let back: ScheduleInput = serde_json::from_value(old).unwrap();
    assert_eq!((back.batch_sequences, back.batch_rows_planned), (0, 0));
}
