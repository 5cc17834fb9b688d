//! Gemma 3 270M end to end: speculation past the sliding window stays
//! token-identical to plain decoding, through snapshot restores of the
//! rotating caches after they wrapped; a batched step gives every sequence
//! bitwise its solo rows. (Its own test binary: the restore counter is
//! process-wide.)
use specd::cache::rotating;
use specd::engine::Prompt;
use specd::model::Logits;
use specd::options::{DrafterSpec, SpecOptions};
use specd::sampling::SamplingParams;
use specd::sequence::Finished;
use specd::speculation::target::{forward_batch, StepRows};
use specd::speculation::{LlamaTarget, Target};
use specd_tests::{assert_step_as_solo, gemma_engine, GROUNDED};

/// Prompt tokens: with the output, past the 512-token window by far.
const PROMPT_TOKENS: usize = 560;
const MAX_TOKENS: usize = 64;

fn run(e: &specd::engine::Engine, ids: &[u32], spec: SpecOptions) -> Finished {
    let params = SamplingParams::default();
    let spec = e.speculation(&spec, &params).unwrap();
    let settings = e.settings(params, Some(MAX_TOKENS), vec![]);
    e.generate(None, ids, &settings, spec, &mut |_| true)
        .unwrap()
}

#[test]
fn speculation_past_the_sliding_window_equals_plain_decoding() {
    let e = gemma_engine();
    assert_eq!(e.model.config.sliding_window, Some(512));
    assert!(
        e.model.batch_invariant(),
        "gemma3 runs on the batch-invariant kernels"
    );
    // Completion mode (the base model has no chat template): text that
    // repeats, so n-gram drafts are long and partly rejected.
    let text = GROUNDED.join("\n\n").repeat(8);
    let mut ids = e.encode(&Prompt::Raw(text)).unwrap();
    assert!(ids.len() > PROMPT_TOKENS, "{} prompt tokens", ids.len());
    ids.truncate(PROMPT_TOKENS);

    let plain = run(
        &e,
        &ids,
        SpecOptions {
            drafter: Some(DrafterSpec::None),
            ..Default::default()
        },
    );
    assert!(
        plain.log.len() > 600,
        "prompt + output is {} tokens",
        plain.log.len()
    );
    for drafter in ["ngram", "self:9"] {
        let before = rotating::restores();
        let spec = run(
            &e,
            &ids,
            SpecOptions {
                drafter: Some(drafter.parse().unwrap()),
                schedule: Some("constant".into()),
                schedule_config: Some(serde_json::json!({"k": 4})),
                acceptance: Some("greedy".into()),
                ..Default::default()
            },
        );
        assert_eq!(spec.emitted, plain.emitted, "{drafter}: tokens differ");
        let s = &spec.stats;
        assert!(s.policy_failure.is_none(), "{drafter}: {s:?}");
        let restores = rotating::restores() - before;
        println!(
            "{drafter}: {} rounds, {} drafted, {} accepted, {restores} rotating-cache restores",
            s.rounds, s.drafted, s.accepted
        );
        assert!(
            restores > 0,
            "{drafter}: no rollback went through a snapshot after the window wrapped"
        );
    }
}

/// Gemma's layers in a continuous-batching step: local layers attend
/// through a sliding window over rotating caches, so the step mixes
/// sequences before the window, past it (the cache wrapped), and one whose
/// verify rows cross the window's edge.
#[test]
fn a_batched_step_gives_every_gemma_sequence_its_solo_rows_bitwise() {
    let e = gemma_engine();
    let window = e.model.config.sliding_window.expect("gemma3 has a window");
    let text = GROUNDED.join("\n\n").repeat(8);
    let ids = e.encode(&Prompt::Raw(text)).unwrap();
    assert!(ids.len() > window + 120, "{} prompt tokens", ids.len());
    // (tokens cached before the step, rows in the step, logits), each
    // sequence reading the prompt from its own start.
    let plan = [
        (window + 80, 5, Some(Logits::All)),
        (20, 1, Some(Logits::Last)),
        (0, 9, None),
        (window - 4, 9, Some(Logits::All)),
    ];
    let start = |i: usize| 7 * i;
    let fresh = |i: usize| {
        let mut t = LlamaTarget::new(e.model.clone());
        t.prefill(&ids[start(i)..start(i) + plan[i].0], None)
            .unwrap();
        t
    };
    let rows = |i: usize| {
        let (c, n, _) = plan[i];
        &ids[start(i) + c..start(i) + c + n]
    };
    let next = |i: usize| ids[start(i) + plan[i].0 + plan[i].1];
    let mut solo = Vec::new();
    let mut solo_next = Vec::new();
    for (i, &(_, _, which)) in plan.iter().enumerate() {
        let mut t = fresh(i);
        match which {
            Some(w) => solo.push(t.forward(rows(i), w == Logits::All).unwrap()),
            None => {
                t.prefill(rows(i), None).unwrap();
                solo.push(Vec::new());
            }
        }
        solo_next.push(t.forward(&[next(i)], false).unwrap());
    }
    let mut targets: Vec<LlamaTarget> = (0..plan.len()).map(fresh).collect();
    let mut parts: Vec<StepRows<'_>> = targets
        .iter_mut()
        .enumerate()
        .map(|(i, t)| StepRows {
            target: t,
            tokens: rows(i),
            logits: plan[i].2,
            taps: None,
        })
        .collect();
    let batched = forward_batch(&e.model, &mut parts).unwrap();
    drop(parts);
    for (i, t) in targets.iter_mut().enumerate() {
        let (c, n, _) = plan[i];
        assert_step_as_solo(i, t, c + n, &batched[i], &solo[i], next(i), &solo_next[i]);
    }
}
