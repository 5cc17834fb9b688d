//! Gemma 2 on specd's kernels (a random 4-bit checkpoint, written here:
//! heads of 64 for the grouped attention kernel, a window of 8 on layers 0
//! and 2, soft-capped scores and logits): row r of a k-row verify is
//! bitwise the 1-row step, before, across and past the window; a batched
//! step gives every sequence bitwise its solo rows.
use specd::model::random::{self, Family, Shape};
use specd::model::{Arch, Llama, Logits, WeightMode};
use specd::speculation::target::{forward_batch, StepRows};
use specd::speculation::{LlamaTarget, Target};
use specd_tests::{assert_step_as_solo, bits};
use std::sync::Arc;

const WINDOW: usize = 8;

fn model() -> Arc<Llama> {
    let dir = std::env::temp_dir().join(format!("specd-gemma2-test-{}", std::process::id()));
    let shape = Shape {
        name: "gemma2-test",
        hidden: 128,
        layers: 3,
        heads: 4,
        kv_heads: 2,
        head_dim: 64,
        ffn: 256,
        vocab: 512,
    };
    random::write_model(shape, Family::Gemma2, 3, &dir, false).unwrap();
    let cfg_path = dir.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["sliding_window"] = WINDOW.into();
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let (m, _) = specd::model::load_model_with(&dir, WeightMode::default()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(m.config.arch, Arch::Gemma2);
    assert_eq!(m.config.sliding_window, Some(WINDOW));
    assert!(
        m.config.attn_logit_softcapping.is_some() && m.config.final_logit_softcapping.is_some()
    );
    assert!(
        m.batch_invariant(),
        "4-bit Gemma 2 runs on the batch-invariant kernels"
    );
    Arc::new(m)
}

fn ids(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 3 + (i * 37 + 11) % 500).collect()
}

#[test]
fn gemma2_verify_rows_are_the_one_row_steps_and_a_batch_its_solo_rows() {
    let m = model();
    let ids = ids(64);
    let fresh = |cached: usize| {
        let mut t = LlamaTarget::new(m.clone());
        if cached > 0 {
            t.prefill(&ids[..cached]).unwrap();
        }
        t
    };
    // (tokens cached, rows verified): inside the window, across its edge,
    // past it (the rotating caches wrapped).
    for (cached, k) in [(0, 5), (3, 8), (20, 6)] {
        let verify = fresh(cached)
            .forward(&ids[cached..cached + k], true)
            .unwrap();
        let mut t = fresh(cached);
        let steps: Vec<Vec<f32>> = (0..k)
            .map(|j| {
                t.forward(&ids[cached + j..cached + j + 1], false)
                    .unwrap()
                    .remove(0)
            })
            .collect();
        assert!(
            bits(&verify) == bits(&steps),
            "{k} rows after {cached}: the verify differs from the steps"
        );
    }

    // A batched step: sequences before, across and past the window.
    let plan = [
        (WINDOW + 20, 5, Some(Logits::All)),
        (4, 1, Some(Logits::Last)),
        (0, 9, None),
        (WINDOW - 3, 6, Some(Logits::All)),
    ];
    let start = |i: usize| 3 * i;
    let seq = |i: usize| &ids[start(i)..];
    let fresh = |i: usize| {
        let mut t = LlamaTarget::new(m.clone());
        if plan[i].0 > 0 {
            t.prefill(&seq(i)[..plan[i].0]).unwrap();
        }
        t
    };
    let rows = |i: usize| &seq(i)[plan[i].0..plan[i].0 + plan[i].1];
    let next = |i: usize| seq(i)[plan[i].0 + plan[i].1];
    let (mut solo, mut solo_next) = (Vec::new(), Vec::new());
    for (i, &(_, _, which)) in plan.iter().enumerate() {
        let mut t = fresh(i);
        match which {
            Some(w) => solo.push(t.forward(rows(i), w == Logits::All).unwrap()),
            None => {
                t.prefill(rows(i)).unwrap();
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
        })
        .collect();
    let batched = forward_batch(&m, &mut parts).unwrap();
    drop(parts);
    for (i, t) in targets.iter_mut().enumerate() {
        let (c, n, _) = plan[i];
        assert_step_as_solo(i, t, c + n, &batched[i], &solo[i], next(i), &solo_next[i]);
    }
}
