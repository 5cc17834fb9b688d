// AVX2 + FMA + F16C: 8 lanes. Compiled with those instructions enabled;
// called only when the CPU has them.
#include <immintrin.h>

#include <cmath>
#include <vector>

#include "qmm_simd.h"

namespace specd_mlx::qmm {
namespace {

struct Avx2 {
  using V = __m256;
  static constexpr int W = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V set1(float v) { return _mm256_set1_ps(v); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static float hsum(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
  static void f16_to_f32(const uint16_t* src, float* dst, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i,
                       _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
    for (; i < n; i++) dst[i] = _cvtsh_ss(src[i]);
  }
  // A 32-block: 4 bits as low nibbles then high nibbles; 8 bits in order.
  static void unpack(const uint8_t* p, int bits, V* q) {
    if (bits == 4) {
      const __m128i mask = _mm_set1_epi8(15);
      __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      __m128i lo = _mm_and_si128(v, mask), hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
      q[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
      q[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
      q[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
      q[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
    } else {
      for (int j = 0; j < 4; j++)
        q[j] = _mm256_cvtepi32_ps(
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * j))));
    }
  }
};

}  // namespace

void avx2(const Args& a, int n0, int n1) { Kernel<Avx2>::run(a, n0, n1); }

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

void axpy_avx2(float a, const float* x, float* y, int n) {
  __m256 av = _mm256_set1_ps(a);
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; i++) y[i] = std::fma(a, x[i], y[i]);
}

}  // namespace specd_mlx::qmm
