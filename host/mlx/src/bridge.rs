//! The cxx bridge to the C++ shim (`shim.h`, `shim.cc`): the only place
//! that names C++.

#[cxx::bridge(namespace = "specd_mlx")]
pub(crate) mod ffi {
    /// A weight in the kernels' packed layout (`qpack`): its output
    /// features `n`, its group size, and its bits with the layout's flags
    /// (`qmm.h`: `kScaleF32`, `kActQ8`). With the packed words, every
    /// packed kernel's weight argument.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct Packing {
        n: i32,
        group_size: i32,
        bits: i32,
    }

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
        fn data_address(x: &Array) -> usize;
        fn to_f32(x: &Array, out: &mut [f32]) -> Result<()>;
        fn to_i32(x: &Array, out: &mut [i32]) -> Result<()>;
        fn to_u32(x: &Array, out: &mut [u32]) -> Result<()>;

        fn new_list() -> UniquePtr<ArrayList>;
        fn list_push(l: Pin<&mut ArrayList>, x: &Array);
        fn list_len(l: &ArrayList) -> usize;
        fn list_get(l: &ArrayList, i: usize) -> Result<UniquePtr<Array>>;
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
        fn tanh(a: &Array) -> Result<UniquePtr<Array>>;
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
            factors: &[f32],
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
        fn quantize(w: &Array, group_size: i32, bits: i32) -> Result<UniquePtr<ArrayList>>;

        fn qmatmul(
            x: &Array,
            w: &Array,
            scales: &Array,
            biases: &Array,
            group_size: i32,
            bits: i32,
        ) -> Result<UniquePtr<Array>>;
        fn qrows_packed(packed: &Array, ids: &Array, packing: Packing) -> Result<UniquePtr<Array>>;
        fn qpack(
            w: &Array,
            scales: &Array,
            biases: &Array,
            group_size: i32,
            bits: i32,
        ) -> Result<UniquePtr<Array>>;
        fn qmatmul_packed(x: &Array, packed: &Array, packing: Packing) -> Result<UniquePtr<Array>>;
        fn qmatmul_packed_add(
            x: &Array,
            packed: &Array,
            packing: Packing,
            residual: &Array,
        ) -> Result<UniquePtr<Array>>;
        fn qmatmul_packed_glu_add(
            gu: &Array,
            packed: &Array,
            packing: Packing,
            residual: &Array,
            gelu: bool,
        ) -> Result<UniquePtr<Array>>;
        /// `tail`: W_o, the MLP's norm weight, W_gate_up, W_down;
        /// `params`: kernels::Tail's integers (Tail::params).
        fn layer_tail(
            o: &Array,
            x: &Array,
            tail: &ArrayList,
            params: &[i32],
            eps: f32,
        ) -> Result<UniquePtr<Array>>;
        fn qmatmul_packed_glu(
            gu: &Array,
            packed: &Array,
            packing: Packing,
            gelu: bool,
        ) -> Result<UniquePtr<Array>>;
        fn qmatmul_packed_norm(
            x: &Array,
            norm_w: &Array,
            eps: f32,
            packed: &Array,
            packing: Packing,
        ) -> Result<UniquePtr<Array>>;
        #[allow(clippy::too_many_arguments)]
        fn qmatmul_packed_norm_rope_rows(
            x: &Array,
            norm_w: &Array,
            eps: f32,
            packed: &Array,
            packing: Packing,
            rope_cols: i32,
            head_dim: i32,
            traditional: bool,
            base: f32,
            positions: &[i32],
            factors: &[f32],
        ) -> Result<UniquePtr<Array>>;
        fn attention(
            q: &Array,
            k: &Array,
            v: &Array,
            scale: f32,
            causal: bool,
            softcap: f32,
        ) -> Result<UniquePtr<Array>>;
        #[allow(clippy::too_many_arguments)]
        fn layer_kv_rows(
            y: &Array,
            caches: &ArrayList,
            spans: &[i32],
            heads: i32,
            kv_heads: i32,
            head_dim: i32,
            scale: f32,
            x: &Array,
            tail: &ArrayList,
            params: &[i32],
            eps: f32,
        ) -> Result<UniquePtr<ArrayList>>;
        #[allow(clippy::too_many_arguments)]
        fn attention_kv_rows(
            y: &Array,
            caches: &ArrayList,
            spans: &[i32],
            heads: i32,
            kv_heads: i32,
            head_dim: i32,
            scale: f32,
        ) -> Result<UniquePtr<ArrayList>>;
        fn kv_alloc(
            old: &Array,
            has_old: bool,
            keep: i32,
            heads: i32,
            cap: i32,
            dim: i32,
            half: bool,
        ) -> Result<UniquePtr<Array>>;
        fn rms_norm_rows(x: &Array, w: &Array, eps: f32) -> Result<UniquePtr<Array>>;
        fn rope_heads(
            x: &Array,
            dims: i32,
            traditional: bool,
            base: f32,
            scale: f32,
            offset: i32,
            factors: &[f32],
        ) -> Result<UniquePtr<Array>>;
        fn swiglu(g: &Array, u: &Array) -> Result<UniquePtr<Array>>;
        fn geglu(g: &Array, u: &Array) -> Result<UniquePtr<Array>>;
        fn row_top2(logits: &Array) -> Result<UniquePtr<Array>>;
        fn row_top2_list(rows: &ArrayList) -> Result<UniquePtr<Array>>;
        fn kernel_threads() -> i32;
        fn set_kernel_threads(n: i32) -> bool;
        fn kernel_isa() -> String;
        fn set_mlx_ops(on: bool);
        fn mlx_ops_only() -> bool;
        fn own_op_count() -> u64;

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
        fn gpu_memory() -> u64;
        fn mlx_version() -> String;
        fn blas_threads() -> i32;
        fn set_blas_threads(n: i32);
        fn blas_config() -> String;

        fn dist_init(backend: &str) -> Result<Vec<i32>>;
        fn dist_send(x: &Array, dst: i32) -> Result<UniquePtr<Array>>;
        fn dist_recv(shape: &[i32], dtype: u8, src: i32) -> Result<UniquePtr<Array>>;
        fn dist_all_gather(x: &Array) -> Result<UniquePtr<Array>>;
    }
}
