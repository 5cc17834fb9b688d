// A thin C++ layer over MLX's public C++ API, shaped for cxx: every op takes
// and returns `Array` (a box around mlx::core::array) and C++ exceptions turn
// into Rust `Err`s.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "mlx/mlx.h"
#include "rust/cxx.h"

namespace specd_mlx {

struct Array {
  mlx::core::array a;
  explicit Array(mlx::core::array x) : a(std::move(x)) {}
};

// An ordered list of arrays (for concatenate, eval, compiled calls).
struct ArrayList {
  std::vector<mlx::core::array> v;
};

// name -> array, as load_gguf / load_safetensors return them.
struct ArrayMap {
  std::unordered_map<std::string, mlx::core::array> m;
  std::unordered_map<std::string, std::string> meta;
};

using A = std::unique_ptr<Array>;

// creation and inspection
A from_f32(rust::Slice<const float> data, rust::Slice<const int32_t> shape);
A from_i32(rust::Slice<const int32_t> data, rust::Slice<const int32_t> shape);
A from_u32(rust::Slice<const uint32_t> data, rust::Slice<const int32_t> shape);
A scalar_f32(float v);
A zeros(rust::Slice<const int32_t> shape, uint8_t dtype);
A arange_i32(int32_t start, int32_t stop);
A clone_array(const Array& x);
rust::Vec<int32_t> shape(const Array& x);
uint8_t dtype(const Array& x);
size_t nbytes(const Array& x);
// Where x's data starts (0 before evaluation): for alignment checks.
size_t data_address(const Array& x);
void to_f32(const Array& x, rust::Slice<float> out);
void to_i32(const Array& x, rust::Slice<int32_t> out);
void to_u32(const Array& x, rust::Slice<uint32_t> out);

// evaluation
std::unique_ptr<ArrayList> new_list();
void list_push(ArrayList& l, const Array& x);
size_t list_len(const ArrayList& l);
A list_get(const ArrayList& l, size_t i);
void eval(const ArrayList& l);
void async_eval(const ArrayList& l);
void eval_one(const Array& x);

// elementwise
A add(const Array& a, const Array& b);
A subtract(const Array& a, const Array& b);
A multiply(const Array& a, const Array& b);
A divide(const Array& a, const Array& b);
A maximum(const Array& a, const Array& b);
A minimum(const Array& a, const Array& b);
A greater(const Array& a, const Array& b);
A less(const Array& a, const Array& b);
A equal(const Array& a, const Array& b);
A where_(const Array& c, const Array& a, const Array& b);
A exp(const Array& a);
A log(const Array& a);
A sqrt(const Array& a);
A rsqrt(const Array& a);
A negative(const Array& a);
A sigmoid(const Array& a);
A tanh(const Array& a);
A silu(const Array& a);
A square(const Array& a);
A astype(const Array& a, uint8_t dtype);

// linear algebra and shape
A matmul(const Array& a, const Array& b);
A reshape(const Array& a, rust::Slice<const int32_t> shape);
A transpose(const Array& a, rust::Slice<const int32_t> axes);
A swapaxes(const Array& a, int32_t a1, int32_t a2);
A expand_dims(const Array& a, int32_t axis);
A squeeze(const Array& a, int32_t axis);
A slice(const Array& a, rust::Slice<const int32_t> start, rust::Slice<const int32_t> stop);
A slice_update(const Array& src, const Array& upd, rust::Slice<const int32_t> start,
               rust::Slice<const int32_t> stop);
A concatenate(const ArrayList& l, int32_t axis);
A take(const Array& a, const Array& idx, int32_t axis);
A contiguous(const Array& a);

// reductions
A softmax(const Array& a, int32_t axis, bool precise);
A logsumexp(const Array& a, int32_t axis, bool keepdims);
A argmax(const Array& a, int32_t axis, bool keepdims);
A max(const Array& a, int32_t axis, bool keepdims);
A sum(const Array& a, int32_t axis, bool keepdims);
A mean(const Array& a, int32_t axis, bool keepdims);

// fast
A rms_norm(const Array& x, const Array& w, float eps);
A rope(const Array& x, int32_t dims, bool traditional, float base, float scale, int32_t offset,
       rust::Slice<const float> factors);
A sdpa(const Array& q, const Array& k, const Array& v, float scale, rust::Str mask_mode);
A sdpa_masked(const Array& q, const Array& k, const Array& v, float scale, const Array& mask);

// quantization
A dequantize(const Array& w, const Array& scales, const Array& biases, int32_t group_size,
             int32_t bits);
A quantized_matmul(const Array& x, const Array& w, const Array& scales, const Array& biases,
                   bool transpose, int32_t group_size, int32_t bits);
std::unique_ptr<ArrayList> quantize(const Array& w, int32_t group_size, int32_t bits);

// specd's own CPU kernels (kernels.cc): batch-invariant, MLX's ops on GPU.
// A packed weight's layout (`qpack`): the cxx bridge's shared `Packing`
// (src/bridge.rs), complete where the kernels are defined.
struct Packing;
A qmatmul(const Array& x, const Array& w, const Array& scales, const Array& biases,
          int32_t group_size, int32_t bits);
A qrows_packed(const Array& packed, const Array& ids, Packing packing);
A qpack(const Array& w, const Array& scales, const Array& biases, int32_t group_size,
        int32_t bits);
A qmatmul_packed(const Array& x, const Array& packed, Packing packing);
A qmatmul_packed_add(const Array& x, const Array& packed, Packing packing, const Array& residual);
A qmatmul_packed_glu_add(const Array& gu, const Array& packed, Packing packing,
                         const Array& residual, bool gelu);
A layer_tail(const Array& o, const Array& x, const ArrayList& tail,
             rust::Slice<const int32_t> params, float eps);
A qmatmul_packed_glu(const Array& gu, const Array& packed, Packing packing, bool gelu);
A qmatmul_packed_norm(const Array& x, const Array& norm_w, float eps, const Array& packed,
                      Packing packing);
A qmatmul_packed_norm_rope_rows(const Array& x, const Array& norm_w, float eps,
                                const Array& packed, Packing packing,
                                int32_t rope_cols, int32_t head_dim, bool traditional, float base,
                                rust::Slice<const int32_t> positions,
                                rust::Slice<const float> factors);
A attention(const Array& q, const Array& k, const Array& v, float scale, bool causal,
            float softcap);
std::unique_ptr<ArrayList> attention_kv_rows(const Array& y, const ArrayList& caches,
                                             rust::Slice<const int32_t> spans, int32_t heads,
                                             int32_t kv_heads, int32_t head_dim, float scale);
std::unique_ptr<ArrayList> layer_kv_rows(const Array& y, const ArrayList& caches,
                                         rust::Slice<const int32_t> spans, int32_t heads,
                                         int32_t kv_heads, int32_t head_dim, float scale,
                                         const Array& x, const ArrayList& tail,
                                         rust::Slice<const int32_t> params, float eps);
A kv_alloc(const Array& old, bool has_old, int32_t keep, int32_t heads, int32_t cap,
           int32_t dim, bool half);
A rms_norm_rows(const Array& x, const Array& w, float eps);
A rope_heads(const Array& x, int32_t dims, bool traditional, float base, float scale,
             int32_t offset, rust::Slice<const float> factors);
A swiglu(const Array& g, const Array& u);
A geglu(const Array& g, const Array& u);
// Per row (last axis), {argmax, max, runner-up, exact} as float32: the
// host's argmax rule in one pass (top2.h).
A row_top2(const Array& logits);
// row_top2 over the rows of several arrays (one width) in one op: [rows, 4].
A row_top2_list(const ArrayList& rows);
int32_t kernel_threads();
bool set_kernel_threads(int32_t n);
rust::String kernel_isa();
void set_mlx_ops(bool on);
bool mlx_ops_only();
uint64_t own_op_count();

// random
A random_key(uint64_t seed);
A random_split(const Array& key, int32_t num);
A random_uniform(rust::Slice<const int32_t> shape, const Array& key);
A random_categorical(const Array& logits, int32_t axis, const Array& key);

// io
std::unique_ptr<ArrayMap> load_gguf(rust::Str path);
std::unique_ptr<ArrayMap> load_safetensors(rust::Str path);
std::unique_ptr<ArrayMap> new_map();
void map_insert(ArrayMap& m, rust::Str name, const Array& x);
void map_insert_meta(ArrayMap& m, rust::Str key, rust::Str value);
rust::Vec<rust::String> map_keys(const ArrayMap& m);
rust::Vec<rust::String> map_meta_keys(const ArrayMap& m);
rust::String map_meta_get(const ArrayMap& m, rust::Str key);
A map_get(const ArrayMap& m, rust::Str name);
void save_safetensors(rust::Str path, const ArrayMap& m);

// memory and device
size_t active_memory();
size_t peak_memory();
void reset_peak_memory();
size_t cache_memory();
void clear_cache();
rust::String default_device();
uint64_t gpu_memory();
rust::String mlx_version();
int32_t blas_threads();
void set_blas_threads(int32_t n);
rust::String blas_config();

// distributed (pipeline ranks over MLX's ring backend)
rust::Vec<int32_t> dist_init(rust::Str backend);
A dist_send(const Array& x, int32_t dst);
A dist_recv(rust::Slice<const int32_t> shape, uint8_t dtype, int32_t src);
A dist_all_gather(const Array& x);

}  // namespace specd_mlx
