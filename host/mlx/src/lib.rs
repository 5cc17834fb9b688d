//! Safe Rust over MLX's C++ API, shaped like mlx-rs (`Array`, ops, `fast::*`)
//! so model code reads like MLX code elsewhere. The C++ side is a thin shim
//! (`shim.cc`); C++ exceptions surface as [`Exception`].
//!
//! On Linux the build links OpenBLAS ahead of the wheel's reference BLAS:
//! MLX's CPU matmul then costs ~1.5x for 8 rows instead of ~8x (see
//! `specd bench blas`).

use std::fmt;

#[cxx::bridge(namespace = "specd_mlx")]
mod ffi {
    unsafe extern "C++" {
        include!("specd-mlx/src/shim.h");
        type Array;
        type ArrayList;
        type ArrayMap;

        fn from_f32(data: &[f32], shape: &[i32]) -> Result<UniquePtr<Array>>;
        fn from_i32(data: &[i32], shape: &[i32]) -> Result<UniquePtr<Array>>;
        fn from_u32(data: &[u32], shape: &[i32]) -> Result<UniquePtr<Array>>;
        fn scalar_f32(v: f32) -> Result<UniquePtr<Array>>;
        fn zeros(shape: &[i32], dtype: u8) -> Result<UniquePtr<Array>>;
        fn arange_i32(start: i32, stop: i32) -> Result<UniquePtr<Array>>;
        fn clone_array(x: &Array) -> UniquePtr<Array>;
        fn shape(x: &Array) -> Vec<i32>;
        fn dtype(x: &Array) -> u8;
        fn nbytes(x: &Array) -> usize;
        fn to_f32(x: &Array, out: &mut [f32]) -> Result<()>;
        fn to_i32(x: &Array, out: &mut [i32]) -> Result<()>;
        fn to_u32(x: &Array, out: &mut [u32]) -> Result<()>;

        fn new_list() -> UniquePtr<ArrayList>;
        fn list_push(l: Pin<&mut ArrayList>, x: &Array);
        fn eval(l: &ArrayList) -> Result<()>;
        fn async_eval(l: &ArrayList) -> Result<()>;
        fn eval_one(x: &Array) -> Result<()>;

        fn add(a: &Array, b: &Array) -> Result<UniquePtr<Array>>;
        fn subtract(a: &Array, b: &Array) -> Result<UniquePtr<Array>>;
        fn multiply(a: &Array, b: &Array) -> Result<UniquePtr<Array>>;
        fn divide(a: &Array, b: &Array) -> Result<UniquePtr<Array>>;
        fn maximum(a: &Array, b: &Array) -> Result<UniquePtr<Array>>;
        fn minimum(a: &Array, b: &Array) -> Result<UniquePtr<Array>>;
        fn greater(a: &Array, b: &Array) -> Result<UniquePtr<Array>>;
        fn less(a: &Array, b: &Array) -> Result<UniquePtr<Array>>;
        fn equal(a: &Array, b: &Array) -> Result<UniquePtr<Array>>;
        fn where_(c: &Array, a: &Array, b: &Array) -> Result<UniquePtr<Array>>;
        fn exp(a: &Array) -> Result<UniquePtr<Array>>;
        fn log(a: &Array) -> Result<UniquePtr<Array>>;
        fn sqrt(a: &Array) -> Result<UniquePtr<Array>>;
        fn rsqrt(a: &Array) -> Result<UniquePtr<Array>>;
        fn negative(a: &Array) -> Result<UniquePtr<Array>>;
        fn sigmoid(a: &Array) -> Result<UniquePtr<Array>>;
        fn silu(a: &Array) -> Result<UniquePtr<Array>>;
        fn square(a: &Array) -> Result<UniquePtr<Array>>;
        fn astype(a: &Array, dtype: u8) -> Result<UniquePtr<Array>>;

        fn matmul(a: &Array, b: &Array) -> Result<UniquePtr<Array>>;
        fn reshape(a: &Array, shape: &[i32]) -> Result<UniquePtr<Array>>;
        fn transpose(a: &Array, axes: &[i32]) -> Result<UniquePtr<Array>>;
        fn swapaxes(a: &Array, a1: i32, a2: i32) -> Result<UniquePtr<Array>>;
        fn expand_dims(a: &Array, axis: i32) -> Result<UniquePtr<Array>>;
        fn squeeze(a: &Array, axis: i32) -> Result<UniquePtr<Array>>;
        fn slice(a: &Array, start: &[i32], stop: &[i32]) -> Result<UniquePtr<Array>>;
        fn slice_update(
            src: &Array,
            upd: &Array,
            start: &[i32],
            stop: &[i32],
        ) -> Result<UniquePtr<Array>>;
        fn concatenate(l: &ArrayList, axis: i32) -> Result<UniquePtr<Array>>;
        fn take(a: &Array, idx: &Array, axis: i32) -> Result<UniquePtr<Array>>;
        fn contiguous(a: &Array) -> Result<UniquePtr<Array>>;

        fn softmax(a: &Array, axis: i32, precise: bool) -> Result<UniquePtr<Array>>;
        fn logsumexp(a: &Array, axis: i32, keepdims: bool) -> Result<UniquePtr<Array>>;
        fn argmax(a: &Array, axis: i32, keepdims: bool) -> Result<UniquePtr<Array>>;
        fn max(a: &Array, axis: i32, keepdims: bool) -> Result<UniquePtr<Array>>;
        fn sum(a: &Array, axis: i32, keepdims: bool) -> Result<UniquePtr<Array>>;
        fn mean(a: &Array, axis: i32, keepdims: bool) -> Result<UniquePtr<Array>>;

        fn rms_norm(x: &Array, w: &Array, eps: f32) -> Result<UniquePtr<Array>>;
        fn rope(
            x: &Array,
            dims: i32,
            traditional: bool,
            base: f32,
            scale: f32,
            offset: i32,
        ) -> Result<UniquePtr<Array>>;
        fn sdpa(
            q: &Array,
            k: &Array,
            v: &Array,
            scale: f32,
            mask_mode: &str,
        ) -> Result<UniquePtr<Array>>;
        fn sdpa_masked(
            q: &Array,
            k: &Array,
            v: &Array,
            scale: f32,
            mask: &Array,
        ) -> Result<UniquePtr<Array>>;

        fn dequantize(
            w: &Array,
            scales: &Array,
            biases: &Array,
            group_size: i32,
            bits: i32,
        ) -> Result<UniquePtr<Array>>;
        fn quantized_matmul(
            x: &Array,
            w: &Array,
            scales: &Array,
            biases: &Array,
            transpose: bool,
            group_size: i32,
            bits: i32,
        ) -> Result<UniquePtr<Array>>;

        fn qmatmul(
            x: &Array,
            w: &Array,
            scales: &Array,
            biases: &Array,
            group_size: i32,
            bits: i32,
        ) -> Result<UniquePtr<Array>>;
        fn qrows_packed(
            packed: &Array,
            ids: &Array,
            n: i32,
            group_size: i32,
            bits: i32,
        ) -> Result<UniquePtr<Array>>;
        fn qpack(
            w: &Array,
            scales: &Array,
            biases: &Array,
            group_size: i32,
            bits: i32,
        ) -> Result<UniquePtr<Array>>;
        fn qmatmul_packed(
            x: &Array,
            packed: &Array,
            n: i32,
            group_size: i32,
            bits: i32,
        ) -> Result<UniquePtr<Array>>;
        fn qmatmul_packed_add(
            x: &Array,
            packed: &Array,
            n: i32,
            group_size: i32,
            bits: i32,
            residual: &Array,
        ) -> Result<UniquePtr<Array>>;
        fn qmatmul_packed_norm(
            x: &Array,
            norm_w: &Array,
            eps: f32,
            packed: &Array,
            n: i32,
            group_size: i32,
            bits: i32,
        ) -> Result<UniquePtr<Array>>;
        #[allow(clippy::too_many_arguments)]
        fn qmatmul_packed_norm_rope(
            x: &Array,
            norm_w: &Array,
            eps: f32,
            packed: &Array,
            n: i32,
            group_size: i32,
            bits: i32,
            rope_cols: i32,
            head_dim: i32,
            traditional: bool,
            base: f32,
            offset: i32,
        ) -> Result<UniquePtr<Array>>;
        fn attention(
            q: &Array,
            k: &Array,
            v: &Array,
            scale: f32,
            causal: bool,
        ) -> Result<UniquePtr<Array>>;
        fn rms_norm_rows(x: &Array, w: &Array, eps: f32) -> Result<UniquePtr<Array>>;
        fn rope_heads(
            x: &Array,
            dims: i32,
            traditional: bool,
            base: f32,
            scale: f32,
            offset: i32,
        ) -> Result<UniquePtr<Array>>;
        fn swiglu(g: &Array, u: &Array) -> Result<UniquePtr<Array>>;
        fn kernel_threads() -> i32;
        fn kernel_isa() -> String;

        fn random_key(seed: u64) -> Result<UniquePtr<Array>>;
        fn random_split(key: &Array, num: i32) -> Result<UniquePtr<Array>>;
        fn random_uniform(shape: &[i32], key: &Array) -> Result<UniquePtr<Array>>;
        fn random_categorical(logits: &Array, axis: i32, key: &Array) -> Result<UniquePtr<Array>>;

        fn load_gguf(path: &str) -> Result<UniquePtr<ArrayMap>>;
        fn load_safetensors(path: &str) -> Result<UniquePtr<ArrayMap>>;
        fn new_map() -> UniquePtr<ArrayMap>;
        fn map_insert(m: Pin<&mut ArrayMap>, name: &str, x: &Array);
        fn map_insert_meta(m: Pin<&mut ArrayMap>, key: &str, value: &str);
        fn map_keys(m: &ArrayMap) -> Vec<String>;
        fn map_meta_keys(m: &ArrayMap) -> Vec<String>;
        fn map_meta_get(m: &ArrayMap, key: &str) -> Result<String>;
        fn map_get(m: &ArrayMap, name: &str) -> Result<UniquePtr<Array>>;
        fn save_safetensors(path: &str, m: &ArrayMap) -> Result<()>;

        fn active_memory() -> usize;
        fn peak_memory() -> usize;
        fn reset_peak_memory();
        fn cache_memory() -> usize;
        fn clear_cache();
        fn default_device() -> String;
        fn mlx_version() -> String;
        fn blas_threads() -> i32;
        fn set_blas_threads(n: i32);
        fn blas_config() -> String;
    }
}

/// An error thrown by MLX (shape mismatch, unreadable file, ...).
#[derive(Debug, Clone, thiserror::Error)]
#[error("mlx: {0}")]
pub struct Exception(pub String);

impl From<cxx::Exception> for Exception {
    fn from(e: cxx::Exception) -> Self {
        Exception(e.what().to_string())
    }
}

pub type Result<T> = std::result::Result<T, Exception>;

/// MLX dtypes, in the order of `mlx::core::Dtype::Val`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Dtype {
    Bool = 0,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Int8,
    Int16,
    Int32,
    Int64,
    Float16,
    Float32,
    Float64,
    Bfloat16,
    Complex64,
}

impl Dtype {
    fn from_code(c: u8) -> Dtype {
        use Dtype::*;
        const ALL: [Dtype; 14] = [
            Bool, Uint8, Uint16, Uint32, Uint64, Int8, Int16, Int32, Int64, Float16, Float32,
            Float64, Bfloat16, Complex64,
        ];
        ALL.get(c as usize).copied().unwrap_or(Complex64)
    }
}

/// A lazily evaluated MLX array (reference counted on the C++ side; cloning
/// is cheap and shares the buffer).
pub struct Array(cxx::UniquePtr<ffi::Array>);

// An mlx::core::array is a shared_ptr (atomic refcount) to data that is
// immutable once evaluated. specd shares evaluated weights between threads
// (Arc<Llama>) and runs one generation at a time, so no graph is built or
// evaluated from two threads at once.
unsafe impl Send for Array {}
unsafe impl Sync for Array {}

impl Clone for Array {
    fn clone(&self) -> Self {
        Array(ffi::clone_array(&self.0))
    }
}

impl fmt::Debug for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Array({:?}, {:?})", self.shape(), self.dtype())
    }
}

fn wrap(r: std::result::Result<cxx::UniquePtr<ffi::Array>, cxx::Exception>) -> Result<Array> {
    Ok(Array(r?))
}

/// Several arrays handed to MLX at once (eval, concatenate).
fn list<'a>(xs: impl IntoIterator<Item = &'a Array>) -> cxx::UniquePtr<ffi::ArrayList> {
    let mut l = ffi::new_list();
    for x in xs {
        ffi::list_push(l.pin_mut(), &x.0);
    }
    l
}

impl Array {
    pub fn from_f32(data: &[f32], shape: &[i32]) -> Result<Array> {
        check_len(data.len(), shape)?;
        wrap(ffi::from_f32(data, shape))
    }
    pub fn from_i32(data: &[i32], shape: &[i32]) -> Result<Array> {
        check_len(data.len(), shape)?;
        wrap(ffi::from_i32(data, shape))
    }
    pub fn from_u32(data: &[u32], shape: &[i32]) -> Result<Array> {
        check_len(data.len(), shape)?;
        wrap(ffi::from_u32(data, shape))
    }
    pub fn scalar(v: f32) -> Result<Array> {
        wrap(ffi::scalar_f32(v))
    }
    pub fn zeros(shape: &[i32], dtype: Dtype) -> Result<Array> {
        wrap(ffi::zeros(shape, dtype as u8))
    }
    pub fn arange(start: i32, stop: i32) -> Result<Array> {
        wrap(ffi::arange_i32(start, stop))
    }
    pub fn shape(&self) -> Vec<i32> {
        ffi::shape(&self.0)
    }
    pub fn dim(&self, axis: i32) -> i32 {
        let s = self.shape();
        let i = if axis < 0 {
            s.len() as i32 + axis
        } else {
            axis
        };
        s[i as usize]
    }
    pub fn ndim(&self) -> usize {
        self.shape().len()
    }
    pub fn size(&self) -> usize {
        self.shape().iter().map(|&d| d as usize).product()
    }
    pub fn dtype(&self) -> Dtype {
        Dtype::from_code(ffi::dtype(&self.0))
    }
    pub fn nbytes(&self) -> usize {
        ffi::nbytes(&self.0)
    }
    /// Evaluates and copies out as f32 (converting if needed).
    pub fn to_vec_f32(&self) -> Result<Vec<f32>> {
        let mut v = vec![0f32; self.size()];
        ffi::to_f32(&self.0, &mut v)?;
        Ok(v)
    }
    pub fn to_vec_i32(&self) -> Result<Vec<i32>> {
        let mut v = vec![0i32; self.size()];
        ffi::to_i32(&self.0, &mut v)?;
        Ok(v)
    }
    pub fn to_vec_u32(&self) -> Result<Vec<u32>> {
        let mut v = vec![0u32; self.size()];
        ffi::to_u32(&self.0, &mut v)?;
        Ok(v)
    }
    pub fn item_f32(&self) -> Result<f32> {
        Ok(self.to_vec_f32()?.first().copied().unwrap_or(f32::NAN))
    }
    pub fn eval(&self) -> Result<()> {
        Ok(ffi::eval_one(&self.0)?)
    }
    pub fn as_type(&self, dtype: Dtype) -> Result<Array> {
        wrap(ffi::astype(&self.0, dtype as u8))
    }
    pub fn reshape(&self, shape: &[i32]) -> Result<Array> {
        wrap(ffi::reshape(&self.0, shape))
    }
    pub fn transpose(&self, axes: &[i32]) -> Result<Array> {
        wrap(ffi::transpose(&self.0, axes))
    }
    pub fn swapaxes(&self, a: i32, b: i32) -> Result<Array> {
        wrap(ffi::swapaxes(&self.0, a, b))
    }
    /// The matrix transpose of a 2-D array.
    pub fn t(&self) -> Result<Array> {
        self.transpose(&[1, 0])
    }
    pub fn expand_dims(&self, axis: i32) -> Result<Array> {
        wrap(ffi::expand_dims(&self.0, axis))
    }
    pub fn squeeze(&self, axis: i32) -> Result<Array> {
        wrap(ffi::squeeze(&self.0, axis))
    }
    pub fn slice(&self, start: &[i32], stop: &[i32]) -> Result<Array> {
        wrap(ffi::slice(&self.0, start, stop))
    }
    /// Returns a copy of `self` with `[start, stop)` replaced by `update`.
    pub fn slice_update(&self, update: &Array, start: &[i32], stop: &[i32]) -> Result<Array> {
        wrap(ffi::slice_update(&self.0, &update.0, start, stop))
    }
    pub fn contiguous(&self) -> Result<Array> {
        wrap(ffi::contiguous(&self.0))
    }
}

fn check_len(len: usize, shape: &[i32]) -> Result<()> {
    let want: i64 = shape.iter().map(|&d| d as i64).product();
    if want != len as i64 || shape.iter().any(|&d| d < 0) {
        return Err(Exception(format!(
            "{len} elements do not fill shape {shape:?}"
        )));
    }
    Ok(())
}

/// Element-wise and linear-algebra ops (broadcasting as in NumPy).
pub mod ops {
    use super::*;

    macro_rules! binary {
        ($($name:ident => $ffi:ident),* $(,)?) => {$(
            pub fn $name(a: &Array, b: &Array) -> Result<Array> { wrap(ffi::$ffi(&a.0, &b.0)) }
        )*};
    }
    macro_rules! unary {
        ($($name:ident => $ffi:ident),* $(,)?) => {$(
            pub fn $name(a: &Array) -> Result<Array> { wrap(ffi::$ffi(&a.0)) }
        )*};
    }
    macro_rules! reduce {
        ($($name:ident => $ffi:ident),* $(,)?) => {$(
            pub fn $name(a: &Array, axis: i32, keepdims: bool) -> Result<Array> {
                wrap(ffi::$ffi(&a.0, axis, keepdims))
            }
        )*};
    }
    binary!(add => add, subtract => subtract, multiply => multiply, divide => divide,
            maximum => maximum, minimum => minimum, greater => greater, less => less,
            equal => equal, matmul => matmul);
    unary!(exp => exp, log => log, sqrt => sqrt, rsqrt => rsqrt, negative => negative,
           sigmoid => sigmoid, silu => silu, square => square);
    reduce!(logsumexp => logsumexp, argmax => argmax, max => max, sum => sum, mean => mean);

    pub fn r#where(cond: &Array, a: &Array, b: &Array) -> Result<Array> {
        wrap(ffi::where_(&cond.0, &a.0, &b.0))
    }
    pub fn softmax(a: &Array, axis: i32, precise: bool) -> Result<Array> {
        wrap(ffi::softmax(&a.0, axis, precise))
    }
    pub fn concatenate(xs: &[&Array], axis: i32) -> Result<Array> {
        wrap(ffi::concatenate(&list(xs.iter().copied()), axis))
    }
    /// Gathers `indices` (an integer array) along `axis`.
    pub fn take(a: &Array, indices: &Array, axis: i32) -> Result<Array> {
        wrap(ffi::take(&a.0, &indices.0, axis))
    }
    /// Expands MLX affine-quantized weights (`w` packed, per-group scales and
    /// biases) back to floating point.
    pub fn dequantize(
        w: &Array,
        scales: &Array,
        biases: &Array,
        group_size: i32,
        bits: i32,
    ) -> Result<Array> {
        wrap(ffi::dequantize(
            &w.0, &scales.0, &biases.0, group_size, bits,
        ))
    }
    pub fn quantized_matmul(
        x: &Array,
        w: &Array,
        scales: &Array,
        biases: &Array,
        transpose: bool,
        group_size: i32,
        bits: i32,
    ) -> Result<Array> {
        wrap(ffi::quantized_matmul(
            &x.0, &w.0, &scales.0, &biases.0, transpose, group_size, bits,
        ))
    }
}

/// MLX's fused kernels.
pub mod fast {
    use super::*;

    pub fn rms_norm(x: &Array, weight: &Array, eps: f32) -> Result<Array> {
        wrap(ffi::rms_norm(&x.0, &weight.0, eps))
    }
    /// Rotary embedding of the last axis; `offset` is the position of the
    /// first row along axis -2.
    pub fn rope(
        x: &Array,
        dims: i32,
        traditional: bool,
        base: f32,
        scale: f32,
        offset: i32,
    ) -> Result<Array> {
        wrap(ffi::rope(&x.0, dims, traditional, base, scale, offset))
    }
    /// Attention mask for [`scaled_dot_product_attention`].
    pub enum Mask<'a> {
        None,
        Causal,
        Array(&'a Array),
    }
    pub fn scaled_dot_product_attention(
        q: &Array,
        k: &Array,
        v: &Array,
        scale: f32,
        mask: Mask<'_>,
    ) -> Result<Array> {
        match mask {
            Mask::None => wrap(ffi::sdpa(&q.0, &k.0, &v.0, scale, "")),
            Mask::Causal => wrap(ffi::sdpa(&q.0, &k.0, &v.0, scale, "causal")),
            Mask::Array(m) => wrap(ffi::sdpa_masked(&q.0, &k.0, &v.0, scale, &m.0)),
        }
    }
}

/// specd's own CPU kernels (MLX primitives in `kernels.cc`). Each output
/// row is computed by the same float operations whatever the number of rows
/// in the call, so a k-row verify rounds exactly like k one-row steps. On a
/// GPU device they fall back to MLX's own ops.
pub mod kernels {
    use super::*;

    /// `x @ dequantize(w)^T` over MLX affine-quantized weights `w`
    /// (`[out, in * bits / 32]` uint32, 4 or 8 bits), with float16 `scales`
    /// and `biases` (`[out, in / group_size]`); `x` is `[..., in]`, the result
    /// float32 `[..., out]`. On CPU this packs the weights on every call: a
    /// model packs once with [`qpack`] and calls [`qmatmul_packed`].
    pub fn qmatmul(
        x: &Array,
        w: &Array,
        scales: &Array,
        biases: &Array,
        group_size: i32,
        bits: i32,
    ) -> Result<Array> {
        wrap(ffi::qmatmul(
            &x.0, &w.0, &scales.0, &biases.0, group_size, bits,
        ))
    }
    /// The CPU kernels' layout of MLX affine-quantized weights (16 output
    /// columns to a vector; see `qmm.h`), computed now: pack once at load.
    pub fn qpack(
        w: &Array,
        scales: &Array,
        biases: &Array,
        group_size: i32,
        bits: i32,
    ) -> Result<Array> {
        wrap(ffi::qpack(&w.0, &scales.0, &biases.0, group_size, bits))
    }
    /// Rows `ids` (1-D integers) of `n` packed weight rows, dequantized to
    /// float32 `[len(ids), in]`: an embedding lookup. An id past `n` gives
    /// a zero row. CPU only.
    pub fn qrows_packed(
        packed: &Array,
        ids: &Array,
        n: i32,
        group_size: i32,
        bits: i32,
    ) -> Result<Array> {
        wrap(ffi::qrows_packed(&packed.0, &ids.0, n, group_size, bits))
    }
    /// [`qmatmul`] over weights packed by [`qpack`]; `n` is the number of
    /// output features. CPU only.
    pub fn qmatmul_packed(
        x: &Array,
        packed: &Array,
        n: i32,
        group_size: i32,
        bits: i32,
    ) -> Result<Array> {
        wrap(ffi::qmatmul_packed(&x.0, &packed.0, n, group_size, bits))
    }
    /// `residual + qmatmul_packed(x, ...)` in one op (the sum rounds as
    /// `ops::add` would); `residual` is shaped like the output. CPU only.
    pub fn qmatmul_packed_add(
        x: &Array,
        packed: &Array,
        n: i32,
        group_size: i32,
        bits: i32,
        residual: &Array,
    ) -> Result<Array> {
        wrap(ffi::qmatmul_packed_add(
            &x.0,
            &packed.0,
            n,
            group_size,
            bits,
            &residual.0,
        ))
    }
    /// `qmatmul_packed(rms_norm(x, norm_w, eps), ...)` in one op (the norm
    /// rounds as [`rms_norm`] does). CPU only.
    pub fn qmatmul_packed_norm(
        x: &Array,
        norm_w: &Array,
        eps: f32,
        packed: &Array,
        n: i32,
        group_size: i32,
        bits: i32,
    ) -> Result<Array> {
        wrap(ffi::qmatmul_packed_norm(
            &x.0, &norm_w.0, eps, &packed.0, n, group_size, bits,
        ))
    }
    /// How [`qmatmul_packed_norm_rope`] rotates its output.
    #[derive(Debug, Clone, Copy)]
    pub struct RopeSpec {
        /// Output columns `[0, cols)` are rotated, in heads of `head_dim`.
        pub cols: i32,
        pub head_dim: i32,
        pub traditional: bool,
        pub base: f32,
        /// Position of the first row.
        pub offset: i32,
    }
    /// [`qmatmul_packed_norm`] with [`rope_heads`] applied to the leading
    /// output columns (q and k of a fused q/k/v), in the same op and
    /// rounding as `rope_heads` does; `x` is one sequence `[1, T, in]`.
    #[allow(clippy::too_many_arguments)]
    pub fn qmatmul_packed_norm_rope(
        x: &Array,
        norm_w: &Array,
        eps: f32,
        packed: &Array,
        n: i32,
        group_size: i32,
        bits: i32,
        rope: RopeSpec,
    ) -> Result<Array> {
        wrap(ffi::qmatmul_packed_norm_rope(
            &x.0,
            &norm_w.0,
            eps,
            &packed.0,
            n,
            group_size,
            bits,
            rope.cols,
            rope.head_dim,
            rope.traditional,
            rope.base,
            rope.offset,
        ))
    }
    /// `softmax(scale * q k^T) v` for `q` `[1, heads, T, d]` and `k`, `v`
    /// `[1, kv_heads, L, d]` (grouped-query when heads > kv_heads), returned
    /// heads last, `[1, T, heads, d]` (so `[1, T, heads * d]` is a free
    /// reshape). With `causal`, query row t sees keys `0..=L - T + t`.
    pub fn attention(q: &Array, k: &Array, v: &Array, scale: f32, causal: bool) -> Result<Array> {
        wrap(ffi::attention(&q.0, &k.0, &v.0, scale, causal))
    }
    /// RMS norm over the last axis in one op (MLX's CPU `fast::rms_norm`
    /// is its unfused fallback, several ops).
    pub fn rms_norm(x: &Array, weight: &Array, eps: f32) -> Result<Array> {
        wrap(ffi::rms_norm_rows(&x.0, &weight.0, eps))
    }
    /// Rotary embedding of `x` `[B, T, heads, d]` (rows at positions
    /// `offset..offset + T`), returned as `[B, heads, T, d]`: the reshape
    /// to heads and the rope in one op.
    pub fn rope_heads(
        x: &Array,
        dims: i32,
        traditional: bool,
        base: f32,
        scale: f32,
        offset: i32,
    ) -> Result<Array> {
        wrap(ffi::rope_heads(
            &x.0,
            dims,
            traditional,
            base,
            scale,
            offset,
        ))
    }
    /// `silu(g) * u` in one op.
    pub fn swiglu(g: &Array, u: &Array) -> Result<Array> {
        wrap(ffi::swiglu(&g.0, &u.0))
    }
    /// Threads the kernels use (`SPECD_THREADS`, default: all cores).
    pub fn threads() -> i32 {
        ffi::kernel_threads()
    }
    /// The SIMD level chosen at run time: `avx512`, `avx2` or `scalar`
    /// (`SPECD_KERNEL_ISA=avx2|scalar` forces a lower one).
    pub fn isa() -> String {
        ffi::kernel_isa()
    }
}

/// Seeded random numbers (MLX's counter-based keys).
pub mod random {
    use super::*;
    pub fn key(seed: u64) -> Result<Array> {
        wrap(ffi::random_key(seed))
    }
    pub fn split(key: &Array, num: i32) -> Result<Array> {
        wrap(ffi::random_split(&key.0, num))
    }
    pub fn uniform(shape: &[i32], key: &Array) -> Result<Array> {
        wrap(ffi::random_uniform(shape, &key.0))
    }
    pub fn categorical(logits: &Array, axis: i32, key: &Array) -> Result<Array> {
        wrap(ffi::random_categorical(&logits.0, axis, &key.0))
    }
}

/// Evaluates several arrays together (one graph walk).
pub fn eval(xs: &[&Array]) -> Result<()> {
    Ok(ffi::eval(&list(xs.iter().copied()))?)
}

/// Starts evaluating in the background; a later `eval` or read waits for it.
pub fn async_eval(xs: &[&Array]) -> Result<()> {
    Ok(ffi::async_eval(&list(xs.iter().copied()))?)
}

/// Tensors (and string metadata) read from or written to a file.
pub struct TensorFile {
    pub tensors: Vec<(String, Array)>,
    pub metadata: Vec<(String, String)>,
}

fn read_map(m: &ffi::ArrayMap) -> Result<TensorFile> {
    let mut tensors = Vec::new();
    let mut keys = ffi::map_keys(m);
    keys.sort();
    for k in keys {
        let a = wrap(ffi::map_get(m, &k))?;
        tensors.push((k, a));
    }
    let mut metadata = Vec::new();
    for k in ffi::map_meta_keys(m) {
        let v = ffi::map_meta_get(m, &k)?;
        metadata.push((k, v));
    }
    metadata.sort();
    Ok(TensorFile { tensors, metadata })
}

pub mod io {
    use super::*;
    use std::path::Path;

    fn path_str(p: &Path) -> Result<&str> {
        p.to_str()
            .ok_or_else(|| Exception(format!("path is not UTF-8: {}", p.display())))
    }
    /// GGUF through MLX's own reader: Q4_0/Q4_1/Q8_0 tensors come back as MLX
    /// affine-quantized triples (`X.weight`, `X.scales`, `X.biases`, group 32).
    /// Only string metadata is returned; read the rest with a GGUF parser.
    pub fn load_gguf(path: &Path) -> Result<TensorFile> {
        let m = ffi::load_gguf(path_str(path)?)?;
        read_map(&m)
    }
    pub fn load_safetensors(path: &Path) -> Result<TensorFile> {
        let m = ffi::load_safetensors(path_str(path)?)?;
        read_map(&m)
    }
    pub fn save_safetensors(
        path: &Path,
        tensors: &[(String, Array)],
        metadata: &[(String, String)],
    ) -> Result<()> {
        let mut m = ffi::new_map();
        for (k, a) in tensors {
            ffi::map_insert(m.pin_mut(), k, &a.0);
        }
        for (k, v) in metadata {
            ffi::map_insert_meta(m.pin_mut(), k, v);
        }
        Ok(ffi::save_safetensors(path_str(path)?, &m)?)
    }
}

/// Memory held by MLX's allocator.
pub mod memory {
    use super::ffi;
    pub fn active() -> usize {
        ffi::active_memory()
    }
    pub fn peak() -> usize {
        ffi::peak_memory()
    }
    pub fn reset_peak() {
        ffi::reset_peak_memory()
    }
    pub fn cache() -> usize {
        ffi::cache_memory()
    }
    pub fn clear_cache() {
        ffi::clear_cache()
    }
}

/// "cpu" or "gpu".
pub fn default_device() -> String {
    ffi::default_device()
}
pub fn version() -> String {
    ffi::mlx_version()
}
/// The BLAS behind MLX's CPU matmul (OpenBLAS on Linux), and its threads.
pub fn blas_config() -> String {
    ffi::blas_config()
}
pub fn blas_threads() -> i32 {
    ffi::blas_threads()
}
pub fn set_blas_threads(n: i32) {
    ffi::set_blas_threads(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_and_shapes() {
        let a = Array::from_f32(&[1., 2., 3., 4., 5., 6.], &[2, 3]).unwrap();
        let b = Array::from_f32(&[1., 0., 0., 1., 1., 1.], &[3, 2]).unwrap();
        let c = ops::matmul(&a, &b).unwrap();
        assert_eq!(c.shape(), vec![2, 2]);
        assert_eq!(c.to_vec_f32().unwrap(), vec![4., 5., 10., 11.]);
        assert_eq!(a.t().unwrap().shape(), vec![3, 2]);
        let s = a.slice(&[0, 1], &[2, 3]).unwrap();
        assert_eq!(s.to_vec_f32().unwrap(), vec![2., 3., 5., 6.]);
    }

    #[test]
    fn errors_are_results() {
        let a = Array::from_f32(&[1., 2.], &[2]).unwrap();
        let b = Array::from_f32(&[1., 2., 3.], &[3]).unwrap();
        let e = ops::add(&a, &b).unwrap_err();
        assert!(e.0.contains("broadcast") || e.0.contains("shape"), "{e}");
        assert!(Array::from_f32(&[1., 2.], &[3]).is_err());
        assert!(io::load_gguf(std::path::Path::new("/nonexistent.gguf")).is_err());
    }

    #[test]
    fn softmax_argmax_take() {
        let x = Array::from_f32(&[0., 1., 3., 2.], &[1, 4]).unwrap();
        let p = ops::softmax(&x, -1, true).unwrap().to_vec_f32().unwrap();
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert_eq!(
            ops::argmax(&x, -1, false).unwrap().to_vec_i32().unwrap(),
            vec![2]
        );
        let idx = Array::from_i32(&[3, 0], &[2]).unwrap();
        let t = ops::take(&x, &idx, 1).unwrap().to_vec_f32().unwrap();
        assert_eq!(t, vec![2., 0.]);
    }

    #[test]
    fn blas_is_openblas_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(blas_config().starts_with("OpenBLAS"), "{}", blas_config());
            assert!(blas_threads() >= 1);
        }
    }
}
