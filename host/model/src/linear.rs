//! Weights as a forward multiplies them: dense float32, or quantized (MLX's
//! affine layout as loaded, repacked once for specd's CPU kernels, and
//! several layers fused into one packed matmul).  The model file only says
//! which linears it has and which it fuses.
use specd_mlx::kernels::{self, Packing};
use specd_mlx::{ops, Array, Dtype, Result};

/// How a model's weights are held and multiplied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightMode {
    /// Quantized tensors stay quantized; specd's kernels (batch-invariant:
    /// greedy speculation equals plain decoding bit for bit).
    #[default]
    Quantized,
    /// Everything dequantized to float32 at load; MLX's matmul and attention.
    F32,
    /// As `Quantized`, and each matmul quantizes its activations to 8 bits
    /// per 32-value block (`qmm.h`), so the dot products run as exact
    /// integer sums (AVX-512 VNNI, or AVX2 `vpmaddubsw`): several times
    /// fewer instructions per row, the same batch invariance; the logits
    /// move (11-18% relative L2 on the default model, docs/benchmarks.md).
    Int8,
}

impl WeightMode {
    pub fn parse(s: &str) -> std::result::Result<WeightMode, String> {
        match s {
            "quantized" | "q" => Ok(WeightMode::Quantized),
            "f32" | "fp32" | "float32" => Ok(WeightMode::F32),
            "int8" => Ok(WeightMode::Int8),
            _ => Err(format!(
                "unknown weights mode {s:?} (use quantized, int8 or f32)"
            )),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            WeightMode::Quantized => "quantized",
            WeightMode::F32 => "f32",
            WeightMode::Int8 => "int8",
        }
    }
    /// Whether quantized weights stay quantized (run on specd's kernels).
    pub fn quantized(self) -> bool {
        self != WeightMode::F32
    }
}

/// Whose kernels run the forward (`--kernels`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernels {
    /// specd's batch-invariant CPU kernels (x86-64 AVX2/AVX-512, scalar
    /// elsewhere) on its packed layout: greedy speculation equals plain
    /// decoding bit for bit. CPU builds only.
    Specd,
    /// MLX's own ops only (quantized matmul on MLX's layout, `fast::`
    /// norms, rope and attention), on whatever device MLX picks: the path
    /// CUDA and Metal builds run, here on the CPU. Not batch-invariant:
    /// greedy speculation may differ from plain decoding at near-ties.
    Mlx,
}

impl Kernels {
    /// This build's default: MLX's ops on GPU builds (CUDA, Metal: only
    /// MLX's ops run there), specd's elsewhere.
    pub fn default_for_build() -> Kernels {
        if specd_mlx::GPU_BUILD {
            Kernels::Mlx
        } else {
            Kernels::Specd
        }
    }
    pub fn parse(s: &str) -> std::result::Result<Kernels, String> {
        match s {
            "specd" => Ok(Kernels::Specd),
            "mlx" => Ok(Kernels::Mlx),
            _ => Err(format!("unknown kernels {s:?} (use specd or mlx)")),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Kernels::Specd => "specd",
            Kernels::Mlx => "mlx",
        }
    }
    /// Whether these kernels can run `weights` in this build: a clear
    /// message where not.
    pub fn check(self, weights: WeightMode) -> std::result::Result<(), String> {
        match (self, weights) {
            (Kernels::Specd, _) if specd_mlx::GPU_BUILD => Err(
                "--kernels specd: specd's kernels are CPU kernels; this build runs MLX on a GPU (use --kernels mlx)".into(),
            ),
            (Kernels::Mlx, WeightMode::Int8) => Err(
                "--weights int8 needs --kernels specd (8-bit activations are specd's kernels; MLX's quantized matmul takes float activations)".into(),
            ),
            _ => Ok(()),
        }
    }
    /// Makes the process run these kernels; before any model loads.
    pub fn install(self) {
        specd_mlx::kernels::set_mlx_ops(self == Kernels::Mlx);
    }
}

/// MLX's layout of affine-quantized weights: `w` `[out, in * bits / 32]`
/// uint32 with per-group `scales` and `biases` `[out, in / group]`: float16,
/// or float32 where float16 cannot hold them exactly (a GGUF K-quant's
/// `d * sc`; see [`super::ggml`]).
#[derive(Clone)]
pub struct QuantSource {
    pub w: Array,
    pub scales: Array,
    pub biases: Array,
}

/// A quantized weight `[out, in]`: MLX's layout, the CPU kernels' packed
/// layout, or both.
#[derive(Clone)]
pub struct QuantizedWeight {
    /// What MLX's kernels, dequantization and (on GPU) embedding lookups
    /// read. Dropped once packed, so the weights are held once.
    pub source: Option<QuantSource>,
    /// The same weights in the CPU kernels' layout ([`kernels::qpack`]),
    /// packed once at load; `None` on GPU, where MLX's kernels take `source`.
    pub packed: Option<Array>,
    pub out_features: i32,
    pub in_features: i32,
    pub group_size: i32,
    /// The value width (4 or 8).
    pub bits: i32,
    /// Scales and biases are float32 (the packed layout's `kScaleF32`).
    pub f32_scales: bool,
    /// Activations quantized to 8 bits in the matmul ([`WeightMode::Int8`]).
    pub int8_activations: bool,
}

/// The packed layout's flag for float32 scales (`qmm.h` `kScaleF32`),
/// or-ed into the kernels' `bits` argument.
const SCALE_F32: i32 = 256;
/// The kernels' flag for 8-bit activations (`qmm.h` `kActQ8`).
const ACT_Q8: i32 = 512;

fn missing(what: &str) -> specd_mlx::Exception {
    specd_mlx::Exception(format!(
        "{what}: this weight was packed into a fused layer (its own copy is gone)"
    ))
}

impl QuantizedWeight {
    pub fn new(src: QuantSource, group_size: i32, bits: i32) -> QuantizedWeight {
        QuantizedWeight {
            out_features: src.w.dim(0),
            in_features: src.w.dim(1) * 32 / bits,
            f32_scales: src.scales.dtype() == Dtype::Float32,
            source: Some(src),
            packed: None,
            group_size,
            bits,
            int8_activations: false,
        }
    }
    /// The packed kernels' weight arguments: the packed weights and their
    /// layout (the output features, the group size and `bits`, the value
    /// width with the float32-scales and 8-bit-activation flags); `None`
    /// where not packed.
    fn packed(&self) -> Option<(&Array, Packing)> {
        let bits = self.bits
            | if self.f32_scales { SCALE_F32 } else { 0 }
            | if self.int8_activations { ACT_Q8 } else { 0 };
        let p = self.packed.as_ref()?;
        Some((
            p,
            Packing {
                n: self.out_features,
                group_size: self.group_size,
                bits,
            },
        ))
    }
    pub fn out_features(&self) -> i32 {
        self.out_features
    }
    pub fn in_features(&self) -> i32 {
        self.in_features
    }
    fn source(&self, what: &str) -> Result<&QuantSource> {
        self.source.as_ref().ok_or_else(|| missing(what))
    }
    /// Packs the weights for the CPU kernels, keeping MLX's layout only
    /// with `keep_source`.
    pub fn pack(self, keep_source: bool) -> Result<QuantizedWeight> {
        let packed = match &self.packed {
            Some(p) => p.clone(),
            None => {
                let src = self.source("packing")?;
                kernels::qpack(&src.w, &src.scales, &src.biases, self.group_size, self.bits)?
            }
        };
        Ok(QuantizedWeight {
            packed: Some(packed),
            source: if keep_source { self.source } else { None },
            ..self
        })
    }
    /// `forward(rms_norm(x, norm, eps))` in one op where packed (the norm as
    /// `kernels::rms_norm` rounds it).
    pub fn forward_normed(&self, x: &Array, norm: &Array, eps: f32) -> Result<Array> {
        match self.packed() {
            Some((p, k)) => kernels::qmatmul_packed_norm(x, norm, eps, p, k),
            None => self.forward(&kernels::rms_norm(x, norm, eps)?),
        }
    }
    /// The packed weights' arguments, which a rope folded into the matmul
    /// needs.
    fn packed_for_rope(&self) -> Result<(&Array, Packing)> {
        self.packed().ok_or_else(|| {
            specd_mlx::Exception("a rope folded into a matmul needs packed weights".into())
        })
    }
    /// [`QuantizedWeight::forward_normed`] with the leading output columns
    /// rotated as `rope` says, in the same op. Packed weights only.
    pub fn forward_normed_rope(
        &self,
        x: &Array,
        norm: &Array,
        eps: f32,
        rope: kernels::RopeSpec<'_>,
    ) -> Result<Array> {
        let (p, k) = self.packed_for_rope()?;
        kernels::qmatmul_packed_norm_rope(x, norm, eps, p, k, rope)
    }
    /// [`QuantizedWeight::forward_normed_rope`] over the rows of several
    /// sequences: row t rotated for `positions[t]` (`rope.offset` unused).
    pub fn forward_normed_rope_rows(
        &self,
        x: &Array,
        norm: &Array,
        eps: f32,
        rope: kernels::RopeSpec<'_>,
        positions: &[i32],
    ) -> Result<Array> {
        let (p, k) = self.packed_for_rope()?;
        kernels::qmatmul_packed_norm_rope_rows(x, norm, eps, p, k, rope, positions)
    }
    /// `residual + forward(swiglu(g, u))` (`gelu`: geglu; no residual:
    /// the product alone) in one op, for `gu` holding g and u side by
    /// side; `None` where the weights are not packed (the caller runs the
    /// separate ops).
    pub fn forward_glu(
        &self,
        gu: &Array,
        residual: Option<&Array>,
        gelu: bool,
    ) -> Option<Result<Array>> {
        let (p, k) = self.packed()?;
        Some(match residual {
            Some(r) => kernels::qmatmul_packed_glu_add(gu, p, k, r, gelu),
            None => kernels::qmatmul_packed_glu(gu, p, k, gelu),
        })
    }
    /// `residual + forward(x)`, in one op where packed.
    pub fn forward_add(&self, x: &Array, residual: &Array) -> Result<Array> {
        match self.packed() {
            Some((p, k)) => kernels::qmatmul_packed_add(x, p, k, residual),
            None => ops::add(residual, &self.forward(x)?),
        }
    }
    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self.packed() {
            Some((p, k)) => kernels::qmatmul_packed(x, p, k),
            None => {
                let src = self.source("forward")?;
                kernels::qmatmul(
                    x,
                    &src.w,
                    &src.scales,
                    &src.biases,
                    self.group_size,
                    self.bits,
                )
            }
        }
    }
    /// Rows `ids` dequantized to float32 (an embedding lookup).
    pub fn rows(&self, ids: &Array) -> Result<Array> {
        if let Some((p, k)) = self.packed() {
            return kernels::qrows_packed(p, ids, k);
        }
        let src = self.source("embedding lookup")?;
        let f = |a: &Array| -> Result<Array> { ops::take(a, ids, 0)?.as_type(Dtype::Float32) };
        ops::dequantize(
            &ops::take(&src.w, ids, 0)?,
            &f(&src.scales)?,
            &f(&src.biases)?,
            self.group_size,
            self.bits,
        )
    }
    fn arrays(&self) -> Vec<&Array> {
        let mut v: Vec<&Array> = self
            .source
            .iter()
            .flat_map(|s| [&s.w, &s.scales, &s.biases])
            .collect();
        v.extend(&self.packed);
        v
    }
}

/// A linear layer, `y = x W^T` with `W` as `[out, in]`.
#[derive(Clone)]
pub enum Linear {
    Dense(Array),
    Quantized(QuantizedWeight),
}

impl Linear {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            Linear::Dense(w) => ops::matmul(x, &w.t()?),
            Linear::Quantized(q) => q.forward(x),
        }
    }
    /// `[residual +] forward(swiglu(g, u))` in one op where the weights
    /// are packed ([`QuantizedWeight::forward_glu`]); `None` elsewhere.
    pub fn forward_glu(
        &self,
        gu: &Array,
        residual: Option<&Array>,
        gelu: bool,
    ) -> Option<Result<Array>> {
        match self {
            Linear::Dense(_) => None,
            Linear::Quantized(q) => q.forward_glu(gu, residual, gelu),
        }
    }
    /// Packed weights' arguments to the kernels (the array, out features,
    /// group size, bits with their flags); `None` unless quantized and packed.
    pub fn packed(&self) -> Option<(&Array, Packing)> {
        match self {
            Linear::Dense(_) => None,
            Linear::Quantized(q) => q.packed(),
        }
    }
    /// `residual + forward(x)` (a residual connection).
    pub fn forward_add(&self, x: &Array, residual: &Array) -> Result<Array> {
        match self {
            Linear::Dense(_) => ops::add(residual, &self.forward(x)?),
            Linear::Quantized(q) => q.forward_add(x, residual),
        }
    }
    pub fn is_quantized(&self) -> bool {
        matches!(self, Linear::Quantized(_))
    }
    /// Quantized weights packed for the CPU kernels (MLX's layout kept only
    /// with `keep_source`); dense ones as they are.
    pub fn pack(self, keep_source: bool) -> Result<Linear> {
        Ok(match self {
            Linear::Quantized(q) => Linear::Quantized(q.pack(keep_source)?),
            other => other,
        })
    }
    /// Drops MLX's layout of a quantized weight that a fused layer now
    /// computes (only its shape is still asked for).
    pub(crate) fn release(&mut self) {
        if let Linear::Quantized(q) = self {
            q.source = None;
        }
    }
    /// One layer computing `parts` side by side (their outputs concatenated
    /// in order), when all are quantized alike over the same inputs: one
    /// matmul instead of several, with more columns to share out among threads.
    pub fn fuse(parts: &[&Linear]) -> Result<Option<Linear>> {
        let qs: Vec<&QuantizedWeight> = parts
            .iter()
            .filter_map(|l| match l {
                Linear::Quantized(q) => Some(q),
                Linear::Dense(_) => None,
            })
            .collect();
        let Some(first) = qs.first() else {
            return Ok(None);
        };
        let alike = |q: &&QuantizedWeight| {
            q.bits == first.bits
                && q.f32_scales == first.f32_scales
                && q.int8_activations == first.int8_activations
                && q.group_size == first.group_size
                && q.in_features() == first.in_features()
        };
        if qs.len() != parts.len() || !qs.iter().all(alike) {
            return Ok(None);
        }
        let sources = qs
            .iter()
            .map(|q| q.source("fusing"))
            .collect::<Result<Vec<_>>>()?;
        let cat = |f: fn(&QuantSource) -> &Array| -> Result<Array> {
            ops::concatenate(&sources.iter().map(|s| f(s)).collect::<Vec<_>>(), 0)
        };
        let src = QuantSource {
            w: cat(|s| &s.w)?,
            scales: cat(|s| &s.scales)?,
            biases: cat(|s| &s.biases)?,
        };
        let mut fused = QuantizedWeight::new(src, first.group_size, first.bits);
        fused.int8_activations = first.int8_activations;
        Ok(Some(Linear::Quantized(fused)))
    }
    /// `[out, in]`.
    pub fn shape(&self) -> [i32; 2] {
        match self {
            Linear::Dense(w) => [w.dim(0), w.dim(1)],
            Linear::Quantized(q) => [q.out_features(), q.in_features()],
        }
    }
    /// Rows of the weight as float32 (for a tied embedding).
    pub fn rows(&self, ids: &Array) -> Result<Array> {
        match self {
            Linear::Dense(w) => ops::take(w, ids, 0),
            Linear::Quantized(q) => q.rows(ids),
        }
    }
    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            Linear::Dense(w) => vec![w],
            Linear::Quantized(q) => q.arrays(),
        }
    }
}

/// `parts` as one packed layer, their own copies released; else each
/// packed on its own.
pub(crate) fn fuse_packed(parts: &mut [&mut Linear]) -> Result<Option<Linear>> {
    let fused = Linear::fuse(&parts.iter().map(|p| &**p).collect::<Vec<_>>())?;
    for p in parts.iter_mut() {
        if fused.is_some() {
            p.release();
        } else {
            **p = p.clone().pack(false)?;
        }
    }
    fused.map(|f| f.pack(false)).transpose()
}
