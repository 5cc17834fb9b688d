// The quantized matmul's ops (kernels_qmm.cc): the matmul with what it
// folds in (an RMS norm, a gated unit, rope, a residual), a llama layer's
// tail as one op, and rows of packed weights; and the row helpers the
// row-wise ops share with it.
#pragma once
#include <cstdint>
#include <vector>

#include "mlx/array.h"
#include "specd-mlx/src/kernels_common.h"

namespace specd_mlx {

// Element offsets of each row of a strided array (kernels_qmm.cc).
std::vector<int64_t> row_offsets(const mx::array& a);

// A gated unit's input row, silu(g) * u or gelu_tanh(g) * u (kernels_qmm.cc).
enum class Glu { None, Silu, Gelu };
void glu_row(const float* g, const float* u, int64_t gc, int64_t uc, float* y, int D, bool gelu);

// x [..., K] f32 (any strides) and packed weights, then optionally an RMS
// norm weight [K] applied to x first, then optionally a residual shaped
// like the output (both row-contiguous).
struct QmmBody {
  int n = 0, group = 0, bits = 0;
  bool norm = false, residual = false;
  float eps = 0.f;
  // x holds a gated unit's gate and up halves side by side ([..., 2 K]):
  // the matmul's input is glu_row of them, made as the rows are prepared
  // (one op and one pass over the rows fewer than a separate swiglu op).
  Glu glu = Glu::None;
  // Rope folded in: heads of head_dim over columns [0, rope_cols) rotated
  // in place, row t at position rope_positions[t] (one sequence's rows or
  // several sequences', a batch's).
  int rope_cols = 0, head_dim = 0;
  std::vector<int32_t> rope_positions;
  bool rope_traditional = false;
  float rope_base = 0.f;
  std::vector<float> rope_factors;
  struct Rows {
    std::vector<int64_t> off;
    int64_t col;
  };
  static Rows rows_of(const std::vector<mx::array>& in, size_t last, const char* op);
  Rows prepare(const std::vector<mx::array>& in, const mx::array&) const;
  void run(const std::vector<mx::array>& in, mx::array& out, const Rows& rows) const;
  void compute(const float* x, const Rows& rows, int M, int width, const uint32_t* w,
               const float* norm_w, const float* r, float* y) const;
};

// A llama layer after its attention, as one op: h = x + o W_o^T, then
// y = h + down(glu(rms_norm(h) W_gate_up^T)). The three matmuls of the ops
// it replaces (qmatmul_packed_add, qmatmul_packed_norm,
// qmatmul_packed_glu_add), computed on the same rows in the same order, so
// the same bits; h and the gate/up rows live in this thread's scratch
// instead of two arrays, and a layer has two op boundaries fewer (each a
// dispatch on the engine thread and a pickup on the stream's).
struct TailBody {
  QmmBody o, gate_up, down;
  QmmBody::Rows prepare(const std::vector<mx::array>& in, const mx::array&) const;
  void run(const std::vector<mx::array>& in, mx::array& out, const QmmBody::Rows& rows) const;
  void compute(const float* o_x, const QmmBody::Rows& rows, int M, int width,
               const mx::array* w, float* y) const;
};

// Rows `ids` of packed weights, dequantized: an embedding lookup straight
// from the layout the matmul reads (w = scale * q + bias). The ids are read
// when the op runs (they may be an argmax computed just before); one past
// the table gives a zero row rather than a read out of bounds.
struct QRowsBody {
  int n, group, bits;
  int prepare(const std::vector<mx::array>& in, const mx::array&) const;
  void run(const std::vector<mx::array>& in, mx::array& out, int) const;
};

}  // namespace specd_mlx
