// How a quantized-matmul kernel walks y (included by qmm_simd.h and
// qmm_vnni.cc): a few column blocks at a time, all rows, so the blocks'
// weights stay in cache while every row tile passes over them; tiles as wide
// as the registers allow, then narrower ones. `K` gives kOutputs (output
// vectors per tile), NV (vectors per column block) and
// tile<BITS, F32S, R, CB>(args, first block, first row). Tiles only decide
// which independent chains run side by side, never a result.
#pragma once
#include <algorithm>
#include <cstdint>

#include "qmm.h"

// Groups a tile prefetches ahead of its reads (CXXFLAGS=-DSPECD_QMM_PREFETCH=N
// builds another distance to measure; 0 turns it off).
#ifndef SPECD_QMM_PREFETCH
#define SPECD_QMM_PREFETCH 8
#endif

namespace specd_mlx::qmm {

// Called once per group with the CB blocks' words of that group. Each
// block's words are one contiguous stream (groups in order, then the next
// block's), and the hardware prefetcher does not run far enough ahead of
// it: without this the loads wait on memory and the FMAs on the loads
// (measured on Zen 5, qmm_bench's cold column). Past a block's end this
// fetches the next block's words, which the next tile reads; past the
// matrix's end a prefetch is dropped.
template <int CB>
inline void prefetch_ahead(const uint32_t* const (&base)[CB], int gw) {
  for (int c = 0; c < CB; c++) {
    const char* ahead = reinterpret_cast<const char*>(base[c] + (size_t)SPECD_QMM_PREFETCH * gw);
    for (int b = 0; b < gw * 4; b += 64) __builtin_prefetch(ahead + b, 0, 3);
  }
}

// Output vectors of a tile of R rows: K::outputs<BITS, R>() where K
// gives it, else K::kOutputs (never more columns than kOutputs / NV).
template <class K, int BITS, int R>
constexpr int tile_outputs() {
  if constexpr (requires { K::template outputs<BITS, R>(); })
    return K::template outputs<BITS, R>();
  else
    return K::kOutputs;
}

template <class K>
struct Tiles {
  template <int BITS, bool F32S, int R, int CB = tile_outputs<K, BITS, R>() / (R * K::NV)>
  static void row_tile(const Args& a, int cb, int cb1, int m) {
    for (; cb + CB <= cb1; cb += CB) K::template tile<BITS, F32S, R, CB>(a, cb, m);
    if constexpr (CB > 1) row_tile<BITS, F32S, R, CB / 2>(a, cb, cb1, m);
  }

  // Whether the kernel runs a tail of R rows as one tile: the AVX2 kernels
  // (2 vectors a column block) where R rows fit their outputs. The AVX-512
  // ones were not measured with such tails.
  template <int BITS, int R>
  static constexpr bool tail_tile() {
    return K::NV == 2 && tile_outputs<K, BITS, R>() / (R * K::NV) >= 1;
  }

  // Whether the rows left after the 8-row tiles (1-7) run as one tile of
  // that many rows (K::kOneTail: the VNNI and AVX-512 float kernels, whose
  // tiles of 1-8 rows fit their 32 registers). A verify of k drafts is 1 + k rows, and
  // a batched step 8 + a few: 2 + 1 or 4 + 2 + 1 tiles unpack and stream
  // every weight two or three times.
  static constexpr bool one_tail() { return requires { requires K::kOneTail; }; }

  // The tile of exactly `left` (<= R) rows.
  template <int BITS, bool F32S, int R>
  static void tail(const Args& a, int c0, int c1, int m, int left) {
    if (left == R)
      row_tile<BITS, F32S, R>(a, c0, c1, m);
    else if constexpr (R > 1)
      tail<BITS, F32S, R - 1>(a, c0, c1, m, left);
  }

  template <int BITS, bool F32S>
  static void run_bits(const Args& a, int cb0, int cb1) {
    constexpr int step = K::kOutputs / K::NV;
    for (int c0 = cb0; c0 < cb1; c0 += step) {
      int c1 = std::min(cb1, c0 + step), m = 0;
      if constexpr (one_tail()) {
        static_assert(step >= 8, "one tail of up to 7 rows after 8-row tiles");
        for (; m + 8 <= a.M; m += 8) row_tile<BITS, F32S, 8>(a, c0, c1, m);
        if (m < a.M) tail<BITS, F32S, 7>(a, c0, c1, m, a.M - m);
        continue;
      }
      if constexpr (step >= 8)
        for (; m + 8 <= a.M; m += 8) row_tile<BITS, F32S, 8>(a, c0, c1, m);
      if constexpr (step >= 4)
        for (; m + 4 <= a.M && !(tail_tile<BITS, 5>() && a.M - m == 5); m += 4)
          row_tile<BITS, F32S, 4>(a, c0, c1, m);
      // Three or five rows left (a verify of 2 or 4 drafts, 7 or 9 rows):
      // one tile, not 2 + 1 or 4 + 1 that unpack every weight twice (a
      // 3-row verify on Zen 3: 14.2-15.1 -> 10.5-11.5 ms, alternated 3
      // times; the 5-row tile is the float kernels', qmm_avx2.h).
      if constexpr (tail_tile<BITS, 3>())
        if (a.M - m == 3) {
          row_tile<BITS, F32S, 3>(a, c0, c1, m);
          m += 3;
        }
      if constexpr (tail_tile<BITS, 5>())
        if (a.M - m == 5) {
          row_tile<BITS, F32S, 5>(a, c0, c1, m);
          m += 5;
        }
      for (; m + 2 <= a.M; m += 2) row_tile<BITS, F32S, 2>(a, c0, c1, m);
      if (m < a.M) row_tile<BITS, F32S, 1>(a, c0, c1, m);
    }
  }

  static void run(const Args& a, int cb0, int cb1) {
    switch (a.bits) {
      case 4: run_bits<4, false>(a, cb0, cb1); break;
      case 8: run_bits<8, false>(a, cb0, cb1); break;
      case 4 | kScaleF32: run_bits<4, true>(a, cb0, cb1); break;
      default: run_bits<8, true>(a, cb0, cb1); break;
    }
  }
};

}  // namespace specd_mlx::qmm
