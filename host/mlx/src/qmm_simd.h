// The quantized matmul body, generic over a SIMD width (included by
// qmm_avx2.cc and qmm_avx512.cc with their own `Isa` traits).
//
// For output (row m, column n) the float operations are, in this order:
//   per group g: t = 0; t = fma(x, q, t) over the group's vectors;
//                acc = fma(t, scale[n, g], acc)
//   then y = hsum(acc) + dot(bias[n, :], xsum[m, :])
// whatever tile (rows x columns) it is computed in. Tiles only decide which
// independent chains run side by side, so results are batch-invariant.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "qmm.h"

namespace specd_mlx::qmm {

template <class I>
struct Kernel {
  using V = typename I::V;
  static constexpr int W = I::W;
  static constexpr int B = 32 / W;  // vectors per 32-block

  // sum_g b[g] * xs[g] in a fixed order.
  static float bias_dot(const float* b, const float* xs, int groups) {
    V acc = I::zero();
    int g = 0;
    for (; g + W <= groups; g += W) acc = I::fma(I::load(b + g), I::load(xs + g), acc);
    float r = I::hsum(acc);
    for (; g < groups; g++) r += b[g] * xs[g];
    return r;
  }

  template <int R, int NC>
  static void tile(const Args& a, int n0, int m0, const float* sf, const float* bf) {
    const int groups = a.K / a.group, row_bytes = a.K * a.bits / 8;
    const uint8_t* w = reinterpret_cast<const uint8_t*>(a.w);
    V acc[R][NC];
    for (int r = 0; r < R; r++)
      for (int c = 0; c < NC; c++) acc[r][c] = I::zero();
    for (int g = 0; g < groups; g++) {
      V t[R][NC];
      for (int r = 0; r < R; r++)
        for (int c = 0; c < NC; c++) t[r][c] = I::zero();
      for (int blk = g * a.group; blk < (g + 1) * a.group; blk += 32) {
        for (int c = 0; c < NC; c++) {
          V q[B];
          I::unpack(w + (size_t)(n0 + c) * row_bytes + blk * a.bits / 8, a.bits, q);
          for (int r = 0; r < R; r++) {
            const float* x = a.x + (size_t)(m0 + r) * a.K + blk;
            for (int j = 0; j < B; j++) t[r][c] = I::fma(I::load(x + j * W), q[j], t[r][c]);
          }
        }
      }
      for (int c = 0; c < NC; c++) {
        V s = I::set1(sf[c * groups + g]);
        for (int r = 0; r < R; r++) acc[r][c] = I::fma(t[r][c], s, acc[r][c]);
      }
    }
    for (int r = 0; r < R; r++)
      for (int c = 0; c < NC; c++)
        a.y[(size_t)(m0 + r) * a.N + n0 + c] =
            I::hsum(acc[r][c]) +
            bias_dot(bf + c * groups, a.xsum + (size_t)(m0 + r) * groups, groups);
  }

  // Columns [n, n + NC), all rows: rows four at a time, then the rest.
  template <int NC>
  static void columns(const Args& a, int n, const float* sf, const float* bf) {
    int m = 0;
    if constexpr (NC == 1) {
      // 16-lane registers come 32 to a core: 8 rows share one unpack there.
      if constexpr (W == 16)
        for (; m + 8 <= a.M; m += 8) tile<8, 1>(a, n, m, sf, bf);
      for (; m + 4 <= a.M; m += 4) tile<4, 1>(a, n, m, sf, bf);
      switch (a.M - m) {
        case 3: tile<3, 1>(a, n, m, sf, bf); break;
        case 2: tile<2, 1>(a, n, m, sf, bf); break;
        case 1: tile<1, 1>(a, n, m, sf, bf); break;
        default: break;
      }
    } else {
      for (; m + 2 <= a.M; m += 2) tile<2, NC>(a, n, m, sf, bf);
      if (m < a.M) tile<1, NC>(a, n, m, sf, bf);
    }
  }

  static void run(const Args& a, int n0, int n1) {
    const int groups = a.K / a.group;
    // Scales and biases of up to 4 columns as float32, reused across calls.
    thread_local std::vector<float> sf, bf;
    sf.resize(4 * groups);
    bf.resize(4 * groups);
    auto convert = [&](int n, int nc) {
      for (int c = 0; c < nc; c++) {
        I::f16_to_f32(a.s + (size_t)(n + c) * groups, sf.data() + c * groups, groups);
        I::f16_to_f32(a.b + (size_t)(n + c) * groups, bf.data() + c * groups, groups);
      }
    };
    int n = n0;
    // Few rows leave the FMA chains of one column latency-bound: run four
    // columns side by side there.
    if (a.M <= 3) {
      for (; n + 4 <= n1; n += 4) {
        convert(n, 4);
        columns<4>(a, n, sf.data(), bf.data());
      }
    }
    for (; n < n1; n++) {
      convert(n, 1);
      columns<1>(a, n, sf.data(), bf.data());
    }
  }
};

}  // namespace specd_mlx::qmm
