//! A llama-family model in the shape of mlx-lm's llama.py and ollama's
//! model interface, with three verbs: [`Llama::embed`] (token ids to rows),
//! [`Llama::layers`] (a range of layers over a batch of one or more
//! sequences, writing their caches, with an [`Outputs`] record for taps and
//! probes) and [`Llama::unembed`] (the final norm and the vocabulary head
//! over the rows asked for). A lone request is a batch of one.
//!
//! One layer implementation per architecture kind ([`LayerKind`]): the
//! llama family ([`layer`]), Gemma 2 and 3 ([`gemma3`], with Gemma 2's
//! capped attention op from [`gemma2`]) and OLMo 2 ([`olmo2`]); each picks
//! its fused ops from the weights and the [`ForwardFlags`] set once at
//! load. Where attention runs per sequence, every kind runs the one path
//! [`Llama::attend_each`] with its op ([`AttnOp`]) and rope base; the
//! q/k/v rows come from [`Llama::qkv_rows`] with the kind's q/k norm
//! ([`QkNorm`]). Adding an architecture is a file with its layer and an
//! arm in [`Llama::layers`]' match. Where the layers run across pipeline ranks is
//! not the model's business: `crate::ranks::Pipeline` wraps it.
//!
//! Two weight paths: quantized (the file's 4/8-bit blocks kept as they are,
//! multiplied by specd's batch-invariant kernels, attention by specd's
//! kernel too) and float32 (dequantized at load, MLX's BLAS matmul and fused
//! attention). See [`crate::WeightMode`].
pub mod attention;
pub mod batch;
pub mod flags;
pub mod gemma2;
pub mod gemma3;
pub mod layer;
pub mod olmo2;
pub mod phi3;
pub mod rope;

pub use self::attention::{AttnOp, QkNorm};
pub(crate) use self::batch::SeqSpan;
pub use self::batch::{ids, no_probe, spans, Logits, Outputs, Probe, Seq, Taps, Unembedded, Want};
pub use self::flags::ForwardFlags;
use self::gemma3::PostNorms;
use crate::cache::{KvCache, LayerCache, RotatingCache};
use crate::linear::{fuse_packed, Linear};
use crate::LlamaConfig;
use specd_mlx::{ops, Array, Result};
use std::ops::Range;

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
    /// Whether q and k are rotated: false on SmolLM3's NoPE layers
    /// ([`crate::config::LlamaConfig::no_rope_layers`]), whose q/k/v matmul
    /// then never takes the rope folded in.
    pub rope: bool,
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
    /// OLMo 2 ([`olmo2`]): the layer's `attn_norm` and `ffn_norm` applied
    /// after attention and the MLP (none before), q/k norms over the whole
    /// projection, attention per sequence.
    Olmo2,
}

impl LayerKind {
    /// How the kind norms q and k where its layers have q/k norms.
    pub fn qk_norm(&self) -> QkNorm {
        match self {
            LayerKind::Olmo2 => QkNorm::Whole,
            _ => QkNorm::Heads,
        }
    }
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
    /// This process's layers: all of them, or one pipeline rank's part.
    pub layers: Vec<Layer>,
    pub norm: Array,
    /// `None` when the head is tied to the embedding.
    pub lm_head: Option<Linear>,
    /// Which of two implementations the layers run (set once at load).
    pub flags: ForwardFlags,
    /// The index of `layers[0]` in the whole model: 0, or where this
    /// process's part of a pipeline starts.
    pub first_layer: usize,
}

impl Llama {
    /// Bytes of KV cache one token takes, every layer: float32 keys and
    /// values, or f16 where the caches are 16-bit ([`ForwardFlags::kv_half`],
    /// the fused path's caches; the per-sequence ops keep float32).
    pub fn kv_bytes_per_token(&self) -> usize {
        let bytes = if self.flags.kv_half && self.fused_attention() {
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
        self.flags.kv_rows
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

    /// Fresh caches, one per layer, held here.
    pub fn new_caches(&self) -> Vec<Box<dyn LayerCache>> {
        self.new_caches_n(self.layer_count())
    }

    /// Fresh caches for the first `n` layers, held here: rotating where the
    /// model attends through a sliding window.
    pub fn new_caches_n(&self, n: usize) -> Vec<Box<dyn LayerCache>> {
        (0..n).map(|i| self.new_cache(i)).collect()
    }

    /// A fresh cache for layer `i`, held here.
    pub fn new_cache(&self, i: usize) -> Box<dyn LayerCache> {
        match self.config.sliding_window {
            Some(w) if self.config.is_local(i) => Box::new(RotatingCache::new(w)),
            _ => Box::new(KvCache::new()),
        }
    }

    /// The embedding rows of token ids `[T]` (uint32, [`ids`]), as
    /// `[1, T, hidden]` (scaled by sqrt(hidden) for Gemma 2 and 3, by
    /// Granite's embedding multiplier).
    pub fn embed(&self, ids: &Array) -> Result<Array> {
        let x = self
            .embed
            .rows(ids)?
            .reshape(&[1, ids.dim(0), self.config.hidden_size as i32])?;
        let Some(scale) = self.config.embedding_scale() else {
            return Ok(x);
        };
        ops::multiply(&x, &Array::scalar(scale)?)
    }

    /// The layers `range` (indices in the whole model, all held here) over
    /// the rows `x` `[1, T, hidden]` of the sequences `seqs`, in order, each
    /// after what its caches hold. The matmuls run over every row at once
    /// (the weights stream once per step); rope and attention per sequence,
    /// at its own positions over its own caches. With
    /// [`Llama::batch_invariant`] weights each sequence's rows are bitwise
    /// those of a forward of it alone. Keeps the rows at the boundaries
    /// `out.taps` asks for and shows each part to its probe.
    pub fn layers(
        &self,
        range: Range<usize>,
        mut x: Array,
        seqs: &mut [Seq<'_>],
        out: &mut Outputs<'_>,
    ) -> Result<Array> {
        if range.start < self.first_layer || range.end > self.local_end() {
            return Err(specd_mlx::Exception(format!(
                "layers {}..{} are not all held by this process (it holds {}..{})",
                range.start,
                range.end,
                self.first_layer,
                self.local_end()
            )));
        }
        let spans = spans(seqs.iter().map(|s| s.rows));
        let total: i32 = seqs.iter().map(|s| s.rows).sum();
        if total != x.dim(1) || seqs.iter().any(|s| s.rows < 1) {
            return Err(specd_mlx::Exception(format!(
                "{} rows for sequences of {:?} rows",
                x.dim(1),
                seqs.iter().map(|s| s.rows).collect::<Vec<_>>()
            )));
        }
        let (taps, probe) = out.parts();
        for i in range.clone() {
            let layer = &self.layers[i - self.first_layer];
            taps.offer(i, &x);
            let mut parts: Vec<SeqSpan<'_>> = seqs
                .iter_mut()
                .zip(&spans)
                .map(|(s, &span)| (&mut s.caches[i], span))
                .collect();
            x = match &layer.kind {
                LayerKind::Llama => self.llama_layer(i, layer, &x, &mut parts, probe)?,
                LayerKind::Gemma3(p) => {
                    gemma3::layer(self, i, layer, p, AttnOp::Plain, &x, &mut parts, probe)?
                }
                LayerKind::Gemma2(p) => {
                    gemma3::layer(self, i, layer, p, AttnOp::Capped, &x, &mut parts, probe)?
                }
                LayerKind::Olmo2 => olmo2::layer(self, i, layer, &x, &mut parts, probe)?,
            };
        }
        taps.offer(range.end, &x);
        Ok(x)
    }

    /// The final norm and the vocabulary head over the rows of `x`
    /// `[1, T, hidden]` that `wants` asks for (sequence s's rows being the
    /// s-th run of `wants[s].rows`), in one matmul.
    pub fn unembed(&self, x: &Array, wants: &[Want], out: &mut Outputs<'_>) -> Result<Unembedded> {
        let t = x.dim(1);
        let d = self.config.hidden_size as i32;
        // Runs of asked rows that follow on are one slice: in a decode step
        // every sequence's last row is every row, so the head reads x as it
        // is.
        let mut runs: Vec<(i32, i32)> = Vec::new();
        let mut spans_out = Vec::with_capacity(wants.len());
        let mut rows = 0;
        for (w, (a, n)) in wants.iter().zip(spans(wants.iter().map(|w| w.rows))) {
            let (from, len) = match w.logits {
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
            return Ok(Unembedded {
                logits: None,
                spans: spans_out,
                hidden: x.clone(),
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
        let logits = self.cap_logits(self.norm_linear(&h, &self.norm, head)?)?;
        (out.parts().1)("final norm + lm head", &[&logits])?;
        Ok(Unembedded {
            logits: Some(logits),
            spans: spans_out,
            hidden: x.clone(),
        })
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
