// specd's own CPU kernels, as MLX primitives: a quantized matmul over MLX's
// affine-quantized weights (4- and 8-bit, the layout MLX gives GGUF Q4_1/Q8_0)
// and a causal attention. Both are batch-invariant: every output row is
// computed by the same sequence of float operations whether it is one of 1 or
// of 16 rows, so a speculative verify rounds exactly like a one-token step.
//
// Why not MLX's own: on CPU its quantized_matmul is ~5x slower than fp32 GEMM,
// and GEMM/SDPA results for a row may change with the row count (BLAS picks
// kernels by shape).
//
// Work is split across a small pool of threads by output column (matmul) or
// by (head, query row) (attention); each output element is owned by exactly
// one thread, so threading never changes a result. The SIMD path is chosen
// once per process from the CPU's features (AVX-512, AVX2+FMA+F16C, scalar).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "specd-mlx/src/pages.h"
#include "specd-mlx/src/qmm.h"
#include "specd-mlx/src/shim.h"
#include "specd-mlx/src/top2.h"
#include "specd-mlx/src/waiting.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace specd_mlx {
namespace mx = mlx::core;

namespace {

// Scratch rows (a fused op's intermediates, attention scores, prepared
// activations) on cache lines, as kernel outputs are (pages.cc
// `aligned_data`): std::vector's malloc gives 16 bytes, and a 64-byte
// vector at 16 past a line is two loads.
template <class T>
struct LineAligned {
  using value_type = T;
  LineAligned() = default;
  template <class U>
  LineAligned(const LineAligned<U>&) {}
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64)));
  }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  template <class U>
  bool operator==(const LineAligned<U>&) const {
    return true;
  }
};
template <class T>
using Scratch = std::vector<T, LineAligned<T>>;

// ---- thread pool --------------------------------------------------------------
//
// Decode calls a kernel a few hundred times per token, tens of microseconds
// apart, so workers spin briefly before sleeping: a condition-variable wake
// per call would cost more than many of the calls themselves.
//
// A spinning worker holds a core, though, and three threads share the
// cores: the stream's (the caller of every kernel), the worker's and the
// engine's, which builds graphs, dispatches them and reads results. Unless
// the engine is blocked on the stream (`Waiting`, waiting.h), a worker idle
// for `kYieldAfter` yields its core at each turn of its wait instead of
// only pausing, so the engine's work runs beside the kernels' rather than
// after the scheduler takes the core back from a spinner. A shorter wait
// keeps spinning: within a forward the calls come microseconds apart, and a
// yield would delay the next pickup. Measured on 2 cores (int8, `bench serve
// --concurrency 1,8`, 3 runs each alternated): 8 streams 620-683 ->
// 682-727 tok/s, one stream unchanged (241-258 / 239-248); yielding from the
// first idle turn gave 8 streams as much but cost one stream 3-4%.
//
// A call is split into more chunks than threads and every participant
// (the caller included) claims chunks until none are left. The caller never
// waits for a worker to show up, only for chunks already claimed: on a busy
// machine a descheduled worker costs nothing but its own absence.
std::atomic<int> g_waiting{0};

class Pool {
 public:
  explicit Pool(int threads) : n_(std::max(1, threads)) {
    for (int i = 1; i < n_; i++) workers_.emplace_back([this] { work(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
      gen_.fetch_add(1);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return n_; }

  // Runs f(0..chunks-1) across the pool; returns when all are done.
  template <class F>
  void run(int chunks, F&& f) {
    if (chunks <= 1 || n_ == 1) {
      for (int c = 0; c < chunks; c++) f(c);
      return;
    }
    std::lock_guard<std::mutex> serial(submit_);
    auto call = [&](int c) { f(c); };
    Job job{[](void* ctx, int c) { (*static_cast<decltype(call)*>(ctx))(c); }, &call, chunks};
    cur_.store(&job);
    gen_.fetch_add(1);
    if (sleeping_.load() > 0) {
      std::lock_guard<std::mutex> lk(m_);
      cv_.notify_all();
    }
    job.drain();
    for (int spins = 0; job.done.load() < chunks; spins++) backoff(spins);
    // A worker that picked up `job` may still be looking at it.
    cur_.store(nullptr);
    for (int spins = 0; users_.load() > 0; spins++) backoff(spins);
  }

 private:
  struct Job {
    void (*fn)(void*, int);
    void* ctx;
    int total;
    std::atomic<int> next{0}, done{0};
    void drain() {
      for (int c; (c = next.fetch_add(1)) < total;) {
        fn(ctx, c);
        done.fetch_add(1);
      }
    }
  };
  static void pause() {
#if defined(__x86_64__)
    _mm_pause();
#else
    std::this_thread::yield();
#endif
  }
  static void backoff(int spins) {
    if (spins < 2000)
      pause();
    else
      std::this_thread::yield();
  }
  void work() {
    // Generation 0 is the pool's birth: a run submitted before this thread
    // got here must still be seen as new.
    uint64_t seen = 0;
    for (;;) {
      idle(seen);
      if (gen_.load() == seen) {
        std::unique_lock<std::mutex> lk(m_);
        sleeping_.fetch_add(1);
        cv_.wait(lk, [&] { return gen_.load() != seen; });
        sleeping_.fetch_sub(1);
      }
      seen = gen_.load();
      if (stop_) return;
      users_.fetch_add(1);
      if (Job* j = cur_.load()) j->drain();
      users_.fetch_sub(1);
    }
  }

  // Waits up to `kSleepAfter` for a run newer than `seen`: pausing, and
  // past `kYieldAfter` yielding while no thread waits on the stream.
  void idle(uint64_t seen) {
    using clock = std::chrono::steady_clock;
    constexpr auto kYieldAfter = std::chrono::microseconds(60);
    constexpr auto kSleepAfter = std::chrono::milliseconds(2);
    const auto t0 = clock::now();
    bool yielding = false;
    for (int spins = 1; gen_.load() == seen; spins++) {
      if (yielding && g_waiting.load(std::memory_order_relaxed) == 0)
        std::this_thread::yield();
      else
        pause();
      if (spins % 64 == 0) {
        auto waited = clock::now() - t0;
        if (waited > kSleepAfter) return;
        yielding = waited > kYieldAfter;
      }
    }
  }

  int n_;
  std::vector<std::thread> workers_;
  std::mutex submit_, m_;
  std::condition_variable cv_;
  std::atomic<uint64_t> gen_{0};
  std::atomic<int> sleeping_{0}, users_{0};
  std::atomic<Job*> cur_{nullptr};
  std::atomic<bool> stop_{false};
};

// Set by set_kernel_threads before the pool exists (bench --threads); 0: none.
std::atomic<int> g_requested_threads{0};
std::atomic<bool> g_pool_made{false};

int default_threads() {
  if (int n = g_requested_threads.load(); n > 0) return n;
  if (const char* s = std::getenv("SPECD_THREADS")) {
    int n = std::atoi(s);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

Pool& pool() {
  static Pool p = [] {
    g_pool_made = true;
    return Pool(default_threads());
  }();
  return p;
}

// Splits [0, n) into `parts` contiguous ranges, aligned to `align`.
std::pair<int, int> share(int n, int parts, int part, int align) {
  int blocks = (n + align - 1) / align;
  int per = blocks / parts, extra = blocks % parts;
  int b0 = part * per + std::min(part, extra);
  int b1 = b0 + per + (part < extra ? 1 : 0);
  return {std::min(n, b0 * align), std::min(n, b1 * align)};
}

// f(first, end) over the items [0, n) on the pool: one range when `alone`
// (too little work to be worth a second thread), else up to 4 ranges a
// thread, so a thread that finishes early takes another.
template <class F>
void run_ranges(int n, bool alone, F f) {
  int chunks = alone ? 1 : std::min(4 * pool().size(), n);
  pool().run(chunks, [&](int i) {
    auto [first, end] = share(n, chunks, i, 1);
    f(first, end);
  });
}

// ---- SIMD level ---------------------------------------------------------------

enum class Isa { Scalar, Avx2, Avx512 };

Isa detect_isa() {
  if (const char* s = std::getenv("SPECD_KERNEL_ISA")) {
    std::string v(s);
    if (v == "scalar") return Isa::Scalar;
    if (v == "avx2") return Isa::Avx2;
  }
#if defined(SPECD_X86_KERNELS)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) return Isa::Avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c"))
    return Isa::Avx2;
#endif
  return Isa::Scalar;
}

Isa isa() {
  static Isa i = detect_isa();
  return i;
}

float h2f(uint16_t h) {
  mx::float16_t f;
  std::memcpy(&f, &h, 2);
  return static_cast<float>(f);
}

// ---- one primitive for every kernel -------------------------------------------
//
// `Body::prepare(inputs)` runs at graph evaluation, when the inputs' buffers
// and strides are known (and throws on misfits); `Body::run(inputs, output,
// prepared)` is the work, dispatched on the CPU stream's thread. The inputs
// ride along in the task so their buffers outlive it.
//
// `OwnOp` is what every kernel op is: its output is always a fresh
// row-major buffer, so `rowmajor` can take one before it is computed.
class OwnOp : public mx::UnaryPrimitive {
  using UnaryPrimitive::UnaryPrimitive;
};

template <class Body>
class KernelOp : public OwnOp {
 public:
  KernelOp(mx::Stream s, const char* name, Body body)
      : OwnOp(s), name_(name), body_(std::move(body)) {}
  void eval_cpu(const std::vector<mx::array>& in, mx::array& out) override {
    out.set_data(aligned_data(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (auto& x : in) enc.set_input_array(x);
    enc.set_output_array(out);
    auto info = body_.prepare(in, out);
    enc.dispatch([body = body_, info = std::move(info), keep = in, out]() mutable {
      body.run(keep, out, info);
    });
  }
  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error(std::string(name_) + " has no GPU kernel (the op falls back to MLX's)");
  }
  const char* name() const override { return name_; }
  const Body& body() const { return body_; }

 private:
  const char* name_;
  Body body_;
};

// Ops of specd's own built since the start: the portable path
// (`--kernels mlx`) must build none, and its tests check that it did not.
std::atomic<uint64_t> g_own_ops{0};
// Set once, before the model loads: every entry point takes MLX's own ops,
// as a GPU build does (the portable path, on whatever device MLX picks).
std::atomic<bool> g_mlx_ops{false};

template <class Body>
A kernel_op(const char* name, Body body, mx::Shape shape, std::vector<mx::array> inputs,
            mx::Dtype dtype = mx::float32) {
  g_own_ops.fetch_add(1, std::memory_order_relaxed);
  auto prim =
      std::make_shared<KernelOp<Body>>(mx::default_stream(mx::Device::cpu), name, std::move(body));
  return std::make_unique<Array>(mx::array(std::move(shape), dtype, prim, std::move(inputs)));
}

// x rounded to f16, to nearest with ties to even: bitwise F16C's
// `vcvtps2ph` (qmm::to_half_avx2), for CPUs without it and the scalar level.
uint16_t f2h(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
  if (a >= 0x7f800000u)  // inf, or NaN kept quiet with its top payload bits
    return sign | 0x7c00u | (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ffu) : 0u);
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // rounds past 65504
  if (a >= 0x38800000u) {                       // a normal half
    uint32_t m = a - 0x38000000u;               // rebias 127 -> 15
    uint32_t r = (m >> 13) + (((m >> 12) & 1u) & (((m & 0x1fffu) != 0x1000u) | ((m >> 13) & 1u)));
    return sign | r;
  }
  // Subnormal or zero: the value in units of 2^-24, rounded to even.
  int e = (int)(a >> 23);
  if (e < 102) return sign;  // below half of the smallest subnormal
  uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  int shift = 126 - e;  // mant * 2^(e - 150) / 2^-24 = mant >> (126 - e)
  uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) q++;
  return sign | q;
}

void to_half(const float* x, uint16_t* y, int n) {
#if defined(SPECD_X86_KERNELS)
  if (isa() != Isa::Scalar) return qmm::to_half_avx2(x, y, n);
#endif
  for (int i = 0; i < n; i++) y[i] = f2h(x[i]);
}

// One row of an RMS norm: y = x * rsqrt(mean(x^2) + eps) * w. Shared by the
// norm op and the norm folded into a matmul, so both round identically.
void rms_norm_row(const float* xr, int64_t col, const float* w, int D, float eps, float* yr) {
  float ss = 0.f;
  for (int i = 0; i < D; i++) ss += xr[i * col] * xr[i * col];
  float inv = 1.f / std::sqrt(ss / D + eps);
  for (int i = 0; i < D; i++) yr[i] = (xr[i * col] * inv) * w[i];
}

// Rotary embedding of head rows at one position, shared by the rope op and
// the rope folded into the q/k/v matmul so both round identically. The angle
// is computed per (position, frequency) exactly as MLX's fallback does:
// theta = (pos * scale) * exp(-i * log(base) / half).
struct Rope {
  int dims, half;
  bool traditional;
  float base, scale;
  std::vector<float> cs, sn;
  Rope(int dims, bool traditional, float base, float scale)
      : dims(dims), half(dims / 2), traditional(traditional), base(base), scale(scale),
        cs(half), sn(half) {}
  // The frequencies depend on (dims, base) only: computed once per thread.
  const std::vector<float>& freq() const {
    thread_local std::vector<float> f;
    thread_local int f_dims = -1;
    thread_local float f_base = 0.f;
    if (f_dims != dims || f_base != base) {
      float step = std::log(base) / half;
      f.resize(half);
      for (int i = 0; i < half; i++) f[i] = std::exp(-float(i) * step);
      f_dims = dims, f_base = base;
    }
    return f;
  }
  void at(int position) {
    const auto& f = freq();
    float pos = float(position) * scale;
    for (int i = 0; i < half; i++) {
      float theta = pos * f[i];
      cs[i] = std::cos(theta);
      sn[i] = std::sin(theta);
    }
  }
  // y = rope(x) over one head of D values (x's values `col` apart); y may be x.
  void row(const float* x, int64_t col, float* y, int D) const {
    for (int i = 0; i < half; i++) {
      int i1 = traditional ? 2 * i : i, i2 = traditional ? 2 * i + 1 : i + half;
      float x1 = x[i1 * col], x2 = x[i2 * col];
      y[i1] = x1 * cs[i] - x2 * sn[i];
      y[i2] = x1 * sn[i] + x2 * cs[i];
    }
    for (int i = dims; i < D; i++) y[i] = x[i * col];
  }
};

// ---- quantized matmul -----------------------------------------------------------
//
// y[m, n] = sum_k x[m, k] * (s[n, g] * q[n, k] + b[n, g]),  g = k / group
//         = sum_g s[n, g] * dot(x[m, g], q[n, g]) + b[n, g] * xsum[m, g]
//
// over weights packed once at load (qmm.h: 16 output columns to a vector,
// x broadcast), so no horizontal sums and no per-call reordering of x. Per
// call, only the per-group sums of x are computed (and strided rows gathered).

using QArgs = qmm::Args;

// Element offsets of each row (all axes but the last) of a strided array:
// the kernels read their inputs where they lie instead of asking MLX for a
// contiguous copy (one more op per call).
std::vector<int64_t> row_offsets(const mx::array& a) {
  int nd = a.ndim();
  int64_t rows = a.size() / a.shape(-1);
  std::vector<int64_t> off(rows);
  std::vector<int> idx(std::max(nd - 1, 0), 0);
  for (int64_t r = 0; r < rows; r++) {
    int64_t o = 0;
    for (int d = 0; d < nd - 1; d++) o += idx[d] * a.strides()[d];
    off[r] = o;
    for (int d = nd - 2; d >= 0; d--) {
      if (++idx[d] < a.shape(d)) break;
      idx[d] = 0;
    }
  }
  return off;
}

// A gated unit's input row: silu(g) * u, or with `gelu` gelu_tanh(g) * u
// (Gemma's GeGLU), over D values of two (possibly strided) rows. The
// swiglu op and a matmul that folds it in (`Glu`) both call this, so the
// two give the same bits.
enum class Glu { None, Silu, Gelu };
void glu_row(const float* g, const float* u, int64_t gc, int64_t uc, float* y, int D, bool gelu) {
#if defined(SPECD_X86_KERNELS)
  if (gc == 1 && uc == 1 && isa() != Isa::Scalar)
    return (gelu ? qmm::geglu_avx2 : qmm::swiglu_avx2)(g, u, y, D);
#endif
  for (int i = 0; i < D; i++) {
    float gv = g[i * gc];
    float z = gelu ? -1.5957691216057308f * std::fma(0.044715f * (gv * gv), gv, gv) : -gv;
    y[i] = gv / (1.f + std::exp(z)) * u[i * uc];
  }
}

// The sums of a row's groups of `group` values, each added in order from
// 0 (the bits of a sequential loop). A lone chain of adds runs at their
// latency; the AVX2 version advances 8 groups side by side.
void group_sums(const float* xr, int K, int group, float* out) {
#if defined(SPECD_X86_KERNELS)
  if (isa() != Isa::Scalar) return qmm::group_sums_avx2(xr, K, group, out);
#endif
  for (int g = 0; g < K / group; g++) {
    float acc = 0.f;
    for (int i = 0; i < group; i++) acc += xr[(size_t)g * group + i];
    out[g] = acc;
  }
}

// Rows of x as a dense [M, K] block (x itself when it already is one, and
// no norm or gated unit is to be applied; with `glu` each row of x holds
// 2 K values, gate then up) and their per-group sums, in a fixed order.
// `also(m, row)` then runs on each dense row (the 8-bit or nibble-scaled
// copies). Rows are independent, so with several they are spread over the
// pool: the matmul's threads would otherwise wait on this part.
template <class F>
const float* prepare_x(const float* x, const std::vector<int64_t>& row_off, int64_t col, int M,
                       int K, int group, const float* norm_w, float eps, Glu glu,
                       Scratch<float>& dense, float* xs, F&& also) {
  bool packed = col == 1 && !norm_w && glu == Glu::None;
  for (int m = 0; m < M && packed; m++) packed = row_off[m] == (int64_t)m * K;
  if (!packed) dense.resize((size_t)M * K);
  float* d0 = packed ? nullptr : dense.data();
  const float* xr0 = packed ? x : d0;
  const int groups = K / group;
  auto row = [&](int m) {
    if (!packed) {
      float* d = d0 + (size_t)m * K;
      if (norm_w)
        rms_norm_row(x + row_off[m], col, norm_w, K, eps, d);
      else if (glu != Glu::None)
        glu_row(x + row_off[m], x + row_off[m] + K * col, col, col, d, K, glu == Glu::Gelu);
      else
        for (int i = 0; i < K; i++) d[i] = x[row_off[m] + i * col];
    }
    const float* xr = xr0 + (size_t)m * K;
    group_sums(xr, K, group, xs + (size_t)m * groups);
    also(m, xr);
  };
  pool().run(M, row);
  return xr0;
}

// The packed layout's formula (qmm_simd.h), one lane at a time.
// The float32 (or float16) scale and bias of lane l in a packed group whose
// scales start at `sb`.
inline std::pair<float, float> lane_scale(const uint32_t* sb, int l, bool f32) {
  if (f32) {
    const float* f = reinterpret_cast<const float*>(sb);
    return {f[l], f[qmm::kLanes + l]};
  }
  const uint16_t* h = reinterpret_cast<const uint16_t*>(sb);
  return {h2f(h[l]), h2f(h[qmm::kLanes + l])};
}

void qmm_scalar(const QArgs& a, int cb0, int cb1) {
  const int vb = qmm::value_bits(a.bits);
  const bool f32 = qmm::scale_f32(a.bits);
  const int groups = a.K / a.group, per = 32 / vb, dpg = a.group / per;
  const int gw = qmm::group_words(a.group, a.bits);
  const uint32_t mask = (1u << vb) - 1;
  for (int cb = cb0; cb < cb1; cb++)
    for (int l = 0; l < qmm::kLanes && cb * qmm::kLanes + l < a.N; l++)
      for (int m = 0; m < a.M; m++) {
        const float* xr = a.x + (size_t)m * a.K;
        float acc = 0.f;
        for (int g = 0; g < groups; g++) {
          const uint32_t* base = a.w + ((size_t)cb * groups + g) * gw;
          float t = 0.f;
          for (int d = 0; d < dpg; d++)
            for (int j = 0; j < per; j++) {
              float q = float((base[d * qmm::kLanes + l] >> (j * vb)) & mask);
              t = std::fma(xr[g * a.group + d * per + j], q, t);
            }
          auto [s, b] = lane_scale(base + dpg * qmm::kLanes, l, f32);
          acc = std::fma(t, s, acc);
          acc = std::fma(b, a.xsum[(size_t)m * groups + g], acc);
        }
        size_t at = (size_t)m * a.N + cb * qmm::kLanes + l;
        a.y[at] = a.r ? acc + a.r[at] : acc;
      }
}

// Rows of x as 8-bit blocks and their scales (qmm.h, `Args::xq`).
void quantize_x(const float* x, int M, int K, int bits, int8_t* xq, float* xd) {
  const int vb = qmm::value_bits(bits);
  for (int m = 0; m < M; m++)
    for (int b = 0; b < K / 32; b++) {
      const float* xb = x + (size_t)m * K + b * 32;
      float amax = 0.f;
      for (int i = 0; i < 32; i++) amax = std::max(amax, std::fabs(xb[i]));
      const float inv = amax > 0.f ? 127.f / amax : 0.f;
      xd[(size_t)m * (K / 32) + b] = amax / 127.f;
      int8_t* q = xq + (size_t)m * K + b * 32;
      for (int i = 0; i < 32; i++) q[qmm::q8_byte(i, vb)] = (int8_t)std::nearbyint(xb[i] * inv);
    }
}

// The 8-bit activation formula (qmm_vnni.cc), one lane at a time.
void qmm_q8_scalar(const QArgs& a, int cb0, int cb1) {
  const int vb = qmm::value_bits(a.bits);
  const bool f32 = qmm::scale_f32(a.bits);
  const int groups = a.K / a.group, per = 32 / vb, dpg = a.group / per, wpb = 32 / per;
  const int gw = qmm::group_words(a.group, a.bits), blocks = a.K / 32;
  const uint32_t mask = (1u << vb) - 1;
  for (int cb = cb0; cb < cb1; cb++)
    for (int l = 0; l < qmm::kLanes && cb * qmm::kLanes + l < a.N; l++)
      for (int m = 0; m < a.M; m++) {
        float acc = 0.f;
        for (int g = 0; g < groups; g++) {
          const uint32_t* base = a.w + ((size_t)cb * groups + g) * gw;
          float t = 0.f;
          for (int bk = 0; bk < a.group / 32; bk++) {
            const int blk = g * (a.group / 32) + bk;
            const int8_t* xb = a.xq + (size_t)m * a.K + blk * 32;
            int32_t isum = 0;
            for (int d = 0; d < wpb; d++) {
              uint32_t w = base[(bk * wpb + d) * qmm::kLanes + l];
              for (int j = 0; j < per; j++) {
                isum += int32_t((w >> (j * vb)) & mask) * xb[qmm::q8_byte(d * per + j, vb)];
              }
            }
            t = std::fma(float(isum), a.xd[(size_t)m * blocks + blk], t);
          }
          auto [s, b] = lane_scale(base + dpg * qmm::kLanes, l, f32);
          acc = std::fma(t, s, acc);
          acc = std::fma(b, a.xsum[(size_t)m * groups + g], acc);
        }
        size_t at = (size_t)m * a.N + cb * qmm::kLanes + l;
        a.y[at] = a.r ? acc + a.r[at] : acc;
      }
}

// Which kernels run 8-bit activations: VNNI where the CPU has it, the AVX2
// `vpmaddubsw` ones on any other AVX2 CPU, else the scalar formula. The same
// level quantizes x and multiplies (they agree on the bytes anyway).
enum class Q8 { Vnni, Avx2, Scalar };

Q8 q8_level() {
#if defined(SPECD_X86_KERNELS)
  static Q8 l = isa() == Isa::Avx512 && __builtin_cpu_supports("avx512vnni") ? Q8::Vnni
                : isa() != Isa::Scalar                                      ? Q8::Avx2
                                                                            : Q8::Scalar;
  return l;
#else
  return Q8::Scalar;
#endif
}

void qmm_range(const QArgs& a, int cb0, int cb1) {
  if (a.xq) {
    switch (q8_level()) {
#if defined(SPECD_X86_KERNELS)
      case Q8::Vnni: return qmm::vnni(a, cb0, cb1);
      case Q8::Avx2: return qmm::q8_avx2(a, cb0, cb1);
#endif
      default: return qmm_q8_scalar(a, cb0, cb1);
    }
  }
  switch (isa()) {
#if defined(SPECD_X86_KERNELS)
    case Isa::Avx512: qmm::avx512(a, cb0, cb1); return;
    case Isa::Avx2: qmm::avx2(a, cb0, cb1); return;
#endif
    default: qmm_scalar(a, cb0, cb1); return;
  }
}

// Below this many weight bytes a matmul runs on one thread: waking the pool
// costs more than it saves.
constexpr size_t kParallelBytes = 32 * 1024;

void qmm_run(const float* x, const std::vector<int64_t>& row_off, int64_t col, const uint32_t* w,
             const float* norm_w, float eps, const float* r, float* y, int M, int N, int K,
             int group, int bits, Glu glu) {
  // Reused across calls: this runs a few hundred times per token.
  thread_local Scratch<float> dense, xs, xqd, xn;
  thread_local Scratch<int8_t> xq;
  const bool q8 = (bits & qmm::kActQ8) && qmm::q8_fits(K, group, bits);
  bits &= ~qmm::kActQ8;
  const int vb = qmm::value_bits(bits);
  xs.resize((size_t)M * (K / group));
  if (q8) xq.resize((size_t)M * K), xqd.resize((size_t)M * (K / 32));
  // Decode and verify sizes only (below the panel kernel's rows, which
  // unpacks once for all rows): a prefill's x copy would crowd its own
  // rows out of the cache (measured: prefill 0.93x at 190 rows), where
  // the shift saved is worth 2% (1.2x at one row).
  bool nibbles = false;
#if defined(SPECD_X86_KERNELS)
  nibbles = !q8 && isa() == Isa::Avx2 && vb == 4 && K % 8 == 0 && M < qmm::kPanelRows;
#endif
  if (nibbles) xn.resize((size_t)M * K);
  // Plain pointers: the rows may be prepared on the pool's threads, where
  // these names are that thread's own (thread_local) buffers.
  int8_t* xq0 = xq.data();
  float *xqd0 = xqd.data(), *xn0 = xn.data();
  std::atomic<bool> exact{true};
  const float* xd = prepare_x(
      x, row_off, col, M, K, group, norm_w, eps, glu, dense, xs.data(), [&](int m, const float* xr) {
        if (q8) {
          int8_t* q = xq0 + (size_t)m * K;
          float* d = xqd0 + (size_t)m * (K / 32);
          switch (q8_level()) {
#if defined(SPECD_X86_KERNELS)
            case Q8::Vnni: qmm::quantize_vnni(xr, 1, K, vb, q, d); break;
            case Q8::Avx2: qmm::quantize_avx2(xr, 1, K, vb, q, d); break;
#endif
            default: quantize_x(xr, 1, K, bits, q, d); break;
          }
        }
#if defined(SPECD_X86_KERNELS)
        if (nibbles && !qmm::scale_nibbles(xr, 1, K, xn0 + (size_t)m * K)) exact = false;
#endif
      });
  QArgs a{xd, xs.data(), w, r, y, M, N, K, group, bits};
  if (q8) a.xq = xq0, a.xd = xqd0;
  if (nibbles && exact) a.x = xn0, a.x_nibble_scaled = true;
  int blocks = (N + qmm::kLanes - 1) / qmm::kLanes;
  size_t bytes = (size_t)N * K * qmm::value_bits(bits) / 8;
  // Chunks of 4 blocks keep the widest one-row tile whole.
  int chunks = bytes < kParallelBytes ? 1 : std::min(4 * pool().size(), (blocks + 3) / 4);
  pool().run(chunks, [&](int i) {
    auto [b0, b1] = share(blocks, chunks, i, 4);
    qmm_range(a, b0, b1);
  });
}

// x [..., K] f32 (any strides) and packed weights, then optionally an RMS
// norm weight [K] applied to x first, then optionally a residual shaped
// like the output (both row-contiguous).
struct QmmBody {
  int n = 0, group = 0, bits = 0;
  bool norm = false, residual = false;
  float eps = 0.f;
  // x holds a gated unit's gate and up halves side by side ([..., 2 K]):
  // the matmul's input is glu_row of them, made as the rows are prepared
  // (one op and one pass over the rows fewer than a separate swiglu op).
  Glu glu = Glu::None;
  // Rope folded in: heads of head_dim over columns [0, rope_cols) rotated
  // in place, row t at position rope_positions[t] (one sequence's rows or
  // several sequences', a batch's).
  int rope_cols = 0, head_dim = 0;
  std::vector<int32_t> rope_positions;
  bool rope_traditional = false;
  float rope_base = 0.f;
  struct Rows {
    std::vector<int64_t> off;
    int64_t col;
  };
  // The rows of in[0] (x) as the matmul reads them, once inputs 1 to
  // `last` - 1 (weights, norm, residual) are checked row-contiguous.
  static Rows rows_of(const std::vector<mx::array>& in, size_t last, const char* op) {
    for (size_t i = 1; i < last; i++)
      if (!in[i].flags().row_contiguous)
        throw std::runtime_error(std::string(op) + ": weights, norm and residual must be row-contiguous");
    return {row_offsets(in[0]), in[0].strides().back()};
  }
  Rows prepare(const std::vector<mx::array>& in, const mx::array&) const {
    return rows_of(in, in.size(), "SpecdQMatmul");
  }
  void run(const std::vector<mx::array>& in, mx::array& out, const Rows& rows) const {
    const float* norm_w = norm ? in[2].data<float>() : nullptr;
    const float* r = residual ? in[norm ? 3 : 2].data<float>() : nullptr;
    compute(in[0].data<float>(), rows, in[0].size() / in[0].shape(-1), in[0].shape(-1),
            in[1].data<uint32_t>(), norm_w, r, out.data<float>());
  }
  // The matmul (and rope) of M rows of x (`width` features each, laid out
  // as `rows` says) into y, [M, n] row-major.
  void compute(const float* x, const Rows& rows, int M, int width, const uint32_t* w,
               const float* norm_w, const float* r, float* y) const {
    int K = glu == Glu::None ? width : width / 2;
    qmm_run(x, rows.off, rows.col, w, norm_w, eps, r, y, M, n, K, group, bits, glu);
    if (rope_cols > 0) {
      // Row by row (each at its own angles), rows spread over the pool.
      run_ranges(M, false, [&](int t0, int t1) {
        Rope rope(head_dim, rope_traditional, rope_base, 1.f);
        for (int t = t0; t < t1; t++) {
          rope.at(rope_positions[t]);
          for (int c = 0; c < rope_cols; c += head_dim) {
            float* h = y + (size_t)t * n + c;
            rope.row(h, 1, h, head_dim);
          }
        }
      });
    }
  }
};

// A llama layer after its attention, as one op: h = x + o W_o^T, then
// y = h + down(glu(rms_norm(h) W_gate_up^T)). The three matmuls of the ops
// it replaces (qmatmul_packed_add, qmatmul_packed_norm,
// qmatmul_packed_glu_add), computed on the same rows in the same order, so
// the same bits; h and the gate/up rows live in this thread's scratch
// instead of two arrays, and a layer has two op boundaries fewer (each a
// dispatch on the engine thread and a pickup on the stream's).
struct TailBody {
  QmmBody o, gate_up, down;
  QmmBody::Rows prepare(const std::vector<mx::array>& in, const mx::array&) const {
    return QmmBody::rows_of(in, in.size(), "SpecdLayerTail");
  }
  // in: o (attention's output), x (the layer's input), W_o, the MLP's norm
  // weight, W_gate_up, W_down.
  void run(const std::vector<mx::array>& in, mx::array& out, const QmmBody::Rows& rows) const {
    compute(in[0].data<float>(), rows, in[0].size() / in[0].shape(-1), in[0].shape(-1),
            in.data() + 1, out.data<float>());
  }
  // M rows of o (`width` features each, laid out as `rows` says); `w`
  // points at x (row-major [M, o.n]), W_o, the MLP's norm weight,
  // W_gate_up and W_down, in that order.
  void compute(const float* o_x, const QmmBody::Rows& rows, int M, int width,
               const mx::array* w, float* y) const {
    const int d = o.n, gu = gate_up.n;
    thread_local Scratch<float> h, g;
    thread_local QmmBody::Rows h_rows{{}, 1}, g_rows{{}, 1};
    h.resize((size_t)M * d), g.resize((size_t)M * gu);
    h_rows.off.resize(M), g_rows.off.resize(M);
    for (int t = 0; t < M; t++) h_rows.off[t] = (int64_t)t * d, g_rows.off[t] = (int64_t)t * gu;
    o.compute(o_x, rows, M, width, w[1].data<uint32_t>(), nullptr, w[0].data<float>(), h.data());
    gate_up.compute(h.data(), h_rows, M, d, w[3].data<uint32_t>(), w[2].data<float>(), nullptr,
                    g.data());
    down.compute(g.data(), g_rows, M, gu, w[4].data<uint32_t>(), nullptr, h.data(), y);
  }
};

// Rows `ids` of packed weights, dequantized: an embedding lookup straight
// from the layout the matmul reads (w = scale * q + bias). The ids are read
// when the op runs (they may be an argmax computed just before); one past
// the table gives a zero row rather than a read out of bounds.
struct QRowsBody {
  int n, group, bits;
  int prepare(const std::vector<mx::array>& in, const mx::array&) const {
    if (!in[0].flags().row_contiguous || !in[1].flags().row_contiguous)
      throw std::runtime_error("SpecdQRows: inputs must be row-contiguous");
    return 0;
  }
  void run(const std::vector<mx::array>& in, mx::array& out, int) const {
    const uint32_t* w = in[0].data<uint32_t>();
    const uint32_t* ids = in[1].data<uint32_t>();
    float* y = out.data<float>();
    const int vb = qmm::value_bits(bits);
    const bool f32 = qmm::scale_f32(bits);
    const int groups = in[0].shape(1), K = groups * group, per = 32 / vb, dpg = group / per;
    const int gw = qmm::group_words(group, bits);
    const uint32_t mask = (1u << vb) - 1;
    for (int64_t t = 0; t < (int64_t)in[1].size(); t++) {
      float* yr = y + t * K;
      uint32_t id = ids[t];
      if (id >= (uint32_t)n) {
        std::fill(yr, yr + K, 0.f);
        continue;
      }
      int cb = id / qmm::kLanes, l = id % qmm::kLanes;
      for (int g = 0; g < groups; g++) {
        const uint32_t* base = w + ((size_t)cb * groups + g) * gw;
        auto [s, b] = lane_scale(base + dpg * qmm::kLanes, l, f32);
        for (int d = 0; d < dpg; d++)
          for (int j = 0; j < per; j++)
            yr[g * group + d * per + j] =
                s * float((base[d * qmm::kLanes + l] >> (j * vb)) & mask) + b;
      }
    }
  }
};

// ---- attention ----------------------------------------------------------------
//
// softmax(scale * q k^T + causal) v per (head, query row), keys in order,
// one thread per (head, row) range. Query row t of T sees keys [0, L - T + t].

struct AttnArgs {
  const float* q;  // strided [H, T, D]
  const float* k;  // strided [Hkv, L, D]
  const float* v;  // strided [Hkv, L, Dv]
  float* o;        // [T, H, Dv] contiguous (heads last: a free reshape to [T, H * Dv])
  int H, Hkv, T, L, D, Dv;
  int64_t q_head, q_row, q_col, k_head, k_row, k_col, v_head, v_row, v_col;
  float scale;
  bool causal;
};

float dot(const float* a, const float* b, int n) {
#if defined(SPECD_X86_KERNELS)
  if (isa() != Isa::Scalar) return qmm::dot_avx2(a, b, n);
#endif
  float r = 0.f;
  for (int i = 0; i < n; i++) r += a[i] * b[i];
  return r;
}

// Row j of a strided [L, n] matrix as a dense pointer (gathered into `tmp`
// when its elements are not adjacent).
inline const float* row_of(const float* base, int64_t row, int64_t col, int j, int n,
                           float* tmp) {
  const float* r = base + j * row;
  if (col == 1) return r;
  for (int i = 0; i < n; i++) tmp[i] = r[i * col];
  return tmp;
}

void axpy(float a, const float* x, float* y, int n) {
#if defined(SPECD_X86_KERNELS)
  if (isa() != Isa::Scalar) return qmm::axpy_avx2(a, x, y, n);
#endif
  for (int i = 0; i < n; i++) y[i] = std::fma(a, x[i], y[i]);
}

float exp_sum(float* p, int n, float shift) {
#if defined(SPECD_X86_KERNELS)
  if (isa() != Isa::Scalar) return qmm::exp_sum_avx2(p, n, shift);
#endif
  float sum = 0.f;
  for (int j = 0; j < n; j++) {
    p[j] = std::exp(p[j] - shift);
    sum += p[j];
  }
  return sum;
}

void attn_rows(const AttnArgs& a, int r0, int r1, Scratch<float>& p) {
  int rep = a.H / a.Hkv;
  p.resize(a.L + 2 * a.D + a.Dv);
  float* ktmp = p.data() + a.L;
  float* vtmp = ktmp + a.D;
  float* qtmp = vtmp + a.Dv;
  for (int hr = r0; hr < r1; hr++) {
    int h = hr / a.T, t = hr % a.T;
    int kvh = h / rep;
    int n = a.causal ? a.L - a.T + t + 1 : a.L;
    const float* q = row_of(a.q + h * a.q_head, a.q_row, a.q_col, t, a.D, qtmp);
    const float* kb = a.k + kvh * a.k_head;
    const float* vb = a.v + kvh * a.v_head;
    float mx = -INFINITY;
    for (int j = 0; j < n; j++) {
      p[j] = dot(q, row_of(kb, a.k_row, a.k_col, j, a.D, ktmp), a.D) * a.scale;
      mx = std::max(mx, p[j]);
    }
    float sum = exp_sum(p.data(), n, mx);
    float* o = a.o + ((size_t)t * a.H + h) * a.Dv;
    std::fill(o, o + a.Dv, 0.f);
    for (int j = 0; j < n; j++) {
      const float* vr = row_of(vb, a.v_row, a.v_col, j, a.Dv, vtmp);
      float pj = p[j];
      axpy(pj, vr, o, a.Dv);
    }
    float inv = 1.f / sum;
    for (int d = 0; d < a.Dv; d++) o[d] *= inv;
  }
}

// Head dims the grouped attention (qmm::attn_group_avx512 / _avx2) takes:
// the default model's 64, 128, and Gemma 3's 256.
inline bool grouped_dim(int d) { return d == 64 || d == 128 || d == 256; }

#if defined(SPECD_X86_KERNELS)
// The grouped attention at the CPU's SIMD level (grouped_dim shapes) for
// `rows` query rows of one sequence and kv head (qmm::attn_group_rows_avx512
// / _avx2); `scores` holds heads * (the rows' n summed) floats.
inline void attn_groups(const qmm::AttnGroup* g, int rows, float* scores) {
  if (isa() == Isa::Avx512) {
    // One row: the per-row kernel, which prefetches the cache rows ahead (a
    // batched decode step reads each sequence's cache from memory).
    if (rows == 1 || !qmm::attn_group_rows_avx512(g, rows, scores))
      for (int r = 0; r < rows; r++) {
        qmm::attn_group_avx512(g[r], scores);
        scores += (size_t)g[r].heads * g[r].n;
      }
  } else {
    qmm::attn_group_rows_avx2(g, rows, scores);
  }
}

// Rows [t0, t1) of one sequence over kv head `kvh`, each a copy of `shared`
// (cache, heads, head dim, scale) with its own rows: head h's query and
// output rows of row t at q(t, h) and o(t, h), its keys n(t).
template <class Q, class O, class N>
void attn_block(const qmm::AttnGroup& shared, int kvh, int t0, int t1, Q q, O o, N n,
                Scratch<float>& scores) {
  qmm::AttnGroup g[qmm::kAttnMaxRows];
  size_t need = 0;
  for (int t = t0; t < t1; t++) {
    qmm::AttnGroup& gt = g[t - t0] = shared;
    for (int i = 0; i < shared.heads; i++) {
      gt.q[i] = q(t, kvh * shared.heads + i);
      gt.o[i] = o(t, kvh * shared.heads + i);
    }
    gt.n = n(t);
    need += (size_t)shared.heads * gt.n;
  }
  scores.resize(need);
  attn_groups(g, t1 - t0, scores.data());
}
#endif

// How the grouped attention cuts T query rows of a sequence over Hkv kv
// heads into units: `rows` a unit (they share each read of the cache), up
// to kAttnMaxRows, while there are still units for every thread; `blocks`
// units a kv head. At T = 8 over 3 kv heads on 2 threads: 2 blocks of 4.
struct RowBlocks {
  int rows, blocks;
};
inline RowBlocks row_blocks(int T, int Hkv) {
  if (T == 0) return {1, 0};
  int want = std::max((T + qmm::kAttnMaxRows - 1) / qmm::kAttnMaxRows,
                      std::min(T, (2 * pool().size() + Hkv - 1) / Hkv));
  int rows = (T + want - 1) / want;
  return {rows, (T + rows - 1) / rows};
}

// q, k, v [1, heads, len, dim], any strides; output [1, T, H, Dv].
struct AttnBody {
  float scale;
  bool causal;
  AttnArgs prepare(const std::vector<mx::array>& in, mx::array& out) const {
    const auto &q = in[0], &k = in[1], &v = in[2];
    return {q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(),
            q.shape(1),      k.shape(1),      q.shape(2),      k.shape(2),
            q.shape(3),      v.shape(3),      q.strides()[1],  q.strides()[2],
            q.strides()[3],  k.strides()[1],  k.strides()[2],  k.strides()[3],
            v.strides()[1],  v.strides()[2],  v.strides()[3],  scale,
            causal};
  }
  void run(const std::vector<mx::array>&, mx::array&, const AttnArgs& a) const {
#if defined(SPECD_X86_KERNELS)
    if (isa() != Isa::Scalar && a.q_col == 1 && a.k_col == 1 && a.v_col == 1 && a.D == a.Dv &&
        grouped_dim(a.D) && a.H / a.Hkv <= qmm::AttnGroup::kMaxHeads) {
      grouped(a);
      return;
    }
#endif
    int rows = a.H * a.T;
    // A row costs ~L*D; below ~64K multiply-adds per call stay on one thread.
    run_ranges(rows, (int64_t)rows * a.L * a.D < 65536, [&](int r0, int r1) {
      thread_local Scratch<float> p;
      attn_rows(a, r0, r1, p);
    });
  }

  // One unit per (kv head, block of query rows): the query heads sharing
  // that kv head, and the block's rows, read each key and value row once.
  void grouped(const AttnArgs& a) const {
    int rep = a.H / a.Hkv;
    auto [rb, per_head] = row_blocks(a.T, a.Hkv);
    int units = a.Hkv * per_head;
    run_ranges(units, (int64_t)a.H * a.T * a.L * a.D < 65536, [&](int u0, int u1) {
      thread_local Scratch<float> scores;
      for (int u = u0; u < u1; u++) {
        int kvh = u / per_head, t0 = u % per_head * rb, t1 = std::min(a.T, t0 + rb);
        qmm::AttnGroup shared{};
        shared.heads = rep;
        shared.k = a.k + kvh * a.k_head;
        shared.v = a.v + kvh * a.v_head;
        shared.k_row = a.k_row;
        shared.v_row = a.v_row;
        shared.D = a.D;
        shared.scale = a.scale;
        attn_block(
            shared, kvh, t0, t1, [&](int t, int h) { return a.q + h * a.q_head + t * a.q_row; },
            [&](int t, int h) { return a.o + ((size_t)t * a.H + h) * a.Dv; },
            [&](int t) { return a.causal ? a.L - a.T + t + 1 : a.L; }, scores);
      }
    });
  }
};

// ---- attention over per-sequence caches (continuous batching) -------------------
//
// One op per layer for all the sequences of a step. `y` holds the step's rows
// [1, T, (H + 2 Hkv) * D]: each row's q, k and v, rope applied, as the fused
// q/k/v matmul leaves them. Sequence s owns rows [a_s, a_s + n_s); its cache
// buffers K_s, V_s [1, Hkv, cap_s, D] (contiguous, allocated by `kv_alloc`)
// hold off_s tokens. The op first writes the sequence's new k/v rows at
// off_s.. in place, then computes every row's causal attention over its own
// cache: row t sees keys [0, off_s + t]. Without it a step cost ~15 MLX ops
// per sequence per layer (row slices, head transposes, two slice_updates,
// slices, a concatenate); with it, one op per layer.
//
// Every row runs exactly the arithmetic of AttnBody (the same helpers, keys
// in order, one owner per output row), so a sequence's output does not depend
// on which others share the call, nor on the thread split.

struct RaggedSpan {
  int a, n, off;  // first row in y, rows, tokens already cached
};

struct RaggedArgs {
  const float* y;
  int64_t y_row;
  std::vector<float*> k, v;        // per sequence (float32 caches)
  std::vector<uint16_t*> k16, v16;  // per sequence (float16 caches)
  std::vector<int64_t> cap;        // per sequence
  float* o;                        // [T, H, D]
};

struct RaggedAttnBody {
  int H, Hkv, D;
  float scale;
  std::vector<RaggedSpan> seqs;
  // The caches hold f16: rows are rounded as they are written and widened
  // exactly as they are read, so attention is that of a float cache
  // holding the rounded values.
  bool half = false;

  RaggedArgs prepare(const std::vector<mx::array>& in, mx::array& out) const {
    RaggedArgs r = prepare_caches(in, 1, out);
    r.y = in[0].data<float>();
    r.y_row = in[0].strides()[1];
    if (in[0].strides()[2] != 1) throw std::runtime_error("attention_kv_rows: y must be row-major");
    return r;
  }
  // Everything but y: the caches are inputs `first`, `first + 1`, ...
  RaggedArgs prepare_caches(const std::vector<mx::array>& in, size_t first, mx::array& out) const {
    RaggedArgs r;
    for (size_t s = 0; s < seqs.size(); s++) {
      const auto &k = in[first + 2 * s], &v = in[first + 1 + 2 * s];
      for (auto* c : {&k, &v})
        if (!c->flags().row_contiguous || c->data_size() != c->size())
          throw std::runtime_error("attention_kv_rows: cache buffers must be contiguous");
      // The caches are written in place: they are specd's own buffers
      // (KvCache allocates them with kv_alloc and copies before writing
      // while a clone shares them), never another array's data.
      if (half) {
        r.k16.push_back(const_cast<uint16_t*>(reinterpret_cast<const uint16_t*>(k.data<mx::float16_t>())));
        r.v16.push_back(const_cast<uint16_t*>(reinterpret_cast<const uint16_t*>(v.data<mx::float16_t>())));
      } else {
        r.k.push_back(const_cast<float*>(k.data<float>()));
        r.v.push_back(const_cast<float*>(v.data<float>()));
      }
      r.cap.push_back(k.shape(2));
    }
    r.o = out.data<float>();
    return r;
  }

  void run(const std::vector<mx::array>&, mx::array&, const RaggedArgs& r) const {
    // The new rows into the caches, before any row reads them.
    for (size_t s = 0; s < seqs.size(); s++) {
      const auto& sp = seqs[s];
      for (int j = 0; j < sp.n; j++) {
        const float* row = r.y + (int64_t)(sp.a + j) * r.y_row;
        for (int h = 0; h < Hkv; h++) {
          int64_t at = ((int64_t)h * r.cap[s] + sp.off + j) * D;
          if (half) {
            to_half(row + (int64_t)(H + h) * D, r.k16[s] + at, D);
            to_half(row + (int64_t)(H + Hkv + h) * D, r.v16[s] + at, D);
            continue;
          }
          std::memcpy(r.k[s] + at, row + (int64_t)(H + h) * D, D * sizeof(float));
          std::memcpy(r.v[s] + at, row + (int64_t)(H + Hkv + h) * D, D * sizeof(float));
        }
      }
    }
    // One unit per (block of a sequence's rows, kv head): the block's rows
    // share each read of the cache (row_blocks; one row a unit on the
    // per-head path). `first[s]` is sequence s's first unit, `rb[s]` its
    // rows per unit.
    std::vector<int> first(seqs.size() + 1, 0), rb(seqs.size());
    int64_t work = 0;
    for (size_t s = 0; s < seqs.size(); s++) {
      RowBlocks b = grouped() ? row_blocks(seqs[s].n, Hkv) : RowBlocks{1, seqs[s].n};
      rb[s] = b.rows;
      first[s + 1] = first[s] + b.blocks * Hkv;
      work += (int64_t)H * seqs[s].n * (seqs[s].off + seqs[s].n) * D;
    }
    int units = first.back();
    // The per-head path reads float rows: a 16-bit cache's rows are widened
    // once a call, every kv head's rows that this call's rows read.
    Widened w;
    if (half && !grouped()) {
      w.k.resize(seqs.size()), w.v.resize(seqs.size());
      for (size_t s = 0; s < seqs.size(); s++) {
        size_t len = (size_t)(seqs[s].off + seqs[s].n) * D;
        w.k[s].resize(Hkv * len), w.v[s].resize(Hkv * len);
        for (int h = 0; h < Hkv; h++) {
          const uint16_t* kh = r.k16[s] + (int64_t)h * r.cap[s] * D;
          const uint16_t* vh = r.v16[s] + (int64_t)h * r.cap[s] * D;
          for (size_t i = 0; i < len; i++) w.k[s][h * len + i] = h2f(kh[i]), w.v[s][h * len + i] = h2f(vh[i]);
        }
      }
    }
    // Below ~64K multiply-adds per call stay on one thread (as AttnBody).
    run_ranges(units, work < 65536, [&](int u0, int u1) {
      thread_local Scratch<float> scratch;
      size_t s = 0;
      for (int u = u0; u < u1; u++) {
        while (u >= first[s + 1]) s++;
        int t0 = (u - first[s]) / Hkv * rb[s], kvh = (u - first[s]) % Hkv;
        unit(r, w, s, t0, std::min(seqs[s].n, t0 + rb[s]), kvh, scratch);
      }
    });
  }

  // A 16-bit cache's rows widened to float for the per-head path: sequence
  // s's kv head h at k[s] + h * (off + n) * D.
  struct Widened {
    std::vector<std::vector<float>> k, v;
  };

  // Whether units run the grouped kernel (else the per-head path).
  bool grouped() const {
#if defined(SPECD_X86_KERNELS)
    return isa() != Isa::Scalar && grouped_dim(D) && H / Hkv <= qmm::AttnGroup::kMaxHeads;
#else
    return false;
#endif
  }

  // Rows [t0, t1) of sequence s, the query heads of kv head `kvh`.
  void unit(const RaggedArgs& r, const Widened& w, size_t s, int t0, int t1, int kvh,
            Scratch<float>& scratch) const {
    const auto& sp = seqs[s];
    int rep = H / Hkv;
#if defined(SPECD_X86_KERNELS)
    if (grouped()) {
      qmm::AttnGroup shared{};
      shared.heads = rep;
      if (half) {
        shared.k16 = r.k16[s] + (int64_t)kvh * r.cap[s] * D;
        shared.v16 = r.v16[s] + (int64_t)kvh * r.cap[s] * D;
      } else {
        shared.k = r.k[s] + (int64_t)kvh * r.cap[s] * D;
        shared.v = r.v[s] + (int64_t)kvh * r.cap[s] * D;
      }
      shared.k_row = shared.v_row = D;
      shared.D = D;
      shared.scale = scale;
      attn_block(
          shared, kvh, t0, t1,
          [&](int t, int h) { return r.y + (int64_t)(sp.a + t) * r.y_row + (int64_t)h * D; },
          [&](int t, int h) { return r.o + ((size_t)(sp.a + t) * H + h) * D; },
          [&](int t) { return sp.off + t + 1; }, scratch);
      return;
    }
#endif
    // The sequence alone as AttnBody sees it: q [H, n, D] strided in y,
    // keys [Hkv, off + n, D] in its cache (or in its widened copy), causal.
    const float* kp = half ? w.k[s].data() : r.k[s];
    const float* vp = half ? w.v[s].data() : r.v[s];
    int64_t kv_head = half ? (int64_t)(sp.off + sp.n) * D : r.cap[s] * D;
    AttnArgs a{r.y + (int64_t)sp.a * r.y_row,
               kp,
               vp,
               r.o + (size_t)sp.a * H * D,
               H,
               Hkv,
               sp.n,
               sp.off + sp.n,
               D,
               D,
               D,
               r.y_row,
               1,
               kv_head,
               D,
               1,
               kv_head,
               D,
               1,
               scale,
               true};
    for (int t = t0; t < t1; t++)
      for (int i = 0; i < rep; i++) {
        int hr = (kvh * rep + i) * sp.n + t;
        attn_rows(a, hr, hr + 1, scratch);
      }
  }
};

// A cache buffer [1, H, cap, D], contiguous: the first `keep` positions of
// `old` (any layout) copied, the rest zero.
struct KvAllocBody {
  int keep;
  bool has_old;
  int prepare(const std::vector<mx::array>&, const mx::array&) const { return 0; }
  void run(const std::vector<mx::array>& in, mx::array& out, int) const {
    std::memset(out.data<void>(), 0, out.nbytes());
    if (!has_old) return;
    if (out.dtype() == mx::float16)
      copy(reinterpret_cast<const uint16_t*>(in[0].data<mx::float16_t>()), in[0],
           reinterpret_cast<uint16_t*>(out.data<mx::float16_t>()), out);
    else
      copy(in[0].data<float>(), in[0], out.data<float>(), out);
  }
  // The first `keep` positions of `o` (any layout, the out's type) into out.
  template <class T>
  void copy(const T* x, const mx::array& o, T* y, const mx::array& out) const {
    int H = out.shape(1), cap = out.shape(2), D = out.shape(3);
    auto st = o.strides();
    for (int h = 0; h < H; h++)
      for (int j = 0; j < keep; j++) {
        T* dst = y + ((int64_t)h * cap + j) * D;
        const T* src = x + h * st[1] + j * st[2];
        if (st[3] == 1)
          std::memcpy(dst, src, D * sizeof(T));
        else
          for (int d = 0; d < D; d++) dst[d] = src[d * st[3]];
      }
  }
};

// ---- small row-wise ops --------------------------------------------------------
//
// On CPU, MLX's fast::rms_norm and fast::rope run as their unfused fallbacks
// (5-10 ops each, every op a dispatch). These do each in one op, row by row.

// y = x * rsqrt(mean(x^2) + eps) * w over the last axis.
struct RmsNormBody {
  float eps;
  std::vector<int64_t> prepare(const std::vector<mx::array>& in, const mx::array&) const {
    if (!in[1].flags().row_contiguous)
      throw std::runtime_error("rms_norm: the weight must be contiguous");
    return row_offsets(in[0]);
  }
  void run(const std::vector<mx::array>& in, mx::array& out,
           const std::vector<int64_t>& rows) const {
    const float* x = in[0].data<float>();
    const float* w = in[1].data<float>();
    float* y = out.data<float>();
    int D = in[0].shape(-1);
    int64_t col = in[0].strides().back();
    for (size_t r = 0; r < rows.size(); r++) rms_norm_row(x + rows[r], col, w, D, eps, y + r * D);
  }
};

// Rotary embedding: x [B, T, H, D] -> [B, H, T, D], position of row t is
// offset + t. The angle is computed per (position, frequency) exactly as
// MLX's fallback does: theta = (pos * scale) * exp(-i * log(base) / half).
struct RopeBody {
  int dims;
  bool traditional;
  float base, scale;
  int offset;
  std::vector<int64_t> prepare(const std::vector<mx::array>&, const mx::array&) const {
    return {};
  }
  void run(const std::vector<mx::array>& in, mx::array& out, const std::vector<int64_t>&) const {
    const auto& a = in[0];
    int B = a.shape(0), T = a.shape(1), H = a.shape(2), D = a.shape(3);
    auto st = a.strides();
    const float* x = a.data<float>();
    float* y = out.data<float>();
    Rope rope(dims, traditional, base, scale);
    for (int t = 0; t < T; t++) {
      rope.at(offset + t);
      for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
          rope.row(x + b * st[0] + t * st[1] + h * st[2], st[3],
                   y + (((size_t)b * H + h) * T + t) * D, D);
    }
  }
};

// silu(g) * u (or, with `gelu`, gelu_tanh(g) * u: Gemma's GeGLU),
// elementwise over two same-shaped (possibly strided) arrays.
struct SwigluBody {
  bool gelu = false;
  struct Rows {
    std::vector<int64_t> g, u;
  };
  Rows prepare(const std::vector<mx::array>& in, const mx::array&) const {
    return {row_offsets(in[0]), row_offsets(in[1])};
  }
  void run(const std::vector<mx::array>& in, mx::array& out, const Rows& rows) const {
    const float* g = in[0].data<float>();
    const float* u = in[1].data<float>();
    float* y = out.data<float>();
    int D = out.shape(-1);
    int64_t gc = in[0].strides().back(), uc = in[1].strides().back();
    for (size_t r = 0; r < rows.g.size(); r++)
      glu_row(g + rows.g[r], u + rows.u[r], gc, uc, y + r * D, D, gelu);
  }
};

// ---- argmax and runner-up per row ------------------------------------------------
//
// What a greedy round reads of each verified row (top2.h): one pass over
// the row instead of MLX's argmax, max and masked-max ops (each a pass). Rows
// are cut into pieces of kTop2Piece values, spread over the pool, and each
// row's pieces merged in order.

constexpr int kTop2Piece = 16384;

Top2 top2_scan(const float* x, int64_t col, int n, int base) {
#if defined(SPECD_X86_KERNELS)
  if (col == 1 && isa() != Isa::Scalar) return qmm::top2_avx2(x, n, base);
#endif
  Top2 t;
  for (int j = 0; j < n; j++) t.push(x[j * col], base + j);
  return t;
}

// out[r] = {argmax, top, second, exact}: `exact` is 1 where the row holds no
// NaN (0 tells the host to read the row and decide itself). The rows are
// those of every input in turn (all of one width).
struct Top2Body {
  struct Rows {
    std::vector<const float*> at;  // each row's first value
    std::vector<int64_t> col;      // each row's value stride
  };
  Rows prepare(const std::vector<mx::array>& in, const mx::array&) const {
    Rows r;
    for (const auto& a : in)
      for (int64_t off : row_offsets(a)) {
        r.at.push_back(a.data<float>() + off);
        r.col.push_back(a.strides().back());
      }
    return r;
  }
  void run(const std::vector<mx::array>& in, mx::array& out, const Rows& rows) const {
    const int V = in[0].shape(-1);
    const int pieces = (V + kTop2Piece - 1) / kTop2Piece, R = rows.at.size();
    const int units = R * pieces;
    std::vector<Top2> part(units);
    // A pass runs at ~15 us per 49152 values on one core (AVX2). Below 2^18
    // values (a 5-row verify of a 49K vocabulary) the call stays on one
    // thread: splitting 2-5 rows saved nothing measurable in a verify (under
    // load), and 1-2 rows alone ran slower split.
    run_ranges(units, (int64_t)R * V < (1 << 18), [&](int u0, int u1) {
      for (int u = u0; u < u1; u++) {
        int r = u / pieces, p0 = (u % pieces) * kTop2Piece, n = std::min(kTop2Piece, V - p0);
        part[u] = top2_scan(rows.at[r] + p0 * rows.col[r], rows.col[r], n, p0);
      }
    });
    float* y = out.data<float>();
    for (int r = 0; r < R; r++) {
      Top2 t = part[(size_t)r * pieces];
      for (int p = 1; p < pieces; p++) t.merge(part[(size_t)r * pieces + p]);
      float* o = y + (size_t)r * 4;
      o[0] = float(t.argmax()), o[1] = t.top, o[2] = t.second, o[3] = t.nan ? 0.f : 1.f;
    }
  }
};

// Whether the entry points run MLX's own ops: on a GPU, and everywhere on
// the portable path.
bool mlx_ops() {
  return g_mlx_ops.load(std::memory_order_relaxed) ||
         mx::default_device().type == mx::Device::DeviceType::gpu;
}

A wrap_array(mx::array a) { return std::make_unique<Array>(std::move(a)); }

// Kernels read float32; a no-op for inputs that already are.
mx::array f32(const mx::array& a) { return mx::astype(a, mx::float32); }

// A row-contiguous view (a copy only where the layout needs one).
// Weights are evaluated, row-contiguous arrays from the loader, and a
// kernel op's output not yet computed will be row-major: both used as they
// are, with no copy op in between (each op costs the engine thread a
// dispatch). Anything else gets a contiguous copy first.
mx::array rowmajor(const mx::array& a) {
  if (a.is_available() ? a.flags().row_contiguous
                       : a.has_primitive() && dynamic_cast<const OwnOp*>(&a.primitive()))
    return a;
  return mx::contiguous(a);
}

}  // namespace

namespace {
// The quantizations the kernels take: 4 or 8 bits (| kScaleF32, |
// kActQ8), groups of 16k.
void check_bits(int32_t group_size, int32_t bits) {
  int vb = qmm::value_bits(bits);
  if ((vb != 4 && vb != 8) || (bits & ~(0xff | qmm::kScaleF32 | qmm::kActQ8)) != 0)
    throw std::invalid_argument("qmatmul supports 4 and 8 bits");
  if (group_size <= 0 || group_size % 16 != 0)
    throw std::invalid_argument("qmatmul needs group sizes of 16k");
}

// MLX's layout as the kernels take it: uint32 words, float16 scales and
// biases (or float32 ones: packed with kScaleF32). `bits` is the value width.
void check_quant(const mx::array& w, const mx::array& scales, const mx::array& biases,
                 int32_t group_size, int32_t bits) {
  check_bits(group_size, bits);
  if (qmm::scale_f32(bits)) throw std::invalid_argument("qmatmul: the scale dtype says f32");
  if (w.ndim() != 2 || scales.ndim() != 2) throw std::invalid_argument("qmatmul: 2-D weights");
  int N = w.shape(0), K = w.shape(1) * 32 / qmm::value_bits(bits);
  if (scales.shape(1) * group_size != K || biases.shape() != scales.shape() ||
      scales.shape(0) != N)
    throw std::invalid_argument("qmatmul: scales/biases do not match the weight");
  bool f16 = scales.dtype() == mx::float16 && biases.dtype() == mx::float16;
  bool f32 = scales.dtype() == mx::float32 && biases.dtype() == mx::float32;
  if (!f16 && !f32)
    throw std::invalid_argument("qmatmul: scales and biases must be float16 or float32");
  if (w.dtype() != mx::uint32) throw std::invalid_argument("qmatmul: weights must be uint32");
}
}  // namespace

A qpack(const Array& w, const Array& scales, const Array& biases, int32_t group_size,
        int32_t bits) {
  check_quant(w.a, scales.a, biases.a, group_size, bits);
  if (bits & qmm::kActQ8) throw std::invalid_argument("qpack: 8-bit activations are not a layout");
  auto wc = mx::contiguous(w.a), sc = mx::contiguous(scales.a), bc = mx::contiguous(biases.a);
  mx::eval({wc, sc, bc});
  const int N = wc.shape(0), wpc = wc.shape(1), groups = sc.shape(1);
  const bool f32 = sc.dtype() == mx::float32;
  const int dpg = group_size * bits / 32,
            gw = qmm::group_words(group_size, bits | (f32 ? qmm::kScaleF32 : 0));
  const int blocks = (N + qmm::kLanes - 1) / qmm::kLanes;
  // Zeroed: the lanes past N in the last block stay 0.
  mx::array packed = weight_array({blocks, groups, gw}, mx::uint32);
  uint32_t* out = packed.data<uint32_t>();
  const uint32_t* W = wc.data<uint32_t>();
  for (int n = 0; n < N; n++) {
    int cb = n / qmm::kLanes, l = n % qmm::kLanes;
    for (int g = 0; g < groups; g++) {
      uint32_t* base = out + ((size_t)cb * groups + g) * gw;
      for (int d = 0; d < dpg; d++) base[d * qmm::kLanes + l] = W[(size_t)n * wpc + g * dpg + d];
      size_t at = (size_t)n * groups + g;
      if (f32) {
        float* sb = reinterpret_cast<float*>(base + dpg * qmm::kLanes);
        sb[l] = sc.data<float>()[at];
        sb[qmm::kLanes + l] = bc.data<float>()[at];
      } else {
        uint16_t* sb = reinterpret_cast<uint16_t*>(base + dpg * qmm::kLanes);
        sb[l] = reinterpret_cast<const uint16_t*>(sc.data<mx::float16_t>())[at];
        sb[qmm::kLanes + l] = reinterpret_cast<const uint16_t*>(bc.data<mx::float16_t>())[at];
      }
    }
  }
  return wrap_array(std::move(packed));
}

namespace {
// Packed weights (qpack's output) for n output features, on the CPU.
void check_packed(const mx::array& p, int32_t n, int32_t group_size, int32_t bits,
                  const char* what) {
  if (mlx_ops())
    throw std::invalid_argument(std::string(what) + ": packed weights are for specd's CPU kernels (not the portable path)");
  check_bits(group_size, bits);
  if (p.ndim() != 3 || p.dtype() != mx::uint32 || n <= 0 ||
      p.shape(0) != (n + qmm::kLanes - 1) / qmm::kLanes ||
      p.shape(2) != qmm::group_words(group_size, bits))
    throw std::invalid_argument(std::string(what) +
                                ": the packed weights do not fit n, group and bits");
}

A qmatmul_packed_impl(const Array& x, const Array& packed, int32_t n, int32_t group_size,
                      int32_t bits, const Array* norm_w, float eps, const Array* residual,
                      QmmBody body = {}) {
  const auto& p = packed.a;
  check_packed(p, n, group_size, bits, "qmatmul_packed");
  int K = p.shape(1) * group_size;
  if (body.glu != Glu::None && x.a.shape(-1) != 2 * K)
    throw std::invalid_argument("qmatmul: a gated input has " + std::to_string(x.a.shape(-1)) +
                                " features, not twice the weight's " + std::to_string(K));
  if (body.glu == Glu::None && x.a.shape(-1) != K)
    throw std::invalid_argument("qmatmul: x has " + std::to_string(x.a.shape(-1)) +
                                " features, the weight " + std::to_string(K));
  mx::Shape shape = x.a.shape();
  shape.back() = n;
  std::vector<mx::array> in{f32(x.a), rowmajor(p)};
  if (norm_w) {
    if (norm_w->a.ndim() != 1 || norm_w->a.shape(0) != K)
      throw std::invalid_argument("qmatmul: the norm weight must be [in features]");
    in.push_back(rowmajor(f32(norm_w->a)));
  }
  if (residual) {
    if (residual->a.shape() != shape)
      throw std::invalid_argument("qmatmul: the residual must be shaped like the output");
    in.push_back(rowmajor(f32(residual->a)));
  }
  body.n = n, body.group = group_size, body.bits = bits;
  body.norm = norm_w != nullptr, body.residual = residual != nullptr, body.eps = eps;
  return kernel_op("SpecdQMatmul", body, shape, std::move(in));
}
}  // namespace

namespace {
// A layer tail's body and the inputs it takes after o: x (row-major),
// W_o, the MLP's norm weight, W_gate_up, W_down. `o_width` and `rows`:
// the o rows it will read; `tail`: the four weights; `p`: the o, gate/up
// and down matmuls' group sizes and bits, the gate/up width, GeGLU or not
// (kernels.rs `Tail::params`).
struct TailPlan {
  TailBody body;
  std::vector<mx::array> in;
};
TailPlan plan_tail(int o_width, int64_t rows, const Array& x, const ArrayList& tail,
                   rust::Slice<const int32_t> p, float eps) {
  if (tail.v.size() != 4 || p.size() != 8)
    throw std::invalid_argument("layer_tail: four weights and eight integers");
  const auto &w_o = tail.v[0], &norm_w = tail.v[1], &w_gate_up = tail.v[2], &w_down = tail.v[3];
  const int o_group = p[0], o_bits = p[1], gate_up_n = p[2], gate_up_group = p[3],
            gate_up_bits = p[4], down_group = p[5], down_bits = p[6];
  const bool gelu = p[7] != 0;
  const int d = x.a.shape(-1);
  check_packed(w_o, d, o_group, o_bits, "layer_tail (o)");
  check_packed(w_gate_up, gate_up_n, gate_up_group, gate_up_bits, "layer_tail (gate/up)");
  check_packed(w_down, d, down_group, down_bits, "layer_tail (down)");
  auto in_features = [](const mx::array& w, int group) { return w.shape(1) * group; };
  if (rows != (int64_t)(x.a.size() / d) || o_width != in_features(w_o, o_group))
    throw std::invalid_argument("layer_tail: o must be x's rows of W_o's in features");
  if (in_features(w_gate_up, gate_up_group) != d || gate_up_n % 2 != 0 ||
      in_features(w_down, down_group) != gate_up_n / 2)
    throw std::invalid_argument("layer_tail: gate/up must map the hidden size to twice down's in features");
  if (norm_w.ndim() != 1 || norm_w.shape(0) != d)
    throw std::invalid_argument("layer_tail: the norm weight must be [hidden]");
  auto matmul = [](int n, int group, int bits) {
    QmmBody b;
    b.n = n, b.group = group, b.bits = bits;
    return b;
  };
  TailBody body{matmul(d, o_group, o_bits), matmul(gate_up_n, gate_up_group, gate_up_bits),
                matmul(d, down_group, down_bits)};
  body.o.residual = true;
  body.gate_up.norm = true, body.gate_up.eps = eps;
  body.down.residual = true, body.down.glu = gelu ? Glu::Gelu : Glu::Silu;
  return {body,
          {rowmajor(f32(x.a)), rowmajor(w_o), rowmajor(f32(norm_w)), rowmajor(w_gate_up),
           rowmajor(w_down)}};
}
}  // namespace

A layer_tail(const Array& o, const Array& x, const ArrayList& tail,
             rust::Slice<const int32_t> params, float eps) {
  if (o.a.ndim() != x.a.ndim()) throw std::invalid_argument("layer_tail: o and x differ in rank");
  auto plan = plan_tail(o.a.shape(-1), o.a.size() / o.a.shape(-1), x, tail, params, eps);
  plan.in.insert(plan.in.begin(), f32(o.a));
  return kernel_op("SpecdLayerTail", plan.body, x.a.shape(), std::move(plan.in));
}

A qmatmul_packed(const Array& x, const Array& packed, int32_t n, int32_t group_size,
                 int32_t bits) {
  return qmatmul_packed_impl(x, packed, n, group_size, bits, nullptr, 0.f, nullptr);
}

A qmatmul_packed_add(const Array& x, const Array& packed, int32_t n, int32_t group_size,
                     int32_t bits, const Array& residual) {
  return qmatmul_packed_impl(x, packed, n, group_size, bits, nullptr, 0.f, &residual);
}

A qmatmul_packed_glu_add(const Array& gu, const Array& packed, int32_t n, int32_t group_size,
                         int32_t bits, const Array& residual, bool gelu) {
  QmmBody body;
  body.glu = gelu ? Glu::Gelu : Glu::Silu;
  return qmatmul_packed_impl(gu, packed, n, group_size, bits, nullptr, 0.f, &residual, body);
}

A qmatmul_packed_glu(const Array& gu, const Array& packed, int32_t n, int32_t group_size,
                     int32_t bits, bool gelu) {
  QmmBody body;
  body.glu = gelu ? Glu::Gelu : Glu::Silu;
  return qmatmul_packed_impl(gu, packed, n, group_size, bits, nullptr, 0.f, nullptr, body);
}

A qmatmul_packed_norm(const Array& x, const Array& norm_w, float eps, const Array& packed,
                      int32_t n, int32_t group_size, int32_t bits) {
  return qmatmul_packed_impl(x, packed, n, group_size, bits, &norm_w, eps, nullptr);
}

A qmatmul_packed_norm_rope_rows(const Array& x, const Array& norm_w, float eps,
                                const Array& packed, int32_t n, int32_t group_size, int32_t bits,
                                int32_t rope_cols, int32_t head_dim, bool traditional, float base,
                                rust::Slice<const int32_t> positions) {
  if (head_dim <= 0 || head_dim % 2 != 0 || rope_cols % head_dim != 0 || rope_cols > n ||
      rope_cols <= 0)
    throw std::invalid_argument("qmatmul rope: whole heads of an even size within the output");
  if (x.a.ndim() != 3 || x.a.shape(0) != 1 || (size_t)x.a.shape(1) != positions.size())
    throw std::invalid_argument("qmatmul rope rows: x must be [1, T, in] with T positions");
  QmmBody body;
  body.rope_cols = rope_cols, body.head_dim = head_dim;
  body.rope_positions.assign(positions.begin(), positions.end());
  body.rope_traditional = traditional, body.rope_base = base;
  return qmatmul_packed_impl(x, packed, n, group_size, bits, &norm_w, eps, nullptr, body);
}

A qrows_packed(const Array& packed, const Array& ids, int32_t n, int32_t group_size,
               int32_t bits) {
  const auto& p = packed.a;
  check_packed(p, n, group_size, bits, "qrows_packed");
  if (ids.a.ndim() != 1) throw std::invalid_argument("qrows_packed: ids must be 1-D");
  return kernel_op("SpecdQRows", QRowsBody{n, group_size, bits},
                   {ids.a.shape(0), p.shape(1) * group_size},
                   {rowmajor(p), rowmajor(mx::astype(ids.a, mx::uint32))});
}

A qmatmul(const Array& x, const Array& w, const Array& scales, const Array& biases,
          int32_t group_size, int32_t bits) {
  check_quant(w.a, scales.a, biases.a, group_size, bits);
  // 8-bit activations are a property of the call, not of the layout.
  const int act = bits & qmm::kActQ8;
  bits &= ~qmm::kActQ8;
  if (mlx_ops())
    return wrap_array(mx::quantized_matmul(x.a, w.a, scales.a, biases.a, true, group_size, bits));
  int flag = scales.a.dtype() == mx::float32 ? qmm::kScaleF32 : 0;
  return qmatmul_packed(x, *qpack(w, scales, biases, group_size, bits), w.a.shape(0), group_size,
                        bits | flag | act);
}

A attention(const Array& q, const Array& k, const Array& v, float scale, bool causal) {
  if (mlx_ops())
    return wrap_array(mx::transpose(
        mx::fast::scaled_dot_product_attention(q.a, k.a, v.a, scale, causal ? "causal" : ""),
        {0, 2, 1, 3}));
  if (q.a.ndim() != 4 || k.a.ndim() != 4 || v.a.ndim() != 4 || q.a.shape(0) != 1)
    throw std::invalid_argument("attention: q, k, v must be [1, heads, len, dim]");
  if (q.a.shape(1) % k.a.shape(1) != 0 || k.a.shape(1) != v.a.shape(1) ||
      k.a.shape(2) != v.a.shape(2) || q.a.shape(3) != k.a.shape(3) ||
      (causal && q.a.shape(2) > k.a.shape(2)))
    throw std::invalid_argument("attention: shapes of q, k, v do not fit together");
  // A softmax over no keys has no value (and the kernels write nothing).
  if (k.a.shape(2) == 0) throw std::invalid_argument("attention: no keys");
  // Keys and values keep their (cache-slice) strides: the kernel reads them
  // in place.
  return kernel_op("SpecdAttention", AttnBody{scale, causal},
                   {1, q.a.shape(2), q.a.shape(1), v.a.shape(3)}, {f32(q.a), f32(k.a), f32(v.a)});
}

namespace {
// The q/k/v matmul (norm and rope folded in) and the ragged attention that
// reads its rows, as one op: attention_kv_rows takes in the matmul op that
// makes its y when nothing else has asked for y yet. The same matmul call
// writes y's rows into this thread's scratch instead of an array, then the
// same attention reads them, so the same bits, and a layer has one op
// boundary fewer.
struct QkvAttnBody {
  QmmBody qkv;
  RaggedAttnBody attn;
  struct Args {
    QmmBody::Rows rows;
    RaggedArgs attn;
  };
  // in: x, the packed weights, the norm weight, then the caches.
  Args prepare(const std::vector<mx::array>& in, mx::array& out) const {
    return {QmmBody::rows_of(in, 3, "SpecdQkvAttention"), attn.prepare_caches(in, 3, out)};
  }
  void run(const std::vector<mx::array>& in, mx::array& out, Args& a) const {
    const int M = in[0].size() / in[0].shape(-1);
    thread_local Scratch<float> y;
    y.resize((size_t)M * qkv.n);
    qkv.compute(in[0].data<float>(), a.rows, M, in[0].shape(-1), in[1].data<uint32_t>(),
                in[2].data<float>(), nullptr, y.data());
    a.attn.y = y.data(), a.attn.y_row = qkv.n;
    attn.run(in, out, a.attn);
  }
};

// The matmul op that makes `y`, where attention may take it in: a q/k/v
// matmul with its norm and no residual or gate, not yet asked for.
const KernelOp<QmmBody>* fusable_qkv(const mx::array& y) {
  if (y.status() != mx::array::Status::unscheduled || !y.has_primitive()) return nullptr;
  auto* op = dynamic_cast<const KernelOp<QmmBody>*>(&y.primitive());
  if (!op || !op->body().norm || op->body().residual || op->body().glu != Glu::None) return nullptr;
  return y.inputs().size() == 3 ? op : nullptr;
}
}  // namespace

namespace {
// A whole llama layer as one op: QkvAttnBody's q/k/v matmul and ragged
// attention, then TailBody's three matmuls over the attention's rows,
// which stay in this thread's scratch. The same calls on the same rows as
// the two ops, so the same bits, and a layer is one op boundary.
struct LayerBody {
  QkvAttnBody attn;
  TailBody tail;
  // in: QkvAttnBody's (x, W_qkv, its norm weight, the caches), then what
  // TailBody takes after o (x row-major, W_o, the MLP's norm weight,
  // W_gate_up, W_down).
  static constexpr size_t kTailInputs = 5;
  QkvAttnBody::Args prepare(const std::vector<mx::array>& in, mx::array& out) const {
    for (size_t i = in.size() - kTailInputs; i < in.size(); i++)
      if (!in[i].flags().row_contiguous)
        throw std::runtime_error("SpecdLayer: the tail's inputs must be row-contiguous");
    return attn.prepare(in, out);
  }
  void run(const std::vector<mx::array>& in, mx::array& out, QkvAttnBody::Args& a) const {
    const int M = in[0].size() / in[0].shape(-1), width = attn.attn.H * attn.attn.D;
    thread_local Scratch<float> o;
    thread_local QmmBody::Rows o_rows{{}, 1};
    o.resize((size_t)M * width), o_rows.off.resize(M);
    for (int t = 0; t < M; t++) o_rows.off[t] = (int64_t)t * width;
    a.attn.o = o.data();
    attn.run(in, out, a);
    tail.compute(o.data(), o_rows, M, width, in.data() + in.size() - kTailInputs,
                 out.data<float>());
  }
};

// The ragged attention's body and inputs (y, then each sequence's keys and
// values), checked.
struct AttnPlan {
  RaggedAttnBody body;
  std::vector<mx::array> in;
  int T;
};
AttnPlan plan_attention(const Array& y, const ArrayList& caches, rust::Slice<const int32_t> spans,
                        int32_t heads, int32_t kv_heads, int32_t head_dim, float scale) {
  if (mlx_ops()) throw std::invalid_argument("attention_kv_rows: specd's CPU kernels only");
  if (heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 || head_dim <= 0)
    throw std::invalid_argument("attention_kv_rows: heads must be a multiple of kv heads");
  size_t S = caches.v.size() / 2;
  if (S == 0 || caches.v.size() != 2 * S || spans.size() != 2 * S)
    throw std::invalid_argument("attention_kv_rows: one (keys, values) and one span per sequence");
  int T = y.a.ndim() == 3 ? y.a.shape(1) : -1;
  if (T < 0 || y.a.shape(0) != 1 || y.a.shape(2) != (heads + 2 * kv_heads) * head_dim)
    throw std::invalid_argument("attention_kv_rows: y must be [1, T, (heads + 2 kv_heads) * dim]");
  RaggedAttnBody body{heads, kv_heads, head_dim, scale, {}};
  body.half = caches.v[0].dtype() == mx::float16;
  const auto cache_type = body.half ? mx::float16 : mx::float32;
  std::vector<mx::array> in{rowmajor(f32(y.a))};
  int a = 0;
  for (size_t s = 0; s < S; s++) {
    int off = spans[2 * s], n = spans[2 * s + 1];
    const auto &k = caches.v[2 * s], &v = caches.v[2 * s + 1];
    for (auto* c : {&k, &v})
      if (c->ndim() != 4 || c->shape(0) != 1 || c->shape(1) != kv_heads ||
          c->shape(3) != head_dim || c->dtype() != cache_type)
        throw std::invalid_argument(
            "attention_kv_rows: caches must be [1, kv_heads, cap, dim], all float32 or all float16");
    if (n <= 0 || off < 0 || off + n > k.shape(2) || v.shape(2) != k.shape(2))
      throw std::invalid_argument("attention_kv_rows: a sequence's rows do not fit its cache");
    body.seqs.push_back({a, n, off});
    a += n;
    in.push_back(k);
    in.push_back(v);
  }
  if (a != T) throw std::invalid_argument("attention_kv_rows: the spans must cover y's rows");
  return {std::move(body), std::move(in), T};
}

// The q/k/v matmul op's inputs (x, weights, norm weight) followed by the
// plan's caches: what an op that takes the matmul in reads.
std::vector<mx::array> with_qkv_inputs(const mx::array& y, const AttnPlan& p) {
  const auto& src = y.inputs();
  std::vector<mx::array> in{src[0], src[1], src[2]};
  in.insert(in.end(), p.in.begin() + 1, p.in.end());
  return in;
}

// `out`, then `o`, then the plan's caches written in place, as arrays that
// depend on `o`: whatever reads them next (the next step's op, an eval of
// the cache) runs the op that writes them first.
std::unique_ptr<ArrayList> with_caches(std::vector<mx::array> front, const AttnPlan& p,
                                       const mx::array& writer) {
  std::vector<mx::array> kv(p.in.begin() + 1, p.in.end());
  auto out = std::make_unique<ArrayList>();
  out->v = std::move(front);
  for (auto& c : mx::depends(kv, {writer})) out->v.push_back(std::move(c));
  return out;
}

// The attention op over the plan: with the q/k/v matmul taken in where it
// can be.
A attention_op(AttnPlan p, const mx::array& y) {
  const mx::Shape shape{1, p.T, p.body.H * p.body.D};
  if (auto* qkv = fusable_qkv(y))
    return kernel_op("SpecdQkvAttention", QkvAttnBody{qkv->body(), std::move(p.body)}, shape,
                     with_qkv_inputs(y, p));
  return kernel_op("SpecdAttentionKvRows", std::move(p.body), shape, std::move(p.in));
}
}  // namespace

std::unique_ptr<ArrayList> attention_kv_rows(const Array& y, const ArrayList& caches,
                                             rust::Slice<const int32_t> spans, int32_t heads,
                                             int32_t kv_heads, int32_t head_dim, float scale) {
  auto p = plan_attention(y, caches, spans, heads, kv_heads, head_dim, scale);
  auto o = attention_op(p, y.a);
  return with_caches({o->a}, p, o->a);
}

std::unique_ptr<ArrayList> layer_kv_rows(const Array& y, const ArrayList& caches,
                                         rust::Slice<const int32_t> spans, int32_t heads,
                                         int32_t kv_heads, int32_t head_dim, float scale,
                                         const Array& x, const ArrayList& tail,
                                         rust::Slice<const int32_t> params, float eps) {
  auto p = plan_attention(y, caches, spans, heads, kv_heads, head_dim, scale);
  if (x.a.ndim() != 3) throw std::invalid_argument("layer_kv_rows: x must be [1, T, hidden]");
  auto t = plan_tail(heads * head_dim, p.T, x, tail, params, eps);
  if (auto* qkv = fusable_qkv(y.a)) {
    auto in = with_qkv_inputs(y.a, p);
    in.insert(in.end(), t.in.begin(), t.in.end());
    auto out = kernel_op("SpecdLayer", LayerBody{{qkv->body(), p.body}, t.body}, x.a.shape(),
                         std::move(in));
    return with_caches({out->a, out->a}, p, out->a);
  }
  // y already asked for (a profile's probe): the attention and the tail
  // as two ops, and the attention's output to time them apart.
  auto o = attention_op(p, y.a);
  t.in.insert(t.in.begin(), o->a);
  auto out = kernel_op("SpecdLayerTail", t.body, x.a.shape(), std::move(t.in));
  return with_caches({out->a, o->a}, p, o->a);
}

A kv_alloc(const Array& old, bool has_old, int32_t keep, int32_t heads, int32_t cap,
           int32_t dim, bool half) {
  if (heads <= 0 || dim <= 0 || cap <= 0 || keep < 0 || keep > cap)
    throw std::invalid_argument("kv_alloc: bad shape");
  std::vector<mx::array> in;
  if (has_old) {
    const auto& o = old.a;
    if (o.ndim() != 4 || o.shape(0) != 1 || o.shape(1) != heads || o.shape(3) != dim ||
        o.shape(2) < keep)
      throw std::invalid_argument("kv_alloc: the old buffer does not fit");
    in.push_back(half ? mx::astype(o, mx::float16) : f32(o));
  }
  return kernel_op("SpecdKvAlloc", KvAllocBody{keep, has_old}, {1, heads, cap, dim},
                   std::move(in), half ? mx::float16 : mx::float32);
}

A rms_norm_rows(const Array& x, const Array& w, float eps) {
  if (mlx_ops()) return std::make_unique<Array>(mx::fast::rms_norm(x.a, w.a, eps));
  if (w.a.ndim() != 1 || w.a.shape(0) != x.a.shape(-1))
    throw std::invalid_argument("rms_norm: weight must be [dim]");
  return kernel_op("SpecdRmsNorm", RmsNormBody{eps}, x.a.shape(), {f32(x.a), rowmajor(f32(w.a))});
}

A rope_heads(const Array& x, int32_t dims, bool traditional, float base, float scale,
             int32_t offset) {
  if (x.a.ndim() != 4) throw std::invalid_argument("rope_heads: x must be [B, T, H, D]");
  if (dims % 2 != 0 || dims > x.a.shape(3))
    throw std::invalid_argument("rope_heads: dims must be even and at most D");
  if (mlx_ops())
    return std::make_unique<Array>(mx::fast::rope(mx::transpose(x.a, {0, 2, 1, 3}), dims,
                                                  traditional, base, scale, offset));
  auto sh = x.a.shape();
  return kernel_op("SpecdRope", RopeBody{dims, traditional, base, scale, offset},
                   {sh[0], sh[2], sh[1], sh[3]}, {f32(x.a)});
}

A swiglu(const Array& g, const Array& u) {
  if (g.a.shape() != u.a.shape()) throw std::invalid_argument("swiglu: shapes differ");
  if (mlx_ops())
    return std::make_unique<Array>(mx::multiply(mx::multiply(g.a, mx::sigmoid(g.a)), u.a));
  return kernel_op("SpecdSwiglu", SwigluBody{}, g.a.shape(), {f32(g.a), f32(u.a)});
}

A geglu(const Array& g, const Array& u) {
  if (g.a.shape() != u.a.shape()) throw std::invalid_argument("geglu: shapes differ");
  if (mlx_ops()) {
    auto inner = mx::add(g.a, mx::multiply(mx::multiply(mx::multiply(g.a, g.a), g.a),
                                           mx::array(0.044715f)));
    auto s = mx::sigmoid(mx::multiply(inner, mx::array(1.5957691216057308f)));
    return std::make_unique<Array>(mx::multiply(mx::multiply(g.a, s), u.a));
  }
  return kernel_op("SpecdGeglu", SwigluBody{true}, g.a.shape(), {f32(g.a), f32(u.a)});
}

namespace {
// A row's {argmax, top, second, exact} by MLX's ops (the GPU's path): the
// largest value off and at the argmax; a row whose maximum is not unique,
// or not a number, is left to the host.
mx::array row_top2_ops(const mx::array& l) {
  int V = l.shape(-1);
  auto x = mx::astype(l, mx::float32);
  auto am = mx::argmax(x, -1, true);
  mx::Shape ar(l.ndim(), 1);
  ar.back() = V;
  auto at = mx::equal(mx::reshape(mx::arange(0, V, mx::uint32), ar), am);
  auto ninf = mx::array(-INFINITY);
  auto top = mx::max(x, -1, true);
  auto second = mx::max(mx::where(at, ninf, x), -1, true);
  auto own = mx::max(mx::where(at, x, ninf), -1, true);
  auto exact = mx::logical_and(mx::greater(mx::subtract(top, second), mx::array(0.f)),
                               mx::equal(own, top));
  return mx::concatenate(
      {mx::astype(am, mx::float32), top, second, mx::astype(exact, mx::float32)}, -1);
}

void check_top2_rows(const mx::array& l, int V) {
  if (l.ndim() < 1 || l.shape(-1) < 1 || l.shape(-1) >= (1 << 24))
    throw std::invalid_argument("row_top2: rows of 1 to 2^24 - 1 values (the index is a float)");
  if (V > 0 && l.shape(-1) != V)
    throw std::invalid_argument("row_top2: every array's rows must be of one width");
}
}  // namespace

A row_top2(const Array& logits) {
  const auto& l = logits.a;
  check_top2_rows(l, 0);
  if (mlx_ops()) return wrap_array(row_top2_ops(l));
  mx::Shape shape = l.shape();
  shape.back() = 4;
  return kernel_op("SpecdRowTop2", Top2Body{}, shape, {f32(l)});
}

A row_top2_list(const ArrayList& rows) {
  if (rows.v.empty()) throw std::invalid_argument("row_top2: no arrays");
  int V = rows.v[0].ndim() > 0 ? rows.v[0].shape(-1) : 0;
  int total = 0;
  std::vector<mx::array> in;
  for (const auto& l : rows.v) {
    check_top2_rows(l, V);
    total += l.size() / V;
    in.push_back(f32(l));
  }
  if (mlx_ops()) {
    std::vector<mx::array> parts;
    for (const auto& l : in) parts.push_back(mx::reshape(row_top2_ops(l), {-1, 4}));
    return wrap_array(mx::concatenate(parts, 0));
  }
  return kernel_op("SpecdRowTop2", Top2Body{}, {total, 4}, std::move(in));
}

int32_t kernel_threads() { return pool().size(); }
bool set_kernel_threads(int32_t n) {
  if (n <= 0 || g_pool_made.load()) return false;
  g_requested_threads = n;
  return !g_pool_made.load();
}
rust::String kernel_isa() {
  switch (isa()) {
    case Isa::Avx512: return rust::String("avx512");
    case Isa::Avx2: return rust::String("avx2");
    default: return rust::String("scalar");
  }
}

void set_mlx_ops(bool on) { g_mlx_ops.store(on); }
bool mlx_ops_only() { return mlx_ops(); }
uint64_t own_op_count() { return g_own_ops.load(); }

void begin_waiting() { g_waiting.fetch_add(1); }
void end_waiting() { g_waiting.fetch_sub(1); }

}  // namespace specd_mlx
