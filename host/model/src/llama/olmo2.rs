//! OLMo 2's layer, in the shape of mlx-lm's `olmo2.py` and llama.cpp's
//! `LLM_ARCH_OLMO2`:
//!
//! - attention: q/k/v straight from the residual stream (no input norm),
//!   q and k through RMS norms over the whole projection (`[heads *
//!   head_dim]` weights, not one head's), rope (rotate-half) on every
//!   layer; the output through the layer's `attn_norm` (HF
//!   `post_attention_layernorm`) before the residual;
//! - MLP: SwiGLU straight from the stream, its output through `ffn_norm`
//!   (`post_feedforward_layernorm`) before the residual.
//!
//! An OLMo 2 layer is a llama-family [`Layer`] of kind
//! [`super::LayerKind::Olmo2`]; its norms run after what they name, so the
//! fused norm + matmul ops (and the fused q/k/v + rope op) never run here.
use super::{halves, AttnOp, Layer, Llama, Probe, SeqSpan};
use specd_mlx::{ops, Array, Result};

/// Layer `i` over the rows of one or more sequences (continuous batching),
/// as [`super::gemma3::layer`]: matmuls and norms over every row at once,
/// rope, cache update and attention per sequence at its own positions
/// ([`Llama::attend_each`]).
pub(crate) fn layer(
    m: &Llama,
    i: usize,
    l: &Layer,
    x: &Array,
    seqs: &mut [SeqSpan<'_>],
    probe: &mut Probe<'_>,
) -> Result<Array> {
    // No input norm; q/k norms over the whole projection
    // ([`super::QkNorm::Whole`]).
    let (q, k, v) = m.qkv_rows(l, x, None, probe)?;
    let rope = Some(m.config.rope_theta);
    let o = m.attend_each(i, (&q, &k, &v), seqs, rope, AttnOp::Plain, probe)?;
    let o = l.o.forward(&o)?;
    let x = ops::add(x, &m.rms_norm(&o, &l.attn_norm)?)?;
    probe("o matmul + post-norm + residual", &[&x])?;

    let (g, u) = match &l.gate_up {
        Some(f) => halves(&f.forward(&x)?)?,
        None => (l.gate.forward(&x)?, l.up.forward(&x)?),
    };
    let d = l.down.forward(&m.swiglu(&g, &u)?)?;
    let x = ops::add(&x, &m.rms_norm(&d, &l.ffn_norm)?)?;
    probe("MLP + post-norm + residual", &[&x])?;
    Ok(x)
}
