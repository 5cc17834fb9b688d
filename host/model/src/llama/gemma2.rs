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
//! - MLP: Gemma 3's ([`super::gemma3::mlp`]): GeGLU, then a post-MLP norm, the
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
//! A Gemma 2 layer is a llama-family [`super::Layer`] of kind
//! [`super::LayerKind::Gemma2`]: Gemma 3's layer ([`super::gemma3::layer`]) with
//! this file's attention op, [`capped_attention`].
use super::Llama;
use specd_mlx::{fast, kernels, ops, Array, Result};

/// Causal attention with Gemma 2's scale and soft-cap
/// ([`super::AttnOp::Capped`]); returns `[1, T, heads * d]`.
pub(super) fn capped_attention(m: &Llama, q: &Array, k: &Array, v: &Array) -> Result<Array> {
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
