// AVX2 + FMA + F16C: 8 lanes. Compiled with those instructions enabled;
// called only when the CPU has them.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <new>

#include "attn_rows_walk.h"
#include "qmm_avx2.h"
#include "qmm_simd.h"

namespace specd_mlx::qmm {

namespace {

// Many rows (prefill slices): a column block's weights are unpacked to
// floats once, into a panel p[k][16] (with its scales and biases), and
// every row tile of R rows then reads it: R x 2 partial sums in registers,
// two loads and R broadcasts for 2R FMAs, where the tiles of qmm_simd.h
// unpack the weights again for every 4 rows. Per output the float
// operations are the formula's, in its order (per group t from 0 by fma
// over the group's values in order; acc = fma(t, s, acc), then fma(b,
// xsum, acc); y = acc (+ r)), so the results are those of any other tile,
// row for row.
struct Panel {
  const float* p;   // [K][16] values
  const float* sb;  // per group: 16 scales, then 16 biases
};

// Rows [m, m + R) of x into y's column block cb.
template <int R>
void panel_tile(const Args& a, const Panel& pn, int cb, int m) {
  const int groups = a.K / a.group;
  alignas(32) float acc[R][kLanes] = {};
  const float* x = a.x + (size_t)m * a.K;
  for (int g = 0; g < groups; g++) {
    __m256 t[R][2];
    for (int r = 0; r < R; r++) t[r][0] = t[r][1] = _mm256_setzero_ps();
    const float* p = pn.p + (size_t)g * a.group * kLanes;
    const float* xg = x + (size_t)g * a.group;
    for (int k = 0; k < a.group; k++) {
      __m256 w0 = _mm256_load_ps(p + 16 * k), w1 = _mm256_load_ps(p + 16 * k + 8);
#pragma GCC unroll 8
      for (int r = 0; r < R; r++) {
        __m256 xb = _mm256_set1_ps(xg[(size_t)r * a.K + k]);
        t[r][0] = _mm256_fmadd_ps(xb, w0, t[r][0]);
        t[r][1] = _mm256_fmadd_ps(xb, w1, t[r][1]);
      }
    }
    const float* sb = pn.sb + (size_t)g * 2 * kLanes;
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      __m256 xs = _mm256_set1_ps(a.xsum[(size_t)(m + r) * groups + g]);
      for (int v = 0; v < 2; v++) {
        __m256 ov = _mm256_load_ps(acc[r] + 8 * v);
        ov = _mm256_fmadd_ps(t[r][v], _mm256_load_ps(sb + 8 * v), ov);
        ov = _mm256_fmadd_ps(_mm256_load_ps(sb + kLanes + 8 * v), xs, ov);
        _mm256_store_ps(acc[r] + 8 * v, ov);
      }
    }
  }
  __m256 out[R][1][2];
  for (int r = 0; r < R; r++)
    for (int v = 0; v < 2; v++) out[r][0][v] = _mm256_load_ps(acc[r] + 8 * v);
  Kernel<Avx2>::store<R, 1>(a, out, cb, m);
}

// Rows of 6: 12 partial sums, 2 weight vectors and a broadcast fill 15 of
// the 16 registers.
constexpr int kPanelTile = 6;
// x bytes a row block holds: it stays in L2 while the column blocks pass
// over it (a 256-row x of K = 576 is 590 KB).
constexpr size_t kPanelXBytes = 192 * 1024;

// A buffer of floats, 32-byte aligned, grown on demand.
struct AlignedFloats {
  float* p = nullptr;
  size_t n = 0;
  float* get(size_t want) {
    if (want > n) {
      std::free(p);
      p = static_cast<float*>(std::aligned_alloc(32, ((want * 4 + 31) / 32) * 32));
      if (!p) throw std::bad_alloc();
      n = want;
    }
    return p;
  }
  ~AlignedFloats() { std::free(p); }
};

template <int BITS, bool F32S>
void panel_bits(const Args& a, int cb0, int cb1) {
  constexpr int per = 32 / BITS;
  const int groups = a.K / a.group, dpg = a.group / per,
            gw = group_words(a.group, BITS | (F32S ? kScaleF32 : 0));
  // Reused across calls (a prefill slice runs a few hundred).
  thread_local AlignedFloats values, scales;
  float* pv = values.get((size_t)a.K * kLanes);
  float* ps = scales.get((size_t)groups * 2 * kLanes);
  const Panel pn{pv, ps};
  // Row blocks: the panels are unpacked again for each.
  const int rb = std::max(kPanelTile, (int)(kPanelXBytes / (4 * (size_t)a.K)) / kPanelTile * kPanelTile);
  for (int m0 = 0; m0 < a.M; m0 += rb) {
    const int m1 = std::min(a.M, m0 + rb);
    for (int cb = cb0; cb < cb1; cb++) {
      for (int g = 0; g < groups; g++) {
        const uint32_t* base = a.w + ((size_t)cb * groups + g) * gw;
        float* p = pv + (size_t)g * a.group * kLanes;
        for (int d = 0; d < dpg; d++)
          for (int v = 0; v < 2; v++) {
            __m256i wv = Avx2::loadw(base + d * kLanes + v * 8);
#pragma GCC unroll 8
            for (int j = 0; j < per; j++)
              _mm256_store_ps(p + (size_t)(d * per + j) * kLanes + 8 * v, Avx2::unpack<BITS>(wv, j));
          }
        const uint16_t* sh = reinterpret_cast<const uint16_t*>(base + dpg * kLanes);
        const float* sf = reinterpret_cast<const float*>(base + dpg * kLanes);
        float* o = ps + (size_t)g * 2 * kLanes;
        for (int v = 0; v < 4; v++)
          _mm256_store_ps(o + 8 * v, F32S ? _mm256_loadu_ps(sf + 8 * v) : Avx2::cvtph(sh + 8 * v));
      }
      int m = m0;
      for (; m + kPanelTile <= m1; m += kPanelTile) panel_tile<kPanelTile>(a, pn, cb, m);
      switch (m1 - m) {
        case 5: panel_tile<5>(a, pn, cb, m); break;
        case 4: panel_tile<4>(a, pn, cb, m); break;
        case 3: panel_tile<3>(a, pn, cb, m); break;
        case 2: panel_tile<2>(a, pn, cb, m); break;
        case 1: panel_tile<1>(a, pn, cb, m); break;
        default: break;
      }
    }
  }
}

}  // namespace

void avx2(const Args& a, int n0, int n1) {
  if (a.M >= kPanelRows && !a.x_nibble_scaled) {
    switch (a.bits) {
      case 4: return panel_bits<4, false>(a, n0, n1);
      case 8: return panel_bits<8, false>(a, n0, n1);
      case 4 | kScaleF32: return panel_bits<4, true>(a, n0, n1);
      default: return panel_bits<8, true>(a, n0, n1);
    }
  }
  if (!a.x_nibble_scaled) return Kernel<Avx2>::run(a, n0, n1);
  using T = Tiles<Kernel<Avx2ScaledNibbles>>;
  if (scale_f32(a.bits))
    T::run_bits<4, true>(a, n0, n1);
  else
    T::run_bits<4, false>(a, n0, n1);
}

bool scale_nibbles(const float* x, int M, int K, float* xs) {
  // Below 2^-102 a value times 2^-24 is subnormal and loses bits.
  constexpr float kTiny = 0x1p-102f;
  // Powers of two: each product is exact where it is not subnormal.
  const __m256 f = _mm256_setr_ps(1.f, 0x1p-4f, 0x1p-8f, 0x1p-12f, 0x1p-16f, 0x1p-20f, 0x1p-24f, 1.f);
  const __m256 tiny = _mm256_set1_ps(kTiny), zero = _mm256_setzero_ps();
  const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 bad = zero;
  for (size_t i = 0, n = (size_t)M * K; i < n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i), a = _mm256_and_ps(v, abs);
    bad = _mm256_or_ps(bad, _mm256_and_ps(_mm256_cmp_ps(a, tiny, _CMP_LT_OQ),
                                          _mm256_cmp_ps(a, zero, _CMP_GT_OQ)));
    _mm256_storeu_ps(xs + i, _mm256_mul_ps(v, f));
  }
  return _mm256_movemask_ps(bad) == 0;
}

void group_sums_avx2(const float* x, int K, int group, float* out) {
  // Lane l sums group g0 + l: each lane adds its group's values one by one,
  // in order, as a scalar loop would, while the 8 lanes run side by side.
  const int groups = K / group;
  const __m256i idx =
      _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(group));
  for (int g0 = 0; g0 < groups; g0 += 8) {
    const int n = std::min(8, groups - g0);
    const __m256 live = _mm256_castsi256_ps(
        _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
    const float* b = x + (size_t)g0 * group;
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < group; i++)
      acc = _mm256_add_ps(acc, _mm256_mask_i32gather_ps(_mm256_setzero_ps(), b + i, idx, live, 4));
    alignas(32) float t[8];
    _mm256_store_ps(t, acc);
    for (int l = 0; l < n; l++) out[g0 + l] = t[l];
  }
}

float dot_avx2(const float* a, const float* b, int n) {
  __m256 acc = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8)
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  float r = Avx2::hsum(acc);
  for (; i < n; i++) r += a[i] * b[i];
  return r;
}

namespace {
// exp(x) for 8 lanes: Cephes' expf (range reduction by ln 2, degree-5
// polynomial), ~1 ulp over the softmax range. Lanes below -87 give ~0.
__m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
}  // namespace

float exp_sum_avx2(float* p, int n, float shift) {
  __m256 acc = _mm256_setzero_ps(), sh = _mm256_set1_ps(shift);
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + j), sh));
    _mm256_storeu_ps(p + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = Avx2::hsum(acc);
  if (j < n) {
    // The tail through the same polynomial, padded to 8 lanes.
    alignas(32) float t[8];
    for (int i = 0; i < 8; i++) t[i] = j + i < n ? p[j + i] - shift : -100.f;
    _mm256_store_ps(t, exp8(_mm256_load_ps(t)));
    for (int i = 0; j + i < n; i++) {
      p[j + i] = t[i];
      sum += t[i];
    }
  }
  return sum;
}

namespace {
// y = f(g, u) over n floats, 8 lanes at a time; the tail through the same
// lanes, zero-padded.
template <class F>
void gated(const float* g, const float* u, float* y, int n, F f) {
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, f(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
  if (i < n) {
    alignas(32) float gt[8] = {}, ut[8] = {}, yt[8];
    for (int j = 0; i + j < n; j++) gt[j] = g[i + j], ut[j] = u[i + j];
    _mm256_store_ps(yt, f(_mm256_load_ps(gt), _mm256_load_ps(ut)));
    for (int j = 0; i + j < n; j++) y[i + j] = yt[j];
  }
}
}  // namespace

void swiglu_avx2(const float* g, const float* u, float* y, int n) {
  const __m256 one = _mm256_set1_ps(1.f);
  gated(g, u, y, n, [&](__m256 gv, __m256 uv) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));
    return _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), uv);
  });
}

void geglu_avx2(const float* g, const float* u, float* y, int n) {
  const __m256 one = _mm256_set1_ps(1.f), a = _mm256_set1_ps(0.044715f),
               mc = _mm256_set1_ps(-1.5957691216057308f);
  gated(g, u, y, n, [&](__m256 gv, __m256 uv) {
    // -c (g + a g^3), as -c * fma(a g^2, g, g)
    __m256 inner = _mm256_fmadd_ps(_mm256_mul_ps(a, _mm256_mul_ps(gv, gv)), gv, gv);
    __m256 e = exp8(_mm256_mul_ps(mc, inner));
    return _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), uv);
  });
}

void axpy_avx2(float a, const float* x, float* y, int n) {
  __m256 av = _mm256_set1_ps(a);
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; i++) y[i] = std::fma(a, x[i], y[i]);
}

}  // namespace specd_mlx::qmm

namespace specd_mlx::qmm {

namespace {
// The scan of top2.h in each of 8 lanes: lane l sees elements j = l mod 8,
// in order, so it keeps exactly what a scan over those elements keeps.
struct Top2Lanes {
  __m256 top = _mm256_set1_ps(-INFINITY), second = top;
  __m256i idx = _mm256_set1_epi32(INT_MAX), sidx = idx;
  __m256 nan = _mm256_setzero_ps();
  void push(__m256 x, __m256i at) {
    __m256 gt1 = _mm256_cmp_ps(x, top, _CMP_GT_OQ), gt2 = _mm256_cmp_ps(x, second, _CMP_GT_OQ);
    second = _mm256_blendv_ps(_mm256_blendv_ps(second, x, gt2), top, gt1);
    sidx = blend(blend(sidx, at, gt2), idx, gt1);
    top = _mm256_blendv_ps(top, x, gt1);
    idx = blend(idx, at, gt1);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  }
  static __m256i blend(__m256i a, __m256i b, __m256 m) {
    return _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b), m));
  }
  void merge_into(Top2& t) const {
    alignas(32) float tp[8], sc[8], nn[8];
    alignas(32) int ix[8], si[8];
    _mm256_store_ps(tp, top), _mm256_store_ps(sc, second), _mm256_store_ps(nn, nan);
    _mm256_store_si256(reinterpret_cast<__m256i*>(ix), idx);
    _mm256_store_si256(reinterpret_cast<__m256i*>(si), sidx);
    for (int l = 0; l < 8; l++) {
      Top2 lane;
      lane.top = tp[l], lane.idx = ix[l], lane.second = sc[l], lane.sidx = si[l];
      lane.nan = nn[l] != 0.f;
      t.merge(lane);
    }
  }
};
}  // namespace

Top2 top2_avx2(const float* x, int n, int base) {
  // Two lane sets, so two independent chains of compares and blends run.
  Top2Lanes a, b;
  __m256i at = _mm256_add_epi32(_mm256_set1_epi32(base), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i step = _mm256_set1_epi32(8), step2 = _mm256_set1_epi32(16);
  int j = 0;
  for (; j + 16 <= n; j += 16) {
    a.push(_mm256_loadu_ps(x + j), at);
    b.push(_mm256_loadu_ps(x + j + 8), _mm256_add_epi32(at, step));
    at = _mm256_add_epi32(at, step2);
  }
  Top2 t;
  a.merge_into(t);
  b.merge_into(t);
  // The tail comes after every index seen: the scan goes on from the merge.
  for (; j < n; j++) t.push(x[j], base + j);
  return t;
}

}  // namespace specd_mlx::qmm

namespace specd_mlx::qmm {

namespace {

// 8 floats of a cache row at `at`: loaded, or widened exactly from float16
// (HALF). The cache's type is a template argument, so the float32 path has
// no per-load test.
template <bool HALF>
__m256 cache8(const float* f, const uint16_t* h, int64_t at) {
  if constexpr (HALF)
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + at)));
  else
    return _mm256_loadu_ps(f + at);
}

// Scores of keys [j0, j0 + J) for heads [h0, h0 + HG): each one dot_avx2's
// chain (acc = 0, then fma per 8 floats in order, hsum) times the scale, so
// it is bitwise the per-head path's. J keys side by side keep J * HG
// independent chains in flight. (The tail of fewer than 8 keys.)
template <bool HALF, int J, int HG>
void scores_keys(const AttnGroup& g, int h0, int j0, float* scores) {
  __m256 acc[J][HG];
  for (int i = 0; i < J; i++)
    for (int h = 0; h < HG; h++) acc[i][h] = _mm256_setzero_ps();
  for (int c = 0; c < g.D; c += 8) {
    __m256 k[J];
    for (int i = 0; i < J; i++) k[i] = cache8<HALF>(g.k, g.k16, (int64_t)(j0 + i) * g.k_row + c);
    for (int h = 0; h < HG; h++) {
      __m256 q = _mm256_loadu_ps(g.q[h0 + h] + c);
      for (int i = 0; i < J; i++) acc[i][h] = _mm256_fmadd_ps(q, k[i], acc[i][h]);
    }
  }
  for (int h = 0; h < HG; h++)
    for (int i = 0; i < J; i++) scores[(h0 + h) * g.n + j0 + i] = Avx2::hsum(acc[i][h]) * g.scale;
}

// Lane l = Avx2::hsum(v[l]), bitwise: the 8 reductions run side by side and
// every lane adds what hsum adds, in its order (lo + hi halves, then
// elements 0 + 2 and 1 + 3, then those two). 21 shuffles and adds for 8
// sums where 8 hsums take 48 and 8 scalar stores.
inline __m256 hsum8(const __m256 (&v)[8]) {
  __m256 t[4];  // t[i]: v[i]'s 4 half sums in the low 128 bits, v[i + 4]'s in the high
  for (int i = 0; i < 4; i++)
    t[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[i], v[i + 4], 0x20),
                         _mm256_permute2f128_ps(v[i], v[i + 4], 0x31));
  // u[0]: v[0], v[1] | v[4], v[5] as (0 + 2, 1 + 3) pairs; u[1]: v[2], v[3] | v[6], v[7].
  __m256 u[2];
  for (int i = 0; i < 2; i++)
    u[i] = _mm256_add_ps(_mm256_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm256_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm256_add_ps(_mm256_shuffle_ps(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm256_shuffle_ps(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// Scores of keys [j0, j0 + 8) for head h: one dot_avx2 chain per key, as
// scores_keys, the 8 sums reduced together (hsum8) and scaled in one
// vector. The 8 key rows (2 KB at D = 64) stay in L1 for the group's next
// head.
template <bool HALF>
void scores_8keys(const AttnGroup& g, int h, int j0, float* scores) {
  __m256 acc[8];
  for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
  const float* q = g.q[h];
  for (int c = 0; c < g.D; c += 8) {
    __m256 qv = _mm256_loadu_ps(q + c);
    for (int i = 0; i < 8; i++)
      acc[i] = _mm256_fmadd_ps(qv, cache8<HALF>(g.k, g.k16, (int64_t)(j0 + i) * g.k_row + c), acc[i]);
  }
  _mm256_storeu_ps(scores + h * g.n + j0, _mm256_mul_ps(hsum8(acc), _mm256_set1_ps(g.scale)));
}

// The tail keys [j0, n) (fewer than 8) of heads [h0, h0 + HG).
template <bool HALF, int HG>
void scores_tail(const AttnGroup& g, int h0, int j0, float* scores) {
  int j = j0;
  for (; j + 2 <= g.n; j += 2) scores_keys<HALF, 2, HG>(g, h0, j, scores);
  if (j < g.n) scores_keys<HALF, 1, HG>(g, h0, j, scores);
}

template <bool HALF>
void scores_tail(const AttnGroup& g, int j0, float* scores) {
  int h0 = 0;
  for (; h0 + 4 <= g.heads; h0 += 4) scores_tail<HALF, 4>(g, h0, j0, scores);
  switch (g.heads - h0) {
    case 3: scores_tail<HALF, 3>(g, h0, j0, scores); break;
    case 2: scores_tail<HALF, 2>(g, h0, j0, scores); break;
    case 1: scores_tail<HALF, 1>(g, h0, j0, scores); break;
    default: break;
  }
}

// The per-head path's max (from -inf in key order, std::max) in 8 lanes:
// max is exact, so only which of +0 and -0 survives a tie could differ,
// and p - (+0) and p - (-0) differ only for p = -0, whose exp8 is 1 either
// way.
inline float max_of(const float* p, int n) {
  __m256 m = _mm256_set1_ps(-INFINITY);
  int i = 0;
  // max_ps(x, m) keeps m where x is NaN, as std::max(m, x) does.
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(p + i), m);
  alignas(32) float l[8];
  _mm256_store_ps(l, m);
  float mx = -INFINITY;
  for (float x : l) mx = std::max(mx, x);
  for (; i < n; i++) mx = std::max(mx, p[i]);
  return mx;
}

// Attention of `rows` query rows of one sequence over one kv head's keys
// and values, row r over keys [0, g[r].n), in attn_rows_walk.h's blocks.
// Per (row, head) the float operations are those of the per-head path, in
// its order: scores (dot_avx2's chains, 8 keys reduced side by side), max,
// exp_sum_avx2, then o = fma(p_j, v_j, o) in key order from 0 (axpy_avx2's),
// times 1 / sum.
template <bool HALF>
void group_rows(const AttnGroup* g, int rows, float* scores) {
  auto softmax = [](const AttnGroup& r, float* sc, float* inv) {
    for (int h = 0; h < r.heads; h++) {
      float* p = sc + h * r.n;
      softcap_scores(p, r.n, r.softcap);
      inv[h] = 1.f / exp_sum_avx2(p, r.n, max_of(p, r.n));
    }
  };
  auto weigh = [](const AttnGroup& r, const float* sc, const float* inv, int j0, int j1) {
    constexpr int CB = 8;  // 64 floats of a row per pass
    for (int h = 0; h < r.heads; h++) {
      const float* p = sc + h * r.n;
      for (int c0 = 0; c0 < r.D; c0 += 8 * CB) {
        float* out = r.o[h] + c0;
        __m256 o[CB];
        for (int c = 0; c < CB; c++) o[c] = j0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(out + 8 * c);
        for (int j = j0; j < j1; j++) {
          __m256 pj = _mm256_set1_ps(p[j]);
          for (int c = 0; c < CB; c++)
            o[c] = _mm256_fmadd_ps(pj, cache8<HALF>(r.v, r.v16, (int64_t)j * r.v_row + c0 + 8 * c), o[c]);
        }
        if (j1 == r.n) {
          __m256 s = _mm256_set1_ps(inv[h]);
          for (int c = 0; c < CB; c++) o[c] = _mm256_mul_ps(o[c], s);
        }
        for (int c = 0; c < CB; c++) _mm256_storeu_ps(out + 8 * c, o[c]);
      }
    }
  };
  auto keys = [](const AttnGroup& r, int h, int j, float* sc) { scores_8keys<HALF>(r, h, j, sc); };
  auto tail = [](const AttnGroup& r, int j, float* sc) { scores_tail<HALF>(r, j, sc); };
  walk_key_blocks<8>(g, rows, scores, keys, tail, softmax, weigh);
}

}  // namespace

void to_half_avx2(const float* x, uint16_t* y, int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; i++) y[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}

bool attn_group_rows_avx2(const AttnGroup* g, int rows, float* scores) {
  // Whole 64-float chunks per pass (grouped_dim: 64, 128, 256).
  if (rows > kAttnMaxRows || g[0].heads > AttnGroup::kMaxHeads || g[0].D % 64 != 0) return false;
  // A group's keys and values are both float16 or both float32.
  if (g[0].k16)
    group_rows<true>(g, rows, scores);
  else
    group_rows<false>(g, rows, scores);
  return true;
}

}  // namespace specd_mlx::qmm
