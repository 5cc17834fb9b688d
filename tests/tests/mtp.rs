//! The MTP drafter's plumbing on the real default model, with a head of
//! random weights written here (a trained one is `tests/py/test_drafter.py`'s):
//! a forward returns exactly its last-layer rows (kept, rolled back with
//! the caches, as a request keeps them), whether the rows came from a lone
//! forward or a batched step; and a request drafting with the head gets its solo tokens (plain
//! decoding's under greedy) alone and in a batch.
use specd::engine::Prompt;
use specd::model::mtp::MtpHead;
use specd::model::ranks::Pipeline;
use specd::model::Outputs;
use specd::options::SpecOptions;
use specd::sampling::SamplingParams;
use specd::scheduler::{Admitted, BatchLimits, Scheduler};
use specd::sequence::Finished;
use specd::speculation::target::{forward_batch_verify, StepRows};
use specd::speculation::{HiddenRows, LlamaTarget, Target, Verified, VerifyMode};
use specd_mlx::{io, Array};
use specd_tests::{bits, engine};
use specd_text::ChatMessage;
use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;

fn chat(text: &str) -> Prompt {
    Prompt::Chat(vec![ChatMessage::user(text)])
}

/// A head of small random weights for the default model, in `dir`.
fn random_head(dir: &Path, vocab: usize, draft_vocab: usize) -> PathBuf {
    let ids: Vec<i32> = (0..draft_vocab as i32)
        .map(|i| i * (vocab / draft_vocab) as i32)
        .collect();
    random_head_over(dir, vocab, &ids, 1.0)
}

/// [`random_head`] with the draft vocabulary `ids` and its final norm's
/// weights all `norm` (0: every draft distribution uniform over `ids`).
fn random_head_over(dir: &Path, vocab: usize, ids: &[i32], norm: f32) -> PathBuf {
    let draft_vocab = ids.len();
    std::fs::create_dir_all(dir).unwrap();
    let (h, nh, nkv, hd, ff) = (576usize, 9usize, 3usize, 64usize, 1536usize);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut rand = |o: usize, i: usize| {
        let v: Vec<f32> = (0..o * i)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.05
            })
            .collect();
        Array::from_f32(&v, &[o as i32, i as i32]).unwrap()
    };
    let ones = |n: usize| Array::from_f32(&vec![1.0; n], &[n as i32]).unwrap();
    let t: Vec<(String, Array)> = vec![
        ("enorm.weight".into(), ones(h)),
        ("hnorm.weight".into(), ones(h)),
        ("eh_proj.weight".into(), rand(h, 2 * h)),
        ("layer.input_layernorm.weight".into(), ones(h)),
        ("layer.self_attn.q_proj.weight".into(), rand(nh * hd, h)),
        ("layer.self_attn.k_proj.weight".into(), rand(nkv * hd, h)),
        ("layer.self_attn.v_proj.weight".into(), rand(nkv * hd, h)),
        ("layer.self_attn.o_proj.weight".into(), rand(h, nh * hd)),
        ("layer.post_attention_layernorm.weight".into(), ones(h)),
        ("layer.mlp.gate_proj.weight".into(), rand(ff, h)),
        ("layer.mlp.up_proj.weight".into(), rand(ff, h)),
        ("layer.mlp.down_proj.weight".into(), rand(h, ff)),
        (
            "norm.weight".into(),
            Array::from_f32(&vec![norm; h], &[h as i32]).unwrap(),
        ),
        (
            "draft_ids".into(),
            Array::from_i32(ids, &[draft_vocab as i32]).unwrap(),
        ),
    ];
    io::save_safetensors(&dir.join("head.safetensors"), &t, &[]).unwrap();
    let cfg = serde_json::json!({
        "format": "specd-mtp", "version": 1, "hidden_size": h, "num_attention_heads": nh,
        "num_key_value_heads": nkv, "head_dim": hd, "intermediate_size": ff,
        "target_vocab_size": vocab, "draft_vocab_size": draft_vocab,
    });
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    dir.to_path_buf()
}

fn temp_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("specd-mtp-{}-{name}", std::process::id()))
}

/// `t` through a prefill of all but the last 8 tokens, a 4-row verify
/// that keeps 2 (its rows rolled back with the caches), then a batched step
/// of 3 rows beside `other` (2 rows after a 3-token prefill, whose rows are
/// dropped). Returns the feature rows each forward returned, as a request
/// keeps them: `t`'s (of `taps`) joined, and `other`'s step's (of
/// `other_taps`).
fn rounds_then_a_batched_step(
    m: &Pipeline,
    ids: &[u32],
    (t, taps): (&mut LlamaTarget, Option<&[usize]>),
    (other, other_taps): (&mut LlamaTarget, Option<&[usize]>),
) -> (Option<HiddenRows>, Option<HiddenRows>) {
    let n = ids.len();
    let prefilled = t.prefill(&ids[..n - 8], taps).unwrap();
    let verified = t
        .verify(&ids[n - 8..n - 4], VerifyMode::Rows, taps)
        .unwrap();
    t.rewind(n - 6).unwrap();
    let kept = verified.hidden.map(|h| h.before(n - 6).unwrap());
    let kept = join(prefilled, kept);
    other.prefill(&ids[..3], other_taps).unwrap();
    let all = Some(specd::model::Logits::All);
    let mut parts = [
        StepRows {
            target: other,
            tokens: &ids[3..5],
            logits: all,
            taps: other_taps,
        },
        StepRows {
            target: t,
            tokens: &ids[n - 6..n - 3],
            logits: all,
            taps,
        },
    ];
    let modes = [VerifyMode::Rows; 2];
    let [o, mine]: [Verified; 2] = (forward_batch_verify(m, &mut parts, &modes).unwrap())
        .try_into()
        .unwrap_or_else(|_| panic!("one result per part"));
    (join(kept, mine.hidden), o.hidden)
}

/// Rows `b` after rows `a`, as a request keeps them.
fn join(a: Option<HiddenRows>, b: Option<HiddenRows>) -> Option<HiddenRows> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.then(b).unwrap()),
        (a, b) => a.or(b),
    }
}

#[test]
fn kept_hidden_rows_are_the_forwards_rows_rolled_back_with_the_caches() {
    let e = engine();
    let ids = e
        .encode(&chat("Name three colors of the rainbow."))
        .unwrap();
    let n = ids.len();
    // Reference: the last layer's rows of the whole prompt in one forward.
    let mut caches = e.model.new_caches();
    let full = specd_tests::hidden(&e.model, &ids, &mut caches, &mut Outputs::none());
    let row = |h: &Array, i: i32| {
        let d = h.dim(2);
        let v = h
            .slice(&[0, i, 0], &[1, i + 1, d])
            .unwrap()
            .to_vec_f32()
            .unwrap();
        bits(&[v])
    };
    let mut t = LlamaTarget::new(e.model.clone());
    let mut other = LlamaTarget::new(e.model.clone());
    let (kept, o) =
        rounds_then_a_batched_step(&e.model, &ids, (&mut t, Some(&[])), (&mut other, None));
    assert!(o.is_none(), "only a forward asked returns rows");
    let kept = kept.expect("rows returned");
    assert_eq!((kept.start, kept.len()), (0, n - 3));
    for i in 0..(n - 3) as i32 {
        assert_eq!(row(&kept.rows, i), row(&full, i), "position {i}");
    }
    // Rows after a roll back start where the caches are.
    t.rewind(n - 5).unwrap();
    let next = t.verify(&ids[n - 5..n - 2], VerifyMode::Rows, Some(&[]));
    let next = next.unwrap().hidden.unwrap();
    assert_eq!((next.start, next.len()), (n - 5, 3));
    assert_eq!(row(&next.rows, 2), row(&full, (n - 3) as i32));
}

#[test]
fn tapped_rows_are_the_forwards_residual_stream_alone_and_batched() {
    // EAGLE-3's features: the rows at layer boundaries, side by side; in a
    // batched step beside a request tapping other boundaries (the step taps
    // their union), and rolled back with the caches, as the last layer's.
    let e = engine();
    let m = &e.model;
    let layers = m.layers.len();
    let taps = [0, 5, layers];
    let ids = e
        .encode(&chat("Name three colors of the rainbow."))
        .unwrap();
    let n = ids.len();
    let mut caches = m.new_caches();
    let mut out = Outputs::tapped(&taps);
    let h = specd_tests::hidden(m, &ids, &mut caches, &mut out);
    let full = out.taps.features().unwrap();
    let d = h.dim(2);
    assert_eq!(full.dim(2), 3 * d);
    let cols = |a: &Array, i: i32, c: i32| {
        let v = a
            .slice(&[0, i, c * d], &[1, i + 1, (c + 1) * d])
            .unwrap()
            .to_vec_f32()
            .unwrap();
        bits(&[v])
    };
    // Both ends are what they say: the embedding, the last layer's output.
    let emb = m
        .embed
        .rows(&Array::from_u32(&ids[..1], &[1]).unwrap())
        .unwrap()
        .reshape(&[1, 1, d])
        .unwrap();
    assert_eq!(cols(&full, 0, 0), cols(&emb, 0, 0));
    for i in [0, (n - 1) as i32] {
        assert_eq!(cols(&full, i, 2), cols(&h, i, 0), "position {i}");
    }
    let mut t = LlamaTarget::new(m.clone());
    let mut other = LlamaTarget::new(m.clone());
    let (kept, o) =
        rounds_then_a_batched_step(m, &ids, (&mut t, Some(&taps)), (&mut other, Some(&[5, 12])));
    let kept = kept.expect("rows returned");
    assert_eq!(
        (kept.start, kept.len(), kept.rows.dim(2)),
        (0, n - 3, 3 * d)
    );
    for i in 0..(n - 3) as i32 {
        for c in 0..3 {
            assert_eq!(
                cols(&kept.rows, i, c),
                cols(&full, i, c),
                "position {i}, tap {c}"
            );
        }
    }
    // The other request got its own boundaries, 5 then 12.
    let o = o.expect("rows returned");
    assert_eq!((o.start, o.len(), o.rows.dim(2)), (3, 2, 2 * d));
    assert_eq!(cols(&o.rows, 0, 0), cols(&full, 3, 1));
}

#[test]
fn a_head_for_another_shape_is_refused() {
    let e = engine();
    let dir = random_head(&temp_dir("shape"), e.model.config.vocab_size, 512);
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    cfg["num_key_value_heads"] = 9.into();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let err = MtpHead::load(&dir, &e.model).err().expect("refused");
    let msg = format!("{err:#}");
    assert!(
        msg.contains("trained for another model") && msg.contains("num_key_value_heads"),
        "{msg}"
    );
}

#[test]
fn drafting_with_a_head_keeps_solo_tokens_alone_and_batched() {
    let mut e = engine();
    let vocab = e.model.config.vocab_size;
    let dir = random_head(&temp_dir("batch"), vocab, 1024);
    e.add_draft_head("rand", &dir).unwrap();
    let e = &*e;
    let opts = |drafter: &str, schedule: &str| SpecOptions {
        drafter: Some(drafter.parse().unwrap()),
        schedule: Some(schedule.into()),
        ..Default::default()
    };
    let greedy = SamplingParams::default();
    let sampled = SamplingParams {
        temperature: 0.8,
        seed: 7,
        ..Default::default()
    };
    let cases = [
        (
            "Write a haiku about the sea.",
            greedy.clone(),
            opts("mtp:rand", "constant"),
        ),
        (
            "List five fruits.",
            sampled.clone(),
            // A schedule that carries nothing across requests: the solo run
            // must not change what the batched one is told.
            opts("mtp:rand", "heuristic-transient"),
        ),
        (
            "Repeat exactly: one two three four five six.",
            greedy.clone(),
            opts("suffix+mtp:rand", "constant"),
        ),
        ("Name a color.", greedy.clone(), opts("ngram", "constant")),
    ];
    let n = 24;
    let prompts: Vec<Vec<u32>> = cases
        .iter()
        .map(|(p, ..)| e.encode(&chat(p)).unwrap())
        .collect();
    let solo = |i: usize, o: &SpecOptions| -> Finished {
        let (_, params, _) = &cases[i];
        let spec = e.speculation(o, params).unwrap();
        let settings = e.settings(params.clone(), Some(n), vec![]);
        e.generate(None, &prompts[i], &settings, spec, &mut |_| true)
            .unwrap()
    };
    let solos: Vec<Finished> = (0..cases.len()).map(|i| solo(i, &cases[i].2)).collect();
    // Greedy with the head is plain decoding, and the head drafted.
    for i in [0, 2] {
        let plain = solo(i, &opts("none", "constant"));
        // What was streamed: a round may commit drafts past the end of
        // generation, which the log keeps and nothing emits.
        assert_eq!(
            solos[i].emitted, plain.emitted,
            "case {i} differs from plain decoding"
        );
    }
    assert!(solos[0].stats.drafted > 0, "the head never drafted");
    let finished: Rc<RefCell<Vec<Option<anyhow::Result<Finished>>>>> =
        Rc::new(RefCell::new((0..cases.len()).map(|_| None).collect()));
    let mut sched = Scheduler::new(e, BatchLimits::default());
    for (i, (_, params, o)) in cases.iter().enumerate() {
        let f = finished.clone();
        sched.admit(Admitted {
            tenant: None,
            prompt: prompts[i].clone(),
            settings: e.settings(params.clone(), Some(n), vec![]),
            spec: e.speculation(o, params).unwrap(),
            sink: Box::new(|_: &str| true),
            done: Box::new(move |r| f.borrow_mut()[i] = Some(r)),
        });
    }
    let (mut widest, mut heads_together) = (0, 0);
    while !sched.is_idle() {
        let r = sched.step(&mut || true);
        widest = widest.max(r.sequences);
        heads_together = heads_together.max(r.head_rounds);
    }
    assert!(widest >= 2, "the requests should have shared steps");
    // The head rounds of a step drafted together (one head forward per
    // draft step), and still each request's solo tokens below: the seeded
    // sampled one draws its drafts from rows computed in a batch.
    assert!(heads_together >= 2, "head rounds never drafted together");
    for (i, r) in finished.borrow_mut().drain(..).enumerate() {
        let fin = r.expect("finished").expect("no failure");
        assert_eq!(
            fin.emitted, solos[i].emitted,
            "case {i} batched differs from its solo run"
        );
    }
}

/// Sampled drafts come from the head's own distribution, the one the
/// rejection acceptance is told: the tokens of many seeds drafted with the
/// head have the distribution of plain sampling, position by position (the
/// chi-square homogeneity test of `batch.rs`, significance 0.001).
#[test]
fn sampling_with_a_head_keeps_the_target_distribution() {
    let mut e = engine();
    let vocab = e.model.config.vocab_size;
    let prompt = e
        .encode(&Prompt::Raw("My favourite animal is the".into()))
        .unwrap();
    let n = 5;
    let runs = |e: &specd::engine::Engine, drafter: &str| -> (Vec<Vec<u32>>, u64, u64) {
        let opts = SpecOptions {
            drafter: Some(drafter.parse().unwrap()),
            schedule: Some("constant".into()),
            schedule_config: Some(serde_json::json!({"k": 3})),
            ..Default::default()
        };
        let (mut drafted, mut accepted) = (0, 0);
        let toks = (0..200u64)
            .map(|seed| {
                let p = SamplingParams {
                    temperature: 1.0,
                    seed,
                    ..Default::default()
                };
                let spec = e.speculation(&opts, &p).unwrap();
                let settings = e.settings(p, Some(n), vec![]);
                let f = e
                    .generate(None, &prompt, &settings, spec, &mut |_| true)
                    .unwrap();
                drafted += f.stats.drafted;
                accepted += f.stats.accepted;
                f.log[prompt.len()..].to_vec()
            })
            .collect();
        (toks, drafted, accepted)
    };
    let (plain, ..) = runs(&e, "none");
    // The head drafts uniformly over the 24 tokens plain sampling drew
    // most, so its drafts are often accepted and often rejected.
    let mut freq: std::collections::HashMap<u32, usize> = Default::default();
    for t in plain.iter().flatten() {
        *freq.entry(*t).or_default() += 1;
    }
    let mut common: Vec<(u32, usize)> = freq.into_iter().collect();
    common.sort_by_key(|&(t, c)| (std::cmp::Reverse(c), t));
    let mut ids: Vec<i32> = common.iter().take(24).map(|&(t, _)| t as i32).collect();
    ids.sort();
    let dir = random_head_over(&temp_dir("dist"), vocab, &ids, 0.0);
    e.add_draft_head("dist", &dir).unwrap();
    let (head, drafted, accepted) = runs(&e, "mtp:dist");
    eprintln!("head: {accepted} of {drafted} drafts accepted");
    assert!(
        accepted * 20 > drafted && accepted < drafted,
        "{accepted} of {drafted}"
    );
    for i in 1..n {
        let at = |r: &[Vec<u32>]| {
            r.iter()
                .filter_map(|t| t.get(i).copied())
                .collect::<Vec<_>>()
        };
        let (stat, df) = specd_tests::chi_square(&at(&plain), &at(&head), 10);
        let crit = specd_tests::chi_square_critical_001(df);
        eprintln!("position {i}: chi-square {stat:.1} (df {df}, critical {crit:.1})");
        assert!(df >= 2, "position {i}: too few categories to test");
        assert!(
            stat < crit,
            "position {i}: drafting with the head changed the distribution"
        );
    }
}
