//! MLX's fused kernels.
use crate::array::wrap;
use crate::bridge::ffi;
use crate::{Array, Result};

shim_fns! {
pub fn rms_norm(x: &Array, weight: &Array, eps: f32);
/// Rotary embedding of the last axis; `offset` is the position of the
/// first row along axis -2. `factors` (one per rotated pair, or none)
/// divide the frequencies (llama.cpp's `rope_freqs`; Llama 3's scaling).
pub fn rope(
    x: &Array, dims: i32, traditional: bool, base: f32, scale: f32, offset: i32, factors: &[f32],
);
}
/// Attention mask for [`scaled_dot_product_attention`].
pub enum Mask<'a> {
    None,
    Causal,
    Array(&'a Array),
}
pub fn scaled_dot_product_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: Mask<'_>,
) -> Result<Array> {
    match mask {
        Mask::None => wrap(ffi::sdpa(&q.0, &k.0, &v.0, scale, "")),
        Mask::Causal => wrap(ffi::sdpa(&q.0, &k.0, &v.0, scale, "causal")),
        Mask::Array(m) => wrap(ffi::sdpa_masked(&q.0, &k.0, &v.0, scale, &m.0)),
    }
}
