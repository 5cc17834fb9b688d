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
use super::{halves, Layer, Llama, Probe, SeqSpan};
use specd_mlx::{ops, Array, Result};

/// Layer `i` over the rows of one or more sequences (continuous batching),
/// as [`super::gemma2::layer`]: matmuls and norms over every row at once,
/// rope, cache update and attention per sequence at its own positions.
pub(crate) fn layer(
    m: &Llama,
    i: usize,
    l: &Layer,
    x: &Array,
    seqs: &mut [SeqSpan<'_>],
    probe: &mut Probe<'_>,
) -> Result<Array> {
    let t = x.dim(1);
    let (nh, nkv, hd) = m.head_counts();
    let (nq, nk) = (nh * hd, nkv * hd);
    let cols = |y: &Array, a: i32, n: i32| y.slice(&[0, 0, a], &[1, t, a + n]);
    let (q, k, v) = match &l.qkv {
        Some(f) => {
            let y = f.forward(x)?;
            (cols(&y, 0, nq)?, cols(&y, nq, nk)?, cols(&y, nq + nk, nk)?)
        }
        None => (l.q.forward(x)?, l.k.forward(x)?, l.v.forward(x)?),
    };
    probe("q/k/v matmuls", &[&q, &k, &v])?;
    let (q, k) = match (&l.q_norm, &l.k_norm) {
        (Some(qn), Some(kn)) => (m.rms_norm(&q, qn)?, m.rms_norm(&k, kn)?),
        _ => (q, k),
    };
    let mut outs = Vec::with_capacity(seqs.len());
    for (cache, (a, rows)) in seqs.iter_mut() {
        let (a, rows) = (*a, *rows);
        // One sequence's rows (all of them alone: no slice op).
        let part = |y: &Array| {
            if rows == t {
                Ok(y.clone())
            } else {
                y.slice(&[0, a, 0], &[1, a + rows, y.dim(2)])
            }
        };
        let offset = cache.offset() as i32;
        let qs = m.rope_heads(&part(&q)?, nh, offset)?;
        let ks = m.rope_heads(&part(&k)?, nkv, offset)?;
        let vs = part(&v)?
            .reshape(&[1, rows, nkv, hd])?
            .transpose(&[0, 2, 1, 3])?;
        probe("rope", &[&qs, &ks])?;
        let (kc, vc) = cache.update(&ks, &vs)?;
        outs.push(m.windowed_attention(&qs, &kc, &vc, m.window(i))?);
    }
    let o = if outs.len() == 1 {
        outs.pop().expect("one")
    } else {
        ops::concatenate(&outs.iter().collect::<Vec<_>>(), 1)?
    };
    probe("attention", &[&o])?;
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
