// The block walk of several query rows of one sequence over one kv head's
// keys and values, shared by the AVX2 and AVX-512 attention kernels
// (attn_group_rows_avx2 / _avx512), which differ only in vector width and
// in the per-block work they pass in.
//
// Keys go in blocks whose rows fit L1 (16 KB), and each block serves every
// row and head before the next is read: the rows and heads share one read of
// the cache from L2 or memory, where one (row, head) at a time over all keys
// read it once per row and head. The walk decides only which block is read
// when; per (row, head) the float operations are the callbacks', in key
// order, so a row's bits are those of the row alone. Between blocks a row's
// partial sums rest in its output row, exactly (a float stored and loaded
// back).
#pragma once
#include <algorithm>

#include "qmm.h"

namespace specd_mlx::qmm {

// W: keys per scores call (the vector width in floats).
// keys(g, h, j, scores): scores of keys [j, j + W) for head h.
// tail(g, j, scores): scores of the row's last keys [j, n), fewer than W,
//   every head.
// softmax(g, scores, inv): exp in place, inv[h] = 1 / the head's sum.
// weigh(g, scores, inv, j0, j1): o += p_j v_j for keys [j0, j1), every
//   head (from 0 when j0 == 0), times inv when j1 == n.
template <int W, class Keys, class Tail, class Softmax, class Weigh>
void walk_key_blocks(const AttnGroup* g, int rows, float* scores, Keys keys, Tail tail,
                     Softmax softmax, Weigh weigh) {
  const int kb = std::max(W, 4096 / g[0].D);  // a multiple of W
  float* sc[kAttnMaxRows];
  int n_max = 0;
  for (int r = 0; r < rows; r++) {
    sc[r] = r == 0 ? scores : sc[r - 1] + (size_t)g[r - 1].heads * g[r - 1].n;
    n_max = std::max(n_max, g[r].n);
  }
  for (int j0 = 0; j0 < n_max; j0 += kb)
    for (int r = 0; r < rows; r++) {
      const int j1 = std::min(g[r].n, j0 + kb);
      int j = j0;
      for (; j + W <= j1; j += W)
        for (int h = 0; h < g[r].heads; h++) keys(g[r], h, j, sc[r]);
      if (j < j1) tail(g[r], j, sc[r]);
    }
  float inv[kAttnMaxRows][AttnGroup::kMaxHeads];
  for (int r = 0; r < rows; r++) softmax(g[r], sc[r], inv[r]);
  for (int j0 = 0; j0 < n_max; j0 += kb)
    for (int r = 0; r < rows; r++)
      if (j0 < g[r].n) weigh(g[r], sc[r], inv[r], j0, std::min(g[r].n, j0 + kb));
}

}  // namespace specd_mlx::qmm
