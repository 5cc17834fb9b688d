// The quantized matmul body over packed weights (qmm.h), generic over a SIMD
// width (included by qmm_avx2.cc and qmm_avx512.cc with their own `Isa`
// traits). Lanes are output columns; x is broadcast.
//
// For output (row m, column n) the float operations are, in this order:
//   per group g: t = 0
//                for each word d, value j: t = fma(x[m, k], q[n, k], t)
//                acc = fma(t, scale[n, g], acc)
//                acc = fma(bias[n, g], xsum[m, g], acc)
//   y = acc (+ r[m, n], the residual, when given)
// whatever tile (rows x column blocks) it is computed in, and whichever
// instruction set: tiles only decide which independent chains run side by
// side, so results are batch-invariant and equal to the scalar reference in
// kernels_qmm.cc, which does the same (so AVX-512, AVX2 and scalar machines
// compute the same bits).
#pragma once
#include <algorithm>
#include <cstdint>

#include "qmm.h"
#include "qmm_tiles.h"

namespace specd_mlx::qmm {

template <class I>
struct Kernel {
  using V = typename I::V;
  using Vi = typename I::Vi;
  static constexpr int W = I::W;
  static constexpr int NV = kLanes / W;  // vectors per column block
  static constexpr int kOutputs = I::kOutputs;
  // Rows past the 8-row tiles as one tile (qmm_tiles.h), where I says so.
  static constexpr bool kOneTail = requires { requires I::kOneTail; };
  // Output vectors of a tile of R rows (tile_outputs).
  template <int BITS, int R>
  static constexpr int outputs() {
    return tile_outputs<I, BITS, R>();
  }

  template <int BITS, bool F32S, int R, int CB>
  static void tile(const Args& a, int cb0, int m0) {
    constexpr int per = 32 / BITS;
    const int groups = a.K / a.group, dpg = a.group / per,
              gw = group_words(a.group, BITS | (F32S ? kScaleF32 : 0));
    V acc[R][CB][NV];
    for (int r = 0; r < R; r++)
      for (int c = 0; c < CB; c++)
        for (int v = 0; v < NV; v++) acc[r][c][v] = I::zero();
    for (int g = 0; g < groups; g++) {
      V t[R][CB][NV];
      for (int r = 0; r < R; r++)
        for (int c = 0; c < CB; c++)
          for (int v = 0; v < NV; v++) t[r][c][v] = I::zero();
      const uint32_t* base[CB];
      for (int c = 0; c < CB; c++) base[c] = a.w + ((size_t)(cb0 + c) * groups + g) * gw;
      prefetch_ahead(base, gw);
      for (int d = 0; d < dpg; d++) {
        const float* xk = a.x + (size_t)m0 * a.K + g * a.group + d * per;
        // Value j of every vector before value j + 1 of any: the FMAs that
        // follow one another feed all R x CB x NV chains in turn, not the R
        // of one vector (with R = 4 and 2 vectors on AVX2 that was 4 chains
        // of 4-cycle FMAs for 2 FMA pipes). Each chain still takes its
        // values in order. Fully unrolled, so the partial sums stay in
        // registers; the weight word is re-read from L1 for every value.
#pragma GCC unroll 8
        for (int j = 0; j < per; j++) {
          V xb[R];
#pragma GCC unroll 8
          for (int r = 0; r < R; r++) xb[r] = I::set1(xk[(size_t)r * a.K + j]);
#pragma GCC unroll 8
          for (int c = 0; c < CB; c++)
#pragma GCC unroll 2
            for (int v = 0; v < NV; v++) {
              V q = I::template unpack<BITS>(I::loadw(base[c] + d * kLanes + v * W), j);
#pragma GCC unroll 8
              for (int r = 0; r < R; r++) t[r][c][v] = I::fma(xb[r], q, t[r][c][v]);
            }
        }
      }
      for (int c = 0; c < CB; c++) {
        const uint16_t* sb = reinterpret_cast<const uint16_t*>(base[c] + dpg * kLanes);
        const float* sf = reinterpret_cast<const float*>(base[c] + dpg * kLanes);
        for (int v = 0; v < NV; v++) {
          V s, b;
          if constexpr (F32S) {
            s = I::load_n(sf + v * W, W), b = I::load_n(sf + kLanes + v * W, W);
          } else {
            s = I::cvtph(sb + v * W), b = I::cvtph(sb + kLanes + v * W);
          }
          for (int r = 0; r < R; r++) {
            V& o = acc[r][c][v];
            o = I::fma(t[r][c][v], s, o);
            o = I::fma(b, I::set1(a.xsum[(size_t)(m0 + r) * groups + g]), o);
          }
        }
      }
    }
    store(a, acc, cb0, m0);
  }

  // A tile's outputs into y (plus the residual r, when given); columns past
  // N are dropped. Also the 8-bit-activation kernels' (qmm_q8_avx2.cc).
  template <int R, int CB>
  static void store(const Args& a, const V (&acc)[R][CB][NV], int cb0, int m0) {
    for (int r = 0; r < R; r++)
      for (int c = 0; c < CB; c++)
        for (int v = 0; v < NV; v++) {
          int n = (cb0 + c) * kLanes + v * W;
          if (n >= a.N) continue;
          size_t at = (size_t)(m0 + r) * a.N + n;
          int len = std::min(W, a.N - n);
          V out = acc[r][c][v];
          if (a.r) out = I::add(out, I::load_n(a.r + at, len));
          I::store(a.y + at, out, len);
        }
  }

  static void run(const Args& a, int cb0, int cb1) { Tiles<Kernel>::run(a, cb0, cb1); }
};

}  // namespace specd_mlx::qmm
