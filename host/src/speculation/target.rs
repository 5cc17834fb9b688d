//! What a round needs from a model: forward new tokens after what its
//! caches hold, get logits rows back as plain numbers, and roll back.
//! [`LlamaTarget`] is the real thing; tests script fakes with one-hot logits.
use crate::cache::KvCache;
use crate::model::{Llama, Logits};
use anyhow::Result;
use std::sync::Arc;

pub trait Target: Send {
    fn vocab_size(&self) -> usize;
    /// Tokens its caches hold.
    fn offset(&self) -> usize;
    /// Forwards `tokens` after the cached ones; returns logits for every new
    /// position when `all`, else only for the last.
    fn forward(&mut self, tokens: &[u32], all: bool) -> Result<Vec<Vec<f32>>>;
    /// Forwards without computing logits (prefill).
    fn prefill(&mut self, tokens: &[u32]) -> Result<()>;
    /// Rolls the caches back to `offset` tokens.
    fn rewind(&mut self, offset: usize) -> Result<()>;
}

/// A llama (or its first `n_layers` layers, for self-speculation) with its
/// own per-layer KV caches.
pub struct LlamaTarget {
    pub model: Arc<Llama>,
    pub caches: Vec<KvCache>,
    pub n_layers: usize,
}

impl LlamaTarget {
    pub fn new(model: Arc<Llama>) -> Self {
        let n = model.layers.len();
        Self::first_layers(model, n)
    }

    pub fn first_layers(model: Arc<Llama>, n_layers: usize) -> Self {
        let n_layers = n_layers.clamp(1, model.layers.len());
        let caches = (0..n_layers).map(|_| KvCache::new()).collect();
        LlamaTarget {
            model,
            caches,
            n_layers,
        }
    }

    pub fn with_caches(model: Arc<Llama>, caches: Vec<KvCache>) -> Self {
        let n_layers = caches.len();
        LlamaTarget {
            model,
            caches,
            n_layers,
        }
    }

    fn eval_caches(&self) -> Result<()> {
        let state: Vec<&specd_mlx::Array> = self.caches.iter().flat_map(|c| c.state()).collect();
        specd_mlx::eval(&state)?;
        Ok(())
    }
}

impl Target for LlamaTarget {
    fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }

    fn offset(&self) -> usize {
        self.caches.first().map(|c| c.offset()).unwrap_or(0)
    }

    fn forward(&mut self, tokens: &[u32], all: bool) -> Result<Vec<Vec<f32>>> {
        let which = if all { Logits::All } else { Logits::Last };
        let logits = self
            .model
            .forward_layers(tokens, &mut self.caches, self.n_layers, which)?;
        let v = logits.to_vec_f32()?;
        let vocab = self.vocab_size();
        Ok(v.chunks(vocab).map(|c| c.to_vec()).collect())
    }

    fn prefill(&mut self, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            return Ok(());
        }
        // Caches are all we need: skip the head.
        let _ = self.model.hidden(tokens, &mut self.caches, self.n_layers)?;
        self.eval_caches()
    }

    fn rewind(&mut self, offset: usize) -> Result<()> {
        for c in &mut self.caches {
            c.truncate(offset);
        }
        Ok(())
    }
}
