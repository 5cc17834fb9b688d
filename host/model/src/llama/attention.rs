//! Attention and the parts around it that every layer kind shares: the
//! norms, the q/k/v rows (with a model's bias and q/k norms), rope by
//! heads, causal and windowed attention, and the one op that writes every
//! sequence's cache rows and attends over them.
use super::{Layer, Llama, Probe};
use crate::cache::KvCache;
use crate::linear::{Linear, QuantizedWeight};
use specd_mlx::kernels::KvRows;
use specd_mlx::{fast, kernels, ops, Array, Result};

impl Llama {
    /// Causal attention of `q` `[1, heads, T, d]` over the cached `k`, `v`;
    /// returns `[1, T, heads * d]`.
    pub fn attention(&self, q: &Array, k: &Array, v: &Array) -> Result<Array> {
        let scale = 1.0 / (self.config.head_dim as f32).sqrt();
        let (h, t, d) = (q.dim(1), q.dim(2), v.dim(3));
        if self.own_kernels {
            return kernels::attention(q, k, v, scale, t > 1)?.reshape(&[1, t, h * d]);
        }
        let mask = if t > 1 {
            fast::Mask::Causal
        } else {
            fast::Mask::None
        };
        fast::scaled_dot_product_attention(q, k, v, scale, mask)?
            .transpose(&[0, 2, 1, 3])?
            .reshape(&[1, t, h * d])
    }

    /// Attention of `q` `[1, h, T, d]` over `k`, `v` `[1, kv, L, d]`, the
    /// last T keys being the queries' own positions; with `window`, query
    /// t sees only the keys less than `window` positions before it. Where
    /// the window cuts, each query row runs alone over its own keys: the
    /// same computation as a one-token step, so a k-token verify stays
    /// bitwise equal to k steps.
    pub(super) fn windowed_attention(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        window: Option<usize>,
    ) -> Result<Array> {
        let (t, l) = (q.dim(2), k.dim(2));
        let w = match window {
            Some(w) if l as usize > w => w as i32,
            _ => return self.attention(q, k, v),
        };
        let (h, d, kv) = (q.dim(1), q.dim(3), k.dim(1));
        let mut rows = Vec::with_capacity(t as usize);
        for i in 0..t {
            // Key index of query i's own position, and its window's start.
            let end = l - t + i + 1;
            let start = (end - w).max(0);
            let qi = q.slice(&[0, 0, i, 0], &[1, h, i + 1, d])?;
            let ki = k.slice(&[0, 0, start, 0], &[1, kv, end, d])?;
            let vi = v.slice(&[0, 0, start, 0], &[1, kv, end, v.dim(3)])?;
            rows.push(self.attention(&qi, &ki, &vi)?);
        }
        ops::concatenate(&rows.iter().collect::<Vec<_>>(), 1)
    }

    /// `lin(rms_norm(x, w))`: one op on the CPU kernels' packed weights.
    pub fn norm_linear(&self, x: &Array, w: &Array, lin: &Linear) -> Result<Array> {
        match lin {
            Linear::Quantized(q) => q.forward_normed(x, w, self.config.rms_norm_eps),
            Linear::Dense(_) => lin.forward(&self.rms_norm(x, w)?),
        }
    }

    pub fn rms_norm(&self, x: &Array, w: &Array) -> Result<Array> {
        if self.own_kernels {
            kernels::rms_norm(x, w, self.config.rms_norm_eps)
        } else {
            fast::rms_norm(x, w, self.config.rms_norm_eps)
        }
    }

    /// `y` `[1, T, n * head_dim]` split into heads `[1, n, T, head_dim]`
    /// and rotated for positions `offset..`.
    pub fn rope_heads(&self, y: &Array, n: i32, offset: i32) -> Result<Array> {
        let c = &self.config;
        let (t, hd) = (y.dim(1), c.head_dim as i32);
        self.rotate(&y.reshape(&[1, t, n, hd])?, c.rope_theta, offset)
    }

    /// The window layer `i` attends through (its cache is rotating), if any.
    pub(super) fn window(&self, i: usize) -> Option<usize> {
        let c = &self.config;
        c.sliding_window.filter(|_| c.is_local(i))
    }

    /// Query heads, key/value heads and the head size.
    pub(crate) fn head_counts(&self) -> (i32, i32, i32) {
        let c = &self.config;
        (
            c.num_attention_heads as i32,
            c.num_key_value_heads as i32,
            c.head_dim as i32,
        )
    }

    /// q, k, v rows `[1, T, n * head_dim]` before the rope: the norm and
    /// the q/k/v matmul, then the model's bias and q/k norms if any.
    pub(super) fn qkv_rows(
        &self,
        l: &Layer,
        x: &Array,
        probe: &mut Probe<'_>,
    ) -> Result<(Array, Array, Array)> {
        let t = x.dim(1);
        let (nh, nkv, hd) = self.head_counts();
        let (nq, nk) = (nh * hd, nkv * hd);
        let cols = |y: &Array, a: i32, n: i32| y.slice(&[0, 0, a], &[1, t, a + n]);
        let (q, k, v) = match &l.qkv {
            Some(f) => {
                let y = self.norm_linear(x, &l.attn_norm, f)?;
                (cols(&y, 0, nq)?, cols(&y, nq, nk)?, cols(&y, nq + nk, nk)?)
            }
            None => {
                let h = self.rms_norm(x, &l.attn_norm)?;
                (l.q.forward(&h)?, l.k.forward(&h)?, l.v.forward(&h)?)
            }
        };
        let (q, k, v) = match &l.qkv_bias {
            Some(b) => {
                let part = |a: i32, n: i32| b.slice(&[a], &[a + n]);
                (
                    ops::add(&q, &part(0, nq)?)?,
                    ops::add(&k, &part(nq, nk)?)?,
                    ops::add(&v, &part(nq + nk, nk)?)?,
                )
            }
            None => (q, k, v),
        };
        probe("norm + q/k/v matmuls", &[&q, &k, &v])?;
        let (q, k) = match (&l.q_norm, &l.k_norm) {
            (Some(qn), Some(kn)) => (self.head_norm(&q, qn, nh)?, self.head_norm(&k, kn, nkv)?),
            _ => (q, k),
        };
        Ok((q, k, v))
    }

    /// RMS norm of each of the `n` heads of `y` `[1, T, n * head_dim]`.
    pub(super) fn head_norm(&self, y: &Array, w: &Array, n: i32) -> Result<Array> {
        let (t, hd) = (y.dim(1), self.config.head_dim as i32);
        self.rms_norm(&y.reshape(&[1, t, n, hd])?, w)?
            .reshape(&[1, t, n * hd])
    }

    /// The packed q/k/v matmul of layer `l` where the rope folds into it
    /// and the fused attention kernel takes its output: specd's kernels,
    /// packed weights, nothing (bias, q/k norm) between matmul and rope,
    /// and a rope to fold (not a NoPE layer: that op always rotates).
    pub(super) fn fused_qkv<'a>(&self, l: &'a Layer) -> Option<&'a QuantizedWeight> {
        let plain = l.rope && l.qkv_bias.is_none() && l.q_norm.is_none() && self.rope_folds();
        match &l.qkv {
            Some(Linear::Quantized(f)) if plain && self.own_kernels && f.packed.is_some() => {
                Some(f)
            }
            _ => None,
        }
    }

    /// Every sequence's new k/v rows into its cache and its attention over
    /// that cache, in one op (`kernels::attention_kv_rows`): `y` is the
    /// fused q/k/v output `[1, T, (heads + 2 kv_heads) * head_dim]`, its
    /// rows the sequences' in order, `rows[s]` of them for `caches[s]`.
    /// Returns `[1, T, heads * head_dim]`.
    pub(super) fn attention_kv_rows(
        &self,
        y: &Array,
        caches: &mut [&mut KvCache],
        rows: &[i32],
    ) -> Result<Array> {
        self.with_kv_rows(caches, rows, |seqs, shape| {
            let (o, kv) = kernels::attention_kv_rows(y, seqs, shape)?;
            Ok((kv, o))
        })
    }

    /// `f` over each cache's writable buffers for its `rows` new rows (with
    /// the attention's shape); the caches it gives back are kept, as
    /// written.
    pub(super) fn with_kv_rows<T>(
        &self,
        caches: &mut [&mut KvCache],
        rows: &[i32],
        f: impl FnOnce(&[KvRows<'_>], kernels::AttnShape) -> Result<(Vec<(Array, Array)>, T)>,
    ) -> Result<T> {
        let (nh, nkv, hd) = self.head_counts();
        let shape = kernels::AttnShape {
            heads: nh,
            kv_heads: nkv,
            head_dim: hd,
            scale: 1.0 / (self.config.head_dim as f32).sqrt(),
        };
        let seqs = caches
            .iter_mut()
            .zip(rows)
            .map(|(c, &n)| {
                let offset = c.offset() as i32;
                let (keys, values) = c.writable(n as usize, nkv, hd, self.flags.kv_half)?;
                Ok(KvRows {
                    keys,
                    values,
                    offset,
                    rows: n,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let (kv, out) = f(&seqs, shape)?;
        drop(seqs);
        for ((c, &n), (k, v)) in caches.iter_mut().zip(rows).zip(kv) {
            c.written(n as usize, k, v);
        }
        Ok(out)
    }
}
