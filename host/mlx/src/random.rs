//! Seeded random numbers (MLX's counter-based keys).
use crate::array::wrap;
use crate::bridge::ffi;
use crate::{Array, Result};
pub fn key(seed: u64) -> Result<Array> {
    wrap(ffi::random_key(seed))
}
pub fn split(key: &Array, num: i32) -> Result<Array> {
    wrap(ffi::random_split(&key.0, num))
}
pub fn uniform(shape: &[i32], key: &Array) -> Result<Array> {
    wrap(ffi::random_uniform(shape, &key.0))
}
pub fn categorical(logits: &Array, axis: i32, key: &Array) -> Result<Array> {
    wrap(ffi::random_categorical(&logits.0, axis, &key.0))
}
