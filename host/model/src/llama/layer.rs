//! The llama family's layer (llama, Mistral, Qwen2/3 with their biases and
//! q/k norms, Phi-3 after its load-time splits) over a batch of one or more
//! sequences: RMSNorm, GQA attention with RoPE, SwiGLU MLP. Which fused
//! ops run is chosen here, from the weights and the model's
//! [`super::ForwardFlags`]: a lone sequence runs the same ops as a batch,
//! so its rows round alike alone and batched.
use super::{halves, AttnOp, Layer, Llama, Probe, SeqSpan};
use crate::cache::KvCache;
use specd_mlx::{kernels, ops, Array, Result};

impl Llama {
    /// Layer `i` over the rows `x` `[1, T, hidden]`, `seqs[s]` being
    /// sequence s's cache of the layer and its rows (first, count): the
    /// norm + q/k/v matmul over every row (with the rope folded in at each
    /// row's own position where the weights are packed), then the cache
    /// writes and attention (one op for all the sequences where their
    /// caches are plain and `kv_rows` is on, per sequence otherwise), then
    /// the rest of the layer over every row again.
    pub(super) fn llama_layer(
        &self,
        i: usize,
        l: &Layer,
        x: &Array,
        seqs: &mut [SeqSpan<'_>],
        probe: &mut Probe<'_>,
    ) -> Result<Array> {
        let c = &self.config;
        let t = x.dim(1);
        let (nh, nkv, hd) = self.head_counts();
        let (nq, nk) = (nh * hd, nkv * hd);
        let cols = |y: &Array, a: i32, n: i32| y.slice(&[0, 0, a], &[1, t, a + n]);
        let o = if let Some(f) = self.fused_qkv(l) {
            // The rope folded into the matmul, each row at its own
            // sequence's position.
            let y = match &*seqs {
                [(cache, _)] => f.forward_normed_rope(
                    x,
                    &l.attn_norm,
                    c.rms_norm_eps,
                    self.rope(cache.offset() as i32),
                )?,
                _ => {
                    let positions: Vec<i32> = seqs
                        .iter()
                        .flat_map(|(cache, (_, n))| {
                            let o = cache.offset() as i32;
                            o..o + n
                        })
                        .collect();
                    f.forward_normed_rope_rows(
                        x,
                        &l.attn_norm,
                        c.rms_norm_eps,
                        self.rope(0),
                        &positions,
                    )?
                }
            };
            probe("norm + q/k/v matmuls + rope", &[&y])?;
            let n_seqs = seqs.len();
            let rows: Vec<i32> = seqs.iter().map(|&(_, (_, n))| n).collect();
            let mut kvs: Vec<&mut KvCache> =
                seqs.iter_mut().filter_map(|(c, _)| c.as_kv()).collect();
            if kvs.len() == n_seqs && self.flags.kv_rows {
                // Every cache a plain one: all the sequences' cache writes
                // and attention in one op.
                return self.attention_and_rest(l, &y, x, &mut kvs, &rows, probe);
            }
            drop(kvs);
            let (q, k, v) = (cols(&y, 0, nq)?, cols(&y, nq, nk)?, cols(&y, nq + nk, nk)?);
            // The rows are rotated already.
            self.attend_each(i, (&q, &k, &v), seqs, None, AttnOp::Plain, probe)?
        } else {
            let (q, k, v) = self.qkv_rows(l, x, Some(&l.attn_norm), probe)?;
            // None on a NoPE layer.
            let rope = l.rope.then_some(c.rope_theta);
            self.attend_each(i, (&q, &k, &v), seqs, rope, AttnOp::Plain, probe)?
        };
        self.layer_rest(l, &o, x, probe)
    }

    /// `silu(g) * u`.
    pub fn swiglu(&self, g: &Array, u: &Array) -> Result<Array> {
        if self.own_kernels {
            kernels::swiglu(g, u)
        } else {
            ops::multiply(&ops::silu(g)?, u)
        }
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
    pub(super) fn tail<'a>(&self, l: &'a Layer) -> Option<kernels::Tail<'a>> {
        if !(self.flags.fused_tail && self.own_kernels) || l.o_bias.is_some() {
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
    pub(super) fn attention_and_rest(
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
}
