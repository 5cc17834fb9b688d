//! The engine's A/B switches (`--kv-rows`, `--fused-tail`, `--light-rounds`)
//! on the real default model: given to `Engine::load` (the model and the
//! pipeline read no environment, and nothing sets them after load), they
//! reach the model and the requests' settings, and either way greedy speculation gives the same
//! tokens; the fused layer tail gives the three ops' logits bit for bit,
//! and the q/k/v matmul inside the attention op the two ops' rows.
use specd::cache::LayerCache;
use specd::engine::{Engine, Prompt};
use specd::load::Switches;
use specd::model::{load_model_with, Llama, Logits, Outputs, WeightMode};
use specd::options::{DrafterSpec, SpecOptions};
use specd::sampling::SamplingParams;
use specd_tests::{default_model_path, load_default, OPEN};
use specd_text::ChatMessage;

fn tokens(e: &Engine) -> Vec<u32> {
    let ids = e
        .encode(&Prompt::Chat(vec![ChatMessage::user(OPEN[0])]))
        .unwrap();
    let params = SamplingParams::default();
    let opts = SpecOptions {
        drafter: Some(DrafterSpec::SelfLayers(4)),
        schedule: Some("constant".into()),
        ..Default::default()
    };
    let spec = e.speculation(&opts, &params).unwrap();
    let settings = e.settings(params, Some(12), vec![]);
    e.generate(None, &ids, &settings, spec, &mut |_| true)
        .unwrap()
        .emitted
}

#[test]
fn switches_reach_the_model_and_the_settings_and_keep_the_tokens() {
    let e = load_default(WeightMode::default(), Switches::default());
    assert_eq!(e.switches, Switches::default());
    assert!(
        e.model.flags.kv_rows
            && e.model.flags.fused_tail
            && e.settings(SamplingParams::default(), None, vec![])
                .light_rounds
    );
    let on = tokens(&e);

    let off = Switches {
        kv_rows: false,
        fused_tail: false,
        light_rounds: false,
        kv_f16: false,
    };
    let e = load_default(WeightMode::default(), off);
    assert!(!e.model.flags.kv_rows, "kv_rows reaches the model");
    assert!(!e.model.flags.fused_tail, "fused_tail reaches the model");
    let s = e.settings(SamplingParams::default(), None, vec![]);
    assert!(
        !s.light_rounds,
        "light_rounds reaches the requests' settings"
    );
    assert_eq!(tokens(&e), on, "the other paths give the same tokens");
}

/// The bits of what `forward` gives, on fresh caches, for a 40-token
/// prefill and then a 6-row verify after it.
fn prefill_then_verify(
    m: &Llama,
    forward: impl Fn(&[u32], &mut [Box<dyn LayerCache>]) -> specd_mlx::Array,
) -> Vec<Vec<u32>> {
    let prompt: Vec<u32> = (0..40u32).map(|i| 200 + (i * 131) % 9000).collect();
    let verify = [17u32, 4242, 99, 1000, 31337, 5];
    let mut caches = m.new_caches();
    [&prompt[..], &verify[..]]
        .iter()
        .map(|toks| {
            let out = forward(toks, &mut caches).to_vec_f32().unwrap();
            out.iter().map(|v| v.to_bits()).collect()
        })
        .collect()
}

/// Both quantized weight modes of the default model.
fn quantized_models() -> impl Iterator<Item = (WeightMode, Llama)> {
    [WeightMode::Quantized, WeightMode::Int8]
        .into_iter()
        .map(|mode| {
            (
                mode,
                load_model_with(&default_model_path(), mode).unwrap().0,
            )
        })
}

/// Every row's logits of a prefill and of a verify after it, fused tail or
/// not: bitwise the same, under both quantized weight modes.
#[test]
fn the_fused_layer_tail_gives_the_three_ops_logits_bit_for_bit() {
    for (mode, mut m) in quantized_models() {
        let mut run = |fused: bool| {
            m.flags.fused_tail = fused;
            prefill_then_verify(&m, |toks, caches| {
                specd_tests::forward(&m, toks, caches, Logits::All)
            })
        };
        let (fused, three) = (run(true), run(false));
        assert_eq!(fused.len(), 2);
        assert!(fused[0].len() > 40 * 1000, "every row's logits");
        assert_eq!(
            fused, three,
            "{mode:?}: the fused tail rounds as the three ops"
        );
    }
}

/// The q/k/v matmul taken into the attention op (where nothing else asked
/// for its rows) gives the hidden states of the two ops bit for bit: a
/// probe that evaluates the matmul's rows first, as `specd profile` does,
/// keeps them apart.
#[test]
fn the_qkv_matmul_inside_the_attention_op_gives_the_two_ops_bits() {
    for (mode, m) in quantized_models() {
        let run = |apart: bool| {
            prefill_then_verify(&m, |toks, caches| {
                let mut probe = |name: &'static str, outs: &[&specd_mlx::Array]| {
                    if apart && name.starts_with("norm + q/k/v") {
                        specd_mlx::eval(outs)?;
                    }
                    Ok(())
                };
                let mut out = Outputs::probed(&mut probe);
                specd_tests::hidden(&m, toks, caches, &mut out)
            })
        };
        let (one_op, two_ops) = (run(false), run(true));
        assert_eq!(one_op[0].len(), 40 * 576, "every row's hidden state");
        assert_eq!(one_op, two_ops, "{mode:?}: the fused op rounds as the two");
    }
}
