//! specd: a native LLM host on MLX whose speculative-decoding policies are
//! sandboxed WebAssembly components.
//!
//! Data flows one way: `specd_mlx` -> [`model`] -> [`cache`] ->
//! [`speculation`] (<- `specd_policy`) -> [`pipeline`] -> [`engine`] -> CLI
//! and server. A module knows only the ones to its left.

pub mod batch;
pub mod bench;
pub mod cache;
pub mod cli;
pub mod engine;
pub mod latency;
pub mod model;
pub mod options;
pub mod pipeline;
pub mod profile;
pub mod replay;
pub mod request;
pub mod sampling;
pub mod serve_bench;
pub mod server;
pub mod speculation;
pub mod spread;
pub use specd_store as store;
pub mod trace;
