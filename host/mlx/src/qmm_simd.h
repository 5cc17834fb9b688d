// The quantized matmul body over packed weights (qmm.h), generic over a SIMD
// width (included by qmm_avx2.cc and qmm_avx512.cc with their own `Isa`
// traits). Lanes are output columns; x is broadcast.
//
// For output (row m, column n) the float operations are, in this order:
//   per group g: t0 = t1 = 0
//                for each word d, value j: t_(d % 2) = fma(x[m, k], q[n, k], t_(d % 2))
//                acc = fma(t0 + t1, scale[n, g], acc)
//                acc = fma(bias[n, g], xsum[m, g], acc)
//   y = acc (+ r[m, n], the residual, when given)
// whatever tile (rows x column blocks) it is computed in: tiles only decide
// which independent chains run side by side, so results are batch-invariant
// (and equal to the scalar reference in kernels.cc, which does the same).
#pragma once
#include <algorithm>
#include <cstdint>

#include "qmm.h"

namespace specd_mlx::qmm {

template <class I>
struct Kernel {
  using V = typename I::V;
  using Vi = typename I::Vi;
  static constexpr int W = I::W;
  static constexpr int NV = kLanes / W;  // vectors per column block

  template <int BITS, int R, int CB>
  static void tile(const Args& a, int cb0, int m0) {
    constexpr int per = 32 / BITS;
    const int groups = a.K / a.group, dpg = a.group / per, gw = group_words(a.group, BITS);
    V acc[R][CB][NV];
    for (int r = 0; r < R; r++)
      for (int c = 0; c < CB; c++)
        for (int v = 0; v < NV; v++) acc[r][c][v] = I::zero();
    for (int g = 0; g < groups; g++) {
      V t[2][R][CB][NV];
      for (int h = 0; h < 2; h++)
        for (int r = 0; r < R; r++)
          for (int c = 0; c < CB; c++)
            for (int v = 0; v < NV; v++) t[h][r][c][v] = I::zero();
      const uint32_t* base[CB];
      for (int c = 0; c < CB; c++) base[c] = a.w + ((size_t)(cb0 + c) * groups + g) * gw;
      for (int d = 0; d < dpg; d++) {
        const float* xk = a.x + (size_t)m0 * a.K + g * a.group + d * per;
        for (int c = 0; c < CB; c++)
          for (int v = 0; v < NV; v++) {
            Vi wv = I::loadw(base[c] + d * kLanes + v * W);
#pragma GCC unroll 8
            for (int j = 0; j < per; j++) {
              V q = I::template unpack<BITS>(wv, j);
              for (int r = 0; r < R; r++)
                t[d & 1][r][c][v] = I::fma(I::set1(xk[(size_t)r * a.K + j]), q, t[d & 1][r][c][v]);
            }
          }
      }
      for (int c = 0; c < CB; c++) {
        const uint16_t* sb = reinterpret_cast<const uint16_t*>(base[c] + dpg * kLanes);
        for (int v = 0; v < NV; v++) {
          V s = I::cvtph(sb + v * W), b = I::cvtph(sb + kLanes + v * W);
          for (int r = 0; r < R; r++) {
            V& o = acc[r][c][v];
            o = I::fma(I::add(t[0][r][c][v], t[1][r][c][v]), s, o);
            o = I::fma(b, I::set1(a.xsum[(size_t)(m0 + r) * groups + g]), o);
          }
        }
      }
    }
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

  // Every row of column blocks [cb, cb + CB): pairs of rows, then the odd one.
  template <int BITS, int CB>
  static void rows(const Args& a, int cb) {
    int m = 0;
    for (; m + 2 <= a.M; m += 2) tile<BITS, 2, CB>(a, cb, m);
    if (m < a.M) tile<BITS, 1, CB>(a, cb, m);
  }

  template <int BITS>
  static void run_bits(const Args& a, int cb0, int cb1) {
    int cb = cb0;
    if (a.M == 1) {
      // One row leaves each chain latency-bound: more column blocks side by side.
      for (; cb + I::kSoloBlocks <= cb1; cb += I::kSoloBlocks) tile<BITS, 1, I::kSoloBlocks>(a, cb, 0);
      for (; cb < cb1; cb++) tile<BITS, 1, 1>(a, cb, 0);
      return;
    }
    for (; cb + I::kPairBlocks <= cb1; cb += I::kPairBlocks) rows<BITS, I::kPairBlocks>(a, cb);
    for (; cb < cb1; cb++) rows<BITS, 1>(a, cb);
  }

  static void run(const Args& a, int cb0, int cb1) {
    if (a.bits == 4)
      run_bits<4>(a, cb0, cb1);
    else
      run_bits<8>(a, cb0, cb1);
  }
};

}  // namespace specd_mlx::qmm
