//! specd: a native LLM host on MLX whose speculative-decoding policies are
//! sandboxed WebAssembly components.
//!
//! Modules use one another one way. Module order (each uses only modules
//! before it; `tests/py/test_import_circles.py` checks it against the
//! imports): `spread`, `model_files`, `options`, `load`, `sampling`, `speculation`,
//! `sequence`, `request`, `ranks`, `engine`, `scheduler`, `trace`,
//! `server`, `cli`. Below them, `specd_mlx` -> `specd_model` ([`model`]
//! and [`cache`], a crate of its own that knows nothing of these) and
//! `specd_policy`. A request goes route (`server`) -> `engine` (its
//! speculation built) -> `scheduler` (continuous batching) -> `sequence`
//! (prefill, then rounds: plan -> read -> decide -> apply) ->
//! `speculation` (the drafter, the policies, the target's verify). The
//! measuring tools (bench, profile, replay) are the `specd-tools` crate,
//! on top of this one.

pub mod cli;
pub mod engine;
pub mod load;
pub mod model_files;
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
