//! specd's own CPU kernels (MLX primitives in `kernels.cc`). Each output
//! row is computed by the same float operations whatever the number of rows
//! in the call, so a k-row verify rounds exactly like k one-row steps. On a
//! GPU device they fall back to MLX's own ops.
use crate::array::wrap;
use crate::bridge::ffi;
use crate::{Array, Result};

pub use crate::bridge::ffi::Packing;

impl Packing {
    pub fn new(n: i32, group_size: i32, bits: i32) -> Packing {
        Packing {
            n,
            group_size,
            bits,
        }
    }
}

shim_fns! {
/// `x @ dequantize(w)^T` over MLX affine-quantized weights `w`
/// (`[out, in * bits / 32]` uint32, 4 or 8 bits), with float16 `scales`
/// and `biases` (`[out, in / group_size]`); `x` is `[..., in]`, the result
/// float32 `[..., out]`. On CPU this packs the weights on every call: a
/// model packs once with [`qpack`] and calls [`qmatmul_packed`].
pub fn qmatmul(x: &Array, w: &Array, scales: &Array, biases: &Array, group_size: i32, bits: i32);
/// The CPU kernels' layout of MLX affine-quantized weights (16 output
/// columns to a vector; see `qmm.h`), computed now: pack once at load.
/// Float32 `scales` and `biases` give the float32-scale layout: the packed
/// calls then take `bits | 256` (`qmm.h` `kScaleF32`). Groups are 16k.
pub fn qpack(w: &Array, scales: &Array, biases: &Array, group_size: i32, bits: i32);
/// Rows `ids` (1-D integers) of `n` packed weight rows, dequantized to
/// float32 `[len(ids), in]`: an embedding lookup. An id past `n` gives
/// a zero row. CPU only.
pub fn qrows_packed(packed: &Array, ids: &Array, packing: Packing);
/// [`qmatmul`] over weights packed by [`qpack`]; `n` is the number of
/// output features. CPU only.
pub fn qmatmul_packed(x: &Array, packed: &Array, packing: Packing);
/// `residual + qmatmul_packed(x, ...)` in one op (the sum rounds as
/// `ops::add` would); `residual` is shaped like the output. CPU only.
pub fn qmatmul_packed_add(
    x: &Array, packed: &Array, packing: Packing, residual: &Array,
);
/// `residual + qmatmul_packed(swiglu(g, u), ...)` in one op, where `gu`
/// holds the gate and up halves side by side (`[..., 2 K]`, as a fused
/// gate/up matmul gives them); `gelu`: [`geglu`] instead. Bitwise the
/// separate ops. CPU only.
pub fn qmatmul_packed_glu_add(
    gu: &Array, packed: &Array, packing: Packing, residual: &Array, gelu: bool,
);
/// [`qmatmul_packed_glu_add`] without the residual (Gemma's post-MLP norm
/// comes between the matmul and its residual). CPU only.
pub fn qmatmul_packed_glu(gu: &Array, packed: &Array, packing: Packing, gelu: bool);
/// `qmatmul_packed(rms_norm(x, norm_w, eps), ...)` in one op (the norm
/// rounds as [`rms_norm`] does). CPU only.
pub fn qmatmul_packed_norm(
    x: &Array, norm_w: &Array, eps: f32, packed: &Array, packing: Packing,
);
}
/// How [`qmatmul_packed_norm_rope`] rotates its output.
#[derive(Debug, Clone, Copy)]
pub struct RopeSpec<'a> {
    /// Output columns `[0, cols)` are rotated, in heads of `head_dim`.
    pub cols: i32,
    pub head_dim: i32,
    pub traditional: bool,
    pub base: f32,
    /// Position of the first row.
    pub offset: i32,
    /// Divisors of the frequencies, one per rotated pair (none: plain
    /// rope), as [`rope_heads`] takes them.
    pub factors: &'a [f32],
}
/// [`qmatmul_packed_norm`] with [`rope_heads`] applied to the leading
/// output columns (q and k of a fused q/k/v), in the same op and
/// rounding as `rope_heads` does; `x` is one sequence `[1, T, in]`.
pub fn qmatmul_packed_norm_rope(
    x: &Array,
    norm_w: &Array,
    eps: f32,
    packed: &Array,
    packing: Packing,
    rope: RopeSpec<'_>,
) -> Result<Array> {
    // One sequence's rows are positions offset, offset + 1, ...: the rows
    // form with those positions (the same arithmetic per row).
    let t = x.shape().get(1).copied().unwrap_or(0);
    let positions: Vec<i32> = (rope.offset..rope.offset + t).collect();
    qmatmul_packed_norm_rope_rows(x, norm_w, eps, packed, packing, rope, &positions)
}
/// [`qmatmul_packed_norm_rope`] over the rows of several sequences: row t
/// is rotated for `positions[t]` (`rope.offset` is not used). The rotation
/// of a row is the same arithmetic as there, so a sequence's rows come out
/// as they do alone.
pub fn qmatmul_packed_norm_rope_rows(
    x: &Array,
    norm_w: &Array,
    eps: f32,
    packed: &Array,
    packing: Packing,
    rope: RopeSpec<'_>,
    positions: &[i32],
) -> Result<Array> {
    wrap(ffi::qmatmul_packed_norm_rope_rows(
        &x.0,
        &norm_w.0,
        eps,
        &packed.0,
        packing,
        rope.cols,
        rope.head_dim,
        rope.traditional,
        rope.base,
        positions,
        rope.factors,
    ))
}
/// `softmax(scale * q k^T) v` for `q` `[1, heads, T, d]` and `k`, `v`
/// `[1, kv_heads, L, d]` (grouped-query when heads > kv_heads), returned
/// heads last, `[1, T, heads, d]` (so `[1, T, heads * d]` is a free
/// reshape). With `causal`, query row t sees keys `0..=L - T + t`.
pub fn attention(q: &Array, k: &Array, v: &Array, scale: f32, causal: bool) -> Result<Array> {
    attention_capped(q, k, v, scale, causal, 0.0)
}
/// [`attention`] with soft-capped scores (Gemma 2's
/// `attn_logit_softcapping`): each score `s = scale q.k` becomes
/// `softcap * tanh(s / softcap)` before the mask and softmax; `softcap` 0
/// is [`attention`] itself, bit for bit. The cap is one scalar function on
/// every ISA, so rows stay bitwise those of the row alone. specd's CPU
/// kernels only (an error where MLX's ops run: MLX's fused attention has no
/// cap).
pub fn attention_capped(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    causal: bool,
    softcap: f32,
) -> Result<Array> {
    wrap(ffi::attention(&q.0, &k.0, &v.0, scale, causal, softcap))
}
/// One sequence's part of [`attention_kv_rows`].
pub struct KvRows<'a> {
    /// Its cache buffers `[1, kv_heads, cap, head_dim]` (made by
    /// [`kv_alloc`]), holding `offset` tokens; the call writes its new rows
    /// after them, in place.
    pub keys: &'a Array,
    pub values: &'a Array,
    pub offset: i32,
    /// Its rows in `y`, after those of the sequences before it.
    pub rows: i32,
}
/// The attention's heads: query heads, key/value heads (grouped-query
/// when fewer), each head's width, and the scores' scale.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub heads: i32,
    pub kv_heads: i32,
    pub head_dim: i32,
    pub scale: f32,
}
/// Attention of several sequences in one op (continuous batching). `y`
/// `[1, T, (heads + 2 * kv_heads) * head_dim]` holds every row's q, k, v
/// with the rope applied (the fused q/k/v matmul's output); each sequence's
/// new k/v rows go into its cache at `offset..` and each of its rows
/// attends causally over its own cache (row t sees keys `0..=offset + t`).
/// Returns the attention `[1, T, heads * head_dim]` and, per sequence, the
/// keys and values to keep: the same buffers, ordered after the write.
/// Each row rounds exactly as [`attention`] does and whatever the other
/// sequences are. The caller must own the buffers alone (nothing else may
/// read their old rows past `offset`). CPU only.
pub fn attention_kv_rows(
    y: &Array,
    seqs: &[KvRows<'_>],
    shape: AttnShape,
) -> Result<(Array, Vec<(Array, Array)>)> {
    let (caches, spans) = kv_lists(seqs);
    let AttnShape {
        heads,
        kv_heads,
        head_dim,
        scale,
    } = shape;
    let out = ffi::attention_kv_rows(&y.0, &caches, &spans, heads, kv_heads, head_dim, scale)
        .map_err(crate::Exception::from)?;
    let mut list = unlist(&out, 1, seqs.len(), "attention_kv_rows")?;
    let kv = pairs(list.split_off(1));
    Ok((list.pop().expect("one array"), kv))
}
/// A llama layer's weights after attention, every one packed: `W_o`, the
/// MLP's norm and its fused gate/up (`gate_up_n` wide) and down matmuls.
pub struct Tail<'a> {
    /// The packed weights of o, gate/up and down, and their layouts (the
    /// output features of o and down are the model's width, taken from `x`).
    pub w_o: &'a Array,
    pub o: Packing,
    pub norm_w: &'a Array,
    pub eps: f32,
    pub w_gate_up: &'a Array,
    pub gate_up: Packing,
    pub w_down: &'a Array,
    pub down: Packing,
    /// GeGLU between gate/up and down (else SwiGLU).
    pub gelu: bool,
}
/// A llama layer after attention in one op: `h = x + o W_o^T`, then
/// `h + down(swiglu(rms_norm(h, norm_w, eps) W_gate_up^T))` (`gelu`:
/// geglu). Bitwise [`qmatmul_packed_add`], [`qmatmul_packed_norm`] and
/// [`qmatmul_packed_glu_add`] one after another. CPU only.
pub fn layer_tail(o: &Array, x: &Array, t: &Tail<'_>) -> Result<Array> {
    wrap(ffi::layer_tail(
        &o.0,
        &x.0,
        &t.weights(),
        &t.params(),
        t.eps,
    ))
}
impl Tail<'_> {
    /// The weights as the shim takes them, in `layer_tail`'s order.
    fn weights(&self) -> cxx::UniquePtr<ffi::ArrayList> {
        crate::array::list([self.w_o, self.norm_w, self.w_gate_up, self.w_down])
    }
    /// The integers as the shim takes them, in `kernels.cc` `plan_tail`'s order.
    fn params(&self) -> [i32; 8] {
        [
            self.o.group_size,
            self.o.bits,
            self.gate_up.n,
            self.gate_up.group_size,
            self.gate_up.bits,
            self.down.group_size,
            self.down.bits,
            self.gelu as i32,
        ]
    }
}
/// What [`layer_kv_rows`] gives.
pub struct LayerRows {
    /// The layer's output, shaped as `x`.
    pub out: Array,
    /// The attention's output where it is an op of its own (`y` was
    /// evaluated first, as a profile's probe does); else `out` again.
    pub attention: Array,
    /// As [`attention_kv_rows`]'s.
    pub caches: Vec<(Array, Array)>,
}
/// A whole llama layer: [`attention_kv_rows`] of `y`, then [`layer_tail`]
/// of its output and `x` (the layer's input, whose q/k/v matmul made
/// `y`). Where that matmul has not been evaluated, all three are one op
/// (the same bits: the same calls on the same rows), else two. CPU only.
pub fn layer_kv_rows(
    y: &Array,
    seqs: &[KvRows<'_>],
    shape: AttnShape,
    x: &Array,
    t: &Tail<'_>,
) -> Result<LayerRows> {
    let (caches, spans) = kv_lists(seqs);
    let out = ffi::layer_kv_rows(
        &y.0,
        &caches,
        &spans,
        shape.heads,
        shape.kv_heads,
        shape.head_dim,
        shape.scale,
        &x.0,
        &t.weights(),
        &t.params(),
        t.eps,
    )
    .map_err(crate::Exception::from)?;
    let mut list = unlist(&out, 2, seqs.len(), "layer_kv_rows")?;
    let caches = pairs(list.split_off(2));
    let attention = list.pop().expect("two arrays");
    let out = list.pop().expect("two arrays");
    Ok(LayerRows {
        out,
        attention,
        caches,
    })
}
/// `seqs` as the FFI takes them: their caches (keys, values per sequence)
/// and their spans (offset, rows per sequence).
fn kv_lists(seqs: &[KvRows<'_>]) -> (cxx::UniquePtr<ffi::ArrayList>, Vec<i32>) {
    let caches = crate::array::list(seqs.iter().flat_map(|s| [s.keys, s.values]));
    let spans = seqs.iter().flat_map(|s| [s.offset, s.rows]).collect();
    (caches, spans)
}
/// The arrays of `out`: `front` of them, then a cache pair per sequence.
fn unlist(out: &ffi::ArrayList, front: usize, seqs: usize, what: &str) -> Result<Vec<Array>> {
    if ffi::list_len(out) != front + 2 * seqs {
        return Err(crate::Exception(format!(
            "{what}: {front} outputs and a cache pair per sequence"
        )));
    }
    (0..front + 2 * seqs)
        .map(|i| wrap(ffi::list_get(out, i)))
        .collect()
}
fn pairs(v: Vec<Array>) -> Vec<(Array, Array)> {
    let mut it = v.into_iter();
    std::iter::from_fn(|| Some((it.next()?, it.next()?))).collect()
}
/// A cache buffer `[1, heads, cap, dim]` of specd's own (contiguous,
/// float32, or float16 where `half`): the first `keep` positions of `old`
/// copied, the rest zero.
pub fn kv_alloc(
    old: Option<&Array>,
    keep: i32,
    heads: i32,
    cap: i32,
    dim: i32,
    half: bool,
) -> Result<Array> {
    let dummy;
    let (o, has) = match old {
        Some(o) => (o, true),
        None => {
            dummy = Array::scalar(0.0)?;
            (&dummy, false)
        }
    };
    wrap(ffi::kv_alloc(&o.0, has, keep, heads, cap, dim, half))
}
shim_fns! {
/// RMS norm over the last axis in one op (MLX's CPU `fast::rms_norm`
/// is its unfused fallback, several ops).
pub fn rms_norm(x: &Array, weight: &Array, eps: f32) as rms_norm_rows;
/// Rotary embedding of `x` `[B, T, heads, d]` (rows at positions
/// `offset..offset + T`), returned as `[B, heads, T, d]`: the reshape
/// to heads and the rope in one op. `factors` (one per rotated pair, or
/// none) divide the frequencies, as [`crate::fast::rope`]'s.
pub fn rope_heads(
    x: &Array, dims: i32, traditional: bool, base: f32, scale: f32, offset: i32, factors: &[f32],
);
/// `silu(g) * u` in one op.
pub fn swiglu(g: &Array, u: &Array);
/// `gelu_tanh(g) * u` in one op (Gemma's GeGLU).
pub fn geglu(g: &Array, u: &Array);
/// Per row of `logits` (its last axis), four float32s: the argmax (the
/// first index of the largest value; NaN never wins), that largest value,
/// the largest at any other index, and 1 where the row holds no NaN, else
/// 0 (the caller reads such a row and decides). The argmax and the two
/// values are bitwise what one scan of the row in index order keeps (the
/// host's `argmax_margin`), ties and signed zeros included; one pass over
/// each row, rows spread over the kernels' threads. On a GPU it is MLX's
/// ops, and a row whose largest value is not unique gets 0 too.
pub fn row_top2(logits: &Array);
}
/// [`row_top2`] over the rows of several arrays (every one's last axis of
/// the same length), in one op: `[rows, 4]`, the rows of `rows[0]` first.
/// A batched step's light parts take their statistics this way.
pub fn row_top2_list(rows: &[&Array]) -> Result<Array> {
    wrap(ffi::row_top2_list(&crate::array::list(
        rows.iter().copied(),
    )))
}
/// Threads the kernels use (`SPECD_THREADS`, default: all cores).
pub fn threads() -> i32 {
    ffi::kernel_threads()
}
/// Sets the kernels' thread count; only before their first use (the pool
/// is made once). False when it came too late or `n` is not positive.
pub fn set_threads(n: i32) -> bool {
    ffi::set_kernel_threads(n)
}
/// Makes every entry point here run MLX's own ops (quantized matmul on
/// MLX's layout, `fast::` norms, rope and attention, MLX's reductions), as
/// a GPU build does: the portable path (`--kernels mlx`). Set it before
/// loading a model (packed weights are refused from then on); it holds for
/// the whole process.
pub fn set_mlx_ops(on: bool) {
    ffi::set_mlx_ops(on)
}
/// Whether the entry points run MLX's own ops: [`set_mlx_ops`], or a GPU
/// as MLX's default device.
pub fn mlx_ops() -> bool {
    ffi::mlx_ops_only()
}
/// How many of specd's own ops this process has built: the portable path
/// builds none.
pub fn own_op_count() -> u64 {
    ffi::own_op_count()
}
/// The SIMD level chosen at run time: `avx512`, `avx2` or `scalar`
/// (`SPECD_KERNEL_ISA=avx2|scalar` forces a lower one).
pub fn isa() -> String {
    ffi::kernel_isa()
}
