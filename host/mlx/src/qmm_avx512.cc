// AVX-512 (F + BW) with F16C: 16 lanes. Compiled with those instructions
// enabled; called only when the CPU has them.
#include <immintrin.h>

#include "qmm_simd.h"

namespace specd_mlx::qmm {
namespace {

struct Avx512 {
  using V = __m512;
  using Vi = __m512i;
  static constexpr int W = 16;
  // Tile widths, in 16-column blocks, that keep every chain in registers.
  static constexpr int kSoloBlocks = 4, kPairBlocks = 2;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float v) { return _mm512_set1_ps(v); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static Vi loadw(const uint32_t* p) { return _mm512_loadu_si512(p); }
  static V cvtph(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // Value j of every lane's word, as float.
  template <int BITS>
  static V unpack(Vi w, int j) {
    if constexpr (BITS == 4) {
      // A 16-entry table lookup on the low 4 bits of each lane: the shift
      // alone isolates the nibble, no mask or int->float conversion.
      const V table = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
      return _mm512_permutexvar_ps(_mm512_srli_epi32(w, 4 * j), table);
    } else {
      // Byte j of each lane moved to its low byte, the rest zeroed.
      const Vi ctl = _mm512_add_epi32(_mm512_set1_epi32(int(0x80808000u | unsigned(j))),
                                      _mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12, 0,
                                                        4, 8, 12));
      return _mm512_cvtepi32_ps(_mm512_shuffle_epi8(w, ctl));
    }
  }
  static void store(float* y, V v, int n) {
    if (n == W)
      _mm512_storeu_ps(y, v);
    else
      _mm512_mask_storeu_ps(y, __mmask16((1u << n) - 1), v);
  }
};

}  // namespace

void avx512(const Args& a, int cb0, int cb1) { Kernel<Avx512>::run(a, cb0, cb1); }

}  // namespace specd_mlx::qmm
