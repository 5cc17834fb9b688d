//! The llama-family model: config, weights, forward, loaders and converter.
pub mod config;
pub mod convert;
pub mod gemma3;
pub mod ggml;
pub mod linear;
pub mod llama;
pub mod load;
pub mod random;

pub use config::{Arch, LlamaConfig};
pub use linear::{Kernels, Linear, QuantSource, QuantizedWeight, WeightMode};
pub use llama::{no_probe, Llama, Logits, Probe};
pub use load::{load_model_with, ModelFormat};
