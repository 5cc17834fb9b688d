// The quantized matmul with 8-bit activations (qmm.h, `Args::xq`) on AVX2,
// for CPUs without AVX-512 VNNI. AVX2 has no `vpdpbusd`; `vpmaddubsw`
// multiplies unsigned by signed bytes and adds adjacent pairs into int16,
// saturating. The weights go in as 4-bit nibbles (0..15) only, so no sum
// saturates and every integer sum is exact:
//   - a 4-bit word's low and high nibbles are its values (qmm.h's x order);
//   - an 8-bit value w = 16 hi + lo is its two nibbles, summed apart:
//     isum = sum(lo * x) + 16 * sum(hi * x).
// One 32-value block adds 8 pair sums of at most 2 * 15 * 127 into each
// int16 lane: |s| <= 30480 < 32767. `vpmaddwd` by 1 then adds the int16
// pairs into the int32 lanes: the exact isum of qmm_vnni.cc.
//
// For output (row m, column n) the float operations are those of
// qmm_vnni.cc, in the same order:
//   per group g:  t = 0
//                 per 32-value block b of g, in order (isum exact):
//                   t = fma(float(isum[m, n, b]), xd[m, b], t)
//                 acc = fma(t, scale[n, g], acc)
//                 acc = fma(bias[n, g], xsum[m, g], acc)
//   y = acc (+ r[m, n])
// so results are batch-invariant and bitwise those of the VNNI kernel and
// of the scalar reference (kernels_qmm.cc `qmm_q8_scalar`). Compiled with AVX2,
// FMA and F16C enabled; called only when the CPU has them.
#include <immintrin.h>

#include "qmm.h"
#include "qmm_avx2.h"
#include "qmm_simd.h"
#include "qmm_tiles.h"

namespace specd_mlx::qmm {
namespace {

constexpr int W = Avx2::W;  // int32 / float lanes of a vector

struct Q8Avx2 {
  // 8 output vectors per tile (up to 4 rows x 2 vectors): their int16
  // block sums and float accumulators, with the words' loop kept rolled
  // (unrolled, GCC hoists every product of the block and spills); measured
  // on its own, 4 outputs ran 1.3x slower at 8 and 16 rows.
  static constexpr int kOutputs = 8, NV = kLanes / W;

  template <int BITS, bool F32S, int R, int CB>
  static void tile(const Args& a, int cb0, int m0) {
    if (a.group == 32)
      body<BITS, F32S, R, CB, true>(a, cb0, m0);
    else
      body<BITS, F32S, R, CB, false>(a, cb0, m0);
  }

  // 8-bit weights from 3 rows: a tile runs each of its column vectors over
  // all of K in turn (the second pass reads the block's words again, from
  // L1). With both at once, their R x 2 x 2 int16 sums and R x 2 float
  // accumulators do not fit the 16 registers and spill on every word
  // (qmm_bench, the 8-bit head, best of 5 alternated runs on Zen 3: 8 rows
  // 3.85 -> 3.63 ms, 16 rows 7.61 -> 7.34 ms). 4-bit weights (half the
  // sums) ran no faster so.
  template <int BITS, bool F32S, int R, int CB, bool ONE>
  static void body(const Args& a, int cb0, int m0) {
    __m256 acc[R][CB][NV];
    if constexpr (BITS == 8 && R >= 3 && NV == 2) {
      pass<BITS, F32S, R, CB, ONE, 0, 1>(a, cb0, m0, acc);
      pass<BITS, F32S, R, CB, ONE, 1, 1>(a, cb0, m0, acc);
    } else {
      pass<BITS, F32S, R, CB, ONE, 0, NV>(a, cb0, m0, acc);
    }
    Kernel<Avx2>::store(a, acc, cb0, m0);
  }

  // ONE: one block per group, so a block's t is the group's (no partial
  // kept across blocks). Fills acc[.][.][V0 .. V0 + VN).
  template <int BITS, bool F32S, int R, int CB, bool ONE, int V0, int VN>
  static void pass(const Args& a, int cb0, int m0, __m256 (&out)[R][CB][NV]) {
    constexpr int per = 32 / BITS;  // values per word
    constexpr int wpb = 32 / per;   // words per 32-value block
    constexpr int S = BITS == 8 ? 2 : 1;  // int16 sums per output
    const int groups = a.K / a.group, bpg = ONE ? 1 : a.group / 32, dpg = a.group / per,
              blocks = a.K / 32;
    const int gw = group_words(a.group, BITS | (F32S ? kScaleF32 : 0));
    const __m256i nib = _mm256_set1_epi32(0x0F0F0F0F), ones = _mm256_set1_epi16(1);
    __m256 acc[R][CB][VN];
    for (int r = 0; r < R; r++)
      for (int c = 0; c < CB; c++)
        for (int v = 0; v < VN; v++) acc[r][c][v] = _mm256_setzero_ps();
    for (int g = 0; g < groups; g++) {
      const uint32_t* base[CB];
      for (int c = 0; c < CB; c++) base[c] = a.w + ((size_t)(cb0 + c) * groups + g) * gw;
      prefetch_ahead(base, gw);
      __m256 t[R][CB][VN];
      if constexpr (!ONE)
        for (int r = 0; r < R; r++)
          for (int c = 0; c < CB; c++)
            for (int v = 0; v < VN; v++) t[r][c][v] = _mm256_setzero_ps();
      for (int bk = 0; bk < bpg; bk++) {
        const int blk = g * bpg + bk;
        // Row r's bytes of this block as 32-bit words (qmm.h's x order).
        const int32_t* xw[R];
        for (int r = 0; r < R; r++)
          xw[r] = reinterpret_cast<const int32_t*>(a.xq + (size_t)(m0 + r) * a.K + blk * 32);
        __m256i s[S][R][CB][VN];
        for (int h = 0; h < S; h++)
          for (int r = 0; r < R; r++)
            for (int c = 0; c < CB; c++)
              for (int v = 0; v < VN; v++) s[h][r][c][v] = _mm256_setzero_si256();
#pragma GCC unroll 1
        for (int d = 0; d < wpb; d++) {
#pragma GCC unroll 8
          for (int c = 0; c < CB; c++)
#pragma GCC unroll 2
            for (int v = 0; v < VN; v++) {
              __m256i wv = _mm256_loadu_si256(
                  reinterpret_cast<const __m256i*>(base[c] + (bk * wpb + d) * kLanes + (V0 + v) * W));
              __m256i lo = _mm256_and_si256(wv, nib);
              __m256i hi = _mm256_and_si256(_mm256_srli_epi32(wv, 4), nib);
#pragma GCC unroll 8
              for (int r = 0; r < R; r++) {
                if constexpr (BITS == 4) {
                  __m256i& ss = s[0][r][c][v];
                  ss = _mm256_add_epi16(
                      ss, _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xw[r][2 * d])));
                  ss = _mm256_add_epi16(
                      ss, _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xw[r][2 * d + 1])));
                } else {
                  const __m256i xv = _mm256_set1_epi32(xw[r][d]);
                  s[0][r][c][v] = _mm256_add_epi16(s[0][r][c][v], _mm256_maddubs_epi16(lo, xv));
                  s[1][r][c][v] = _mm256_add_epi16(s[1][r][c][v], _mm256_maddubs_epi16(hi, xv));
                }
              }
            }
        }
        for (int r = 0; r < R; r++) {
          const __m256 xd = _mm256_set1_ps(a.xd[(size_t)(m0 + r) * blocks + blk]);
          for (int c = 0; c < CB; c++)
            for (int v = 0; v < VN; v++) {
              __m256i isum = _mm256_madd_epi16(s[0][r][c][v], ones);
              if constexpr (S == 2)
                isum = _mm256_add_epi32(
                    isum, _mm256_slli_epi32(_mm256_madd_epi16(s[1][r][c][v], ones), 4));
              __m256 f = _mm256_cvtepi32_ps(isum);
              if constexpr (ONE)
                t[r][c][v] = _mm256_fmadd_ps(f, xd, _mm256_setzero_ps());
              else
                t[r][c][v] = _mm256_fmadd_ps(f, xd, t[r][c][v]);
            }
        }
      }
      for (int c = 0; c < CB; c++)
        for (int v = 0; v < VN; v++) {
          __m256 sc, bi;
          if constexpr (F32S) {
            const float* sf = reinterpret_cast<const float*>(base[c] + dpg * kLanes);
            sc = _mm256_loadu_ps(sf + (V0 + v) * W), bi = _mm256_loadu_ps(sf + kLanes + (V0 + v) * W);
          } else {
            const uint16_t* sb = reinterpret_cast<const uint16_t*>(base[c] + dpg * kLanes);
            sc = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + (V0 + v) * W)));
            bi = _mm256_cvtph_ps(
                _mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + kLanes + (V0 + v) * W)));
          }
          for (int r = 0; r < R; r++) {
            __m256& o = acc[r][c][v];
            o = _mm256_fmadd_ps(t[r][c][v], sc, o);
            o = _mm256_fmadd_ps(bi, _mm256_set1_ps(a.xsum[(size_t)(m0 + r) * groups + g]), o);
          }
        }
    }
    for (int r = 0; r < R; r++)
      for (int c = 0; c < CB; c++)
        for (int v = 0; v < VN; v++) out[r][c][V0 + v] = acc[r][c][v];
  }
};

}  // namespace

void quantize_avx2(const float* x, int M, int K, int bits, int8_t* xq, float* xd) {
  // packs_epi32 / packs_epi16 interleave 128-bit lanes: this puts the 8
  // dwords of 4 values each back in order.
  const __m256i dword_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i nibble_order = q8_nibble_order();
  const __m256 sign = _mm256_set1_ps(-0.f);
  for (int m = 0; m < M; m++)
    for (int b = 0; b < K / 32; b++) {
      const float* xb = x + (size_t)m * K + b * 32;
      __m256 v[4], mx = _mm256_setzero_ps();
      for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(xb + 8 * i);
        mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[i]));
      }
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
      const float amax = _mm_cvtss_f32(m4);
      const float inv = amax > 0.f ? 127.f / amax : 0.f;
      xd[(size_t)m * (K / 32) + b] = amax / 127.f;
      // Round to nearest even (the default MXCSR mode), as std::nearbyint.
      __m256i q[4];
      for (int i = 0; i < 4; i++) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(inv)));
      __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
      p = _mm256_permutevar8x32_epi32(p, dword_order);
      if (bits == 4) p = _mm256_shuffle_epi8(p, nibble_order);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + (size_t)m * K + b * 32), p);
    }
}

void q8_avx2(const Args& a, int cb0, int cb1) { Tiles<Q8Avx2>::run(a, cb0, cb1); }

}  // namespace specd_mlx::qmm
