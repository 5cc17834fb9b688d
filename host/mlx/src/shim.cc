#include "specd-mlx/src/shim.h"

#include <cstring>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <variant>
#include <vector>

#include "specd-mlx/src/kernels_common.h"
#include "specd-mlx/src/waiting.h"

#ifdef SPECD_OPENBLAS
// Referencing OpenBLAS from our own code keeps it a direct dependency of every
// binary (rustc links with --as-needed), so libmlx's cblas_sgemm binds to it
// ahead of the wheel's reference BLAS.
extern "C" {
int openblas_get_num_threads(void);
void openblas_set_num_threads(int);
char* openblas_get_config(void);
}
// A static initializer keeps a live reference to OpenBLAS in every binary that
// links the shim, so the linker cannot drop it as unneeded.
static const int kOpenblasThreadsAtStart = openblas_get_num_threads();
#endif

namespace specd_mlx {
namespace mx = mlx::core;

namespace {
mx::Shape to_shape(rust::Slice<const int32_t> s) { return mx::Shape(s.begin(), s.end()); }
A wrap(mx::array a) { return std::make_unique<Array>(std::move(a)); }

// Evaluates `v`: the graph dispatched, then the wait for its results counted
// as waiting (waiting.h), so the kernels' idle workers keep spinning for the
// next call rather than yield to this thread.
void eval_waiting(std::vector<mx::array> v) {
  mx::async_eval(v);
  Waiting w;
  mx::eval(v);
}

const mx::Dtype kDtypes[] = {mx::bool_,   mx::uint8,   mx::uint16,  mx::uint32, mx::uint64,
                             mx::int8,    mx::int16,   mx::int32,   mx::int64,  mx::float16,
                             mx::float32, mx::float64, mx::bfloat16, mx::complex64};
mx::Dtype to_dtype(uint8_t d) {
  if (d >= sizeof(kDtypes) / sizeof(kDtypes[0])) throw std::invalid_argument("unknown dtype code");
  return kDtypes[d];
}

template <typename T>
void copy_out(const Array& x, rust::Slice<T> out, mx::Dtype want) {
  mx::array a = x.a.dtype() == want ? x.a : mx::astype(x.a, want);
  // An evaluated row-contiguous array is read where it lies: a contiguous
  // node would be one more graph to schedule and wait for per read.
  eval_waiting({a});
  if (!a.flags().row_contiguous) {
    a = mx::contiguous(a);
    eval_waiting({a});
  }
  if (out.size() != a.size())
    throw std::invalid_argument("output buffer has " + std::to_string(out.size()) +
                                " elements, array has " + std::to_string(a.size()));
  std::memcpy(out.data(), a.data<T>(), a.size() * sizeof(T));
}
}  // namespace

A from_f32(rust::Slice<const float> d, rust::Slice<const int32_t> s) {
  return wrap(mx::array(d.data(), to_shape(s), mx::float32));
}
A from_i32(rust::Slice<const int32_t> d, rust::Slice<const int32_t> s) {
  return wrap(mx::array(d.data(), to_shape(s), mx::int32));
}
A from_u32(rust::Slice<const uint32_t> d, rust::Slice<const int32_t> s) {
  return wrap(mx::array(d.data(), to_shape(s), mx::uint32));
}
A scalar_f32(float v) { return wrap(mx::array(v)); }
A zeros(rust::Slice<const int32_t> s, uint8_t dt) { return wrap(mx::zeros(to_shape(s), to_dtype(dt))); }
A arange_i32(int32_t start, int32_t stop) { return wrap(mx::arange(start, stop, mx::int32)); }
A clone_array(const Array& x) { return wrap(x.a); }
rust::Vec<int32_t> shape(const Array& x) {
  rust::Vec<int32_t> v;
  for (auto d : x.a.shape()) v.push_back(d);
  return v;
}
uint8_t dtype(const Array& x) {
  for (uint8_t i = 0; i < sizeof(kDtypes) / sizeof(kDtypes[0]); i++)
    if (kDtypes[i] == x.a.dtype()) return i;
  return 255;
}
size_t nbytes(const Array& x) { return x.a.nbytes(); }
size_t data_address(const Array& x) {
  return x.a.is_available() ? reinterpret_cast<size_t>(x.a.data<char>()) : 0;
}
void to_f32(const Array& x, rust::Slice<float> out) { copy_out(x, out, mx::float32); }
void to_i32(const Array& x, rust::Slice<int32_t> out) { copy_out(x, out, mx::int32); }
void to_u32(const Array& x, rust::Slice<uint32_t> out) { copy_out(x, out, mx::uint32); }

std::unique_ptr<ArrayList> new_list() { return std::make_unique<ArrayList>(); }
void list_push(ArrayList& l, const Array& x) { l.v.push_back(x.a); }
size_t list_len(const ArrayList& l) { return l.v.size(); }
A list_get(const ArrayList& l, size_t i) {
  if (i >= l.v.size()) throw std::out_of_range("list_get: index past the list");
  return std::make_unique<Array>(l.v[i]);
}
void eval(const ArrayList& l) { eval_waiting(l.v); }
void async_eval(const ArrayList& l) { mx::async_eval(l.v); }
void eval_one(const Array& x) { eval_waiting({x.a}); }

A add(const Array& a, const Array& b) { return wrap(mx::add(a.a, b.a)); }
A subtract(const Array& a, const Array& b) { return wrap(mx::subtract(a.a, b.a)); }
A multiply(const Array& a, const Array& b) { return wrap(mx::multiply(a.a, b.a)); }
A divide(const Array& a, const Array& b) { return wrap(mx::divide(a.a, b.a)); }
A maximum(const Array& a, const Array& b) { return wrap(mx::maximum(a.a, b.a)); }
A minimum(const Array& a, const Array& b) { return wrap(mx::minimum(a.a, b.a)); }
A greater(const Array& a, const Array& b) { return wrap(mx::greater(a.a, b.a)); }
A less(const Array& a, const Array& b) { return wrap(mx::less(a.a, b.a)); }
A equal(const Array& a, const Array& b) { return wrap(mx::equal(a.a, b.a)); }
A where_(const Array& c, const Array& a, const Array& b) { return wrap(mx::where(c.a, a.a, b.a)); }
A exp(const Array& a) { return wrap(mx::exp(a.a)); }
A log(const Array& a) { return wrap(mx::log(a.a)); }
A sqrt(const Array& a) { return wrap(mx::sqrt(a.a)); }
A rsqrt(const Array& a) { return wrap(mx::rsqrt(a.a)); }
A negative(const Array& a) { return wrap(mx::negative(a.a)); }
A sigmoid(const Array& a) { return wrap(mx::sigmoid(a.a)); }
A tanh(const Array& a) { return wrap(mx::tanh(a.a)); }
A silu(const Array& a) { return wrap(mx::multiply(a.a, mx::sigmoid(a.a))); }
A square(const Array& a) { return wrap(mx::square(a.a)); }
A astype(const Array& a, uint8_t dt) { return wrap(mx::astype(a.a, to_dtype(dt))); }

A matmul(const Array& a, const Array& b) { return wrap(mx::matmul(a.a, b.a)); }
A reshape(const Array& a, rust::Slice<const int32_t> s) { return wrap(mx::reshape(a.a, to_shape(s))); }
A transpose(const Array& a, rust::Slice<const int32_t> axes) {
  return wrap(mx::transpose(a.a, std::vector<int>(axes.begin(), axes.end())));
}
A swapaxes(const Array& a, int32_t a1, int32_t a2) { return wrap(mx::swapaxes(a.a, a1, a2)); }
A expand_dims(const Array& a, int32_t axis) { return wrap(mx::expand_dims(a.a, axis)); }
A squeeze(const Array& a, int32_t axis) { return wrap(mx::squeeze(a.a, axis)); }
A slice(const Array& a, rust::Slice<const int32_t> start, rust::Slice<const int32_t> stop) {
  return wrap(mx::slice(a.a, to_shape(start), to_shape(stop)));
}
A slice_update(const Array& src, const Array& upd, rust::Slice<const int32_t> start,
               rust::Slice<const int32_t> stop) {
  return wrap(mx::slice_update(src.a, upd.a, to_shape(start), to_shape(stop)));
}
A concatenate(const ArrayList& l, int32_t axis) { return wrap(mx::concatenate(l.v, axis)); }
A take(const Array& a, const Array& idx, int32_t axis) { return wrap(mx::take(a.a, idx.a, axis)); }
A contiguous(const Array& a) { return wrap(mx::contiguous(a.a)); }

A softmax(const Array& a, int32_t axis, bool precise) {
  return wrap(mx::softmax(a.a, std::vector<int>{axis}, precise));
}
A logsumexp(const Array& a, int32_t axis, bool k) { return wrap(mx::logsumexp(a.a, axis, k)); }
A argmax(const Array& a, int32_t axis, bool k) { return wrap(mx::argmax(a.a, axis, k)); }
A max(const Array& a, int32_t axis, bool k) { return wrap(mx::max(a.a, axis, k)); }
A sum(const Array& a, int32_t axis, bool k) { return wrap(mx::sum(a.a, axis, k)); }
A mean(const Array& a, int32_t axis, bool k) { return wrap(mx::mean(a.a, axis, k)); }

A rms_norm(const Array& x, const Array& w, float eps) {
  return wrap(mx::fast::rms_norm(x.a, w.a, eps));
}
A rope(const Array& x, int32_t dims, bool traditional, float base, float scale, int32_t offset,
       rust::Slice<const float> factors) {
  if (factors.empty()) return wrap(mx::fast::rope(x.a, dims, traditional, base, scale, offset));
  if (factors.size() != size_t(dims / 2))
    throw std::invalid_argument("rope: one frequency factor per rotated pair");
  std::vector<float> f(factors.begin(), factors.end());
  return wrap(mx::fast::rope(x.a, dims, traditional, std::nullopt, scale, offset,
                             rope_periods(dims, base, f)));
}
A sdpa(const Array& q, const Array& k, const Array& v, float scale, rust::Str mask_mode) {
  return wrap(mx::fast::scaled_dot_product_attention(q.a, k.a, v.a, scale, std::string(mask_mode)));
}
A sdpa_masked(const Array& q, const Array& k, const Array& v, float scale, const Array& mask) {
  return wrap(mx::fast::scaled_dot_product_attention(q.a, k.a, v.a, scale, "array", mask.a));
}

A dequantize(const Array& w, const Array& scales, const Array& biases, int32_t group_size,
             int32_t bits) {
  return wrap(mx::dequantize(w.a, scales.a, biases.a, group_size, bits));
}
A quantized_matmul(const Array& x, const Array& w, const Array& scales, const Array& biases,
                   bool transpose, int32_t group_size, int32_t bits) {
  return wrap(mx::quantized_matmul(x.a, w.a, scales.a, biases.a, transpose, group_size, bits));
}
std::unique_ptr<ArrayList> quantize(const Array& w, int32_t group_size, int32_t bits) {
  auto out = std::make_unique<ArrayList>();
  for (auto& a : mx::quantize(w.a, group_size, bits)) out->v.push_back(std::move(a));
  return out;
}

A random_key(uint64_t seed) { return wrap(mx::random::key(seed)); }
A random_split(const Array& key, int32_t num) { return wrap(mx::random::split(key.a, num)); }
A random_uniform(rust::Slice<const int32_t> s, const Array& key) {
  return wrap(mx::random::uniform(to_shape(s), mx::float32, key.a));
}
A random_categorical(const Array& logits, int32_t axis, const Array& key) {
  return wrap(mx::random::categorical(logits.a, axis, key.a));
}

std::unique_ptr<ArrayMap> load_gguf(rust::Str path) {
  auto [arrays, meta] = mx::load_gguf(std::string(path));
  auto m = std::make_unique<ArrayMap>();
  m->m = std::move(arrays);
  // Strings as they are; numeric scalars as decimal text (config values).
  for (auto& [k, v] : meta) {
    if (auto s = std::get_if<std::string>(&v)) {
      m->meta.emplace(k, *s);
    } else if (auto a = std::get_if<mx::array>(&v); a && a->size() == 1) {
      auto f = mx::astype(*a, mx::float64);
      f.eval();
      std::ostringstream os;
      os.precision(17);
      os << f.item<double>();
      m->meta.emplace(k, os.str());
    }
  }
  return m;
}
std::unique_ptr<ArrayMap> load_safetensors(rust::Str path) {
  auto [arrays, meta] = mx::load_safetensors(std::string(path));
  auto m = std::make_unique<ArrayMap>();
  m->m = std::move(arrays);
  m->meta = std::move(meta);
  return m;
}
std::unique_ptr<ArrayMap> new_map() { return std::make_unique<ArrayMap>(); }
void map_insert(ArrayMap& m, rust::Str name, const Array& x) {
  m.m.insert_or_assign(std::string(name), x.a);
}
void map_insert_meta(ArrayMap& m, rust::Str k, rust::Str v) {
  m.meta.insert_or_assign(std::string(k), std::string(v));
}
rust::Vec<rust::String> map_keys(const ArrayMap& m) {
  rust::Vec<rust::String> v;
  for (auto& kv : m.m) v.push_back(rust::String(kv.first));
  return v;
}
rust::Vec<rust::String> map_meta_keys(const ArrayMap& m) {
  rust::Vec<rust::String> v;
  for (auto& kv : m.meta) v.push_back(rust::String(kv.first));
  return v;
}
rust::String map_meta_get(const ArrayMap& m, rust::Str key) {
  auto it = m.meta.find(std::string(key));
  if (it == m.meta.end()) throw std::out_of_range("no metadata key " + std::string(key));
  return rust::String(it->second);
}
A map_get(const ArrayMap& m, rust::Str name) {
  auto it = m.m.find(std::string(name));
  if (it == m.m.end()) throw std::out_of_range("no tensor named " + std::string(name));
  return wrap(it->second);
}
void save_safetensors(rust::Str path, const ArrayMap& m) {
  mx::save_safetensors(std::string(path), m.m, m.meta);
}

size_t active_memory() { return mx::get_active_memory(); }
size_t peak_memory() { return mx::get_peak_memory(); }
void reset_peak_memory() { mx::reset_peak_memory(); }
size_t cache_memory() { return mx::get_cache_memory(); }
void clear_cache() { mx::clear_cache(); }
rust::String default_device() {
  auto d = mx::default_device();
  return rust::String(d.type == mx::Device::DeviceType::gpu ? "gpu" : "cpu");
}

uint64_t gpu_memory() {
  if (mx::default_device().type != mx::Device::DeviceType::gpu) return 0;
  const auto& info = mx::device_info(mx::default_device());
  for (const char* key : {"total_memory", "memory_size"}) {
    auto it = info.find(key);
    if (it != info.end() && std::holds_alternative<size_t>(it->second))
      return std::get<size_t>(it->second);
  }
  return 0;
}
rust::String mlx_version() { return rust::String(mx::version()); }

// The process's group, joined once. Its operations run on the CPU stream:
// the ring backend moves host memory.
namespace {
std::optional<mx::distributed::Group>& group() {
  static std::optional<mx::distributed::Group> g;
  return g;
}
mx::distributed::Group joined() {
  if (!group()) throw std::runtime_error("no distributed group: dist_init first");
  return *group();
}
}  // namespace

rust::Vec<int32_t> dist_init(rust::Str backend) {
  if (!group()) group() = mx::distributed::init(true, std::string(backend));
  rust::Vec<int32_t> out;
  out.push_back(group()->rank());
  out.push_back(group()->size());
  return out;
}
A dist_send(const Array& x, int32_t dst) {
  return wrap(mx::distributed::send(x.a, dst, joined(), mx::Device::cpu));
}
A dist_recv(rust::Slice<const int32_t> shape, uint8_t dtype, int32_t src) {
  return wrap(mx::distributed::recv(to_shape(shape), to_dtype(dtype), src, joined(), mx::Device::cpu));
}
A dist_all_gather(const Array& x) { return wrap(mx::distributed::all_gather(x.a, joined(), mx::Device::cpu)); }

#ifdef SPECD_OPENBLAS
int32_t blas_threads() { return openblas_get_num_threads(); }
void set_blas_threads(int32_t n) { openblas_set_num_threads(n); }
rust::String blas_config() { return rust::String(std::string("OpenBLAS ") + openblas_get_config()); }
#else
int32_t blas_threads() { return 0; }
void set_blas_threads(int32_t) {}
rust::String blas_config() { return rust::String("platform BLAS"); }
#endif

}  // namespace specd_mlx
