// AVX-512 (F + BW) with F16C: 16 lanes. Compiled with those instructions
// enabled; called only when the CPU has them.
#include <immintrin.h>

#include <algorithm>

#include "attn_rows_walk.h"
#include "qmm_simd.h"

namespace specd_mlx::qmm {
namespace {

struct Avx512 {
  using V = __m512;
  using Vi = __m512i;
  static constexpr int W = 16;
  // Output vectors per tile (rows x column vectors): 8 accumulators and 8
  // partial sums fill half the 32 registers and keep 8 independent FMA
  // chains in flight, so one partial sum per group suffices.
  static constexpr int kOutputs = 8;
  // 4-bit tiles of 8 rows hold 16 (8 rows x 2 blocks): each unpacked
  // weight vector then feeds as many FMAs, twice the chains are in flight,
  // and the accumulators, touched once a group, spill to L1. Faster there on
  // Zen 5 (qmm_bench, one thread: 1536x576 at 8 rows 88-119 -> 69-72 us),
  // slower for 1 row and for 8-bit weights, which keep 8.
  // Tiles of 2-4 rows take one column block (R outputs): their 8 / R or
  // 16 / R blocks, each a weight stream prefetched 8 groups ahead, cost
  // more than their extra chains gave on a 2-core Zen 4 (`specd profile
  // --rows R`, the default weights, light step, medians of 6 runs alternated
  // in rotated order: 2 / 3 / 4 rows 7.47 / 9.87 / 10.92 -> 6.71 / 8.33 /
  // 9.76 ms, in all 6 pairs at 4 rows; one row keeps its 8 blocks, which
  // read the same as 4 or 2 there).
  template <int BITS, int R>
  static constexpr int outputs() {
    if constexpr (R >= 2 && R <= 4) return R;
    return BITS == 4 && R >= 4 ? 16 : kOutputs;
  }
  // Rows past the 8-row tiles (1-7) run as one tile (qmm_tiles.h).
  static constexpr bool kOneTail = true;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float v) { return _mm512_set1_ps(v); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static float hsum(V v) {
    // In registers: a store and two reloads would stall on store forwarding.
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
  static Vi loadw(const uint32_t* p) { return _mm512_loadu_si512(p); }
  static V cvtph(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // Value j of every lane's word, as float.
  template <int BITS>
  static V unpack(Vi w, int j) {
    if constexpr (BITS == 4) {
      // A 16-entry table lookup on the low 4 bits of each lane: the shift
      // alone isolates the nibble, no mask or int->float conversion.
      const V table = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
      return _mm512_permutexvar_ps(_mm512_srli_epi32(w, 4 * j), table);
    } else {
      // Byte j of each lane moved to its low byte, the rest zeroed.
      const Vi ctl = _mm512_add_epi32(_mm512_set1_epi32(int(0x80808000u | unsigned(j))),
                                      _mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12, 0,
                                                        4, 8, 12));
      return _mm512_cvtepi32_ps(_mm512_shuffle_epi8(w, ctl));
    }
  }
  static V load_n(const float* p, int n) {
    return n == W ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(__mmask16((1u << n) - 1), p);
  }
  static void store(float* y, V v, int n) {
    if (n == W)
      _mm512_storeu_ps(y, v);
    else
      _mm512_mask_storeu_ps(y, __mmask16((1u << n) - 1), v);
  }
};

}  // namespace

void avx512(const Args& a, int cb0, int cb1) { Kernel<Avx512>::run(a, cb0, cb1); }

namespace {

// The max of p[0, n) as a scan from p[0] with std::max finds it, in 16
// lanes: max is exact, so only which of +0 and -0 survives a tie could
// differ, and p - (+0) and p - (-0) differ only for p = -0, whose exp is 1
// either way.
inline float max_of(const float* p, int n) {
  // Every lane starts from p[0], as the scan does; max_ps(x, m) keeps m
  // where x is NaN, as std::max(m, x) does.
  __m512 m = _mm512_set1_ps(p[0]);
  int i = 1;
  for (; i + 16 <= n; i += 16) m = _mm512_max_ps(_mm512_loadu_ps(p + i), m);
  alignas(64) float l[16];
  _mm512_store_ps(l, m);
  float mx = l[0];
  for (int k = 1; k < 16; k++) mx = std::max(mx, l[k]);
  for (; i < n; i++) mx = std::max(mx, p[i]);
  return mx;
}

// Per head: its scores turned into exp(score - max) in place, and 1 / their
// sum in inv[h].
inline void softmax_heads(float* scores, int n, int hg, float* inv, float softcap) {
  for (int h = 0; h < hg; h++) {
    float* p = scores + h * n;
    softcap_scores(p, n, softcap);
    inv[h] = 1.f / exp_sum_avx2(p, n, max_of(p, n));
  }
}

// 16 floats of a cache row at `at`: loaded, or widened exactly from float16
// (HALF), so a 16-bit cache gives the results of a float cache holding the
// same values. The cache's type is a template argument: no per-load test.
template <bool HALF>
__m512 cache16(const float* f, const uint16_t* h, int64_t at) {
  if constexpr (HALF)
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + at)));
  else
    return _mm512_loadu_ps(f + at);
}

#ifndef SPECD_ATTN_PREFETCH
#define SPECD_ATTN_PREFETCH 16
#endif

// The cache row `SPECD_ATTN_PREFETCH` rows past `at` (DC vectors), fetched
// ahead: a step's caches are read once each, from memory (8 sequences of
// 256 tokens read 94 MB of float32 keys and values), and the hardware
// prefetcher falls behind their rows as it does behind the weights'. 16
// rows: attention's perf samples against the 4-bit tile's at context 1024,
// 1.00-1.16 without, 0.88-0.91 with (8: 0.72-1.00). CXXFLAGS=
// -DSPECD_ATTN_PREFETCH=N builds another distance, 0 none.
template <bool HALF, int DC>
void prefetch_row(const float* f, const uint16_t* h, int64_t at, int64_t row) {
  if constexpr (SPECD_ATTN_PREFETCH > 0) {
    const int64_t ahead = at + SPECD_ATTN_PREFETCH * row;
    const char* p = HALF ? reinterpret_cast<const char*>(h + ahead)
                         : reinterpret_cast<const char*>(f + ahead);
    constexpr int bytes = DC * 16 * (HALF ? 2 : 4);
    for (int b = 0; b < bytes; b += 64) __builtin_prefetch(p + b, 0, 3);
  }
}

// Output vectors [c0, c0 + CB) of heads [h0, h0 + hg) over keys [j0, j1)
// (head h's scores at scores[(h - h0) * n], 1 / sum at inv[h - h0]):
// o = fma(p_j, v_j, o) in key order from 0, taken up from the output rows
// where an earlier block of keys left it, times 1 / sum after the last key.
// PREFETCH: value rows fetched ahead (a lone row streams its cache from
// memory; a unit of rows reads a block that its first row brought in).
template <bool HALF, int HG, int CB, bool PREFETCH>
void weigh_keys(const AttnGroup& g, int h0, int hg, const float* scores, const float* inv, int c0,
                int j0, int j1) {
  const int n = g.n;
  __m512 o[HG][CB];
  for (int h = 0; h < hg; h++)
    for (int c = 0; c < CB; c++)
      o[h][c] = j0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(g.o[h0 + h] + 16 * (c0 + c));
  for (int j = j0; j < j1; j++) {
    const int64_t vr = j * g.v_row + 16 * c0;
    if constexpr (PREFETCH) prefetch_row<HALF, CB>(g.v, g.v16, vr, g.v_row);
    __m512 v[CB];
    for (int c = 0; c < CB; c++) v[c] = cache16<HALF>(g.v, g.v16, vr + 16 * c);
    for (int h = 0; h < hg; h++) {
      __m512 pj = _mm512_set1_ps(scores[h * n + j]);
      for (int c = 0; c < CB; c++) o[h][c] = _mm512_fmadd_ps(pj, v[c], o[h][c]);
    }
  }
  for (int h = 0; h < hg; h++)
    for (int c = 0; c < CB; c++) {
      __m512 x = j1 == n ? _mm512_mul_ps(o[h][c], _mm512_set1_ps(inv[h])) : o[h][c];
      _mm512_storeu_ps(g.o[h0 + h] + 16 * (c0 + c), x);
    }
}

// Heads [h0, h0 + HG) of the group, head dim 16 * DC.
template <bool HALF, int DC, int HG>
void attn_heads(const AttnGroup& g, int h0, int hg, float* scores) {
  const int n = g.n;
  __m512 q[HG][DC];
  for (int h = 0; h < hg; h++)
    for (int c = 0; c < DC; c++) q[h][c] = _mm512_loadu_ps(g.q[h0 + h] + 16 * c);
  for (int j = 0; j < n; j++) {
    const int64_t kr = j * g.k_row;
    prefetch_row<HALF, DC>(g.k, g.k16, kr, g.k_row);
    __m512 k[DC];
    for (int c = 0; c < DC; c++) k[c] = cache16<HALF>(g.k, g.k16, kr + 16 * c);
    for (int h = 0; h < hg; h++) {
      __m512 acc = _mm512_mul_ps(q[h][0], k[0]);
      for (int c = 1; c < DC; c++) acc = _mm512_fmadd_ps(q[h][c], k[c], acc);
      scores[h * n + j] = Avx512::hsum(acc) * g.scale;
    }
  }
  float inv[HG];
  softmax_heads(scores, n, hg, inv, g.softcap);
  weigh_keys<HALF, HG, DC, true>(g, h0, hg, scores, inv, 0, 0, n);
}

// Head dim 16 * DC too wide to keep the group's queries in registers (256,
// Gemma 3): the queries are read from L1 for each key row, and the outputs
// are built CB vectors at a time. Keys and values still stream once for the
// group's heads. Each score and each output element sums in the same order as
// attn_heads (the chunks in order, then the keys in order), so a row's bits
// do not depend on the rows or heads around it.
template <bool HALF, int DC, int HG, int CB>
void attn_heads_wide(const AttnGroup& g, int h0, int hg, float* scores) {
  const int n = g.n;
  for (int j = 0; j < n; j++) {
    const int64_t kr = j * g.k_row;
    prefetch_row<HALF, DC>(g.k, g.k16, kr, g.k_row);
    __m512 acc[HG];
    __m512 k0 = cache16<HALF>(g.k, g.k16, kr);
    for (int h = 0; h < hg; h++) acc[h] = _mm512_mul_ps(_mm512_loadu_ps(g.q[h0 + h]), k0);
    for (int c = 1; c < DC; c++) {
      __m512 k = cache16<HALF>(g.k, g.k16, kr + 16 * c);
      for (int h = 0; h < hg; h++)
        acc[h] = _mm512_fmadd_ps(_mm512_loadu_ps(g.q[h0 + h] + 16 * c), k, acc[h]);
    }
    for (int h = 0; h < hg; h++) scores[h * n + j] = Avx512::hsum(acc[h]) * g.scale;
  }
  float inv[HG];
  softmax_heads(scores, n, hg, inv, g.softcap);
  for (int c0 = 0; c0 < DC; c0 += CB)
    weigh_keys<HALF, HG, CB, true>(g, h0, hg, scores, inv, c0, 0, n);
}

// Every head of the group, HG at a time, through `heads`.
template <int HG>
void attn_all(const AttnGroup& g, float* scores,
              void (*heads)(const AttnGroup&, int, int, float*)) {
  for (int h0 = 0; h0 < g.heads; h0 += HG) heads(g, h0, std::min(HG, g.heads - h0), scores);
}

template <bool HALF>
bool attn_group(const AttnGroup& g, float* scores) {
  switch (g.D) {
    case 64: attn_all<3>(g, scores, attn_heads<HALF, 4, 3>); return true;
    case 128: attn_all<2>(g, scores, attn_heads<HALF, 8, 2>); return true;
    case 256: attn_all<4>(g, scores, attn_heads_wide<HALF, 16, 4, 4>); return true;
    default: return false;
  }
}

// Lane l = Avx512::hsum(v[l]), bitwise: the 16 reductions run side by
// side and every lane adds what hsum adds, in its order (the 256-bit
// halves, then the 128-bit quarters, then elements 0 + 2 and 1 + 3, then
// those two). 30 shuffles and 15 adds for 16 sums where 16 hsums take 48
// shuffles, 64 adds and 16 scalar stores.
inline __m512 hsum16(const __m512 (&v)[16]) {
  // t[2i]: the 8 half sums of v[i] (quarters 0, 1) and v[i + 4] (2, 3);
  // t[2i + 1]: those of v[i + 8] and v[i + 12].
  __m512 t[8];
  for (int i = 0; i < 4; i++)
    for (int s = 0; s < 2; s++) {
      const __m512 a = v[i + 8 * s], b = v[i + 4 + 8 * s];
      t[2 * i + s] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    }
  // w[i]: quarter c holds the 4 quarter sums of v[4c + i].
  __m512 w[4];
  for (int i = 0; i < 4; i++)
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  // Per quarter as hsum8 in qmm_avx2.cc: (0 + 2, 1 + 3) pairs, then their sum.
  __m512 u[2];
  for (int i = 0; i < 2; i++)
    u[i] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// Scores of keys [j0, j0 + 16) for head h: per key attn_heads' chain (q
// times the first 16 floats, then an fma per 16 in order), the 16 sums
// reduced together (hsum16) and scaled in one vector. The 16 key rows (4
// KB at D = 64) stay in L1 for the group's next head and the unit's next
// row. The head dim is 16 * DC: with it known, a key's chain is straight
// code over one row pointer, and the query and the 16 sums stay in
// registers (a run-time D kept 16 row pointers and spilled the sums).
template <bool HALF, int DC>
void scores_16keys(const AttnGroup& g, int h, int j0, float* scores) {
  __m512 q[DC], acc[16];
  for (int c = 0; c < DC; c++) q[c] = _mm512_loadu_ps(g.q[h] + 16 * c);
  int64_t at = (int64_t)j0 * g.k_row;
#pragma GCC unroll 16
  for (int i = 0; i < 16; i++, at += g.k_row) {
    __m512 a = _mm512_mul_ps(q[0], cache16<HALF>(g.k, g.k16, at));
    for (int c = 1; c < DC; c++) a = _mm512_fmadd_ps(q[c], cache16<HALF>(g.k, g.k16, at + 16 * c), a);
    acc[i] = a;
  }
  _mm512_storeu_ps(scores + h * g.n + j0, _mm512_mul_ps(hsum16(acc), _mm512_set1_ps(g.scale)));
}

// The last keys [j0, n) of a row (fewer than 16), every head: attn_heads'
// chain and hsum per (key, head), the heads' chains side by side.
template <bool HALF>
void scores_tail(const AttnGroup& g, int j0, float* scores) {
  __m512 acc[AttnGroup::kMaxHeads];
  for (int j = j0; j < g.n; j++) {
    const int64_t kr = j * g.k_row;
    const __m512 k0 = cache16<HALF>(g.k, g.k16, kr);
    for (int h = 0; h < g.heads; h++) acc[h] = _mm512_mul_ps(_mm512_loadu_ps(g.q[h]), k0);
    for (int c = 16; c < g.D; c += 16) {
      const __m512 k = cache16<HALF>(g.k, g.k16, kr + c);
      for (int h = 0; h < g.heads; h++)
        acc[h] = _mm512_fmadd_ps(_mm512_loadu_ps(g.q[h] + c), k, acc[h]);
    }
    for (int h = 0; h < g.heads; h++) scores[h * g.n + j] = Avx512::hsum(acc[h]) * g.scale;
  }
}

// Attention of `rows` query rows of one sequence over one kv head's keys
// and values, row r over keys [0, g[r].n), in attn_rows_walk.h's blocks.
// Per (row, head) the float operations are attn_heads', in its order (the
// scores' chains, 16 keys reduced side by side; max, exp_sum_avx2, the fma
// chains over the values, times 1 / sum), so a row's bits are those of the
// row alone.
template <bool HALF, int HG, int CB, int DC>
void group_rows(const AttnGroup* g, int rows, float* scores) {
  auto softmax = [](const AttnGroup& r, float* sc, float* inv) { softmax_heads(sc, r.n, r.heads, inv, r.softcap); };
  auto weigh = [](const AttnGroup& r, const float* sc, const float* inv, int j0, int j1) {
    for (int h0 = 0; h0 < r.heads; h0 += HG)
      for (int c0 = 0; c0 < r.D / 16; c0 += CB)
        weigh_keys<HALF, HG, CB, false>(r, h0, std::min(HG, r.heads - h0), sc + h0 * r.n, inv + h0, c0,
                                        j0, j1);
  };
  auto keys = [](const AttnGroup& r, int h, int j, float* sc) { scores_16keys<HALF, DC>(r, h, j, sc); };
  auto tail = [](const AttnGroup& r, int j, float* sc) { scores_tail<HALF>(r, j, sc); };
  walk_key_blocks<16>(g, rows, scores, keys, tail, softmax, weigh);
}

template <bool HALF>
bool group_rows(const AttnGroup* g, int rows, float* scores) {
  // The heads and output vectors per pass of attn_group's shapes.
  switch (g[0].D) {
    case 64: group_rows<HALF, 3, 4, 4>(g, rows, scores); return true;
    case 128: group_rows<HALF, 2, 8, 8>(g, rows, scores); return true;
    case 256: group_rows<HALF, 4, 4, 16>(g, rows, scores); return true;
    default: return false;
  }
}

}  // namespace

bool attn_group_rows_avx512(const AttnGroup* g, int rows, float* scores) {
  if (rows > kAttnMaxRows || g[0].heads > AttnGroup::kMaxHeads) return false;
  return g[0].k16 ? group_rows<true>(g, rows, scores) : group_rows<false>(g, rows, scores);
}

bool attn_group_avx512(const AttnGroup& g, float* scores) {
  if (g.heads > AttnGroup::kMaxHeads) return false;
  // A group's keys and values are both float16 or both float32.
  return g.k16 ? attn_group<true>(g, scores) : attn_group<false>(g, scores);
}

}  // namespace specd_mlx::qmm
