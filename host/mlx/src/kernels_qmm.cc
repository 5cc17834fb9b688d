// The quantized matmul (kernels_qmm.h).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mlx/array.h"
#include "specd-mlx/src/kernels_common.h"
#include "specd-mlx/src/kernels_qmm.h"
#include "specd-mlx/src/qmm.h"

namespace specd_mlx {

// ---- quantized matmul -----------------------------------------------------------
//
// y[m, n] = sum_k x[m, k] * (s[n, g] * q[n, k] + b[n, g]),  g = k / group
//         = sum_g s[n, g] * dot(x[m, g], q[n, g]) + b[n, g] * xsum[m, g]
//
// over weights packed once at load (qmm.h: 16 output columns to a vector,
// x broadcast), so no horizontal sums and no per-call reordering of x. Per
// call, only the per-group sums of x are computed (and strided rows gathered).

namespace {
using QArgs = qmm::Args;
}  // namespace

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

namespace {

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

// With 8-bit activations, the sums that carry the weights' affine bias
// (y = sum_g s_g (q . x)_g + b_g sum_g x) are those of the 8-bit x, not of
// the float x: xs[g] = sum over g's blocks of xd * (the block's integer
// sum), as llama.cpp's Q8_1 blocks keep s = d * sum(q). Then y is exactly
// the dequantized weights times the dequantized x. With the float sums
// instead, the bias term is b_g sum(x) while the scale term sees x rounded,
// so every output carries b_g times the block's summed rounding error: b is
// about -8 s for Q4_0/Q4_1 (values 0..15) and -128 s for Q8_0 (values
// 0..255, the tied head), far larger than the centred weights' own error
// (the int8 perplexity gap, docs/benchmarks.md). Integer sums are exact and
// the float steps go in block order, so every ISA gets the same bits.
void q8_group_sums(const int8_t* xq, const float* xd, int K, int group, float* xs) {
  const int per = group / 32;
  for (int g = 0; g < K / group; g++) {
    float t = 0.f;
    for (int bk = 0; bk < per; bk++) {
      const int blk = g * per + bk;
      const int8_t* q = xq + (size_t)blk * 32;
      int32_t s = 0;
      for (int i = 0; i < 32; i++) s += q[i];
      t = std::fma(float(s), xd[blk], t);
    }
    xs[g] = t;
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
  float *xqd0 = xqd.data(), *xn0 = xn.data(), *xs0 = xs.data();
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
          q8_group_sums(q, d, K, group, xs0 + (size_t)m * (K / group));
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

}  // namespace

// The rows of in[0] (x) as the matmul reads them, once inputs 1 to
// `last` - 1 (weights, norm, residual) are checked row-contiguous.
QmmBody::Rows QmmBody::rows_of(const std::vector<mx::array>& in, size_t last, const char* op) {
  for (size_t i = 1; i < last; i++)
    if (!in[i].flags().row_contiguous)
      throw std::runtime_error(std::string(op) + ": weights, norm and residual must be row-contiguous");
  return {row_offsets(in[0]), in[0].strides().back()};
}

QmmBody::Rows QmmBody::prepare(const std::vector<mx::array>& in, const mx::array&) const {
  return rows_of(in, in.size(), "SpecdQMatmul");
}

void QmmBody::run(const std::vector<mx::array>& in, mx::array& out, const Rows& rows) const {
  const float* norm_w = norm ? in[2].data<float>() : nullptr;
  const float* r = residual ? in[norm ? 3 : 2].data<float>() : nullptr;
  compute(in[0].data<float>(), rows, in[0].size() / in[0].shape(-1), in[0].shape(-1),
          in[1].data<uint32_t>(), norm_w, r, out.data<float>());
}

// The matmul (and rope) of M rows of x (`width` features each, laid out
// as `rows` says) into y, [M, n] row-major.
void QmmBody::compute(const float* x, const Rows& rows, int M, int width, const uint32_t* w,
                      const float* norm_w, const float* r, float* y) const {
  int K = glu == Glu::None ? width : width / 2;
  qmm_run(x, rows.off, rows.col, w, norm_w, eps, r, y, M, n, K, group, bits, glu);
  if (rope_cols > 0) {
    // Row by row (each at its own angles), rows spread over the pool.
    run_ranges(M, false, [&](int t0, int t1) {
      Rope rope(head_dim, rope_traditional, rope_base, 1.f, rope_factors);
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

QmmBody::Rows TailBody::prepare(const std::vector<mx::array>& in, const mx::array&) const {
  return QmmBody::rows_of(in, in.size(), "SpecdLayerTail");
}

// in: o (attention's output), x (the layer's input), W_o, the MLP's norm
// weight, W_gate_up, W_down.
void TailBody::run(const std::vector<mx::array>& in, mx::array& out,
                   const QmmBody::Rows& rows) const {
  compute(in[0].data<float>(), rows, in[0].size() / in[0].shape(-1), in[0].shape(-1),
          in.data() + 1, out.data<float>());
}

// M rows of o (`width` features each, laid out as `rows` says); `w`
// points at x (row-major [M, o.n]), W_o, the MLP's norm weight,
// W_gate_up and W_down, in that order.
void TailBody::compute(const float* o_x, const QmmBody::Rows& rows, int M, int width,
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

int QRowsBody::prepare(const std::vector<mx::array>& in, const mx::array&) const {
  if (!in[0].flags().row_contiguous || !in[1].flags().row_contiguous)
    throw std::runtime_error("SpecdQRows: inputs must be row-contiguous");
  return 0;
}

void QRowsBody::run(const std::vector<mx::array>& in, mx::array& out, int) const {
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

}  // namespace specd_mlx
