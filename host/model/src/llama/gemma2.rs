//! Gemma 2's layer, in the shape of transformers' `modeling_gemma2.py`
//! (mlx-lm's gemma2.py, which has no sliding window) and llama.cpp's
//! `LLM_ARCH_GEMMA2`:
//!
//! - attention: q/k/v from the input norm (no q/k norms), rope at
//!   `rope_theta` on every layer, scores scaled by
//!   1 / sqrt(`query_pre_attn_scalar`) and soft-capped,
//!   `s = cap tanh(s / cap)` (`attn_logit_softcapping`), before the mask
//!   and softmax; the output through a post-attention norm before the
//!   residual;
//! - even layers attend through a sliding window (a rotating cache, and the
//!   window per query row on multi-token forwards), odd layers globally;
//! - MLP: Gemma 3's ([`gemma3::mlp`]): GeGLU, then a post-MLP norm, the
//!   residual;
//! - the embedding scaled by sqrt(hidden) in float32
//!   ([`crate::LlamaConfig::embed_scale`]), the logits soft-capped
//!   (`final_logit_softcapping`, [`Llama::cap_logits`]).
//!
//! Norms are Gemma's `1 + w` (folded in at load, as for Gemma 3). On
//! specd's kernels the capped attention is `kernels::attention_capped`;
//! on MLX's ops (float32 files, `--kernels mlx`) it is built from MLX's ops
//! as mlx-lm builds it, MLX's fused attention having no cap.
//!
//! A Gemma 2 layer is a llama-family [`Layer`] of kind
//! [`super::LayerKind::Gemma2`]: the llama forward hands such layers to
//! [`layer`].
use super::gemma3::{self, PostNorms};
use super::{Layer, Llama, Probe, SeqSpan};
use specd_mlx::{fast, kernels, ops, Array, Result};

/// Layer `i` of a Gemma 2 model over the rows of one or more sequences
/// (continuous batching), as [`gemma3::layer`]: `x` `[1, T, hidden]` holds
/// sequence s's rows at `seqs[s].1` (first row, rows), `seqs[s].0` being
/// its cache of this layer. Norms and matmuls run over every row at once;
/// rope, cache update and attention per sequence at its own positions, so
/// with batch-invariant weights a sequence's rows are bitwise those of its
/// forward alone.
pub(crate) fn layer(
    m: &Llama,
    i: usize,
    l: &Layer,
    n: &PostNorms,
    x: &Array,
    seqs: &mut [SeqSpan<'_>],
    probe: &mut Probe<'_>,
) -> Result<Array> {
    let t = x.dim(1);
    let (nh, nkv, hd) = m.head_counts();
    let (q, k, v) = m.qkv_rows(l, x, probe)?;
    let base = m.config.rope_base(i);
    let window = m.window(i);
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
        let heads = |y: &Array, n: i32| part(y)?.reshape(&[1, rows, n, hd]);
        let q = m.rotate(&heads(&q, nh)?, base, offset)?;
        let k = m.rotate(&heads(&k, nkv)?, base, offset)?;
        let v = part(&v)?
            .reshape(&[1, rows, nkv, hd])?
            .transpose(&[0, 2, 1, 3])?;
        probe("rope", &[&q, &k])?;
        let (k, v) = cache.update(&k, &v)?;
        outs.push(windowed(m, &q, &k, &v, window)?);
    }
    let o = if outs.len() == 1 {
        outs.pop().expect("one")
    } else {
        ops::concatenate(&outs.iter().collect::<Vec<_>>(), 1)?
    };
    probe("capped attention", &[&o])?;
    let o = l.o.forward(&o)?;
    let x = ops::add(x, &m.rms_norm(&o, &n.attn)?)?;
    probe("o matmul + post-norm + residual", &[&x])?;

    let d = gemma3::mlp(m, l, &x, probe)?;
    let x = ops::add(&x, &m.rms_norm(&d, &n.ffn)?)?;
    probe("post-norm + residual", &[&x])?;
    Ok(x)
}

/// Capped attention of `q` `[1, h, T, d]` over `k`, `v` `[1, kv, L, d]`,
/// the last T keys the queries' own; with `window`, query t sees only the
/// keys less than `window` positions before it. Where the window cuts,
/// each query row runs alone over its own keys (as
/// `Llama::windowed_attention`): the computation of a one-token step, so a
/// k-token verify stays bitwise equal to k steps.
fn windowed(m: &Llama, q: &Array, k: &Array, v: &Array, window: Option<usize>) -> Result<Array> {
    let (t, l) = (q.dim(2), k.dim(2));
    let w = match window {
        Some(w) if l as usize > w => w as i32,
        _ => return attention(m, q, k, v),
    };
    let (h, d, kv) = (q.dim(1), q.dim(3), k.dim(1));
    let mut rows = Vec::with_capacity(t as usize);
    for i in 0..t {
        // Key index of query i's own position, and its window's start.
        let end = l - t + i + 1;
        let start = (end - w).max(0);
        let qi = q.slice(&[0, 0, i, 0], &[1, h, i + 1, d])?;
        let ki = k.slice(&[0, 0, start, 0], &[1, kv, end, d])?;
        let vi = v.slice(&[0, 0, start, 0], &[1, kv, end, v.dim(3)])?;
        rows.push(attention(m, &qi, &ki, &vi)?);
    }
    ops::concatenate(&rows.iter().collect::<Vec<_>>(), 1)
}

/// Causal attention with Gemma 2's scale and soft-cap; returns
/// `[1, T, heads * d]`.
fn attention(m: &Llama, q: &Array, k: &Array, v: &Array) -> Result<Array> {
    let c = &m.config;
    let scale = c.attn_scale();
    let cap = c.attn_logit_softcapping.unwrap_or(0.0);
    let (h, t, d) = (q.dim(1), q.dim(2), v.dim(3));
    if m.own_kernels {
        return kernels::attention_capped(q, k, v, scale, t > 1, cap)?.reshape(&[1, t, h * d]);
    }
    let o = match cap {
        0.0 => {
            let mask = match t > 1 {
                true => fast::Mask::Causal,
                false => fast::Mask::None,
            };
            fast::scaled_dot_product_attention(q, k, v, scale, mask)?
        }
        _ => mlx_capped(q, k, v, scale, cap)?,
    };
    o.transpose(&[0, 2, 1, 3])?.reshape(&[1, t, h * d])
}

/// Capped causal attention from MLX's ops, as mlx-lm's gemma2.py: queries
/// scaled, `q k^T` per kv head's group, `cap tanh(s / cap)`, the causal
/// mask, a precise softmax, times `v`. Returns `[1, h, T, d]`.
fn mlx_capped(q: &Array, k: &Array, v: &Array, scale: f32, cap: f32) -> Result<Array> {
    let (h, t, d, kv, l, dv) = (q.dim(1), q.dim(2), q.dim(3), k.dim(1), k.dim(2), v.dim(3));
    let rep = h / kv;
    let q = ops::multiply(q, &Array::scalar(scale)?)?.reshape(&[1, kv, rep, t, d])?;
    let k = k.reshape(&[1, kv, 1, l, d])?.transpose(&[0, 1, 2, 4, 3])?;
    let s = ops::matmul(&q, &k)?;
    let c = Array::scalar(cap)?;
    let mut s = ops::multiply(&ops::tanh(&ops::divide(&s, &c)?)?, &c)?;
    if t > 1 {
        // Query row i sees keys 0..=l - t + i.
        let mask: Vec<f32> = (0..t)
            .flat_map(|i| {
                (0..l).map(move |j| {
                    if j <= l - t + i {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                })
            })
            .collect();
        s = ops::add(&s, &Array::from_f32(&mask, &[t, l])?)?;
    }
    let p = ops::softmax(&s, -1, true)?;
    ops::matmul(&p, &v.reshape(&[1, kv, 1, l, dv])?)?.reshape(&[1, h, t, dv])
}

impl Llama {
    /// The logits `cap tanh(l / cap)` where the model soft-caps them
    /// (Gemma 2's `final_logit_softcapping`); as they are otherwise.
    /// Elementwise, so a row's logits do not depend on the rows around it.
    pub(super) fn cap_logits(&self, logits: Array) -> Result<Array> {
        let Some(cap) = self.config.final_logit_softcapping else {
            return Ok(logits);
        };
        let c = Array::scalar(cap)?;
        ops::multiply(&ops::tanh(&ops::divide(&logits, &c)?)?, &c)
    }
}
