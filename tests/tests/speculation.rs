//! Speculation on the real default model: greedy losslessness for every
//! drafter and schedule, rotating-cache rollback, the prefix cache.
use specd::engine::{Engine, Prompt};
use specd::model::Logits;
use specd::options::{DrafterSpec, SpecOptions};
use specd::sampling::SamplingParams;
use specd::sequence::Finished;
use specd::speculation::{LlamaTarget, Target};
use specd_tests::{engine, GROUNDED, OPEN};
use specd_text::ChatMessage;
use std::sync::Arc;

fn chat(text: &str) -> Prompt {
    Prompt::Chat(vec![ChatMessage::user(text)])
}

fn run(prompt: &str, opts: &SpecOptions, max_tokens: usize) -> Finished {
    run_on(&engine(), prompt, opts, max_tokens)
}

fn run_on(e: &Engine, prompt: &str, opts: &SpecOptions, max_tokens: usize) -> Finished {
    let ids = e.encode(&chat(prompt)).unwrap();
    let params = SamplingParams::default();
    let spec = e.speculation(opts, &params).unwrap();
    let settings = e.settings(params, Some(max_tokens), vec![]);
    e.generate(None, &ids, &settings, spec, &mut |_| true)
        .unwrap()
}

/// No speculation: plain decoding.
fn plain_opts() -> SpecOptions {
    SpecOptions {
        drafter: Some(DrafterSpec::None),
        ..Default::default()
    }
}

fn opts(drafter: &str, schedule: &str) -> SpecOptions {
    SpecOptions {
        drafter: Some(drafter.parse().unwrap()),
        schedule: Some(schedule.into()),
        acceptance: Some("greedy".into()),
        draft_max: Some(6),
        ..Default::default()
    }
}

/// Whether the default model runs on the batch-invariant fast path (its
/// default): then identical means identical.
fn fast_path() -> bool {
    engine().model.batch_invariant()
}

/// The identical-output rule (docs/architecture.md): identical, or (off the batch-invariant fast path) the
/// first difference sits where the top-2 logit margin is under 0.01 in
/// either run.
fn same_or_near_tie(plain: &Finished, spec: &Finished) -> Result<bool, String> {
    static EXACT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let exact = *EXACT.get_or_init(fast_path);
    let n = plain.emitted.len().min(spec.emitted.len());
    match (0..n).find(|&i| plain.emitted[i] != spec.emitted[i]) {
        None if plain.emitted.len() == spec.emitted.len() => Ok(false),
        None => Err(format!(
            "lengths differ: {} vs {}",
            plain.emitted.len(),
            spec.emitted.len()
        )),
        Some(i) => {
            let m = plain.margins[i].min(spec.margins[i]);
            if exact {
                Err(format!(
                    "first difference at token {i} (top-2 margin {m}) on the batch-invariant path"
                ))
            } else if m < 0.01 {
                Ok(true)
            } else {
                Err(format!(
                    "first difference at token {i} with top-2 margin {m}"
                ))
            }
        }
    }
}

#[test]
fn default_model_runs_batch_invariant() {
    let e = engine();
    assert!(
        e.model.batch_invariant(),
        "the default model should load on the quantized, batch-invariant path"
    );
    // A 7-token forward gives, row for row, the bits of 7 one-token forwards.
    let ids = e
        .encode(&chat("Name three colors of the rainbow."))
        .unwrap();
    let (body, tail) = ids.split_at(ids.len() - 7);
    let m = &e.model;
    let vocab = m.config.vocab_size;
    let mut caches = m.new_caches();
    specd_tests::forward(m, body, &mut caches, Logits::Last)
        .eval()
        .unwrap();
    let batched = specd_tests::forward(m, tail, &mut caches, Logits::All)
        .to_vec_f32()
        .unwrap();
    for c in caches.iter_mut() {
        assert!(c.rewind(body.len()));
    }
    for (i, t) in tail.iter().enumerate() {
        let one = specd_tests::forward(m, &[*t], &mut caches, Logits::Last)
            .to_vec_f32()
            .unwrap();
        let row = &batched[i * vocab..(i + 1) * vocab];
        let same = row
            .iter()
            .zip(&one)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "row {i} of a 7-token verify differs from its one-token step"
        );
    }
}

#[test]
fn greedy_speculation_is_lossless_for_every_drafter_and_schedule() {
    let layers = engine().model.layers.len();
    let drafters = [
        format!("self:{layers}"),
        "self:4".to_string(),
        "ngram".to_string(),
    ];
    let mut near_ties = 0;
    let mut compared = 0;
    let mut accepted = 0;
    for prompt in GROUNDED.iter().chain(OPEN.iter()) {
        let plain = run(prompt, &plain_opts(), 64);
        assert!(plain.emitted.len() > 4, "{prompt}");
        for d in &drafters {
            for s in ["constant", "heuristic"] {
                let spec = run(prompt, &opts(d, s), 64);
                accepted += spec.stats.accepted;
                compared += 1;
                match same_or_near_tie(&plain, &spec) {
                    Ok(tie) => near_ties += tie as usize,
                    Err(e) => panic!("{d} / {s} on {prompt:?}: {e}"),
                }
                assert!(spec.stats.policy_failure.is_none());
            }
        }
    }
    assert!(accepted > 0, "speculation accepted nothing at all");
    println!("greedy losslessness: {compared} comparisons, {near_ties} ended at a near-tie");
}

/// Greedy `ngram` and `self:4` speculation on `e` give plain decoding's
/// tokens on two grounded prompts, and accept something.
fn greedy_speculation_is_plain(e: &Engine) {
    let mut accepted = 0;
    for prompt in GROUNDED.iter().take(2) {
        let plain = run_on(e, prompt, &plain_opts(), 48);
        assert!(plain.emitted.len() > 4, "{prompt}");
        for d in ["ngram", "self:4"] {
            let spec = run_on(e, prompt, &opts(d, "constant"), 48);
            assert_eq!(plain.emitted, spec.emitted, "{d} on {prompt:?}");
            assert!(spec.stats.policy_failure.is_none());
            accepted += spec.stats.accepted;
        }
    }
    assert!(accepted > 0, "speculation accepted nothing at all");
}

#[test]
fn int8_activations_keep_greedy_speculation_lossless() {
    // `--weights int8` changes the numbers (logits move by about 1%), not
    // the invariance: a verify row is bitwise the plain step's row, so
    // greedy speculation still equals plain decoding exactly.
    let e = specd_tests::int8_engine();
    assert!(e.model.batch_invariant());
    greedy_speculation_is_plain(&e);
}

#[test]
fn f16_kv_caches_keep_greedy_speculation_lossless() {
    // 16-bit caches round the keys and values, not the invariance: every
    // path reads the same cache, so greedy speculation still equals plain
    // decoding exactly, and a token's KV takes half the bytes.
    let e = specd_tests::f16_kv_engine();
    assert!(e.model.flags.kv_half);
    assert_eq!(
        e.model.kv_bytes_per_token() * 2,
        e.model.config.kv_bytes_per_token(4)
    );
    let mut t = LlamaTarget::new(e.model.clone());
    t.prefill(&e.encode(&chat("Hello")).unwrap(), None).unwrap();
    let held = t.caches[0].state();
    assert!(!held.is_empty() && held.iter().all(|a| a.dtype() == specd_mlx::Dtype::Float16));
    greedy_speculation_is_plain(&e);
}

/// A target with a sliding window of 16, sharing the default model's weights.
fn rotating_target() -> LlamaTarget {
    let e = engine();
    let mut m = (*e.model).clone();
    m.config.sliding_window = Some(16);
    LlamaTarget::new(Arc::new(m))
}

#[test]
fn rotating_cache_rollback_after_a_wrap_equals_recomputing() {
    let e = engine();
    let prompt = e
        .encode(&chat(
            "Count from one to twenty: one two three four five six seven",
        ))
        .unwrap();
    drop(e);
    let (x, drafts, y) = (
        prompt[prompt.len() - 1],
        [264u32, 1345, 2177, 3045, 411],
        5012u32,
    );
    let body = &prompt[..prompt.len() - 1];
    let keep = 2; // drafts kept

    // A speculative round that wraps the window, then a rollback.
    let mut a = rotating_target();
    a.prefill(body, None).unwrap();
    let before = a.offset();
    let offsets: Vec<usize> = (1..=drafts.len() + 1).map(|i| before + i).collect();
    a.prepare_snapshots(&offsets);
    let mut input = vec![x];
    input.extend_from_slice(&drafts);
    a.forward(&input, true).unwrap();
    // The window wrapped: rolling back in place is impossible, only a snapshot can.
    assert!(
        !a.caches[0].boxed_clone().rewind(before + 1 + keep),
        "the window wrapped"
    );
    a.rewind(before + 1 + keep).unwrap();
    assert_eq!(
        a.snapshot_counts(),
        (0, 0),
        "snapshots are closed after the rollback"
    );
    let la = a.forward(&[y], false).unwrap().pop().unwrap();

    // Recompute from scratch with only the kept tokens.
    let mut b = rotating_target();
    b.prefill(body, None).unwrap();
    let mut kept = vec![x];
    kept.extend_from_slice(&drafts[..keep]);
    b.forward(&kept, true).unwrap();
    let lb = b.forward(&[y], false).unwrap().pop().unwrap();
    let diff = la
        .iter()
        .zip(&lb)
        .map(|(p, q)| (p - q).abs())
        .fold(0.0f32, f32::max);
    assert!(diff < 1e-3, "max logit difference {diff}");
    assert_eq!(a.offset(), b.offset());
    let _ = Logits::All;
}

#[test]
fn prefix_cache_prefills_only_new_tokens_and_changes_nothing() {
    let e = engine();
    let long = GROUNDED.join(" ").repeat(3);
    let first = e
        .encode(&Prompt::Chat(vec![ChatMessage::user(format!(
            "{long}\nSummarize the above."
        ))]))
        .unwrap();
    let second = e
        .encode(&Prompt::Chat(vec![ChatMessage::user(format!(
            "{long}\nWhat is the first sentence?"
        ))]))
        .unwrap();
    let shared = first
        .iter()
        .zip(&second)
        .take_while(|(a, b)| a == b)
        .count();
    assert!(shared > 200, "prompts share a long prefix ({shared})");
    let params = SamplingParams::default();
    let settings = e.settings(params.clone(), Some(24), vec![]);
    let none = plain_opts();
    e.generate(
        Some(""),
        &first,
        &settings,
        e.speculation(&none, &params).unwrap(),
        &mut |_| true,
    )
    .unwrap();
    let cached = e
        .generate(
            Some(""),
            &second,
            &settings,
            e.speculation(&none, &params).unwrap(),
            &mut |_| true,
        )
        .unwrap();
    assert_eq!(
        cached.stats.cached_tokens, shared,
        "reused exactly the shared prefix"
    );
    let fresh = e
        .generate(
            None,
            &second,
            &settings,
            e.speculation(&none, &params).unwrap(),
            &mut |_| true,
        )
        .unwrap();
    assert_eq!(fresh.stats.cached_tokens, 0);
    assert_eq!(
        cached.emitted, fresh.emitted,
        "the prefix cache changed the output"
    );
    assert!(cached.stats.prompt_seconds < fresh.stats.prompt_seconds);
}

#[test]
fn greedy_acceptance_with_every_schedule_matches_plain_decoding() {
    let schedules: Vec<String> = {
        let e = engine();
        e.policies
            .list()
            .into_iter()
            .filter(|p| p.builtin && p.exports.schedule)
            .map(|p| p.name)
            .collect()
    };
    assert!(schedules.len() >= 5, "built-in schedules: {schedules:?}");
    for prompt in GROUNDED.iter().take(3).chain(OPEN.iter().take(2)) {
        let plain = run(prompt, &plain_opts(), 48);
        for s in &schedules {
            let spec = run(prompt, &opts("ngram", s), 48);
            if let Err(e) = same_or_near_tie(&plain, &spec) {
                panic!("schedule {s} on {prompt:?}: {e}");
            }
            assert!(
                spec.stats.policy_failure.is_none(),
                "{s}: {:?}",
                spec.stats.policy_failure
            );
            assert_eq!(spec.stats.schedule, *s);
        }
    }
}

/// Plain greedy decoding straight on a model: tokens and top-2 margins.
fn greedy_tokens(m: &specd::model::Llama, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<f32>) {
    let mut caches = m.new_caches();
    let mut logits = specd_tests::forward(m, prompt, &mut caches, Logits::Last);
    let (mut toks, mut margins) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let l = logits.to_vec_f32().unwrap();
        let (mut best, mut b1, mut b2) = (0usize, f32::MIN, f32::MIN);
        for (i, &v) in l.iter().enumerate() {
            if v > b1 {
                (b2, b1, best) = (b1, v, i);
            } else if v > b2 {
                b2 = v;
            }
        }
        toks.push(best as u32);
        margins.push(b1 - b2);
        logits = specd_tests::forward(m, &[best as u32], &mut caches, Logits::Last);
    }
    (toks, margins)
}

#[test]
fn quantized_kernels_decode_like_the_f32_reference() {
    // The same weights dequantized to float32 and run on MLX's own ops: the
    // quantized path must pick the same greedy tokens (different float
    // rounding, so the near-tie rule of docs/architecture.md applies).
    let reference = specd::model::load_model_with(
        &specd_tests::default_model_path(),
        specd::model::WeightMode::F32,
    )
    .unwrap()
    .0;
    assert!(!reference.batch_invariant());
    let e = engine();
    let mut ties = 0;
    for prompt in GROUNDED.iter().take(2).chain(OPEN.iter().take(2)) {
        let ids = e.encode(&chat(prompt)).unwrap();
        let (a, ma) = greedy_tokens(&e.model, &ids, 32);
        let (b, mb) = greedy_tokens(&reference, &ids, 32);
        if let Some(i) = (0..a.len()).find(|&i| a[i] != b[i]) {
            let m = ma[i].min(mb[i]);
            assert!(
                m < 0.01,
                "{prompt:?}: first difference at {i}, top-2 margin {m}"
            );
            ties += 1;
        }
    }
    println!("quantized vs f32 reference: {ties} of 4 prompts ended at a near-tie");
}

/// One plain greedy request on a target we keep, with the round-by-round
/// loop (`record`) or the pipelined one.
fn plain_run(
    target: &mut LlamaTarget,
    prompt: &[u32],
    max_tokens: usize,
    stop: Vec<String>,
    record: bool,
    cancel_after: Option<usize>,
) -> Finished {
    let e = engine();
    let mut settings = e.settings(SamplingParams::default(), Some(max_tokens), stop);
    settings.record = record;
    let mut pieces = 0usize;
    let mut sink = |s: &str| {
        pieces += usize::from(!s.is_empty());
        cancel_after.is_none_or(|n| pieces < n)
    };
    specd::sequence::generate(target, &e.tokenizer, prompt, 0, &settings, None, &mut sink).unwrap()
}

#[test]
fn pipelined_greedy_decoding_matches_round_by_round_and_leaves_the_caches_right() {
    assert!(SamplingParams::default().plain_greedy());
    let (model, tokenizer, ids) = {
        let e = engine();
        let ids = e.encode(&chat(GROUNDED[0])).unwrap();
        (e.model.clone(), e.tokenizer.clone(), ids)
    };
    // A stop string the output is known to reach, taken from a first run.
    let mut t = LlamaTarget::new(model.clone());
    let probe = plain_run(&mut t, &ids, 24, vec![], true, None);
    let word = tokenizer.decode(&probe.emitted[12..14]);
    let cases: [(usize, Vec<String>, Option<usize>); 3] = [
        (24, vec![], None),                        // the budget ends it
        (64, vec![word.trim().to_string()], None), // a stop string
        (64, vec![], Some(5)),                     // the client goes away
    ];
    for (max, stop, cancel) in cases {
        let mut ta = LlamaTarget::new(model.clone());
        let rounds = plain_run(&mut ta, &ids, max, stop.clone(), true, cancel);
        let mut tb = LlamaTarget::new(model.clone());
        let piped = plain_run(&mut tb, &ids, max, stop.clone(), false, cancel);
        let case = format!("max {max}, stop {stop:?}, cancel {cancel:?}");
        assert_eq!(rounds.emitted, piped.emitted, "{case}");
        assert_eq!(rounds.log, piped.log, "{case}");
        assert_eq!(rounds.margins, piped.margins, "{case}");
        assert_eq!(rounds.stats.done_reason, piped.stats.done_reason, "{case}");
        assert_eq!(rounds.stats.rounds, piped.stats.rounds, "{case}");
        // The forward queued ahead is rolled back: the caches hold all but
        // the last committed token, and continuing from them gives the
        // logits a fresh prefill of the same tokens gives.
        let n = piped.log.len();
        assert_eq!(tb.offset(), n - 1, "{case}");
        let next = tb.forward(&piped.log[n - 1..], false).unwrap();
        let mut fresh = LlamaTarget::new(model.clone());
        fresh.prefill(&piped.log[..n - 1], None).unwrap();
        let want = fresh.forward(&piped.log[n - 1..], false).unwrap();
        assert!(
            next[0]
                .iter()
                .zip(&want[0])
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{case}: continuing from the pipelined caches differs from a fresh prefill"
        );
    }
}

#[test]
fn a_policy_printing_1_mib_speculates_losslessly_and_the_stats_count_the_dropped_output() {
    // wasi-demo-c prints `{"print": N}` bytes in `create` and answers k = 1.
    let chatty = std::path::Path::new(specd_policy::BUILT_COMPONENTS_DIR).join("wasi-demo-c.wasm");
    let bytes = std::fs::read(&chatty).unwrap_or_else(|e| panic!("{}: {e}", chatty.display()));
    engine().policies.add("chatty-c", &bytes).unwrap();
    let prompt = GROUNDED[0];
    let plain = run(prompt, &plain_opts(), 32);
    let spec = run(
        prompt,
        &SpecOptions {
            schedule_config: Some(serde_json::json!({ "print": 1 << 20 })),
            ..opts("ngram", "chatty-c")
        },
        32,
    );
    assert_eq!(spec.stats.policy_failure, None);
    assert!(
        spec.stats.drafted > 0,
        "chatty-c answers k = 3: drafts were verified"
    );
    if let Err(e) = same_or_near_tie(&plain, &spec) {
        panic!("chatty-c: {e}");
    }
    // 1 MiB from create, a line per round; 16 KiB kept for the log.
    let dropped = spec.stats.policy_output_dropped;
    assert!(
        ((1 << 20) - (16 << 10)..(1 << 20) + 4096).contains(&dropped),
        "dropped {dropped}"
    );
    // The HTTP `speculation` object and --stats-json are this struct, serialized.
    let json = serde_json::to_value(&spec.stats).unwrap();
    assert_eq!(json["policy_output_dropped"], serde_json::json!(dropped));
    assert_eq!(plain.stats.policy_output_dropped, 0);
}
