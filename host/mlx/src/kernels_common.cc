// What several of the kernels' sections share (kernels_common.h).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "specd-mlx/src/kernels_common.h"
#include "specd-mlx/src/qmm.h"

namespace specd_mlx {

namespace {

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

}  // namespace

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

}  // namespace specd_mlx
