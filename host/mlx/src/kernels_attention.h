// The attention ops (kernels_attention.cc): causal attention of one
// sequence over its keys, and of a step's sequences over their own caches
// (continuous batching), and the cache buffers the latter write in place.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "mlx/array.h"
#include "specd-mlx/src/kernels_common.h"

namespace specd_mlx {

struct AttnArgs {
  const float* q;  // strided [H, T, D]
  const float* k;  // strided [Hkv, L, D]
  const float* v;  // strided [Hkv, L, Dv]
  float* o;        // [T, H, Dv] contiguous (heads last: a free reshape to [T, H * Dv])
  int H, Hkv, T, L, D, Dv;
  int64_t q_head, q_row, q_col, k_head, k_row, k_col, v_head, v_row, v_col;
  float scale;
  bool causal;
  float softcap = 0.f;  // qmm::softcap_scores; 0: none
};

// q, k, v [1, heads, len, dim], any strides; output [1, T, H, Dv].
struct AttnBody {
  float scale;
  bool causal;
  float softcap = 0.f;  // soft-capped scores (Gemma 2); 0: none
  AttnArgs prepare(const std::vector<mx::array>& in, mx::array& out) const;
  void run(const std::vector<mx::array>&, mx::array&, const AttnArgs& a) const;
  void grouped(const AttnArgs& a) const;
};

struct RaggedSpan {
  int a, n, off;  // first row in y, rows, tokens already cached
};

struct RaggedArgs {
  const float* y;
  int64_t y_row;
  std::vector<float*> k, v;        // per sequence (float32 caches)
  std::vector<uint16_t*> k16, v16;  // per sequence (float16 caches)
  std::vector<int64_t> cap;        // per sequence
  float* o;                        // [T, H, D]
};

struct RaggedAttnBody {
  int H, Hkv, D;
  float scale;
  std::vector<RaggedSpan> seqs;
  // The caches hold f16: rows are rounded as they are written and widened
  // exactly as they are read, so attention is that of a float cache
  // holding the rounded values.
  bool half = false;

  RaggedArgs prepare(const std::vector<mx::array>& in, mx::array& out) const;
  RaggedArgs prepare_caches(const std::vector<mx::array>& in, size_t first, mx::array& out) const;
  void run(const std::vector<mx::array>&, mx::array&, const RaggedArgs& r) const;

  // A 16-bit cache's rows widened to float for the per-head path: sequence
  // s's kv head h at k[s] + h * (off + n) * D.
  struct Widened {
    std::vector<std::vector<float>> k, v;
  };

  bool grouped() const;
  void unit(const RaggedArgs& r, const Widened& w, size_t s, int t0, int t1, int kvh,
            Scratch<float>& scratch) const;
};

// A cache buffer [1, H, cap, D], contiguous: the first `keep` positions of
// `old` (any layout) copied, the rest zero.
struct KvAllocBody {
  int keep;
  bool has_old;
  int prepare(const std::vector<mx::array>&, const mx::array&) const { return 0; }
  void run(const std::vector<mx::array>& in, mx::array& out, int) const;
  template <class T>
  void copy(const T* x, const mx::array& o, T* y, const mx::array& out) const;
};

}  // namespace specd_mlx
