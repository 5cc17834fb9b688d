//! A llama forward in the shape of mlx-lm's llama.py: RMSNorm, RoPE, GQA
//! attention through MLX's fused kernel, SwiGLU MLP, tied or untied head.
use super::LlamaConfig;
use crate::cache::{KvCache, LayerCache, RotatingCache};
use specd_mlx::{fast, ops, Array, Result};

/// A dense linear layer, `y = x W^T` with `W` as `[out, in]`.
#[derive(Clone)]
pub struct Linear {
    pub weight: Array,
}

impl Linear {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        ops::matmul(x, &self.weight.t()?)
    }
}

#[derive(Clone)]
pub struct Layer {
    pub attn_norm: Array,
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub ffn_norm: Array,
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

/// Which positions' logits a forward returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only the last position (prefill, plain decoding).
    Last,
    /// Every new position (a speculative verify).
    All,
}

#[derive(Clone)]
pub struct Llama {
    pub config: LlamaConfig,
    /// `[vocab, hidden]`, float32.
    pub embed: Array,
    pub layers: Vec<Layer>,
    pub norm: Array,
    /// `None` when the head is tied to the embedding.
    pub lm_head: Option<Linear>,
}

impl Llama {
    /// Fresh caches, one per layer.
    pub fn new_caches(&self) -> Vec<Box<dyn LayerCache>> {
        self.new_caches_n(self.config.num_hidden_layers)
    }

    /// Caches for the first `n` layers: rotating where the model attends
    /// through a sliding window.
    pub fn new_caches_n(&self, n: usize) -> Vec<Box<dyn LayerCache>> {
        (0..n)
            .map(|_| match self.config.sliding_window {
                Some(w) => Box::new(RotatingCache::new(w)) as Box<dyn LayerCache>,
                None => Box::new(KvCache::new()) as Box<dyn LayerCache>,
            })
            .collect()
    }

    /// Runs `tokens` through all layers after what `caches` hold; returns
    /// logits `[T or 1, vocab]` (float32, lazy).
    pub fn forward(
        &self,
        tokens: &[u32],
        caches: &mut [Box<dyn LayerCache>],
        which: Logits,
    ) -> Result<Array> {
        self.forward_layers(tokens, caches, self.layers.len(), which)
    }

    /// The first `n_layers` layers, then the final norm and head: the target
    /// itself for `n_layers == layers.len()`, a self-speculative draft below.
    pub fn forward_layers(
        &self,
        tokens: &[u32],
        caches: &mut [Box<dyn LayerCache>],
        n_layers: usize,
        which: Logits,
    ) -> Result<Array> {
        let h = self.hidden(tokens, caches, n_layers)?;
        self.head(&h, which)
    }

    /// Hidden states after `n_layers` layers, `[1, T, hidden]`.
    pub fn hidden(
        &self,
        tokens: &[u32],
        caches: &mut [Box<dyn LayerCache>],
        n_layers: usize,
    ) -> Result<Array> {
        assert!(caches.len() >= n_layers, "one cache per layer");
        let t = tokens.len() as i32;
        let ids = Array::from_u32(tokens, &[t])?;
        let mut x =
            ops::take(&self.embed, &ids, 0)?.reshape(&[1, t, self.config.hidden_size as i32])?;
        for (layer, cache) in self.layers[..n_layers].iter().zip(caches.iter_mut()) {
            x = self.layer(layer, &x, cache)?;
        }
        Ok(x)
    }

    /// Final norm and the vocabulary projection.
    pub fn head(&self, h: &Array, which: Logits) -> Result<Array> {
        let t = h.dim(1);
        let d = self.config.hidden_size as i32;
        let h = match which {
            Logits::All => h.reshape(&[t, d])?,
            Logits::Last => h.slice(&[0, t - 1, 0], &[1, t, d])?.reshape(&[1, d])?,
        };
        let h = fast::rms_norm(&h, &self.norm, self.config.rms_norm_eps)?;
        match &self.lm_head {
            Some(head) => head.forward(&h),
            None => ops::matmul(&h, &self.embed.t()?),
        }
    }

    fn layer(&self, l: &Layer, x: &Array, cache: &mut Box<dyn LayerCache>) -> Result<Array> {
        let c = &self.config;
        let t = x.dim(1);
        let (nh, nkv, hd) = (
            c.num_attention_heads as i32,
            c.num_key_value_heads as i32,
            c.head_dim as i32,
        );
        let offset = cache.offset() as i32;

        let h = fast::rms_norm(x, &l.attn_norm, c.rms_norm_eps)?;
        let heads = |y: Array, n: i32| -> Result<Array> {
            y.reshape(&[1, t, n, hd])?.transpose(&[0, 2, 1, 3])
        };
        let q = heads(l.q.forward(&h)?, nh)?;
        let k = heads(l.k.forward(&h)?, nkv)?;
        let v = heads(l.v.forward(&h)?, nkv)?;
        let q = fast::rope(&q, hd, c.rope_traditional, c.rope_theta, 1.0, offset)?;
        let k = fast::rope(&k, hd, c.rope_traditional, c.rope_theta, 1.0, offset)?;
        let (k, v) = cache.update(&k, &v)?;
        let mask = if t > 1 {
            fast::Mask::Causal
        } else {
            fast::Mask::None
        };
        let scale = 1.0 / (hd as f32).sqrt();
        let o = fast::scaled_dot_product_attention(&q, &k, &v, scale, mask)?;
        let o = o.transpose(&[0, 2, 1, 3])?.reshape(&[1, t, nh * hd])?;
        let x = ops::add(x, &l.o.forward(&o)?)?;

        let h = fast::rms_norm(&x, &l.ffn_norm, c.rms_norm_eps)?;
        let g = ops::silu(&l.gate.forward(&h)?)?;
        let u = l.up.forward(&h)?;
        let m = l.down.forward(&ops::multiply(&g, &u)?)?;
        ops::add(&x, &m)
    }

    /// Every weight, for evaluation after loading.
    pub fn weights(&self) -> Vec<&Array> {
        let mut w = vec![&self.embed, &self.norm];
        if let Some(h) = &self.lm_head {
            w.push(&h.weight);
        }
        for l in &self.layers {
            w.extend([
                &l.attn_norm,
                &l.q.weight,
                &l.k.weight,
                &l.v.weight,
                &l.o.weight,
                &l.ffn_norm,
                &l.gate.weight,
                &l.up.weight,
                &l.down.weight,
            ]);
        }
        w
    }
}
