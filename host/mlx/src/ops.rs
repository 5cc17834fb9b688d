//! Element-wise and linear-algebra ops (broadcasting as in NumPy).
use crate::array::{list, wrap};
use crate::bridge::ffi;
use crate::{Array, Result};

macro_rules! binary {
    ($($name:ident => $ffi:ident),* $(,)?) => {$(
        pub fn $name(a: &Array, b: &Array) -> Result<Array> { wrap(ffi::$ffi(&a.0, &b.0)) }
    )*};
}
macro_rules! unary {
    ($($name:ident => $ffi:ident),* $(,)?) => {$(
        pub fn $name(a: &Array) -> Result<Array> { wrap(ffi::$ffi(&a.0)) }
    )*};
}
macro_rules! reduce {
    ($($name:ident => $ffi:ident),* $(,)?) => {$(
        pub fn $name(a: &Array, axis: i32, keepdims: bool) -> Result<Array> {
            wrap(ffi::$ffi(&a.0, axis, keepdims))
        }
    )*};
}
binary!(add => add, subtract => subtract, multiply => multiply, divide => divide,
        maximum => maximum, minimum => minimum, greater => greater, less => less,
        equal => equal, matmul => matmul);
unary!(exp => exp, log => log, sqrt => sqrt, rsqrt => rsqrt, negative => negative,
       sigmoid => sigmoid, tanh => tanh, silu => silu, square => square);
reduce!(logsumexp => logsumexp, argmax => argmax, max => max, sum => sum, mean => mean);

shim_fns! {
pub fn r#where(cond: &Array, a: &Array, b: &Array) as where_;
pub fn softmax(a: &Array, axis: i32, precise: bool);
/// Gathers `indices` (an integer array) along `axis`.
pub fn take(a: &Array, indices: &Array, axis: i32);
/// Expands MLX affine-quantized weights (`w` packed, per-group scales and
/// biases) back to floating point.
pub fn dequantize(w: &Array, scales: &Array, biases: &Array, group_size: i32, bits: i32);
pub fn quantized_matmul(
    x: &Array, w: &Array, scales: &Array, biases: &Array, transpose: bool, group_size: i32,
    bits: i32,
);
}
/// `w` `[out, in]` affine-quantized by MLX (`group_size` 32, 64 or 128;
/// `bits` 2 to 8): the packed weights, scales and biases.
pub fn quantize(w: &Array, group_size: i32, bits: i32) -> Result<(Array, Array, Array)> {
    let l = ffi::quantize(&w.0, group_size, bits)?;
    let get = |i| wrap(ffi::list_get(&l, i));
    Ok((get(0)?, get(1)?, get(2)?))
}
pub fn concatenate(xs: &[&Array], axis: i32) -> Result<Array> {
    wrap(ffi::concatenate(&list(xs.iter().copied()), axis))
}
