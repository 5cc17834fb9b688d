//! Light speculative rounds (the verify copies back only each row's argmax
//! and margin, computed on the device) against full rounds (every row
//! copied back and transformed on the host), on the real default model:
//! same tokens, stats, trace and caches, at every point a client can
//! cancel.
use specd::engine::Prompt;
use specd::options::SpecOptions;
use specd::sampling::SamplingParams;
use specd::sequence::Finished;
use specd::speculation::{LlamaTarget, RoundTrace, Target, VerifyMode, VerifyRows};
use specd_tests::{engine, GROUNDED};
use specd_text::ChatMessage;

/// One greedy request with `drafter` (a schedule that reads no timings, so
/// both kinds of round are asked the same) on a target we keep; the sink
/// cancels at its `cancel_at`-th call (text or probe).
fn run(
    target: &mut LlamaTarget,
    prompt: &[u32],
    drafter: &str,
    light: bool,
    stop: Vec<String>,
    cancel_at: Option<usize>,
) -> (Finished, usize) {
    let e = engine();
    let params = SamplingParams::default();
    let opts = SpecOptions {
        drafter: Some(drafter.parse().unwrap()),
        schedule: Some("constant".into()),
        schedule_config: Some(serde_json::json!({"k": 4})),
        acceptance: Some("greedy".into()),
        draft_max: Some(6),
        ..Default::default()
    };
    let spec = e.speculation(&opts, &params).unwrap();
    let mut settings = e.settings(params, Some(12), stop);
    settings.record = true;
    settings.light_rounds = light;
    let mut calls = 0usize;
    let mut sink = |_: &str| {
        calls += 1;
        cancel_at.is_none_or(|n| calls < n)
    };
    let fin =
        specd::sequence::generate(target, &e.tokenizer, prompt, 0, &settings, spec, &mut sink)
            .unwrap();
    (fin, calls)
}

/// A round as the policies saw it, without the timings (which differ run
/// to run).
fn untimed(t: &RoundTrace) -> serde_json::Value {
    let mut v = serde_json::to_value(t).unwrap();
    for k in ["draft_seconds", "verify_seconds", "policy_seconds"] {
        v.as_object_mut().unwrap().remove(k);
    }
    if let Some(input) = v.get_mut("schedule_input").and_then(|i| i.as_object_mut()) {
        for k in ["draft_seconds_per_token", "verify_seconds_by_len", "recent"] {
            input.remove(k);
        }
    }
    v
}

fn assert_same(full: &Finished, light: &Finished, case: &str) {
    assert_eq!(full.emitted, light.emitted, "{case}");
    assert_eq!(full.log, light.log, "{case}");
    let bits = |m: &[f32]| m.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&full.margins), bits(&light.margins), "{case}");
    let (a, b) = (&full.stats, &light.stats);
    assert_eq!(a.done_reason, b.done_reason, "{case}");
    assert_eq!(a.generated_tokens, b.generated_tokens, "{case}");
    assert_eq!(
        (a.rounds, a.drafted, a.accepted, a.near_ties),
        (b.rounds, b.drafted, b.accepted, b.near_ties),
        "{case}"
    );
    assert_eq!(a.policy_failure, b.policy_failure, "{case}");
    assert_eq!(full.trace.len(), light.trace.len(), "{case}");
    for (x, y) in full.trace.iter().zip(&light.trace) {
        assert_eq!(untimed(x), untimed(y), "{case}: round {}", x.round);
    }
}

/// Both targets' caches hold all but the last committed token, and the
/// next forward from them gives bitwise the same logits.
fn assert_same_caches(ta: &mut LlamaTarget, tb: &mut LlamaTarget, fin: &Finished, case: &str) {
    let n = fin.log.len();
    assert_eq!(ta.offset(), n - 1, "{case}");
    assert_eq!(tb.offset(), n - 1, "{case}");
    let a = ta.forward(&fin.log[n - 1..], false).unwrap();
    let b = tb.forward(&fin.log[n - 1..], false).unwrap();
    assert!(
        a[0].iter()
            .zip(&b[0])
            .all(|(x, y)| x.to_bits() == y.to_bits()),
        "{case}: the caches differ"
    );
}

#[test]
fn light_rounds_equal_full_rounds_at_every_cancel_point() {
    let (model, tokenizer, ids) = {
        let e = engine();
        let ids = e
            .encode(&Prompt::Chat(vec![ChatMessage::user(GROUNDED[0])]))
            .unwrap();
        (e.model.clone(), e.tokenizer.clone(), ids)
    };
    // Every cancel point with the n-gram drafter; a few with a model
    // drafter (its own caches roll back too).
    for (drafter, every) in [("ngram", 1), ("self:8", 5)] {
        // A whole run first: how many sink calls it makes, and a stop
        // string it reaches.
        let mut ta = LlamaTarget::new(model.clone());
        let (whole, calls) = run(&mut ta, &ids, drafter, false, vec![], None);
        assert!(whole.stats.drafted > 0, "{drafter}: nothing was drafted");
        let word = tokenizer.decode(&whole.emitted[6..8]).trim().to_string();
        let mut cases: Vec<(Vec<String>, Option<usize>)> = vec![(vec![], None), (vec![word], None)];
        cases.extend((1..=calls).step_by(every).map(|n| (vec![], Some(n))));
        for (stop, cancel) in cases {
            let case = format!("{drafter}, stop {stop:?}, cancel at call {cancel:?}");
            let mut ta = LlamaTarget::new(model.clone());
            let (full, _) = run(&mut ta, &ids, drafter, false, stop.clone(), cancel);
            let mut tb = LlamaTarget::new(model.clone());
            let (light, _) = run(&mut tb, &ids, drafter, true, stop.clone(), cancel);
            assert_same(&full, &light, &case);
            assert_same_caches(&mut ta, &mut tb, &full, &case);
        }
    }
}

/// The target's argmax-only verify answers what the host's argmax of the
/// full rows does, row by row, and leaves the caches as the full verify.
#[test]
fn argmax_verify_rows_equal_the_host_argmax_of_the_full_rows() {
    let (model, ids) = {
        let e = engine();
        let ids = e
            .encode(&Prompt::Chat(vec![ChatMessage::user(GROUNDED[1])]))
            .unwrap();
        (e.model.clone(), ids)
    };
    let (head, rows) = ids.split_at(ids.len() - 7);
    let mut ta = LlamaTarget::new(model.clone());
    let mut tb = LlamaTarget::new(model.clone());
    ta.prefill(head, None).unwrap();
    tb.prefill(head, None).unwrap();
    let VerifyRows::Logits(full) = ta.verify(rows, VerifyMode::Rows, None).unwrap().rows else {
        panic!("full rows asked");
    };
    let VerifyRows::Argmax(light) = tb.verify(rows, VerifyMode::Argmax, None).unwrap().rows else {
        panic!("argmax rows asked");
    };
    assert_eq!(full.len(), rows.len());
    assert_eq!(light.len(), rows.len());
    for (i, (f, l)) in full.iter().zip(&light).enumerate() {
        let want = specd::sampling::argmax_margin(f);
        assert_eq!(
            (want.0, want.1.to_bits()),
            (l.argmax, l.margin.to_bits()),
            "row {i}"
        );
    }
    assert_eq!(ta.offset(), tb.offset());
    let n = ids.len();
    let a = ta.forward(&ids[n - 1..], false).unwrap();
    let b = tb.forward(&ids[n - 1..], false).unwrap();
    assert_eq!(a, b);
}
