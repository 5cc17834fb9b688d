//! Every architecture on specd's kernels, each from a random 4-bit
//! checkpoint written here (heads of 64 for the grouped attention kernel;
//! a window of 8 where the family has one: Gemma 2's even layers, Gemma 3's
//! local ones, every Phi-3 layer): row r of a k-row verify is bitwise the
//! 1-row step, before, across and past the window; a batched step gives
//! every sequence bitwise its solo rows.
use specd::model::random::{self, Family, Shape};
use specd::model::ranks::Pipeline;
use specd::model::{Arch, LlamaConfig, Logits, WeightMode};
use specd::speculation::{LlamaTarget, Target};
use specd_tests::{assert_batch_as_solo, bits};
use std::sync::Arc;

const WINDOW: usize = 8;

/// The 4-bit random `family` checkpoint, `config` fields changed, loaded;
/// `check` asserts the loader read it as that architecture.
fn model(family: Family, config: serde_json::Value, check: fn(&LlamaConfig)) -> Arc<Pipeline> {
    let name = family.name();
    let dir = std::env::temp_dir().join(format!("specd-arch-test-{name}-{}", std::process::id()));
    // Qwen2 and Phi-3 have no head size of their own (hidden / heads).
    let hidden = match family {
        Family::Qwen2 | Family::Phi3 => 256,
        _ => 128,
    };
    let shape = Shape {
        name: "arch-test",
        hidden,
        layers: 3,
        heads: 4,
        kv_heads: 2,
        head_dim: 64,
        ffn: 256,
        vocab: 512,
    };
    random::write_model(shape, family, 3, &dir, false).unwrap();
    let cfg_path = dir.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    for (k, v) in config.as_object().unwrap() {
        cfg[k] = v.clone();
    }
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let (m, _) = specd::model::load_model_with(&dir, WeightMode::default()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    check(&m.config);
    assert!(
        m.batch_invariant(),
        "4-bit {name} runs on the batch-invariant kernels"
    );
    Arc::new(Pipeline::alone(m))
}

fn ids(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 3 + (i * 37 + 11) % 500).collect()
}

/// Row r of a k-row verify is bitwise the 1-row step; a batched step gives
/// every sequence its solo rows and caches. Positions reach past WINDOW
/// (rotating caches wrapped where the model has a window).
fn verify_rows_are_steps_and_a_batch_its_solo_rows(m: Arc<Pipeline>) {
    let ids = ids(64);
    let fresh = |cached: usize| {
        let mut t = LlamaTarget::new(m.clone());
        if cached > 0 {
            t.prefill(&ids[..cached], None).unwrap();
        }
        t
    };
    // (tokens cached, rows verified): inside the window, across its edge,
    // past it.
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
            "{:?}: {k} rows after {cached}: the verify differs from the steps",
            m.config.arch
        );
    }

    // A batched step: sequences before, across and past the window.
    let plan = [
        (WINDOW + 20, 5, Some(Logits::All)),
        (4, 1, Some(Logits::Last)),
        (0, 9, None),
        (WINDOW - 3, 6, Some(Logits::All)),
    ];
    assert_batch_as_solo(&m, &ids, &plan, |i| 3 * i);
}

#[test]
fn llama3_verify_rows_are_the_one_row_steps_and_a_batch_its_solo_rows() {
    // Llama 3.2's rope scaling (rope_scaling: llama3): the scaled
    // frequencies go into the batched step at each row's own position.
    let m = model(Family::Llama3, serde_json::json!({}), |c| {
        assert_eq!(c.arch, Arch::Llama);
        assert!(c.rope_freq_factors.is_some(), "llama3 scaling read");
    });
    verify_rows_are_steps_and_a_batch_its_solo_rows(m);
}

#[test]
fn qwen2_verify_rows_are_the_one_row_steps_and_a_batch_its_solo_rows() {
    let m = model(Family::Qwen2, serde_json::json!({}), |c| {
        assert!(c.qkv_bias && !c.qk_norm, "Qwen2's q/k/v biases");
    });
    verify_rows_are_steps_and_a_batch_its_solo_rows(m);
}

#[test]
fn qwen3_verify_rows_are_the_one_row_steps_and_a_batch_its_solo_rows() {
    let m = model(Family::Qwen3, serde_json::json!({}), |c| {
        assert!(c.qk_norm && !c.qkv_bias, "Qwen3's q/k norms");
    });
    verify_rows_are_steps_and_a_batch_its_solo_rows(m);
}

#[test]
fn phi3_verify_rows_are_the_one_row_steps_and_a_batch_its_solo_rows() {
    // A window on every layer (Phi-3 mini's 2047, here 8); the fused
    // tensors split at load.
    let m = model(
        Family::Phi3,
        serde_json::json!({"sliding_window": WINDOW}),
        |c| {
            assert_eq!(c.sliding_window, Some(WINDOW));
            assert!(!c.tie_word_embeddings, "Phi-3's own head");
        },
    );
    verify_rows_are_steps_and_a_batch_its_solo_rows(m);
}

#[test]
fn gemma3_verify_rows_are_the_one_row_steps_and_a_batch_its_solo_rows() {
    // Every 2nd layer global: layers 0 and 2 local (a window of 8), 1 global.
    let m = model(
        Family::Gemma3,
        serde_json::json!({"sliding_window": WINDOW, "sliding_window_pattern": 2}),
        |c| {
            assert_eq!(c.arch, Arch::Gemma3);
            assert_eq!(c.sliding_window, Some(WINDOW));
            assert_eq!(c.sliding_window_pattern, Some(2));
        },
    );
    verify_rows_are_steps_and_a_batch_its_solo_rows(m);
}

#[test]
fn gemma2_verify_rows_are_the_one_row_steps_and_a_batch_its_solo_rows() {
    // A window of 8 on layers 0 and 2, soft-capped scores and logits.
    let m = model(
        Family::Gemma2,
        serde_json::json!({"sliding_window": WINDOW}),
        |c| {
            assert_eq!(c.arch, Arch::Gemma2);
            assert_eq!(c.sliding_window, Some(WINDOW));
            assert!(c.attn_logit_softcapping.is_some() && c.final_logit_softcapping.is_some());
        },
    );
    verify_rows_are_steps_and_a_batch_its_solo_rows(m);
}

#[test]
fn smollm3_verify_rows_are_the_one_row_steps_and_a_batch_its_solo_rows() {
    // The middle layer without rope (the unfused path) between roped ones.
    let m = model(
        Family::SmolLm3,
        serde_json::json!({"no_rope_layers": [1, 0, 1]}),
        |c| assert_eq!(c.no_rope_layers, [1], "SmolLM3's layer without rope"),
    );
    verify_rows_are_steps_and_a_batch_its_solo_rows(m);
}

#[test]
fn olmo2_verify_rows_are_the_one_row_steps_and_a_batch_its_solo_rows() {
    // Its own layer kind: post-norms, q/k norms over the whole projection.
    let m = model(Family::Olmo2, serde_json::json!({}), |c| {
        assert_eq!(c.arch, Arch::Olmo2);
        assert!(c.qk_norm, "OLMo 2's q/k norms");
    });
    verify_rows_are_steps_and_a_batch_its_solo_rows(m);
}
