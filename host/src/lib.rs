//! specd: a native LLM host on MLX whose speculative-decoding policies are
//! sandboxed WebAssembly components.
//!
//! Data flows one way: `specd_mlx` -> [`model`] -> [`cache`] -> speculation
//! -> pipeline -> server / CLI. A module knows only the ones to its left.
pub mod cache;
pub mod model;
