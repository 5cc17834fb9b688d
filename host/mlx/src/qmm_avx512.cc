// AVX-512 (F + BW) with F16C: 16 lanes. Compiled with those instructions
// enabled; called only when the CPU has them.
#include <immintrin.h>

#include <vector>

#include "qmm_simd.h"

namespace specd_mlx::qmm {
namespace {

struct Avx512 {
  using V = __m512;
  static constexpr int W = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V set1(float v) { return _mm512_set1_ps(v); }
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
  static void f16_to_f32(const uint16_t* src, float* dst, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16)
      _mm512_storeu_ps(
          dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
    for (; i < n; i++) dst[i] = _cvtsh_ss(src[i]);
  }
  // A 32-block: 4 bits as low nibbles then high nibbles; 8 bits in order.
  static void unpack(const uint8_t* p, int bits, V* q) {
    if (bits == 4) {
      const __m128i mask = _mm_set1_epi8(15);
      __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      q[0] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(v, mask)));
      q[1] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(v, 4), mask)));
    } else {
      const __m128i* v = reinterpret_cast<const __m128i*>(p);
      q[0] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(v)));
      q[1] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(v + 1)));
    }
  }
};

}  // namespace

void avx512(const Args& a, int n0, int n1) { Kernel<Avx512>::run(a, n0, n1); }

}  // namespace specd_mlx::qmm
