// The quantized matmul's arguments and its per-ISA entry points. The SIMD
// variants live in their own translation units (qmm_avx2.cc, qmm_avx512.cc),
// each compiled with its instruction set enabled, and are only called after
// a run-time CPU check.
#pragma once
#include <cstdint>

namespace specd_mlx::qmm {

struct Args {
  const float* x;     // prepared activations [M, K] (see kernels.cc)
  const float* xsum;  // per-group sums of x, [M, K / group]
  const uint32_t* w;  // [N, K * bits / 32]
  const uint16_t* s;  // float16 scales [N, K / group]
  const uint16_t* b;  // float16 biases [N, K / group]
  float* y;           // [M, N]
  int M, N, K, group, bits;
};

// Columns [n0, n1) of y, every row.
void avx2(const Args& a, int n0, int n1);
void avx512(const Args& a, int n0, int n1);

// Attention helpers: a fixed-order dot product, and y += a * x.
float dot_avx2(const float* a, const float* b, int n);
void axpy_avx2(float a, const float* x, float* y, int n);
// p[j] = exp(p[j] - shift) for j < n; returns their sum (fixed order).
float exp_sum_avx2(float* p, int n, float shift);

}  // namespace specd_mlx::qmm
