//! The llama-family model: config, weights, forward, loaders and converter.
pub mod config;
pub mod convert;
pub mod llama;
pub mod load;

pub use config::LlamaConfig;
pub use llama::{no_probe, Linear, Llama, Logits, Probe, QuantSource, QuantizedWeight, WeightMode};
pub use load::{load_model_with, ModelFormat};
