//! Memory held by MLX's allocator.
use crate::bridge::ffi;
pub fn active() -> usize {
    ffi::active_memory()
}
pub fn peak() -> usize {
    ffi::peak_memory()
}
pub fn reset_peak() {
    ffi::reset_peak_memory()
}
pub fn cache() -> usize {
    ffi::cache_memory()
}
pub fn clear_cache() {
    ffi::clear_cache()
}
