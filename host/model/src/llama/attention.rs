//! Attention and the parts around it that every layer kind shares: the
//! norms, the q/k/v rows (with a model's bias and q/k norms), rope by
//! heads, causal and windowed attention, and the one op that writes every
//! sequence's cache rows and attends over them.
use super::{Layer, Llama, Probe, SeqSpan};
use crate::cache::KvCache;
use crate::linear::{Linear, QuantizedWeight};
use specd_mlx::kernels::KvRows;
use specd_mlx::{fast, kernels, ops, Array, Result};

/// Which attention op a layer kind runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnOp {
    /// Scores scaled by 1 / sqrt(head_dim), softmax.
    Plain,
    /// Gemma 2's: scaled by 1 / sqrt(`query_pre_attn_scalar`) and
    /// soft-capped (`kernels::attention_capped`).
    Capped,
}

impl AttnOp {
    /// What a probe calls it.
    fn label(self) -> &'static str {
        match self {
            AttnOp::Plain => "attention",
            AttnOp::Capped => "capped attention",
        }
    }
}

/// How q and k are normed between the q/k/v matmul and the rope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    /// Over each head (Qwen3, Gemma 3: `[head_dim]` weights).
    Heads,
    /// Over the whole projection (OLMo 2: `[heads * head_dim]` weights).
    Whole,
}

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

    /// Attention of `q` `[1, h, T, d]` over `k`, `v` `[1, kv, L, d]` by
    /// `op`, the last T keys being the queries' own positions; with
    /// `window`, query t sees only the keys less than `window` positions
    /// before it. Where the window cuts, each query row runs alone over its
    /// own keys: the same computation as a one-token step, so a k-token
    /// verify stays bitwise equal to k steps.
    pub(super) fn windowed_attention(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        window: Option<usize>,
        op: AttnOp,
    ) -> Result<Array> {
        let (t, l) = (q.dim(2), k.dim(2));
        let w = match window {
            Some(w) if l as usize > w => w as i32,
            _ => return self.attend(op, q, k, v),
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
            rows.push(self.attend(op, &qi, &ki, &vi)?);
        }
        ops::concatenate(&rows.iter().collect::<Vec<_>>(), 1)
    }

    /// Causal attention by `op`; returns `[1, T, heads * d]`.
    fn attend(&self, op: AttnOp, q: &Array, k: &Array, v: &Array) -> Result<Array> {
        match op {
            AttnOp::Plain => self.attention(q, k, v),
            AttnOp::Capped => super::gemma2::capped_attention(self, q, k, v),
        }
    }

    /// Layer `i`'s attention over the rows `q`, `k`, `v` `[1, T, n *
    /// head_dim]` of the sequences `seqs` (each its cache of the layer and
    /// its rows, first and count): per sequence, at its own positions, the
    /// rope at base `rope` (`None`: the rows are rotated already, or the
    /// layer has no rope), its cache update and its attention by `op`
    /// through the layer's window. Every layer kind's per-sequence path
    /// (and an EAGLE-3 head's layer) runs it, so each sequence's rows are
    /// those of a forward of it alone. Returns `[1, T, heads * head_dim]`.
    pub(crate) fn attend_each(
        &self,
        i: usize,
        (q, k, v): (&Array, &Array, &Array),
        seqs: &mut [SeqSpan<'_>],
        rope: Option<f32>,
        op: AttnOp,
        probe: &mut Probe<'_>,
    ) -> Result<Array> {
        let t = q.dim(1);
        let (nh, nkv, hd) = self.head_counts();
        let window = self.window(i);
        let mut outs = Vec::with_capacity(seqs.len());
        for (cache, (a, rows)) in seqs.iter_mut() {
            let (a, rows) = (*a, *rows);
            // One sequence's rows (all of them alone: no slice op), split
            // into heads `[1, rows, n, head_dim]`.
            let heads = |y: &Array, n: i32| {
                let y = match rows == t {
                    true => y.clone(),
                    false => y.slice(&[0, a, 0], &[1, a + rows, y.dim(2)])?,
                };
                y.reshape(&[1, rows, n, hd])
            };
            let by_heads = |y: Array| y.transpose(&[0, 2, 1, 3]);
            let offset = cache.offset() as i32;
            let (qs, ks) = match rope {
                Some(base) => {
                    let qs = self.rotate(&heads(q, nh)?, base, offset)?;
                    let ks = self.rotate(&heads(k, nkv)?, base, offset)?;
                    probe("rope", &[&qs, &ks])?;
                    (qs, ks)
                }
                None => (by_heads(heads(q, nh)?)?, by_heads(heads(k, nkv)?)?),
            };
            let vs = by_heads(heads(v, nkv)?)?;
            let (kc, vc) = cache.update(&ks, &vs)?;
            probe("cache update", &[&kc, &vc])?;
            outs.push(self.windowed_attention(&qs, &kc, &vc, window, op)?);
        }
        let o = match outs.len() {
            1 => outs.pop().expect("one"),
            _ => ops::concatenate(&outs.iter().collect::<Vec<_>>(), 1)?,
        };
        probe(op.label(), &[&o])?;
        Ok(o)
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

    /// q, k, v rows `[1, T, n * head_dim]` before the rope: the input norm
    /// `norm` (`None`: `x` is the matmul's input as it is, OLMo 2's
    /// residual stream or an EAGLE-3 head's normed rows) and the q/k/v
    /// matmul, then the model's bias and the layer's q/k norms if any.
    pub(crate) fn qkv_rows(
        &self,
        l: &Layer,
        x: &Array,
        norm: Option<&Array>,
        probe: &mut Probe<'_>,
    ) -> Result<(Array, Array, Array)> {
        let t = x.dim(1);
        let (nh, nkv, hd) = self.head_counts();
        let (nq, nk) = (nh * hd, nkv * hd);
        let cols = |y: &Array, a: i32, n: i32| y.slice(&[0, 0, a], &[1, t, a + n]);
        let (q, k, v) = match (&l.qkv, norm) {
            (Some(f), Some(w)) => {
                let y = self.norm_linear(x, w, f)?;
                (cols(&y, 0, nq)?, cols(&y, nq, nk)?, cols(&y, nq + nk, nk)?)
            }
            (Some(f), None) => {
                let y = f.forward(x)?;
                (cols(&y, 0, nq)?, cols(&y, nq, nk)?, cols(&y, nq + nk, nk)?)
            }
            (None, _) => {
                let h = match norm {
                    Some(w) => self.rms_norm(x, w)?,
                    None => x.clone(),
                };
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
        let label = match norm {
            Some(_) => "norm + q/k/v matmuls",
            None => "q/k/v matmuls",
        };
        probe(label, &[&q, &k, &v])?;
        let (q, k) = match (&l.q_norm, &l.k_norm, l.kind.qk_norm()) {
            (Some(qn), Some(kn), QkNorm::Heads) => {
                (self.head_norm(&q, qn, nh)?, self.head_norm(&k, kn, nkv)?)
            }
            (Some(qn), Some(kn), QkNorm::Whole) => (self.rms_norm(&q, qn)?, self.rms_norm(&k, kn)?),
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
