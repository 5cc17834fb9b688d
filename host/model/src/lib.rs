//! specd's models: config, weights, the forward, loaders and the converter
//! (the llama family, Gemma 3 as a layer kind of it), and the caches a
//! forward writes.
//!
//! This crate depends only on `specd_mlx` and `specd_text`: a model knows
//! nothing of batching, requests, policies or the engine. It reports what
//! the engine needs to account for it (its KV bytes per token,
//! [`Llama::kv_bytes_per_token`]); the scheduler only adds.
pub mod cache;
pub mod config;
pub mod convert;
pub mod ggml;
pub mod linear;
pub mod llama;
pub mod load;
pub mod mtp;
pub mod random;
pub mod ranks;

pub use config::{Arch, LlamaConfig};
pub use linear::{Kernels, Linear, QuantSource, QuantizedWeight, WeightMode};
pub use llama::gemma3;
pub use llama::{no_probe, ForwardFlags, Llama, Logits, Outputs, Probe, Seq, Want};
pub use load::{load_model_part, load_model_with, ModelFormat};
