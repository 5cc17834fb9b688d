//! specd: a native LLM host on MLX whose speculative-decoding policies are
//! sandboxed WebAssembly components.
//!
//! Data flows one way: `specd_mlx` -> `specd_model` ([`model`] and
//! [`cache`], a crate of their own that knows nothing of what follows) ->
//! [`speculation`] (<- `specd_policy`) -> [`sequence`] (a request's life:
//! prefill, rounds, emitting) -> [`engine`] -> [`scheduler`] (continuous
//! batching) -> [`server`] and [`cli`]. A module knows only the ones to its left. The measuring tools
//! (bench, profile, replay) are the `specd-tools` crate, on top of this one.

pub mod cli;
pub mod engine;
pub mod load;
pub mod options;
pub mod ranks;
pub mod request;
pub mod sampling;
pub mod scheduler;
pub mod sequence;
pub mod server;
pub mod speculation;
pub mod spread;
pub use specd_store as store;
pub mod trace;
pub use specd_model as model;
pub use specd_model::cache;
