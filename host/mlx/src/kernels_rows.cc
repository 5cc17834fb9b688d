// The small row-wise ops (kernels_rows.h).
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "mlx/array.h"
#include "specd-mlx/src/kernels_common.h"
#include "specd-mlx/src/kernels_qmm.h"
#include "specd-mlx/src/kernels_rows.h"
#include "specd-mlx/src/qmm.h"
#include "specd-mlx/src/top2.h"

namespace specd_mlx {

// ---- small row-wise ops --------------------------------------------------------
//
// On CPU, MLX's fast::rms_norm and fast::rope run as their unfused fallbacks
// (5-10 ops each, every op a dispatch). These do each in one op, row by row.

std::vector<int64_t> RmsNormBody::prepare(const std::vector<mx::array>& in,
                                          const mx::array&) const {
  if (!in[1].flags().row_contiguous)
    throw std::runtime_error("rms_norm: the weight must be contiguous");
  return row_offsets(in[0]);
}

void RmsNormBody::run(const std::vector<mx::array>& in, mx::array& out,
                      const std::vector<int64_t>& rows) const {
  const float* x = in[0].data<float>();
  const float* w = in[1].data<float>();
  float* y = out.data<float>();
  int D = in[0].shape(-1);
  int64_t col = in[0].strides().back();
  for (size_t r = 0; r < rows.size(); r++) rms_norm_row(x + rows[r], col, w, D, eps, y + r * D);
}

std::vector<int64_t> RopeBody::prepare(const std::vector<mx::array>&, const mx::array&) const {
  return {};
}

void RopeBody::run(const std::vector<mx::array>& in, mx::array& out,
                   const std::vector<int64_t>&) const {
  const auto& a = in[0];
  int B = a.shape(0), T = a.shape(1), H = a.shape(2), D = a.shape(3);
  auto st = a.strides();
  const float* x = a.data<float>();
  float* y = out.data<float>();
  Rope rope(dims, traditional, base, scale, factors);
  for (int t = 0; t < T; t++) {
    rope.at(offset + t);
    for (int b = 0; b < B; b++)
      for (int h = 0; h < H; h++)
        rope.row(x + b * st[0] + t * st[1] + h * st[2], st[3],
                 y + (((size_t)b * H + h) * T + t) * D, D);
  }
}

SwigluBody::Rows SwigluBody::prepare(const std::vector<mx::array>& in, const mx::array&) const {
  return {row_offsets(in[0]), row_offsets(in[1])};
}

void SwigluBody::run(const std::vector<mx::array>& in, mx::array& out, const Rows& rows) const {
  const float* g = in[0].data<float>();
  const float* u = in[1].data<float>();
  float* y = out.data<float>();
  int D = out.shape(-1);
  int64_t gc = in[0].strides().back(), uc = in[1].strides().back();
  for (size_t r = 0; r < rows.g.size(); r++)
    glu_row(g + rows.g[r], u + rows.u[r], gc, uc, y + r * D, D, gelu);
}

// ---- argmax and runner-up per row ------------------------------------------------
//
// What a greedy round reads of each verified row (top2.h): one pass over
// the row instead of MLX's argmax, max and masked-max ops (each a pass). Rows
// are cut into pieces of kTop2Piece values, spread over the pool, and each
// row's pieces merged in order.

namespace {

constexpr int kTop2Piece = 16384;

Top2 top2_scan(const float* x, int64_t col, int n, int base) {
#if defined(SPECD_X86_KERNELS)
  if (col == 1 && isa() != Isa::Scalar) return qmm::top2_avx2(x, n, base);
#endif
  Top2 t;
  for (int j = 0; j < n; j++) t.push(x[j * col], base + j);
  return t;
}

}  // namespace

Top2Body::Rows Top2Body::prepare(const std::vector<mx::array>& in, const mx::array&) const {
  Rows r;
  for (const auto& a : in)
    for (int64_t off : row_offsets(a)) {
      r.at.push_back(a.data<float>() + off);
      r.col.push_back(a.strides().back());
    }
  return r;
}

void Top2Body::run(const std::vector<mx::array>& in, mx::array& out, const Rows& rows) const {
  const int V = in[0].shape(-1);
  const int pieces = (V + kTop2Piece - 1) / kTop2Piece, R = rows.at.size();
  const int units = R * pieces;
  std::vector<Top2> part(units);
  // A pass runs at ~15 us per 49152 values on one core (AVX2). Below 2^18
  // values (a 5-row verify of a 49K vocabulary) the call stays on one
  // thread: splitting 2-5 rows saved nothing measurable in a verify (under
  // load), and 1-2 rows alone ran slower split.
  run_ranges(units, (int64_t)R * V < (1 << 18), [&](int u0, int u1) {
    for (int u = u0; u < u1; u++) {
      int r = u / pieces, p0 = (u % pieces) * kTop2Piece, n = std::min(kTop2Piece, V - p0);
      part[u] = top2_scan(rows.at[r] + p0 * rows.col[r], rows.col[r], n, p0);
    }
  });
  float* y = out.data<float>();
  for (int r = 0; r < R; r++) {
    Top2 t = part[(size_t)r * pieces];
    for (int p = 1; p < pieces; p++) t.merge(part[(size_t)r * pieces + p]);
    float* o = y + (size_t)r * 4;
    o[0] = float(t.argmax()), o[1] = t.top, o[2] = t.second, o[3] = t.nan ? 0.f : 1.f;
  }
}

}  // namespace specd_mlx
