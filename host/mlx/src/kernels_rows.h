// The small row-wise ops (kernels_rows.cc): RMS norm, rope, the gated
// units, and the argmax and runner-up of each row.
#pragma once
#include <cstdint>
#include <vector>

#include "mlx/array.h"
#include "specd-mlx/src/kernels_common.h"
#include "specd-mlx/src/top2.h"

namespace specd_mlx {

// y = x * rsqrt(mean(x^2) + eps) * w over the last axis.
struct RmsNormBody {
  float eps;
  std::vector<int64_t> prepare(const std::vector<mx::array>& in, const mx::array&) const;
  void run(const std::vector<mx::array>& in, mx::array& out,
           const std::vector<int64_t>& rows) const;
};

// Rotary embedding: x [B, T, H, D] -> [B, H, T, D], position of row t is
// offset + t. The angle is computed per (position, frequency) exactly as
// MLX's fallback does: theta = (pos * scale) * exp(-i * log(base) / half).
struct RopeBody {
  int dims;
  bool traditional;
  float base, scale;
  int offset;
  std::vector<float> factors;
  std::vector<int64_t> prepare(const std::vector<mx::array>&, const mx::array&) const;
  void run(const std::vector<mx::array>& in, mx::array& out, const std::vector<int64_t>&) const;
};

// silu(g) * u (or, with `gelu`, gelu_tanh(g) * u: Gemma's GeGLU),
// elementwise over two same-shaped (possibly strided) arrays.
struct SwigluBody {
  bool gelu = false;
  struct Rows {
    std::vector<int64_t> g, u;
  };
  Rows prepare(const std::vector<mx::array>& in, const mx::array&) const;
  void run(const std::vector<mx::array>& in, mx::array& out, const Rows& rows) const;
};

// out[r] = {argmax, top, second, exact}: `exact` is 1 where the row holds no
// NaN (0 tells the host to read the row and decide itself). The rows are
// those of every input in turn (all of one width).
struct Top2Body {
  struct Rows {
    std::vector<const float*> at;  // each row's first value
    std::vector<int64_t> col;      // each row's value stride
  };
  Rows prepare(const std::vector<mx::array>& in, const mx::array&) const;
  void run(const std::vector<mx::array>& in, mx::array& out, const Rows& rows) const;
};

}  // namespace specd_mlx
