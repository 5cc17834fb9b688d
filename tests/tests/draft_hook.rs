//! Contract 0.2's per-token drafting hook on the real default model: a 0.2
//! schedule stops a model drafter token by token, the trace records what it
//! was asked and answered, and `specd replay` reproduces it; 0.1 schedules
//! are never asked; the 0.2 built-ins keep greedy output identical to plain.
use specd::engine::Prompt;
use specd::options::{DrafterSpec, SpecOptions};
use specd::sampling::SamplingParams;
use specd::sequence::Finished;
use specd::trace::Recorded;
use specd_tests::{engine, GROUNDED, OPEN};
use specd_text::ChatMessage;
use specd_tools::replay::{replay, ReplayPolicies, TimingModel};

/// Drafts of a round (the stop-below fixture and most checks use k = 4).
const K: u32 = 4;
/// The fixture stops after the first draft token whose top-1 is below this.
const THRESHOLD: f32 = 0.5;

fn run(prompt: &str, opts: &SpecOptions, max_tokens: usize) -> (Finished, Recorded) {
    let e = engine();
    let ids = e
        .encode(&Prompt::Chat(vec![ChatMessage::user(prompt)]))
        .unwrap();
    let params = SamplingParams::default();
    let spec = e.speculation(opts, &params).unwrap();
    let mut settings = e.settings(params, Some(max_tokens), vec![]);
    settings.record = true;
    let fin = e
        .generate(None, &ids, &settings, spec, &mut |_| true)
        .unwrap();
    let header = specd::trace::header(&e, &settings, opts, &fin).unwrap();
    let rec = Recorded {
        header,
        rounds: fin.trace.clone(),
    };
    (fin, rec)
}

fn opts(drafter: &str, schedule: &str, config: serde_json::Value) -> SpecOptions {
    SpecOptions {
        drafter: Some(drafter.parse().unwrap()),
        schedule: Some(schedule.into()),
        schedule_config: Some(config),
        acceptance: Some("greedy".into()),
        draft_max: Some(6),
        ..Default::default()
    }
}

fn plain() -> SpecOptions {
    SpecOptions {
        drafter: Some(DrafterSpec::None),
        ..Default::default()
    }
}

/// Adds a test fixture (a 0.2 component from `plugins/fixtures`, not a
/// built-in) under its own name.
fn add_fixture(name: &str) {
    let path =
        std::path::Path::new(specd_policy::BUILT_COMPONENTS_DIR).join(format!("{name}.wasm"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let info = engine().policies.add(name, &bytes).unwrap();
    assert_eq!(info.exports.contract, specd_policy::Contract::V0_2);
}

fn add_stop_below() {
    add_fixture("stop-below");
}

#[test]
fn the_hook_stops_drafting_where_the_schedule_says_and_a_replay_gives_the_same_decisions() {
    add_stop_below();
    let prompt = GROUNDED[0];
    let config = serde_json::json!({ "k": K, "threshold": THRESHOLD });
    let (fin, rec) = run(prompt, &opts("self:4", "stop-below", config.clone()), 24);
    assert_eq!(fin.stats.policy_failure, None);
    let (mut early, mut asked) = (0, 0);
    for r in fin.trace.iter().filter(|r| r.k > 0) {
        // Asked after every draft token but the k-th, until it said stop.
        let stop_at = r.draft_steps.iter().position(|h| !h.go_on);
        let expected_drafted = stop_at.map_or(r.k, |i| i as u32 + 1);
        assert_eq!(r.drafted, expected_drafted, "round {}: {r:?}", r.round);
        let expected_calls = stop_at.map_or(r.k as usize - 1, |i| i + 1);
        assert_eq!(r.draft_steps.len(), expected_calls, "round {}", r.round);
        for (i, h) in r.draft_steps.iter().enumerate() {
            assert_eq!(h.step.index as usize, i);
            assert_eq!(h.step.k, r.k);
            // The fixture's rule, on what the host handed it.
            assert_eq!(h.go_on, h.step.top1 >= THRESHOLD, "{h:?}");
            // The hook saw what acceptance then saw at that position.
            let p = &r.positions[i];
            assert_eq!((h.step.token, h.step.q), (p.token, p.q));
            assert_eq!(Some(h.step.top1), p.draft_top1);
            assert_eq!(Some(h.step.entropy), p.draft_entropy);
        }
        asked += r.draft_steps.len();
        early += (r.drafted < r.k) as usize;
    }
    assert!(asked > 0, "the hook was never asked");
    assert!(early > 0, "no round stopped early: {:?}", fin.trace);
    assert_eq!(
        fin.stats.drafted,
        fin.trace.iter().map(|r| r.drafted as u64).sum::<u64>()
    );

    // Greedy: what the hook decides never changes the text.
    let (base, _) = run(prompt, &plain(), 24);
    assert_eq!(fin.emitted, base.emitted);

    // A trace line survives JSON (the `--record` file), hook calls included.
    let line = serde_json::to_string(&fin.trace[1]).unwrap();
    let back: specd::speculation::RoundTrace = serde_json::from_str(&line).unwrap();
    assert_eq!(back.draft_steps, fin.trace[1].draft_steps);

    // Replay with the recorded schedule reproduces every k, hook answer
    // and decision; with a threshold of 0 it never stops, so it differs.
    let recs = vec![rec];
    let timing = TimingModel::from_rounds(recs.iter().flat_map(|r| &r.rounds)).unwrap();
    let e = engine();
    let host = &e.policies;
    let same = ReplayPolicies {
        schedule_config: config.to_string(),
        ..Default::default()
    };
    let rep = replay(host, &recs, &same, &timing, true).unwrap();
    assert!(rep.matches_recording, "{:?}", rep.first_mismatch);
    assert_eq!(rep.drafted, fin.stats.drafted);
    let never = ReplayPolicies {
        schedule_config: serde_json::json!({ "k": K, "threshold": 0.0 }).to_string(),
        ..Default::default()
    };
    let rep = replay(host, &recs, &never, &timing, true).unwrap();
    assert!(!rep.matches_recording && rep.decision_mismatches > 0);
    assert!(rep.first_mismatch.unwrap().contains("draft hook"));
}

#[test]
fn v0_1_schedules_are_never_asked_and_the_v0_2_builtins_are_lossless() {
    let prompt = OPEN[0];
    let (base, _) = run(prompt, &plain(), 24);
    // A 0.1 schedule drafts k every round: no hook calls, but the positions
    // still carry the draft statistics (0.2 acceptance policies see them).
    let (fin, _) = run(
        prompt,
        &opts("self:4", "constant", serde_json::json!({ "k": K })),
        24,
    );
    assert_eq!(fin.emitted, base.emitted);
    for r in fin.trace.iter().filter(|r| r.k > 0) {
        assert!(r.draft_steps.is_empty());
        assert_eq!(r.drafted, r.k);
        assert!(r
            .positions
            .iter()
            .all(|p| p.draft_entropy.is_some_and(|h| h >= 0.0)
                && p.draft_top1.is_some_and(|t| t > 0.0 && t <= 1.0)));
    }
    // adaedl and bandit (0.2) with the model drafter: greedy output is plain's.
    for (schedule, config) in [
        ("adaedl", serde_json::json!({})),
        ("bandit", serde_json::json!({ "arms": [1, 2, 4] })),
    ] {
        let (fin, _) = run(prompt, &opts("self:4", schedule, config), 24);
        assert_eq!(fin.stats.policy_failure, None, "{schedule}");
        assert!(fin.stats.drafted > 0, "{schedule} never drafted");
        assert_eq!(fin.emitted, base.emitted, "{schedule} changed the text");
    }
}

#[test]
fn a_schedule_trapping_in_the_hook_ends_speculation_and_the_text_is_plain() {
    add_stop_below();
    let prompt = GROUNDED[1];
    // threshold 0: it would draft on, but it traps at the second token.
    let config = serde_json::json!({ "k": K, "threshold": 0.0, "trap_at": 1 });
    let (fin, _) = run(prompt, &opts("self:4", "stop-below", config), 16);
    let failure = fin.stats.policy_failure.clone().expect("a policy failure");
    let json = serde_json::to_value(&failure).unwrap();
    assert_eq!(json["kind"], "trap", "{json}");
    assert!(
        json["message"]
            .as_str()
            .unwrap()
            .contains("continue-drafting"),
        "{json}"
    );
    // Nothing drafted in the failing round was verified; plain from there.
    assert_eq!(fin.stats.drafted, 0);
    let (base, _) = run(prompt, &plain(), 16);
    assert_eq!(fin.emitted, base.emitted);
}

#[test]
fn a_v0_2_acceptance_policy_sees_the_draft_statistics_of_a_model_drafter() {
    // `draft-stats` decides as greedy does, but answers out of range where a
    // position lacks the draft entropy or top-1 that 0.2 positions carry.
    add_fixture("draft-stats");
    let prompt = GROUNDED[0];
    let with = |drafter: &str| SpecOptions {
        drafter: Some(drafter.parse().unwrap()),
        schedule: Some("constant".into()),
        schedule_config: Some(serde_json::json!({ "k": K })),
        acceptance: Some("draft-stats".into()),
        draft_max: Some(6),
        ..Default::default()
    };
    let (base, _) = run(prompt, &plain(), 24);
    // A model drafter has a distribution: the fields arrive, every round.
    let (fin, _) = run(prompt, &with("self:4"), 24);
    assert!(
        fin.stats.policy_failure.is_none(),
        "{:?}",
        fin.stats.policy_failure
    );
    assert!(fin.stats.drafted > 0, "{:?}", fin.stats);
    assert_eq!(fin.emitted, base.emitted);
    // n-gram drafts are point masses without a distribution: the fields are
    // absent, the fixture's answer is refused, and the text stays plain.
    let (fin, _) = run(prompt, &with("ngram"), 24);
    let failure = fin.stats.policy_failure.clone().expect("a policy failure");
    let json = serde_json::to_value(&failure).unwrap();
    assert_eq!(json["kind"], "invalid_answer", "{json}");
    assert_eq!(fin.emitted, base.emitted);
}
