//! A llama forward in the shape of mlx-lm's llama.py: RMSNorm, RoPE, GQA
//! attention, SwiGLU MLP, tied or untied head.
//!
//! Two weight paths: quantized (the file's 4/8-bit blocks kept as they are,
//! multiplied by specd's batch-invariant kernels, attention by specd's
//! kernel too) and float32 (dequantized at load, MLX's BLAS matmul and fused
//! attention). See [`WeightMode`].
pub mod gemma2;
pub mod gemma3;
pub mod phi3;
pub mod rope;

use self::gemma3::PostNorms;
use crate::cache::{KvCache, LayerCache, RotatingCache};
use crate::linear::{fuse_packed, Linear, QuantizedWeight};
use crate::ranks::Downstream;
use crate::LlamaConfig;
use specd_mlx::kernels::KvRows;
use specd_mlx::{fast, kernels, ops, Array, Result};
use std::sync::Arc;

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
    /// `q`, `k`, `v` as one matmul, and `gate`, `up` as one (packed for the
    /// CPU kernels by [`Llama::pack_for_cpu`]); the forward prefers them.
    pub qkv: Option<Linear>,
    pub gate_up: Option<Linear>,
    /// The q, k and v biases concatenated `[q_out + 2 * kv_out]` (Qwen2,
    /// `attention_bias`), added before rope.
    pub qkv_bias: Option<Array>,
    /// The output projection's bias (llama/Qwen3 `attention_bias`).
    pub o_bias: Option<Array>,
    /// Per-head RMS norm weights `[head_dim]` of q and k, applied before
    /// rope (Qwen3, Gemma 3).
    pub q_norm: Option<Array>,
    pub k_norm: Option<Array>,
    /// Which forward the layer runs.
    pub kind: LayerKind,
}

/// What a layer is beyond the parts every llama-family layer has, and so
/// which forward runs it.
#[derive(Clone)]
pub enum LayerKind {
    /// llama, Mistral, Qwen2/3: SwiGLU MLP, no norms after attention or MLP.
    Llama,
    /// Gemma 3 ([`crate::gemma3`]): its post-norms, GeGLU, a rope base per
    /// layer kind, attention per sequence.
    Gemma3(PostNorms),
    /// Gemma 2 ([`gemma2`]): Gemma 3's post-norms and GeGLU, no q/k norms,
    /// soft-capped attention.
    Gemma2(PostNorms),
}

/// Called with a part's name and outputs as a forward builds them.
pub type Probe<'a> = dyn FnMut(&'static str, &[&Array]) -> Result<()> + 'a;

/// The probe of every forward but the profiler's.
pub fn no_probe(_: &'static str, _: &[&Array]) -> Result<()> {
    Ok(())
}

/// Rows of the residual stream a forward keeps besides its output, at
/// layer boundaries: boundary k holds the rows after the first k layers
/// (0: the embedding; the layer count: the last layer's output, before the
/// final norm). EAGLE-3 heads read three of them, as vLLM numbers them
/// (`eagle_aux_hidden_state_layer_ids`, `_maybe_add_hidden_state` in its
/// llama.py).
#[derive(Default)]
pub struct Taps {
    at: Vec<usize>,
    rows: Vec<Option<Array>>,
}

impl Taps {
    pub fn at(boundaries: &[usize]) -> Taps {
        Taps {
            at: boundaries.to_vec(),
            rows: vec![None; boundaries.len()],
        }
    }

    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    /// `x`, the rows at boundary `k`, kept where asked for.
    fn offer(&mut self, k: usize, x: &Array) {
        for (b, r) in self.at.iter().zip(&mut self.rows) {
            if *b == k {
                *r = Some(x.clone());
            }
        }
    }

    /// The rows kept, concatenated in the order asked for.
    pub fn features(&mut self) -> Result<Array> {
        let rows = self.take()?;
        ops::concatenate(&rows.iter().collect::<Vec<_>>(), 2)
    }

    /// The rows kept, in the order the boundaries were asked for.
    pub fn take(&mut self) -> Result<Vec<Array>> {
        let rows = std::mem::take(&mut self.rows);
        self.at
            .iter()
            .zip(rows)
            .map(|(b, r)| {
                r.ok_or_else(|| {
                    specd_mlx::Exception(format!(
                        "no rows at layer boundary {b} (past this process's layers)"
                    ))
                })
            })
            .collect()
    }
}

/// Which positions' logits a forward returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only the last position (prefill, plain decoding).
    Last,
    /// Every new position (a speculative verify).
    All,
}

/// The logits of a [`Llama::forward_batch`]: `[rows, vocab]` for the rows
/// the sequences asked for, in order (`None` where none did), and per
/// sequence its rows `(first, count)` among them (`None`: a prefill chunk).
pub struct BatchLogits {
    pub logits: Option<Array>,
    pub spans: Vec<Option<(i32, i32)>>,
    /// The last layer's output over every row, `[1, rows, hidden]`, before
    /// the final norm (what an MTP head drafts from).
    pub hidden: Array,
}

/// One sequence's part of [`Llama::forward_batch`].
pub struct BatchRows<'a> {
    /// Its new tokens (at least one), after what its caches hold.
    pub tokens: &'a [u32],
    /// Its caches, one per layer of the model.
    pub caches: &'a mut [Box<dyn LayerCache>],
    /// Which of its rows' logits come back; `None`: none (prefill).
    pub logits: Option<Logits>,
}

#[derive(Clone)]
pub struct Llama {
    pub config: LlamaConfig,
    /// `[vocab, hidden]`; also the head when tied.
    pub embed: Linear,
    /// Attention, norms, rope and the SwiGLU activation through specd's
    /// one-op, batch-invariant CPU kernels (the quantized path) or MLX's
    /// fast ops (the float32 path).
    pub own_kernels: bool,
    pub layers: Vec<Layer>,
    pub norm: Array,
    /// `None` when the head is tied to the embedding.
    pub lm_head: Option<Linear>,
    /// Whether attention runs through `kernels::attention_kv_rows` where it
    /// can (true when loaded); false: the per-sequence ops it replaced, to
    /// measure one against the other with one build
    /// (the engine's `Switches`).
    pub kv_rows: bool,
    /// Whether a layer's o, gate/up and down matmuls run as one op where
    /// they can ([`kernels::layer_tail`]; true when loaded); false: three,
    /// as `specd profile` shows them part by part
    /// (the engine's `Switches`).
    pub fused_tail: bool,
    /// Whether the caches that attention writes in place hold f16 keys and
    /// values (half the bytes a token, and half what a step reads) instead
    /// of float32 (the engine's `Switches::kv_f16`); off when loaded.
    pub kv_half: bool,
    /// The index of `layers[0]` in the whole model: 0, or where this
    /// rank's part of a pipeline starts ([`crate::ranks`]).
    pub first_layer: usize,
    /// On rank 0 of a pipeline: the ranks that run the layers after
    /// `layers` (their caches are [`crate::ranks::RemoteCache`]s here).
    pub downstream: Option<Arc<Downstream>>,
}

impl Llama {
    /// Bytes of KV cache one token takes, every layer: float32 keys and
    /// values, or f16 where the caches are 16-bit ([`Llama::kv_half`], the
    /// fused path's caches; the per-sequence ops keep float32).
    pub fn kv_bytes_per_token(&self) -> usize {
        let bytes = if self.kv_half && self.fused_attention() {
            2
        } else {
            4
        };
        self.config.kv_bytes_per_token(bytes)
    }

    /// Whether every layer's attention is the one op over plain caches
    /// (`kernels::attention_kv_rows`), the only writer of 16-bit caches:
    /// packed q/k/v weights, no sliding window, no Gemma 3 layers.
    fn fused_attention(&self) -> bool {
        self.kv_rows
            && self.config.sliding_window.is_none()
            && self
                .layers
                .iter()
                .all(|l| matches!(l.kind, LayerKind::Llama) && self.fused_qkv(l).is_some())
    }

    /// The model's layers, wherever they run (`layers` holds this
    /// process's).
    pub fn layer_count(&self) -> usize {
        self.config.num_hidden_layers
    }

    /// One past the last layer this process holds.
    pub fn local_end(&self) -> usize {
        self.first_layer + self.layers.len()
    }

    /// Fresh caches, one per layer.
    pub fn new_caches(&self) -> Vec<Box<dyn LayerCache>> {
        self.new_caches_n(self.config.num_hidden_layers)
    }

    /// Caches for the first `n` layers: rotating where the model attends
    /// through a sliding window; on rank 0 of a pipeline, remote for the
    /// layers the other ranks hold.
    pub fn new_caches_n(&self, n: usize) -> Vec<Box<dyn LayerCache>> {
        (0..n)
            .map(|i| match &self.downstream {
                Some(d) if i >= self.local_end() => d.new_cache(i),
                _ => self.new_cache(i),
            })
            .collect()
    }

    /// A fresh cache for layer `i`, held here.
    pub fn new_cache(&self, i: usize) -> Box<dyn LayerCache> {
        match self.config.sliding_window {
            Some(w) if self.config.is_local(i) => Box::new(RotatingCache::new(w)),
            _ => Box::new(KvCache::new()),
        }
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
        self.hidden_probed(tokens, caches, n_layers, &mut no_probe)
    }

    /// [`Llama::hidden`], calling `probe` with each part's name and outputs
    /// as soon as the part is built (`specd profile` evaluates and times
    /// them there; everything else passes [`no_probe`]).
    pub fn hidden_probed(
        &self,
        tokens: &[u32],
        caches: &mut [Box<dyn LayerCache>],
        n_layers: usize,
        probe: &mut Probe<'_>,
    ) -> Result<Array> {
        let ids = Array::from_u32(tokens, &[tokens.len() as i32])?;
        self.hidden_ids(&ids, caches, n_layers, probe)
    }

    /// [`Llama::hidden`], and the rows at the boundaries `taps` names
    /// concatenated in that order (`[1, T, taps * hidden]`; the hidden
    /// rows themselves where `taps` is empty): what a draft head reads.
    pub fn hidden_and_features(
        &self,
        tokens: &[u32],
        caches: &mut [Box<dyn LayerCache>],
        n_layers: usize,
        taps: &[usize],
    ) -> Result<(Array, Array)> {
        if taps.is_empty() {
            let h = self.hidden(tokens, caches, n_layers)?;
            return Ok((h.clone(), h));
        }
        let ids = Array::from_u32(tokens, &[tokens.len() as i32])?;
        let mut kept = Taps::at(taps);
        let h = self.layers_tapped(
            self.embedded(&ids)?,
            caches,
            n_layers,
            &mut no_probe,
            &mut kept,
        )?;
        Ok((h, kept.features()?))
    }

    /// [`Llama::hidden_probed`] from token ids `[T]` (uint32) on the device,
    /// e.g. an argmax not yet computed.
    pub fn hidden_ids(
        &self,
        ids: &Array,
        caches: &mut [Box<dyn LayerCache>],
        n_layers: usize,
        probe: &mut Probe<'_>,
    ) -> Result<Array> {
        let x = self.embedded(ids)?;
        probe("embedding", &[&x])?;
        self.layers_from(x, caches, n_layers, probe)
    }

    /// The first `n_layers` layers over the input rows `x` `[1, T, hidden]`
    /// (an embedding, or what a draft head feeds its layer).
    pub fn layers_from(
        &self,
        x: Array,
        caches: &mut [Box<dyn LayerCache>],
        n_layers: usize,
        probe: &mut Probe<'_>,
    ) -> Result<Array> {
        self.layers_tapped(x, caches, n_layers, probe, &mut Taps::default())
    }

    /// [`Llama::layers_from`], keeping the rows at the boundaries `taps`
    /// asks for.
    pub fn layers_tapped(
        &self,
        mut x: Array,
        caches: &mut [Box<dyn LayerCache>],
        n_layers: usize,
        probe: &mut Probe<'_>,
        taps: &mut Taps,
    ) -> Result<Array> {
        assert!(caches.len() >= n_layers, "one cache per layer");
        let t = x.dim(1);
        let here = n_layers.min(self.local_end()) - self.first_layer;
        for (j, layer) in self.layers[..here].iter().enumerate() {
            let i = self.first_layer + j;
            taps.offer(i, &x);
            let cache = &mut caches[i];
            x = match &layer.kind {
                LayerKind::Gemma3(p) => {
                    gemma3::layer(self, i, layer, p, &x, &mut [(cache, (0, t))], probe)?
                }
                LayerKind::Gemma2(p) => {
                    gemma2::layer(self, i, layer, p, &x, &mut [(cache, (0, t))], probe)?
                }
                LayerKind::Llama => self.layer(i, layer, &x, cache, probe)?,
            };
        }
        taps.offer(self.first_layer + here, &x);
        if n_layers > self.local_end() {
            x = self.downstream(n_layers, &x, std::iter::once((caches, t)))?;
        }
        Ok(x)
    }

    /// The embedding rows of token ids `[T]`, as `[1, T, hidden]` (scaled
    /// by sqrt(hidden) for Gemma 2 and 3, Granite's embedding multiplier).
    fn embedded(&self, ids: &Array) -> Result<Array> {
        let x = self
            .embed
            .rows(ids)?
            .reshape(&[1, ids.dim(0), self.config.hidden_size as i32])?;
        let Some(scale) = self.config.embedding_scale() else {
            return Ok(x);
        };
        ops::multiply(&x, &Array::scalar(scale)?)
    }

    /// Final norm and the vocabulary projection.
    pub fn head(&self, h: &Array, which: Logits) -> Result<Array> {
        self.head_probed(h, which, &mut no_probe)
    }

    pub fn head_probed(&self, h: &Array, which: Logits, probe: &mut Probe<'_>) -> Result<Array> {
        let t = h.dim(1);
        let d = self.config.hidden_size as i32;
        let h = match which {
            Logits::All => h.reshape(&[t, d])?,
            Logits::Last => h.slice(&[0, t - 1, 0], &[1, t, d])?.reshape(&[1, d])?,
        };
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        let logits = self.cap_logits(self.norm_linear(&h, &self.norm, head)?)?;
        probe("final norm + lm head", &[&logits])?;
        Ok(logits)
    }

    /// Packs the quantized weights for the CPU kernels, fusing `q`/`k`/`v`
    /// and `gate`/`up` into one matmul each where they are quantized alike.
    /// The unfused parts keep MLX's layout (for shapes, and the GPU).
    pub fn pack_for_cpu(&mut self) -> Result<()> {
        // Embedding lookups read the packed layout too.
        self.embed = self.embed.clone().pack(false)?;
        if let Some(h) = self.lm_head.take() {
            self.lm_head = Some(h.pack(false)?);
        }
        for l in &mut self.layers {
            l.qkv = fuse_packed(&mut [&mut l.q, &mut l.k, &mut l.v])?;
            l.gate_up = fuse_packed(&mut [&mut l.gate, &mut l.up])?;
            for p in [&mut l.o, &mut l.down] {
                *p = p.clone().pack(false)?;
            }
        }
        Ok(())
    }

    /// Whether a forward over k new tokens gives, row for row, bitwise the
    /// logits of k one-token forwards: every matmul through specd's
    /// quantized kernels and attention through its kernel (norms, rope and
    /// elementwise ops are row-wise in MLX already).
    pub fn batch_invariant(&self) -> bool {
        self.own_kernels
            && self.lm_head.as_ref().unwrap_or(&self.embed).is_quantized()
            && self.layers.iter().all(|l| {
                [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down]
                    .into_iter()
                    .all(|l| l.is_quantized())
            })
    }

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

    /// `silu(g) * u`.
    pub fn swiglu(&self, g: &Array, u: &Array) -> Result<Array> {
        if self.own_kernels {
            kernels::swiglu(g, u)
        } else {
            ops::multiply(&ops::silu(g)?, u)
        }
    }

    /// q, k, v of a layer as heads `[1, heads, T, head_dim]`, q and k
    /// rotated for positions `offset..`. With the CPU kernels and a packed
    /// q/k/v the norm, the matmul and the rope are one op; the heads are
    /// views of its output.
    fn qkv_heads(
        &self,
        l: &Layer,
        x: &Array,
        offset: i32,
        probe: &mut Probe<'_>,
    ) -> Result<(Array, Array, Array)> {
        let c = &self.config;
        let t = x.dim(1);
        let (nh, nkv, hd) = self.head_counts();
        let (nq, nk) = (nh * hd, nkv * hd);
        // Column slices of one product: views, no copies.
        let cols = |y: &Array, a: i32, n: i32| y.slice(&[0, 0, a], &[1, t, a + n]);
        let heads = |y: &Array, n: i32| y.reshape(&[1, t, n, hd])?.transpose(&[0, 2, 1, 3]);
        // A bias or a q/k norm comes between the matmul and the rope, so
        // those models skip the op that folds the rope into the matmul.
        let plain = l.qkv_bias.is_none() && l.q_norm.is_none() && self.rope_folds();
        if let (true, Some(Linear::Quantized(f))) = (plain, &l.qkv) {
            if f.packed.is_some() {
                let y =
                    f.forward_normed_rope(x, &l.attn_norm, c.rms_norm_eps, self.rope(offset))?;
                probe("norm + q/k/v matmuls + rope", &[&y])?;
                return Ok((
                    heads(&cols(&y, 0, nq)?, nh)?,
                    heads(&cols(&y, nq, nk)?, nkv)?,
                    heads(&cols(&y, nq + nk, nk)?, nkv)?,
                ));
            }
        }
        let (q, k, v) = self.qkv_rows(l, x, probe)?;
        let q = self.rope_heads(&q, nh, offset)?;
        let k = self.rope_heads(&k, nkv, offset)?;
        probe("rope", &[&q, &k])?;
        Ok((q, k, heads(&v, nkv)?))
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
    fn head_norm(&self, y: &Array, w: &Array, n: i32) -> Result<Array> {
        let (t, hd) = (y.dim(1), self.config.head_dim as i32);
        self.rms_norm(&y.reshape(&[1, t, n, hd])?, w)?
            .reshape(&[1, t, n * hd])
    }

    fn layer(
        &self,
        i: usize,
        l: &Layer,
        x: &Array,
        cache: &mut Box<dyn LayerCache>,
        probe: &mut Probe<'_>,
    ) -> Result<Array> {
        let offset = cache.offset() as i32;
        if let (Some(f), Some(kv)) = (self.fused_qkv(l), cache.as_kv().filter(|_| self.kv_rows)) {
            // One sequence is a batch of one: the same two ops as
            // `layer_batch`, so a sequence's rows round alike alone and batched.
            let y = f.forward_normed_rope(
                x,
                &l.attn_norm,
                self.config.rms_norm_eps,
                self.rope(offset),
            )?;
            probe("norm + q/k/v matmuls + rope", &[&y])?;
            return self.attention_and_rest(l, &y, x, &mut [kv], &[x.dim(1)], probe);
        }

        let (q, k, v) = self.qkv_heads(l, x, offset, probe)?;
        let (k, v) = cache.update(&k, &v)?;
        probe("cache update", &[&k, &v])?;
        let o = self.windowed_attention(&q, &k, &v, self.window(i))?;
        probe("attention", &[&o])?;
        self.layer_rest(l, &o, x, probe)
    }

    /// The packed q/k/v matmul of layer `l` where the rope folds into it
    /// and the fused attention kernel takes its output: specd's kernels,
    /// packed weights, nothing (bias, q/k norm) between matmul and rope.
    fn fused_qkv<'a>(&self, l: &'a Layer) -> Option<&'a QuantizedWeight> {
        let plain = l.qkv_bias.is_none() && l.q_norm.is_none() && self.rope_folds();
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
    fn attention_kv_rows(
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
    fn with_kv_rows<T>(
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
                let (keys, values) = c.writable(n as usize, nkv, hd, self.kv_half)?;
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

    /// The MLP's input norm and its gate and up matmuls (one fused matmul
    /// where the layer has it) over `x` `[1, T, hidden]`.
    pub(super) fn gate_up(&self, l: &Layer, x: &Array) -> Result<(Array, Array)> {
        Ok(match &l.gate_up {
            Some(f) => halves(&self.norm_linear(x, &l.ffn_norm, f)?)?,
            None => {
                let h = self.rms_norm(x, &l.ffn_norm)?;
                (l.gate.forward(&h)?, l.up.forward(&h)?)
            }
        })
    }

    /// A layer's weights after attention where they run as one op
    /// ([`kernels::layer_tail`]): its three matmuls packed and nothing
    /// between them (no o bias; a fused gate/up whose SwiGLU folds into
    /// down).
    fn tail<'a>(&self, l: &'a Layer) -> Option<kernels::Tail<'a>> {
        if !(self.fused_tail && self.own_kernels) || l.o_bias.is_some() {
            return None;
        }
        let (w_o, o) = l.o.packed()?;
        let (w_gate_up, gate_up) = l.gate_up.as_ref()?.packed()?;
        let (w_down, down) = l.down.packed()?;
        Some(kernels::Tail {
            w_o,
            o,
            norm_w: &l.ffn_norm,
            eps: self.config.rms_norm_eps,
            w_gate_up,
            gate_up,
            w_down,
            down,
            gelu: false,
        })
    }

    /// Attention over the caches (as [`Self::attention_kv_rows`]) and the
    /// rest of the layer: where the layer's tail fuses, the whole layer is
    /// one op ([`kernels::layer_kv_rows`]; two where a probe evaluated `y`).
    fn attention_and_rest(
        &self,
        l: &Layer,
        y: &Array,
        x: &Array,
        caches: &mut [&mut KvCache],
        rows: &[i32],
        probe: &mut Probe<'_>,
    ) -> Result<Array> {
        let Some(tail) = self.tail(l) else {
            let o = self.attention_kv_rows(y, caches, rows)?;
            probe("cache update + attention", &[&o])?;
            return self.layer_rest(l, &o, x, probe);
        };
        let (out, attention) = self.with_kv_rows(caches, rows, |seqs, shape| {
            let r = kernels::layer_kv_rows(y, seqs, shape, x, &tail)?;
            Ok((r.caches, (r.out, r.attention)))
        })?;
        probe("cache update + attention", &[&attention])?;
        probe("o matmul + MLP, one op", &[&out])?;
        Ok(out)
    }

    /// A layer after attention: `o` matmul + residual, then the MLP.
    pub(crate) fn layer_rest(
        &self,
        l: &Layer,
        o: &Array,
        x: &Array,
        probe: &mut Probe<'_>,
    ) -> Result<Array> {
        if let Some(t) = self.tail(l) {
            let y = kernels::layer_tail(o, x, &t)?;
            probe("o matmul + MLP, one op", &[&y])?;
            return Ok(y);
        }
        let x = l.o.forward_add(o, x)?;
        let x = match &l.o_bias {
            Some(b) => ops::add(&x, b)?,
            None => x,
        };
        probe("o matmul + residual", &[&x])?;

        let (g, u) = match (&l.gate_up, self.own_kernels) {
            // The swiglu folded into the down matmul where its weights are
            // packed: the same bits, one op a layer fewer.
            (Some(f), true) => {
                let gu = self.norm_linear(&x, &l.ffn_norm, f)?;
                probe("norm + gate/up matmuls", &[&gu])?;
                if let Some(y) = l.down.forward_glu(&gu, Some(&x), false) {
                    let y = y?;
                    probe("silu * up + down + residual", &[&y])?;
                    return Ok(y);
                }
                halves(&gu)?
            }
            _ => {
                let (g, u) = self.gate_up(l, &x)?;
                probe("norm + gate/up matmuls", &[&g, &u])?;
                (g, u)
            }
        };
        let gu = self.swiglu(&g, &u)?;
        probe("silu * up", &[&gu])?;
        let x = l.down.forward_add(&gu, &x)?;
        probe("down matmul + residual", &[&x])?;
        Ok(x)
    }

    /// One forward over the rows of several sequences at once (continuous
    /// batching): the matmuls run over all rows together, so the weights
    /// are streamed once per step; rope and attention run per sequence, at
    /// its own positions over its own caches. Where the q/k/v matmul folds
    /// the rope in and every cache is a plain [`KvCache`], a layer is a
    /// fixed handful of ops whatever the number of sequences: the cache
    /// writes and every sequence's attention are one op
    /// (`kernels::attention_kv_rows`), the same one a lone forward runs.
    /// Gemma 3's layers run their q/k norms, rope and windowed attention per
    /// sequence ([`gemma3::layer`]). With [`Llama::batch_invariant`]
    /// weights every sequence's logits are bitwise those of a forward of it
    /// alone. Returns the logits of the rows asked for, in sequence order,
    /// and which of them are each sequence's.
    pub fn forward_batch(&self, seqs: &mut [BatchRows<'_>]) -> Result<BatchLogits> {
        self.forward_batch_tapped(seqs, &mut Taps::default())
    }

    /// [`Llama::forward_batch`], keeping the rows at the boundaries `taps`
    /// asks for (every row of the step).
    pub fn forward_batch_tapped(
        &self,
        seqs: &mut [BatchRows<'_>],
        taps: &mut Taps,
    ) -> Result<BatchLogits> {
        if let Some(d) = &self.downstream {
            if seqs.len() > 1 && d.micro_batches.load(std::sync::atomic::Ordering::Relaxed) {
                if !taps.is_empty() {
                    return Err(specd_mlx::Exception(
                        "layer taps across pipeline ranks".into(),
                    ));
                }
                return self.forward_batch_halves(d, seqs);
            }
        }
        let (ids, spans) = self.batch_ids(seqs)?;
        let x = self.layers_batch_tapped(self.embedded(&ids)?, seqs, &spans, taps)?;
        self.batch_head(x, seqs, &spans)
    }

    /// The step's token ids `[T]` and each sequence's rows `(first, count)`.
    fn batch_ids(&self, seqs: &[BatchRows<'_>]) -> Result<(Array, Vec<(i32, i32)>)> {
        let n_layers = self.layer_count();
        let mut tokens = Vec::new();
        let mut spans = Vec::with_capacity(seqs.len());
        for s in seqs.iter() {
            assert!(!s.tokens.is_empty(), "every sequence brings rows");
            assert!(s.caches.len() >= n_layers, "one cache per layer");
            spans.push((tokens.len() as i32, s.tokens.len() as i32));
            tokens.extend_from_slice(s.tokens);
        }
        let t = tokens.len() as i32;
        Ok((Array::from_u32(&tokens, &[t])?, spans))
    }

    /// [`Llama::forward_batch`] on rank 0 of a pipeline, as two
    /// micro-batches: the second half's layers here run while the next
    /// rank runs the first half's, and the first half's head while it runs
    /// the second's. Every row is computed as in one batch (the kernels
    /// are batch-invariant), so the result is the same, bit for bit.
    fn forward_batch_halves(
        &self,
        d: &Downstream,
        seqs: &mut [BatchRows<'_>],
    ) -> Result<BatchLogits> {
        let io = |e: anyhow::Error| specd_mlx::Exception(format!("{e:#}"));
        // Halves of about equal rows, each at least one sequence.
        let total: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        let mut mid = 1;
        let mut rows = seqs[0].tokens.len();
        while mid + 1 < seqs.len() && 2 * (rows + seqs[mid].tokens.len()) <= total {
            rows += seqs[mid].tokens.len();
            mid += 1;
        }
        let (a, b) = seqs.split_at_mut(mid);
        let mut sent = Vec::with_capacity(2);
        for half in [&mut *a, &mut *b] {
            let (ids, spans) = self.batch_ids(half)?;
            let x =
                self.local_layers_batch(self.embedded(&ids)?, half, &spans, &mut Taps::default())?;
            let rows = half
                .iter_mut()
                .zip(&spans)
                .map(|(s, &(_, r))| (&mut *s.caches, r));
            sent.push((d.send(&x, rows).map_err(io)?, spans));
        }
        let mut outs = Vec::with_capacity(2);
        for (half, (x, spans)) in [&mut *a, &mut *b].into_iter().zip(sent) {
            let x = d.recv(x).map_err(io)?;
            let out = self.batch_head(x, half, &spans)?;
            // Computed now: the next rank works on the other half meanwhile.
            if let Some(l) = &out.logits {
                l.eval()?;
            }
            outs.push(out);
        }
        let (lb, la) = (outs.pop().expect("two"), outs.pop().expect("two"));
        let shift = la.logits.as_ref().map_or(0, |l| l.dim(0));
        let logits = match (la.logits, lb.logits) {
            (Some(x), Some(y)) => Some(ops::concatenate(&[&x, &y], 0)?),
            (x, y) => x.or(y),
        };
        let spans = la
            .spans
            .into_iter()
            .chain(lb.spans.into_iter().map(|s| s.map(|(f, n)| (f + shift, n))))
            .collect();
        Ok(BatchLogits {
            logits,
            spans,
            hidden: ops::concatenate(&[&la.hidden, &lb.hidden], 1)?,
        })
    }

    /// The head of [`Llama::forward_batch`] over the rows asked for, from
    /// the last layer's rows `x`.
    pub(crate) fn batch_head(
        &self,
        x: Array,
        seqs: &[BatchRows<'_>],
        spans: &[(i32, i32)],
    ) -> Result<BatchLogits> {
        let t = x.dim(1);
        let d = self.config.hidden_size as i32;
        // The head over the rows asked for only, in one matmul. Runs of
        // them that follow on are one slice: in a decode step every
        // sequence's last row is every row, so the head reads x as it is.
        let mut runs: Vec<(i32, i32)> = Vec::new();
        let mut spans_out = Vec::with_capacity(seqs.len());
        let mut rows = 0;
        for (s, &(a, n)) in seqs.iter().zip(spans) {
            let (from, len) = match s.logits {
                None => {
                    spans_out.push(None);
                    continue;
                }
                Some(Logits::All) => (a, n),
                Some(Logits::Last) => (a + n - 1, 1),
            };
            match runs.last_mut() {
                Some(r) if r.0 + r.1 == from => r.1 += len,
                _ => runs.push((from, len)),
            }
            spans_out.push(Some((rows, len)));
            rows += len;
        }
        if runs.is_empty() {
            return Ok(BatchLogits {
                logits: None,
                spans: spans_out,
                hidden: x,
            });
        }
        let run = |&(from, len): &(i32, i32)| x.slice(&[0, from, 0], &[1, from + len, d]);
        let h = match runs.as_slice() {
            [(0, n)] if *n == t => x.clone(),
            [one] => run(one)?,
            _ => {
                let picked = runs
                    .iter()
                    .map(run)
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                ops::concatenate(&picked.iter().collect::<Vec<_>>(), 1)?
            }
        }
        .reshape(&[rows, d])?;
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        Ok(BatchLogits {
            logits: Some(self.cap_logits(self.norm_linear(&h, &self.norm, head)?)?),
            spans: spans_out,
            hidden: x,
        })
    }

    /// Every layer of [`Llama::forward_batch`] over the rows `x`
    /// `[1, T, hidden]` (`spans[s]` are sequence `s`'s): this process's,
    /// then, on rank 0 of a pipeline, the other ranks'.
    pub fn layers_batch(
        &self,
        x: Array,
        seqs: &mut [BatchRows<'_>],
        spans: &[(i32, i32)],
    ) -> Result<Array> {
        self.layers_batch_tapped(x, seqs, spans, &mut Taps::default())
    }

    fn layers_batch_tapped(
        &self,
        x: Array,
        seqs: &mut [BatchRows<'_>],
        spans: &[(i32, i32)],
        taps: &mut Taps,
    ) -> Result<Array> {
        let mut x = self.local_layers_batch(x, seqs, spans, taps)?;
        if self.downstream.is_some() {
            let n = self.layer_count();
            let rows = seqs
                .iter_mut()
                .zip(spans)
                .map(|(s, &(_, r))| (&mut *s.caches, r));
            x = self.downstream(n, &x, rows)?;
        }
        Ok(x)
    }

    /// The layers this process holds, of [`Llama::layers_batch`].
    fn local_layers_batch(
        &self,
        mut x: Array,
        seqs: &mut [BatchRows<'_>],
        spans: &[(i32, i32)],
        taps: &mut Taps,
    ) -> Result<Array> {
        for (j, layer) in self.layers.iter().enumerate() {
            let i = self.first_layer + j;
            taps.offer(i, &x);
            x = match &layer.kind {
                LayerKind::Gemma3(g) => {
                    let mut parts: Vec<_> = seqs
                        .iter_mut()
                        .zip(spans)
                        .map(|(s, &span)| (&mut s.caches[i], span))
                        .collect();
                    gemma3::layer(self, i, layer, g, &x, &mut parts, &mut no_probe)?
                }
                LayerKind::Gemma2(g) => {
                    let mut parts: Vec<_> = seqs
                        .iter_mut()
                        .zip(spans)
                        .map(|(s, &span)| (&mut s.caches[i], span))
                        .collect();
                    gemma2::layer(self, i, layer, g, &x, &mut parts, &mut no_probe)?
                }
                LayerKind::Llama => self.layer_batch(layer, &x, i, seqs, spans)?,
            };
        }
        taps.offer(self.local_end(), &x);
        Ok(x)
    }

    /// The layers after this process's, on the ranks that hold them.
    fn downstream<'a>(
        &self,
        n_layers: usize,
        x: &Array,
        seqs: impl Iterator<Item = (&'a mut [Box<dyn LayerCache>], i32)>,
    ) -> Result<Array> {
        let d = match &self.downstream {
            Some(d) if n_layers == self.layer_count() => d,
            _ => {
                return Err(specd_mlx::Exception(format!(
                    "layers {}..{n_layers} are not held by this process",
                    self.local_end()
                )))
            }
        };
        d.forward(x, seqs)
            .map_err(|e| specd_mlx::Exception(format!("{e:#}")))
    }

    /// Layer `li` of [`Llama::forward_batch`]: the norm + q/k/v matmul over
    /// every row (with the rope folded in at each row's own position where
    /// the weights are packed), then the cache writes and attention (one op
    /// for all the sequences where their caches are plain, per sequence
    /// otherwise), then the rest of the layer over every row again.
    fn layer_batch(
        &self,
        l: &Layer,
        x: &Array,
        li: usize,
        seqs: &mut [BatchRows<'_>],
        spans: &[(i32, i32)],
    ) -> Result<Array> {
        let c = &self.config;
        let t = x.dim(1);
        let (nh, nkv, hd) = self.head_counts();
        let (nq, nk) = (nh * hd, nkv * hd);
        let cols = |y: &Array, a: i32, n: i32| y.slice(&[0, 0, a], &[1, t, a + n]);
        let heads = |y: &Array, n: i32| y.reshape(&[1, y.dim(1), n, hd])?.transpose(&[0, 2, 1, 3]);
        let mut outs = Vec::with_capacity(seqs.len());
        let positions = || -> Vec<i32> {
            seqs.iter()
                .zip(spans)
                .flat_map(|(s, &(_, n))| {
                    let o = s.caches[li].offset() as i32;
                    o..o + n
                })
                .collect()
        };
        if let Some(f) = self.fused_qkv(l) {
            // The rope folded into the matmul, each row at its own
            // sequence's position: the solo forward's op and rounding.
            let y = f.forward_normed_rope_rows(
                x,
                &l.attn_norm,
                c.rms_norm_eps,
                self.rope(0),
                &positions(),
            )?;
            let n_seqs = seqs.len();
            let mut kvs: Vec<&mut KvCache> = seqs
                .iter_mut()
                .filter_map(|s| s.caches[li].as_kv())
                .collect();
            if kvs.len() == n_seqs && self.kv_rows {
                // Every cache a plain one: all the sequences' cache writes
                // and attention in one op, as alone (`layer`).
                let rows: Vec<i32> = spans.iter().map(|&(_, n)| n).collect();
                return self.attention_and_rest(l, &y, x, &mut kvs, &rows, &mut no_probe);
            }
            drop(kvs);
            let (q, k, v) = (cols(&y, 0, nq)?, cols(&y, nq, nk)?, cols(&y, nq + nk, nk)?);
            for (s, &(a, n)) in seqs.iter_mut().zip(spans) {
                let rows = |y: &Array| y.slice(&[0, a, 0], &[1, a + n, y.dim(2)]);
                let (qs, ks, vs) = (
                    heads(&rows(&q)?, nh)?,
                    heads(&rows(&k)?, nkv)?,
                    heads(&rows(&v)?, nkv)?,
                );
                let (kc, vc) = s.caches[li].update(&ks, &vs)?;
                outs.push(self.windowed_attention(&qs, &kc, &vc, self.window(li))?);
            }
        }
        if outs.is_empty() {
            let (q, k, v) = self.qkv_rows(l, x, &mut no_probe)?;
            for (s, &(a, n)) in seqs.iter_mut().zip(spans) {
                let rows = |y: &Array| y.slice(&[0, a, 0], &[1, a + n, y.dim(2)]);
                let cache = &mut s.caches[li];
                let offset = cache.offset() as i32;
                // Rope per sequence, at its own positions.
                let qs = self.rope_heads(&rows(&q)?, nh, offset)?;
                let ks = self.rope_heads(&rows(&k)?, nkv, offset)?;
                let vs = heads(&rows(&v)?, nkv)?;
                let (kc, vc) = cache.update(&ks, &vs)?;
                outs.push(self.windowed_attention(&qs, &kc, &vc, self.window(li))?);
            }
        }
        let o = if outs.len() == 1 {
            outs.pop().expect("one")
        } else {
            ops::concatenate(&outs.iter().collect::<Vec<_>>(), 1)?
        };
        self.layer_rest(l, &o, x, &mut no_probe)
    }

    /// Every weight, for evaluation after loading.
    pub fn weights(&self) -> Vec<&Array> {
        let mut w = self.embed.arrays();
        w.push(&self.norm);
        if let Some(h) = &self.lm_head {
            w.extend(h.arrays());
        }
        for l in &self.layers {
            w.extend([&l.attn_norm, &l.ffn_norm]);
            w.extend(
                [&l.qkv_bias, &l.o_bias, &l.q_norm, &l.k_norm]
                    .into_iter()
                    .flatten(),
            );
            for lin in [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down] {
                w.extend(lin.arrays());
            }
            for lin in l.qkv.iter().chain(&l.gate_up) {
                w.extend(lin.arrays());
            }
            if let LayerKind::Gemma3(p) | LayerKind::Gemma2(p) = &l.kind {
                w.extend([&p.attn, &p.ffn]);
            }
        }
        w
    }
}

/// A fused gate/up matmul's output `[1, T, 2 n]` as its gate and up halves.
pub(super) fn halves(y: &Array) -> Result<(Array, Array)> {
    let (t, n) = (y.dim(1), y.dim(2) / 2);
    Ok((
        y.slice(&[0, 0, 0], &[1, t, n])?,
        y.slice(&[0, 0, n], &[1, t, 2 * n])?,
    ))
}
