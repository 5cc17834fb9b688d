// The AVX2 + FMA + F16C traits of the SIMD kernels (qmm_simd.h): 8 lanes.
// Included only by translation units compiled with those instructions
// (qmm_avx2.cc, qmm_q8_avx2.cc, and qmm_vnni.cc for q8_nibble_order).
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace specd_mlx::qmm {

struct Avx2 {
  using V = __m256;
  using Vi = __m256i;
  static constexpr int W = 8;
  // Output vectors per tile: 8 partial sums keep 8 FMA chains in flight
  // (Zen 3 and Skylake: 2 FMAs a cycle, 4 cycles each) and leave registers
  // for the weights and the broadcast x; the group accumulators, touched
  // once a group, may live on the stack. 8 outputs allow 4-row tiles, so
  // each unpacked weight vector feeds 4 FMAs: 1.34x the old 2-row tiles of
  // 4 outputs with 2 partial sums each (measured on a 2-core Zen 3).
  static constexpr int kOutputs = 8;
  // A tile of 5 rows (a verify of 4 drafts, a batched step's last rows)
  // holds 10: each unpacked weight vector then feeds all 5, where 4 + 1
  // unpacked it twice (qmm_bench, 2 threads, fastest call, alternated 3
  // times on Zen 3: 1536x576 85-93 -> 72-79 us, 8-bit head 2.8-3.0 ->
  // 1.9-2.5 ms). 6 rows in 12 spill (1536x576 91-107 -> 136-141 us):
  // they stay 4 + 2.
  template <int BITS, int R>
  static constexpr int outputs() {
    return R == 5 ? 10 : kOutputs;
  }
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float v) { return _mm256_set1_ps(v); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static float hsum(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
  static Vi loadw(const uint32_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  static V cvtph(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  // Value j of every lane's word, as float.
  template <int BITS>
  static V unpack(Vi w, int j) {
    if constexpr (BITS == 4) {
      return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(w, 4 * j), _mm256_set1_epi32(15)));
    } else {
      const Vi ctl = _mm256_add_epi32(_mm256_set1_epi32(int(0x80808000u | unsigned(j))),
                                      _mm256_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12));
      return _mm256_cvtepi32_ps(_mm256_shuffle_epi8(w, ctl));
    }
  }
  static V load_n(const float* p, int n) {
    if (n == W) return _mm256_loadu_ps(p);
    alignas(32) float t[8] = {};
    for (int i = 0; i < n; i++) t[i] = p[i];
    return _mm256_load_ps(t);
  }
  static void store(float* y, V v, int n) {
    if (n == W) {
      _mm256_storeu_ps(y, v);
      return;
    }
    alignas(32) float t[8];
    _mm256_store_ps(t, v);
    for (int i = 0; i < n; i++) y[i] = t[i];
  }
};

// 8-bit activations for 4-bit weights (qmm.h): within each 8-byte word the
// even values' bytes, then the odd ones'. `shuffle_epi8` stays inside
// 16-byte lanes, which hold 2 words. Shared by quantize_avx2 and
// quantize_vnni.
inline __m256i q8_nibble_order() {
  return _mm256_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15, 0, 2, 4, 6, 1, 3,
                          5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
}

// The traits for x given pre-scaled (`Args::x_nibble_scaled`): 4-bit values
// 0..6 stay in place, q * 16^j, one AND instead of a shift and an AND (1.2x
// at one row); value 7 is the shift alone (15 * 16^7 is past int32, so its
// x is not scaled).
// Only 4-bit tiles are built with them (`avx2` in qmm_avx2.cc).
struct Avx2ScaledNibbles : Avx2 {
  template <int BITS>
  static V unpack(Vi w, int j) {
    static_assert(BITS == 4, "pre-scaled x is for 4-bit values only");
    if (j == 7) return _mm256_cvtepi32_ps(_mm256_srli_epi32(w, 28));
    return _mm256_cvtepi32_ps(_mm256_and_si256(w, _mm256_set1_epi32(15 << (4 * j))));
  }
};

}  // namespace specd_mlx::qmm
