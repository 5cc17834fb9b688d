//! Per-layer attention caches.
pub mod kv;
pub use kv::KvCache;
