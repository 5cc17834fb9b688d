//! Gemma 3's layer, in the shape of mlx-lm's `gemma3_text.py`:
//!
//! - attention: q/k/v from the input norm; an RMS norm over each head of q
//!   and of k *before* the rope; a rope base per layer kind (local layers
//!   10000, global ones `rope_theta`); the output through a post-attention
//!   norm before the residual;
//! - local layers attend through a sliding window (a rotating cache, and a
//!   window mask on multi-token forwards); every `sliding_window_pattern`-th
//!   layer is global;
//! - MLP: GeGLU, `gelu_tanh(gate) * up`, then down, a post-MLP norm, the
//!   residual;
//! - the embedding scaled by sqrt(hidden) (rounded to bfloat16, as mlx-lm
//!   and Hugging Face do for the bf16 checkpoint).
//!
//! Gemma's RMS norm multiplies by `1 + w`; GGUF files store `1 + w` already
//! (llama.cpp's converter adds the one), so the norms here are plain RMS
//! norms over the file's weights. The matmuls, norms and attention are the
//! llama path's batch-invariant kernels.
//!
//! A Gemma layer is a llama-family [`Layer`] of kind
//! [`super::LayerKind::Gemma3`]: [`Llama::layers`] hands such layers
//! to [`layer`], which borrows the shared parts (q/k/v rows, norms,
//! windowed attention) from [`Llama`].
use super::{halves, AttnOp, Layer, Llama, Probe, SeqSpan};
use specd_mlx::{kernels, ops, Array, Result};

/// Gemma 3's norms on the attention output and on the MLP output, before
/// the residual (GGUF weights: Gemma's `1 + w` already folded in by the
/// converter).
#[derive(Clone)]
pub struct PostNorms {
    pub attn: Array,
    pub ffn: Array,
}

/// `gelu_tanh(g) * u`, with 0.5 x (1 + tanh z) written as x sigmoid(2z).
fn geglu(m: &Llama, g: &Array, u: &Array) -> Result<Array> {
    if m.own_kernels {
        // One op instead of eight: 18 layers of eight dispatches each
        // cost more per step than the arithmetic.
        return kernels::geglu(g, u);
    }
    const C: f32 = 1.595_769; // 2 sqrt(2 / pi)
    let g3 = ops::multiply(&ops::multiply(g, g)?, g)?;
    let inner = ops::add(g, &ops::multiply(&g3, &Array::scalar(0.044715)?)?)?;
    let s = ops::sigmoid(&ops::multiply(&inner, &Array::scalar(C)?)?)?;
    ops::multiply(&ops::multiply(g, &s)?, u)
}

/// Layer `i` of a Gemma 3 model (attention by `op` [`AttnOp::Plain`]) or
/// a Gemma 2 one ([`AttnOp::Capped`], no q/k norms) over the rows `x`
/// `[1, T, hidden]` of one or more sequences (continuous batching),
/// `seqs[s]` being sequence s's cache of this layer and its rows (first,
/// count). The norms (q/k's per head included) and matmuls run over every
/// row at once (the weights stream once per step); the rope, cache update
/// and windowed attention per sequence, at its own positions, as alone
/// ([`Llama::attend_each`]). Every op is row-wise or per sequence, so with
/// batch-invariant weights a sequence's rows are bitwise those of its
/// forward alone; alone is one span over all of `x`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn layer(
    m: &Llama,
    i: usize,
    l: &Layer,
    n: &PostNorms,
    op: AttnOp,
    x: &Array,
    seqs: &mut [SeqSpan<'_>],
    probe: &mut Probe<'_>,
) -> Result<Array> {
    // The norm, the q/k/v matmul and the per-head q/k norms, as llama's.
    let (q, k, v) = m.qkv_rows(l, x, Some(&l.attn_norm), probe)?;
    let rope = Some(m.config.rope_base(i));
    let o = m.attend_each(i, (&q, &k, &v), seqs, rope, op, probe)?;
    let o = l.o.forward(&o)?;
    let x = ops::add(x, &m.rms_norm(&o, &n.attn)?)?;
    probe("o matmul + post-norm + residual", &[&x])?;

    let d = mlp(m, l, &x, probe)?;
    let x = ops::add(&x, &m.rms_norm(&d, &n.ffn)?)?;
    probe("post-norm + residual", &[&x])?;
    Ok(x)
}

/// The MLP without its residual: norm, gate/up matmuls, geglu, down
/// (Gemma 2's too).
pub(super) fn mlp(m: &Llama, l: &Layer, x: &Array, probe: &mut Probe<'_>) -> Result<Array> {
    // The geglu folded into the down matmul where its weights are
    // packed: the same bits, one op a layer fewer (as llama's swiglu).
    if let (Some(f), true) = (&l.gate_up, m.own_kernels) {
        let gu = m.norm_linear(x, &l.ffn_norm, f)?;
        probe("norm + gate/up matmuls", &[&gu])?;
        if let Some(d) = l.down.forward_glu(&gu, None, true) {
            let d = d?;
            probe("geglu + down matmul", &[&d])?;
            return Ok(d);
        }
        let (g, u) = halves(&gu)?;
        return l.down.forward(&geglu(m, &g, &u)?);
    }
    let (g, u) = m.gate_up(l, x)?;
    let gu = geglu(m, &g, &u)?;
    probe("norm + gate/up matmuls + geglu", &[&gu])?;
    let d = l.down.forward(&gu)?;
    probe("down matmul", &[&d])?;
    Ok(d)
}

#[cfg(test)]
mod tests {
    use crate::LlamaConfig;

    #[test]
    fn embedding_scale_is_sqrt_hidden_rounded_to_bfloat16() {
        let mut c: LlamaConfig = serde_json::from_value(serde_json::json!({
            "hidden_size": 640, "num_hidden_layers": 1, "num_attention_heads": 4,
            "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 8,
            "vocab_size": 8, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
            "rope_traditional": false, "max_position_embeddings": 8,
            "tie_word_embeddings": true
        }))
        .unwrap();
        assert_eq!(c.embed_scale(), 25.25);
        c.hidden_size = 1152;
        assert_eq!(c.embed_scale(), 34.0); // sqrt 33.94 in bf16
    }
}
