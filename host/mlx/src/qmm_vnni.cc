// The quantized matmul with 8-bit activations (qmm.h, `Args::xq`), on
// AVX-512 VNNI: `vpdpbusd` multiplies the weights' unsigned 4- or 8-bit
// values by the activations' signed bytes and adds four products per lane
// into an int32, exactly. Compiled with AVX-512 F/BW/VNNI enabled; called
// only when the CPU has them.
//
// For output (row m, column n) the float operations are, in this order:
//   per group g:  t = 0
//                 per 32-value block b of g, in order (isum exact):
//                   t = fma(float(isum[m, n, b]), xd[m, b], t)
//                 acc = fma(t, scale[n, g], acc)
//                 acc = fma(bias[n, g], xsum[m, g], acc)
//   y = acc (+ r[m, n])
// whatever tile computes it, so results are batch-invariant and equal to
// the scalar reference (kernels_qmm.cc `qmm_q8_scalar`). Only explicit fmas:
// a separate multiply and add may or may not be contracted into one,
// depending on the tile.
#include <immintrin.h>

#include <algorithm>

#include "qmm.h"
#include "qmm_avx2.h"
#include "qmm_tiles.h"

namespace specd_mlx::qmm {
namespace {

constexpr int W = 16;  // lanes = output columns of one block

struct Vnni {
  // 8 output vectors per tile (rows x column blocks), as the float kernel:
  // 8 int32 and 8 float accumulators leave room for the operands.
  static constexpr int kOutputs = 8, NV = 1;
  // Rows past the 8-row tiles run as one tile (qmm_tiles.h).
  static constexpr bool kOneTail = true;

  template <int BITS, bool F32S, int R, int CB>
  static void tile(const Args& a, int cb0, int m0) {
    if (a.group == 32) return tile_g32<BITS, F32S, R, CB>(a, cb0, m0);
    constexpr int per = 32 / BITS;  // values per word
    constexpr int wpb = 32 / per;   // words per 32-value block
    const int groups = a.K / a.group, bpg = a.group / 32, dpg = a.group / per,
              blocks = a.K / 32;
    const int gw = group_words(a.group, BITS | (F32S ? kScaleF32 : 0));
    const __m512i nib = _mm512_set1_epi32(0x0F0F0F0F);
    __m512 acc[R][CB] = {};
    for (int g = 0; g < groups; g++) {
      const uint32_t* base[CB];
      group_words_at(a, cb0, groups, g, gw, base);
      __m512 t[R][CB];
      for (int r = 0; r < R; r++)
        for (int c = 0; c < CB; c++) t[r][c] = _mm512_setzero_ps();
      for (int bk = 0; bk < bpg; bk++) {
        const int blk = g * bpg + bk;
        // Row r's bytes of this block as 32-bit words (qmm.h's x order).
        const int32_t* xw[R];
        for (int r = 0; r < R; r++)
          xw[r] = reinterpret_cast<const int32_t*>(a.xq + (size_t)(m0 + r) * a.K + blk * 32);
        __m512i s[R][CB];
        for (int r = 0; r < R; r++)
          for (int c = 0; c < CB; c++) s[r][c] = _mm512_setzero_si512();
  #pragma GCC unroll 8
        for (int d = 0; d < wpb; d++) {
  #pragma GCC unroll 8
          for (int c = 0; c < CB; c++) {
            __m512i wv = _mm512_loadu_si512(base[c] + (bk * wpb + d) * kLanes);
            if constexpr (BITS == 4) {
              __m512i lo = _mm512_and_si512(wv, nib);
              __m512i hi = _mm512_and_si512(_mm512_srli_epi32(wv, 4), nib);
  #pragma GCC unroll 8
              for (int r = 0; r < R; r++) {
                s[r][c] = _mm512_dpbusd_epi32(s[r][c], lo, _mm512_set1_epi32(xw[r][2 * d]));
                s[r][c] = _mm512_dpbusd_epi32(s[r][c], hi, _mm512_set1_epi32(xw[r][2 * d + 1]));
              }
            } else {
  #pragma GCC unroll 8
              for (int r = 0; r < R; r++)
                s[r][c] = _mm512_dpbusd_epi32(s[r][c], wv, _mm512_set1_epi32(xw[r][d]));
            }
          }
        }
        for (int r = 0; r < R; r++) {
          __m512 xd = _mm512_set1_ps(a.xd[(size_t)(m0 + r) * blocks + blk]);
          for (int c = 0; c < CB; c++)
            t[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[r][c]), xd, t[r][c]);
        }
      }
      for (int c = 0; c < CB; c++) {
        __m512 sc, bi;
        group_scales<F32S>(base[c] + dpg * kLanes, sc, bi);
        for (int r = 0; r < R; r++) {
          acc[r][c] = _mm512_fmadd_ps(t[r][c], sc, acc[r][c]);
          acc[r][c] = _mm512_fmadd_ps(bi, _mm512_set1_ps(a.xsum[(size_t)(m0 + r) * groups + g]),
                                      acc[r][c]);
        }
      }
    }
    store(a, acc, cb0, m0);
  }

  // Where group g's words start in each of the tile's column blocks (its
  // values, then its scales), prefetched ahead.
  template <int CB>
  static void group_words_at(const Args& a, int cb0, int groups, int g, int gw,
                             const uint32_t* (&base)[CB]) {
    for (int c = 0; c < CB; c++) base[c] = a.w + ((size_t)(cb0 + c) * groups + g) * gw;
    prefetch_ahead(base, gw);
  }

  // A column block's scales and biases of one group (they follow its
  // value words): float32, or float16 widened.
  template <bool F32S>
  static void group_scales(const uint32_t* at, __m512& sc, __m512& bi) {
    if constexpr (F32S) {
      const float* sf = reinterpret_cast<const float*>(at);
      sc = _mm512_loadu_ps(sf), bi = _mm512_loadu_ps(sf + kLanes);
    } else {
      const __m256i* sb = reinterpret_cast<const __m256i*>(at);
      sc = _mm512_cvtph_ps(_mm256_loadu_si256(sb));
      bi = _mm512_cvtph_ps(_mm256_loadu_si256(sb + 1));
    }
  }

  // y (+ r) from a tile's accumulators.
  template <int R, int CB>
  static void store(const Args& a, const __m512 (&acc)[R][CB], int cb0, int m0) {
    for (int r = 0; r < R; r++)
      for (int c = 0; c < CB; c++) {
        int n = (cb0 + c) * kLanes;
        if (n >= a.N) continue;
        size_t at = (size_t)(m0 + r) * a.N + n;
        int len = std::min(W, a.N - n);
        __mmask16 k = len == W ? __mmask16(0xffff) : __mmask16((1u << len) - 1);
        __m512 out = acc[r][c];
        if (a.r) out = _mm512_add_ps(out, _mm512_maskz_loadu_ps(k, a.r + at));
        _mm512_mask_storeu_ps(a.y + at, k, out);
      }
  }

  // Groups of one 32-value block (GGUF's Q4_0 / Q4_1, the default model,
  // and Q8_0), the same operations as `tile`: each output's products go to
  // two int32 chains (4-bit: low and high nibbles; 8-bit: even and odd
  // words), added before the conversion (integer sums are exact in any
  // order), so a block's 8 dependent vpdpbusd become two chains of 4 and
  // the tile's 8 outputs keep 16 of them in flight; with one block a
  // group, no running t (t = fma(isum, xd, 0) as `tile` computes it from
  // t = 0).
  template <int BITS, bool F32S, int R, int CB>
  static void tile_g32(const Args& a, int cb0, int m0) {
    constexpr int wpb = BITS;  // words per 32-value block
    const int groups = a.K / 32;
    const int gw = group_words(32, BITS | (F32S ? kScaleF32 : 0));
    const __m512i nib = _mm512_set1_epi32(0x0F0F0F0F);
    const __m512 zero = _mm512_setzero_ps();
    __m512 acc[R][CB] = {};
    for (int g = 0; g < groups; g++) {
      const uint32_t* base[CB];
      group_words_at(a, cb0, groups, g, gw, base);
      const int32_t* xw[R];
      for (int r = 0; r < R; r++)
        xw[r] = reinterpret_cast<const int32_t*>(a.xq + (size_t)(m0 + r) * a.K + g * 32);
      __m512i sl[R][CB], sh[R][CB];
      for (int r = 0; r < R; r++)
        for (int c = 0; c < CB; c++) sl[r][c] = sh[r][c] = _mm512_setzero_si512();
  #pragma GCC unroll 4
      for (int d = 0; d < 4; d++) {
  #pragma GCC unroll 8
        for (int c = 0; c < CB; c++) {
          __m512i lo, hi;
          if constexpr (BITS == 4) {
            __m512i wv = _mm512_loadu_si512(base[c] + d * kLanes);
            lo = _mm512_and_si512(wv, nib);
            hi = _mm512_and_si512(_mm512_srli_epi32(wv, 4), nib);
          } else {
            lo = _mm512_loadu_si512(base[c] + 2 * d * kLanes);
            hi = _mm512_loadu_si512(base[c] + (2 * d + 1) * kLanes);
          }
  #pragma GCC unroll 8
          for (int r = 0; r < R; r++) {
            sl[r][c] = _mm512_dpbusd_epi32(sl[r][c], lo, _mm512_set1_epi32(xw[r][2 * d]));
            sh[r][c] = _mm512_dpbusd_epi32(sh[r][c], hi, _mm512_set1_epi32(xw[r][2 * d + 1]));
          }
        }
      }
      for (int c = 0; c < CB; c++) {
        __m512 sc, bi;
        group_scales<F32S>(base[c] + wpb * kLanes, sc, bi);
        for (int r = 0; r < R; r++) {
          __m512 xd = _mm512_set1_ps(a.xd[(size_t)(m0 + r) * groups + g]);
          __m512 t = _mm512_fmadd_ps(
              _mm512_cvtepi32_ps(_mm512_add_epi32(sl[r][c], sh[r][c])), xd, zero);
          acc[r][c] = _mm512_fmadd_ps(t, sc, acc[r][c]);
          acc[r][c] = _mm512_fmadd_ps(bi, _mm512_set1_ps(a.xsum[(size_t)(m0 + r) * groups + g]),
                                      acc[r][c]);
        }
      }
    }
    store(a, acc, cb0, m0);
  }

};

// Groups of 32 (tile_g32): one column block a tile, whatever its rows (R
// outputs). A block's weights are one stream, and a tile of fewer rows took
// 8 / R blocks side by side (2 rows: 4 streams) for independent chains. But
// tile_g32 keeps two vpdpbusd chains an output, and on a 2-core Zen 4 the
// extra streams cost more than the chains gave: `specd --weights int8
// profile --rows R`, light step, median of 6 runs alternated, 1 / 2 / 3 / 4
// rows 4.92 / 5.34 / 6.45 / 6.36 ms -> 4.44 / 4.30 / 4.68 / 5.27 ms (6 rows,
// one block before too: 6.26 / 6.29); `bench decode` 177 -> 208 tok/s.
// Other groups keep `tile`'s one chain an output, so they keep 8 / R blocks.
struct VnniG32 : Vnni {
  template <int BITS, int R>
  static constexpr int outputs() {
    return R;
  }
};

}  // namespace

void quantize_vnni(const float* x, int M, int K, int bits, int8_t* xq, float* xd) {
  const __m256i nibble_order = q8_nibble_order();
  for (int m = 0; m < M; m++)
    for (int b = 0; b < K / 32; b++) {
      const float* xb = x + (size_t)m * K + b * 32;
      __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
      float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
      const float inv = amax > 0.f ? 127.f / amax : 0.f;
      xd[(size_t)m * (K / 32) + b] = amax / 127.f;
      // Round to nearest even (the default MXCSR mode), as std::nearbyint.
      __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(inv)));
      __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(inv)));
      __m256i q = _mm256_set_m128i(_mm512_cvtepi32_epi8(q1), _mm512_cvtepi32_epi8(q0));
      if (bits == 4) q = _mm256_shuffle_epi8(q, nibble_order);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + (size_t)m * K + b * 32), q);
    }
}

void vnni(const Args& a, int cb0, int cb1) {
  if (a.group == 32)
    Tiles<VnniG32>::run(a, cb0, cb1);
  else
    Tiles<Vnni>::run(a, cb0, cb1);
}

}  // namespace specd_mlx::qmm
