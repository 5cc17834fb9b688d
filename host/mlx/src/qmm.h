// The quantized matmul's arguments, its packed weight layout, and its per-ISA
// entry points. The SIMD variants live in their own translation units
// (qmm_avx2.cc, qmm_avx512.cc), each compiled with its instruction set
// enabled, and are only called after a run-time CPU check.
#pragma once
#include <cmath>
#include <cstdint>

#include "top2.h"

namespace specd_mlx::qmm {

// Packed weights ("columns in lanes"): MLX's affine-quantized rows
// (`[N, K * bits / 32]` uint32, float16 scales and biases `[N, K / group]`)
// regrouped by blocks of 16 output columns, so one vector load brings the
// same packed word of 16 columns and each SIMD lane owns one column:
//
//   block cb (columns 16 cb ..), group g: kGroupWords(group, bits) words =
//     dpg * 16 weight words   word d of column 16 cb + l at [d * 16 + l]
//     8 words                 16 float16 scales, lane l = column 16 cb + l
//     8 words                 16 float16 biases
//
// with dpg = group * bits / 32 words per column and group. Columns past N
// are zero. A word holds 32 / bits values, value j of the word at bits
// j * bits (MLX's order), so word d of group g holds inputs g * group +
// d * 32 / bits + j.
//
// A variant for scales that float16 cannot hold exactly (a K-quant's d * sc
// has up to 18 significant bits): `bits | kScaleF32` says the scales and
// biases are float32, 16 words each, in the same place. Groups may be 16
// values (Q6_K's sub-blocks) as well as multiples of 32.
constexpr int kLanes = 16;
constexpr int kScaleF32 = 256;
// In a matmul's `bits` argument (not in the layout): quantize the
// activations to 8 bits (`Args::xq`) where the layout allows it.
constexpr int kActQ8 = 512;
// The value width of a `bits` argument (without the scale flag).
inline int value_bits(int bits) { return bits & 0xff; }
inline bool scale_f32(int bits) { return (bits & kScaleF32) != 0; }
inline int group_words(int group, int bits) {
  return group * value_bits(bits) / 32 * kLanes + (scale_f32(bits) ? 2 * kLanes : kLanes);
}

// 8-bit activations (`Args::xq`, when not null): each row's 32-value blocks
// quantized symmetrically, x ~ xd[m, b] * xq, xd = max |x| / 127 over the
// block, xq = round(x * (127 / max |x|)) in [-127, 127]. Bytes are in the order the
// weight words use them: with 8-bit weights the block's values in order;
// with 4-bit weights, per word of 8 values, the even ones (the words' low
// nibbles) then the odd ones (the high nibbles).
struct Args {
  const float* x;     // activations [M, K], dense rows
  const float* xsum;  // per-group sums of x, [M, K / group] (with xq: of the 8-bit x)
  const uint32_t* w;  // packed weights [ceil(N / 16), K / group, group_words]
  const float* r;     // added to y when not null: [M, N], dense rows
  float* y;           // [M, N]
  int M, N, K, group, bits;  // bits: value width, | kScaleF32 for float32 scales
  const int8_t* xq = nullptr;  // 8-bit activations [M, K], or null: float x
  const float* xd = nullptr;   // their scales, [M, K / 32]
  // 4-bit values only (avx2): x[m, k] is given times 2^(-4 j), j = k % 8
  // (j = 7: as it is), the inverse of the factor 16^j that value j of a
  // word carries in place, so the kernel masks values 0..6 without shifting
  // them (`scale_nibbles`). Each product is exactly x q (the factors differ
  // by powers of two), so the results are the formula's bit for bit.
  bool x_nibble_scaled = false;
};

// x times 2^(-4 (k % 8)) but for k % 8 = 7 (`Args::x_nibble_scaled`) into
// xs, M rows of K (K a multiple of 8); false where that would not be exact:
// some nonzero |x| below 2^-102 would lose bits as a subnormal.
bool scale_nibbles(const float* x, int M, int K, float* xs);

// Where value i (0..31) of a block stands among the block's 8-bit
// activations (the order above).
inline int q8_byte(int i, int value_bits) {
  return value_bits == 4 ? (i / 8) * 8 + (i % 2) * 4 + (i % 8) / 2 : i;
}

// Whether a matmul can take 8-bit activations: 4- or 8-bit values in groups
// of whole 32-value blocks.
inline bool q8_fits(int K, int group, int bits) {
  int vb = value_bits(bits);
  return (vb == 4 || vb == 8) && group % 32 == 0 && K % group == 0;
}

// Rows from which the AVX2 kernel unpacks a column block's weights once for
// all rows (a panel) rather than once per row tile (qmm_avx2.cc): 1.2-1.4x
// at 32-256 rows (the prefill slices), about 1.2x at 16 on the 4-bit
// shapes, and no clear gain at 8 and below (best of 600 calls, 2 threads).
constexpr int kPanelRows = 16;
// Column blocks [cb0, cb1) of y, every row.
void avx2(const Args& a, int cb0, int cb1);
void avx512(const Args& a, int cb0, int cb1);
// 8-bit activations (a.xq set), AVX-512 VNNI.
void vnni(const Args& a, int cb0, int cb1);
// 8-bit activations on AVX2 (no VNNI): the same sums and results
// (qmm_q8_avx2.cc).
void q8_avx2(const Args& a, int cb0, int cb1);
// Rows of x [M, K] as 8-bit blocks and their scales (the layout above),
// with AVX-512 or AVX2; the same bytes as kernels_qmm.cc's scalar `quantize_x`.
void quantize_vnni(const float* x, int M, int K, int bits, int8_t* xq, float* xd);
void quantize_avx2(const float* x, int M, int K, int bits, int8_t* xq, float* xd);

// Causal attention of query row t for the heads that share one kv head
// (GQA): each key and value row is loaded once for all of them. AVX-512,
// contiguous rows, head dim 64, 128 or 256, a float32 or float16 cache;
// returns false (nothing done) for other shapes. Per head the float
// operations are those of a lone head: scores in key order, softmax
// (exp_sum_avx2), then o = sum_j p_j v_j in key order, times 1 / sum.
struct AttnGroup {
  static constexpr int kMaxHeads = 16;
  const float* q[kMaxHeads];  // query rows, D floats each
  float* o[kMaxHeads];        // output rows, D floats each
  int heads;
  const float* k;  // key row j at k + j * k_row
  const float* v;  // value row j at v + j * v_row
  int64_t k_row, v_row;
  int n, D;  // keys seen, head dim
  float scale;
  // A 16-bit cache: keys and values as f16 here instead (k, v unused),
  // k_row and v_row counting halves. Read with F16C's exact widening, so
  // the results are those of a float cache holding the same values.
  const uint16_t* k16 = nullptr;
  const uint16_t* v16 = nullptr;
  // Gemma 2's attention logit soft-capping (`softcap_scores`); 0: none.
  float softcap = 0.f;
};
// Soft-capped scores, s = cap tanh(s / cap), over n scores, before the
// softmax (Gemma 2's `attn_logit_softcapping`); cap 0 leaves them as they
// are. One scalar function for every ISA and path, so a score caps to the
// same bits wherever its dot product gave the same bits.
inline void softcap_scores(float* p, int n, float cap) {
  if (cap == 0.f) return;
  for (int j = 0; j < n; j++) p[j] = std::tanh(p[j] / cap) * cap;
}
// y = x rounded to f16 (to nearest, ties to even: F16C's), n floats.
void to_half_avx2(const float* x, uint16_t* y, int n);
bool attn_group_avx512(const AttnGroup& g, float* scores);
// The same on AVX2 for `rows` query rows of one sequence at once (g[r]:
// row r's q, o and n; k, v, heads, D and scale the same in all), head dims
// a multiple of 64, with the float operations of the per-head AVX2 path
// (kernels_attention.cc `attn_rows`: dot_avx2, exp_sum_avx2, axpy_avx2), so its
// results are bitwise that path's whatever rows share a call. `scores`
// holds heads * (the rows' n summed) floats.
constexpr int kAttnMaxRows = 8;
bool attn_group_rows_avx2(const AttnGroup* g, int rows, float* scores);
// The same on AVX-512 with attn_group_avx512's float operations (head dims
// 64, 128, 256): a row's results are bitwise that kernel's on the row alone.
bool attn_group_rows_avx512(const AttnGroup* g, int rows, float* scores);

// out[g] = the sum of x[g * group .. (g + 1) * group), K / group groups,
// each added in order from 0 (a sequential loop's bits).
void group_sums_avx2(const float* x, int K, int group, float* out);
// Attention helpers: a fixed-order dot product, and y += a * x.
float dot_avx2(const float* a, const float* b, int n);
void axpy_avx2(float a, const float* x, float* y, int n);
// y = silu(g) * u = g / (1 + exp(-g)) * u over n contiguous floats.
void swiglu_avx2(const float* g, const float* u, float* y, int n);
// y = gelu_tanh(g) * u = g / (1 + exp(-c (g + 0.044715 g^3))) * u, c = 2
// sqrt(2 / pi) (0.5 (1 + tanh z) written as sigmoid(2 z)), over n floats.
void geglu_avx2(const float* g, const float* u, float* y, int n);
// p[j] = exp(p[j] - shift) for j < n; returns their sum (fixed order).
float exp_sum_avx2(float* p, int n, float shift);
// The scan of top2.h over x[0..n), element j at index base + j.
Top2 top2_avx2(const float* x, int n, int base);

}  // namespace specd_mlx::qmm
