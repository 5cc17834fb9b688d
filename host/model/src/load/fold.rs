//! What the loader folds into a model beyond its tensors: the rope
//! frequency factors a GGUF carries as tensors (Llama 3's
//! `rope_freqs.weight`, Phi's longrope lists), and the scales a config
//! states that the forward never reads because the weights carry them
//! (Granite's multipliers, a longrope or yarn attention factor).
use super::{Names, Tensors};
use crate::LlamaConfig;
use anyhow::{Context, Result};
use std::collections::HashMap;

/// The tensor of a GGUF's rope frequency factors (llama.cpp's converter
/// writes Llama 3's scaling there); every rank's layers rotate by it.
pub(super) const ROPE_FREQS: &str = "rope_freqs.weight";

/// The GGUF's `rope_freqs.weight` as the factors llama.cpp divides the
/// rope frequencies by, if it has one.
pub fn rope_freqs(t: &Tensors, config: &LlamaConfig) -> Result<Option<Vec<f32>>> {
    if t.get(ROPE_FREQS).is_none() {
        return Ok(None);
    }
    let f = t.vector(ROPE_FREQS)?.to_vec_f32()?;
    crate::llama::rope::check_factors(ROPE_FREQS, &f, config.rotary_dims())?;
    Ok(Some(f))
}

/// A Phi-3.5/Phi-4-mini GGUF's longrope factors (`rope_factors_short` and
/// `_long`, as llama.cpp's converter writes them): the list llama.cpp's rule
/// picks for the context specd serves ([`crate::llama::rope::longrope_pick`]),
/// against `rope.scaling.original_context_length`.
pub(super) fn longrope_factors(
    t: &Tensors,
    config: &LlamaConfig,
    meta: &HashMap<String, String>,
) -> Result<Option<Vec<f32>>> {
    let (short, long) = ("rope_factors_short.weight", "rope_factors_long.weight");
    if t.get(short).is_none() && t.get(long).is_none() {
        return Ok(None);
    }
    let arch = meta
        .get("general.architecture")
        .map_or("llama", String::as_str);
    let key = format!("{arch}.rope.scaling.original_context_length");
    let original: usize = meta
        .get(&key)
        .with_context(|| format!("the GGUF carries {long} but no {key}"))?
        .parse()
        .with_context(|| format!("GGUF metadata {key} is not an integer"))?;
    let read = |name: &str| -> Result<Vec<f32>> {
        let f = t.vector(name)?.to_vec_f32()?;
        crate::llama::rope::check_factors(name, &f, config.rotary_dims())?;
        Ok(f)
    };
    Ok(Some(crate::llama::rope::longrope_pick(
        config.max_position_embeddings,
        original,
        read(short)?,
        read(long)?,
    )))
}

/// Folds Granite's residual, attention and logits scales into the weights
/// ([`crate::config::GraniteScales`]): every row of the o and down
/// projections times the residual multiplier, of q times the attention
/// multiplier x sqrt(head_dim) (the forward scales by 1 / sqrt(head_dim)),
/// the final norm divided by the logits scaling.
pub(super) fn fold_granite(t: &mut Tensors, config: &LlamaConfig, names: &Names) -> Result<()> {
    let Some(g) = config.granite else {
        return Ok(());
    };
    let q_scale = g.attention * (config.head_dim as f32).sqrt();
    for i in 0..config.num_hidden_layers {
        let n = |part: &str| format!("{}{i}.{part}", names.layer_prefix);
        for (base, by) in [
            (n(names.q), q_scale),
            (n(names.o), g.residual),
            (n(names.down), g.residual),
        ] {
            t.scale_linear(&base, by)?;
        }
        t.f32_scales_like_q(&n(names.q), &[n(names.k), n(names.v)])?;
    }
    let norm = format!("{}.weight", names.norm);
    if t.map.contains_key(&norm) {
        let rows = vec![1.0 / g.logits; config.hidden_size];
        t.scale_rows(&norm, &rows)?;
    }
    Ok(())
}

/// Folds a longrope or yarn attention factor `m` (it multiplies the
/// rotated values of q and k) into the model: the rotated rows of each
/// layer's q projection (weights, quantized scales and biases, bias) times
/// m^2, or, where a q norm comes between (Qwen3), its rotated values. The
/// attention products are then those of the scaled q and k; the forward
/// and its kernels need not know.
pub(super) fn fold_attn_factor(t: &mut Tensors, config: &LlamaConfig, names: &Names) -> Result<()> {
    let Some(m) = config.rope_attn_factor else {
        return Ok(());
    };
    let (hd, rot) = (config.head_dim, config.rotary_dims());
    let m2 = m * m;
    // One value per row of a head: m^2 on the rotated ones.
    let head: Vec<f32> = (0..hd).map(|i| if i < rot { m2 } else { 1.0 }).collect();
    for i in 0..config.num_hidden_layers {
        let n = |part: &str| format!("{}{i}.{part}", names.layer_prefix);
        if config.qk_norm {
            let name = format!("{}.weight", n(names.q_norm));
            if t.map.contains_key(&name) {
                t.scale_rows(&name, &head)?;
            }
            continue;
        }
        let q = n(names.q);
        let rows: Vec<f32> = (0..config.num_attention_heads)
            .flat_map(|_| head.iter().copied())
            .collect();
        for suffix in ["weight", "scales", "biases", "bias"] {
            let name = format!("{q}.{suffix}");
            // A quantized weight's words stay; its scales and biases scale.
            if suffix == "weight" && t.map.contains_key(&format!("{q}.scales")) {
                continue;
            }
            if t.map.contains_key(&name) {
                t.scale_rows(&name, &rows)?;
            }
        }
        t.f32_scales_like_q(&q, &[n(names.k), n(names.v)])?;
    }
    Ok(())
}
