// specd's own CPU kernels, as MLX primitives: a quantized matmul over MLX's
// affine-quantized weights (4- and 8-bit, the layout MLX gives GGUF Q4_1/Q8_0)
// and a causal attention. Both are batch-invariant: every output row is
// computed by the same sequence of float operations whether it is one of 1 or
// of 16 rows, so a speculative verify rounds exactly like a one-token step.
//
// Why not MLX's own: on CPU its quantized_matmul is ~5x slower than fp32 GEMM,
// and GEMM/SDPA results for a row may change with the row count (BLAS picks
// kernels by shape).
//
// Work is split across a small pool of threads by output column (matmul) or
// by (head, query row) (attention); each output element is owned by exactly
// one thread, so threading never changes a result. The SIMD path is chosen
// once per process from the CPU's features (AVX-512, AVX2+FMA+F16C, scalar).
//
// By file: the thread pool (kernels_pool.h, .cc); the SIMD level
// (kernels_isa.h, .cc); what several kernels share, such as scratch rows,
// float16 conversions, the RMS norm row and the rotary embedding
// (kernels_common.h, .cc); the quantized matmul (kernels_qmm.h, .cc); the
// attention, plain and over per-sequence caches (kernels_attention.h,
// .cc); the row-wise ops and the argmax and runner-up per row
// (kernels_rows.h, .cc). Here: the MLX primitive every kernel is, and the
// entry points the bridge calls.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "specd-mlx/src/kernels_attention.h"
#include "specd-mlx/src/kernels_common.h"
#include "specd-mlx/src/kernels_qmm.h"
#include "specd-mlx/src/kernels_rows.h"
#include "specd-mlx/src/pages.h"
#include "specd-mlx/src/qmm.h"
#include "specd-mlx/src/bridge.rs.h"
#include "specd-mlx/src/shim.h"
#include "specd-mlx/src/top2.h"
#include "specd-mlx/src/waiting.h"

namespace specd_mlx {
namespace mx = mlx::core;

namespace {

// ---- one primitive for every kernel -------------------------------------------
//
// `Body::prepare(inputs)` runs at graph evaluation, when the inputs' buffers
// and strides are known (and throws on misfits); `Body::run(inputs, output,
// prepared)` is the work, dispatched on the CPU stream's thread. The inputs
// ride along in the task so their buffers outlive it.
//
// `OwnOp` is what every kernel op is: its output is always a fresh
// row-major buffer, so `rowmajor` can take one before it is computed.
class OwnOp : public mx::UnaryPrimitive {
  using UnaryPrimitive::UnaryPrimitive;
};

template <class Body>
class KernelOp : public OwnOp {
 public:
  KernelOp(mx::Stream s, const char* name, Body body)
      : OwnOp(s), name_(name), body_(std::move(body)) {}
  void eval_cpu(const std::vector<mx::array>& in, mx::array& out) override {
    out.set_data(aligned_data(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (auto& x : in) enc.set_input_array(x);
    enc.set_output_array(out);
    auto info = body_.prepare(in, out);
    enc.dispatch([body = body_, info = std::move(info), keep = in, out]() mutable {
      body.run(keep, out, info);
    });
  }
  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error(std::string(name_) + " has no GPU kernel (the op falls back to MLX's)");
  }
  const char* name() const override { return name_; }
  const Body& body() const { return body_; }

 private:
  const char* name_;
  Body body_;
};

// Ops of specd's own built since the start: the portable path
// (`--kernels mlx`) must build none, and its tests check that it did not.
std::atomic<uint64_t> g_own_ops{0};
// Set once, before the model loads: every entry point takes MLX's own ops,
// as a GPU build does (the portable path, on whatever device MLX picks).
std::atomic<bool> g_mlx_ops{false};

template <class Body>
A kernel_op(const char* name, Body body, mx::Shape shape, std::vector<mx::array> inputs,
            mx::Dtype dtype = mx::float32) {
  g_own_ops.fetch_add(1, std::memory_order_relaxed);
  auto prim =
      std::make_shared<KernelOp<Body>>(mx::default_stream(mx::Device::cpu), name, std::move(body));
  return std::make_unique<Array>(mx::array(std::move(shape), dtype, prim, std::move(inputs)));
}

// Whether the entry points run MLX's own ops: on a GPU, and everywhere on
// the portable path.
bool mlx_ops() {
  return g_mlx_ops.load(std::memory_order_relaxed) ||
         mx::default_device().type == mx::Device::DeviceType::gpu;
}

A wrap_array(mx::array a) { return std::make_unique<Array>(std::move(a)); }

// Kernels read float32; a no-op for inputs that already are.
mx::array f32(const mx::array& a) { return mx::astype(a, mx::float32); }

// A row-contiguous view (a copy only where the layout needs one).
// Weights are evaluated, row-contiguous arrays from the loader, and a
// kernel op's output not yet computed will be row-major: both used as they
// are, with no copy op in between (each op costs the engine thread a
// dispatch). Anything else gets a contiguous copy first.
mx::array rowmajor(const mx::array& a) {
  if (a.is_available() ? a.flags().row_contiguous
                       : a.has_primitive() && dynamic_cast<const OwnOp*>(&a.primitive()))
    return a;
  return mx::contiguous(a);
}

}  // namespace

namespace {
// The quantizations the kernels take: 4 or 8 bits (| kScaleF32, |
// kActQ8), groups of 16k.
void check_bits(int32_t group_size, int32_t bits) {
  int vb = qmm::value_bits(bits);
  if ((vb != 4 && vb != 8) || (bits & ~(0xff | qmm::kScaleF32 | qmm::kActQ8)) != 0)
    throw std::invalid_argument("qmatmul supports 4 and 8 bits");
  if (group_size <= 0 || group_size % 16 != 0)
    throw std::invalid_argument("qmatmul needs group sizes of 16k");
}

// MLX's layout as the kernels take it: uint32 words, float16 scales and
// biases (or float32 ones: packed with kScaleF32). `bits` is the value width.
void check_quant(const mx::array& w, const mx::array& scales, const mx::array& biases,
                 int32_t group_size, int32_t bits) {
  check_bits(group_size, bits);
  if (qmm::scale_f32(bits)) throw std::invalid_argument("qmatmul: the scale dtype says f32");
  if (w.ndim() != 2 || scales.ndim() != 2) throw std::invalid_argument("qmatmul: 2-D weights");
  int N = w.shape(0), K = w.shape(1) * 32 / qmm::value_bits(bits);
  if (scales.shape(1) * group_size != K || biases.shape() != scales.shape() ||
      scales.shape(0) != N)
    throw std::invalid_argument("qmatmul: scales/biases do not match the weight");
  bool f16 = scales.dtype() == mx::float16 && biases.dtype() == mx::float16;
  bool f32 = scales.dtype() == mx::float32 && biases.dtype() == mx::float32;
  if (!f16 && !f32)
    throw std::invalid_argument("qmatmul: scales and biases must be float16 or float32");
  if (w.dtype() != mx::uint32) throw std::invalid_argument("qmatmul: weights must be uint32");
}
}  // namespace

A qpack(const Array& w, const Array& scales, const Array& biases, int32_t group_size,
        int32_t bits) {
  check_quant(w.a, scales.a, biases.a, group_size, bits);
  if (bits & qmm::kActQ8) throw std::invalid_argument("qpack: 8-bit activations are not a layout");
  auto wc = mx::contiguous(w.a), sc = mx::contiguous(scales.a), bc = mx::contiguous(biases.a);
  mx::eval({wc, sc, bc});
  const int N = wc.shape(0), wpc = wc.shape(1), groups = sc.shape(1);
  const bool f32 = sc.dtype() == mx::float32;
  const int dpg = group_size * bits / 32,
            gw = qmm::group_words(group_size, bits | (f32 ? qmm::kScaleF32 : 0));
  const int blocks = (N + qmm::kLanes - 1) / qmm::kLanes;
  // Zeroed: the lanes past N in the last block stay 0.
  mx::array packed = weight_array({blocks, groups, gw}, mx::uint32);
  uint32_t* out = packed.data<uint32_t>();
  const uint32_t* W = wc.data<uint32_t>();
  for (int n = 0; n < N; n++) {
    int cb = n / qmm::kLanes, l = n % qmm::kLanes;
    for (int g = 0; g < groups; g++) {
      uint32_t* base = out + ((size_t)cb * groups + g) * gw;
      for (int d = 0; d < dpg; d++) base[d * qmm::kLanes + l] = W[(size_t)n * wpc + g * dpg + d];
      size_t at = (size_t)n * groups + g;
      if (f32) {
        float* sb = reinterpret_cast<float*>(base + dpg * qmm::kLanes);
        sb[l] = sc.data<float>()[at];
        sb[qmm::kLanes + l] = bc.data<float>()[at];
      } else {
        uint16_t* sb = reinterpret_cast<uint16_t*>(base + dpg * qmm::kLanes);
        sb[l] = reinterpret_cast<const uint16_t*>(sc.data<mx::float16_t>())[at];
        sb[qmm::kLanes + l] = reinterpret_cast<const uint16_t*>(bc.data<mx::float16_t>())[at];
      }
    }
  }
  return wrap_array(std::move(packed));
}

namespace {
// Packed weights (qpack's output) for n output features, on the CPU.
void check_packed(const mx::array& p, int32_t n, int32_t group_size, int32_t bits,
                  const char* what) {
  if (mlx_ops())
    throw std::invalid_argument(std::string(what) + ": packed weights are for specd's CPU kernels (not the portable path)");
  check_bits(group_size, bits);
  if (p.ndim() != 3 || p.dtype() != mx::uint32 || n <= 0 ||
      p.shape(0) != (n + qmm::kLanes - 1) / qmm::kLanes ||
      p.shape(2) != qmm::group_words(group_size, bits))
    throw std::invalid_argument(std::string(what) +
                                ": the packed weights do not fit n, group and bits");
}

A qmatmul_packed_impl(const Array& x, const Array& packed, Packing packing,
                      const Array* norm_w, float eps, const Array* residual, QmmBody body = {}) {
  const int32_t n = packing.n, group_size = packing.group_size, bits = packing.bits;
  const auto& p = packed.a;
  check_packed(p, n, group_size, bits, "qmatmul_packed");
  int K = p.shape(1) * group_size;
  if (body.glu != Glu::None && x.a.shape(-1) != 2 * K)
    throw std::invalid_argument("qmatmul: a gated input has " + std::to_string(x.a.shape(-1)) +
                                " features, not twice the weight's " + std::to_string(K));
  if (body.glu == Glu::None && x.a.shape(-1) != K)
    throw std::invalid_argument("qmatmul: x has " + std::to_string(x.a.shape(-1)) +
                                " features, the weight " + std::to_string(K));
  mx::Shape shape = x.a.shape();
  shape.back() = n;
  std::vector<mx::array> in{f32(x.a), rowmajor(p)};
  if (norm_w) {
    if (norm_w->a.ndim() != 1 || norm_w->a.shape(0) != K)
      throw std::invalid_argument("qmatmul: the norm weight must be [in features]");
    in.push_back(rowmajor(f32(norm_w->a)));
  }
  if (residual) {
    if (residual->a.shape() != shape)
      throw std::invalid_argument("qmatmul: the residual must be shaped like the output");
    in.push_back(rowmajor(f32(residual->a)));
  }
  body.n = n, body.group = group_size, body.bits = bits;
  body.norm = norm_w != nullptr, body.residual = residual != nullptr, body.eps = eps;
  return kernel_op("SpecdQMatmul", body, shape, std::move(in));
}
}  // namespace

namespace {
// A layer tail's body and the inputs it takes after o: x (row-major),
// W_o, the MLP's norm weight, W_gate_up, W_down. `o_width` and `rows`:
// the o rows it will read; `tail`: the four weights; `p`: the o, gate/up
// and down matmuls' group sizes and bits, the gate/up width, GeGLU or not
// (kernels.rs `Tail::params`).
struct TailPlan {
  TailBody body;
  std::vector<mx::array> in;
};
TailPlan plan_tail(int o_width, int64_t rows, const Array& x, const ArrayList& tail,
                   rust::Slice<const int32_t> p, float eps) {
  if (tail.v.size() != 4 || p.size() != 8)
    throw std::invalid_argument("layer_tail: four weights and eight integers");
  const auto &w_o = tail.v[0], &norm_w = tail.v[1], &w_gate_up = tail.v[2], &w_down = tail.v[3];
  const int o_group = p[0], o_bits = p[1], gate_up_n = p[2], gate_up_group = p[3],
            gate_up_bits = p[4], down_group = p[5], down_bits = p[6];
  const bool gelu = p[7] != 0;
  const int d = x.a.shape(-1);
  check_packed(w_o, d, o_group, o_bits, "layer_tail (o)");
  check_packed(w_gate_up, gate_up_n, gate_up_group, gate_up_bits, "layer_tail (gate/up)");
  check_packed(w_down, d, down_group, down_bits, "layer_tail (down)");
  auto in_features = [](const mx::array& w, int group) { return w.shape(1) * group; };
  if (rows != (int64_t)(x.a.size() / d) || o_width != in_features(w_o, o_group))
    throw std::invalid_argument("layer_tail: o must be x's rows of W_o's in features");
  if (in_features(w_gate_up, gate_up_group) != d || gate_up_n % 2 != 0 ||
      in_features(w_down, down_group) != gate_up_n / 2)
    throw std::invalid_argument("layer_tail: gate/up must map the hidden size to twice down's in features");
  if (norm_w.ndim() != 1 || norm_w.shape(0) != d)
    throw std::invalid_argument("layer_tail: the norm weight must be [hidden]");
  auto matmul = [](int n, int group, int bits) {
    QmmBody b;
    b.n = n, b.group = group, b.bits = bits;
    return b;
  };
  TailBody body{matmul(d, o_group, o_bits), matmul(gate_up_n, gate_up_group, gate_up_bits),
                matmul(d, down_group, down_bits)};
  body.o.residual = true;
  body.gate_up.norm = true, body.gate_up.eps = eps;
  body.down.residual = true, body.down.glu = gelu ? Glu::Gelu : Glu::Silu;
  return {body,
          {rowmajor(f32(x.a)), rowmajor(w_o), rowmajor(f32(norm_w)), rowmajor(w_gate_up),
           rowmajor(w_down)}};
}
}  // namespace

A layer_tail(const Array& o, const Array& x, const ArrayList& tail,
             rust::Slice<const int32_t> params, float eps) {
  if (o.a.ndim() != x.a.ndim()) throw std::invalid_argument("layer_tail: o and x differ in rank");
  auto plan = plan_tail(o.a.shape(-1), o.a.size() / o.a.shape(-1), x, tail, params, eps);
  plan.in.insert(plan.in.begin(), f32(o.a));
  return kernel_op("SpecdLayerTail", plan.body, x.a.shape(), std::move(plan.in));
}

A qmatmul_packed(const Array& x, const Array& packed, Packing packing) {
  return qmatmul_packed_impl(x, packed, packing, nullptr, 0.f, nullptr);
}

A qmatmul_packed_add(const Array& x, const Array& packed, Packing packing,
                     const Array& residual) {
  return qmatmul_packed_impl(x, packed, packing, nullptr, 0.f, &residual);
}

A qmatmul_packed_glu_add(const Array& gu, const Array& packed, Packing packing,
                         const Array& residual, bool gelu) {
  QmmBody body;
  body.glu = gelu ? Glu::Gelu : Glu::Silu;
  return qmatmul_packed_impl(gu, packed, packing, nullptr, 0.f, &residual, body);
}

A qmatmul_packed_glu(const Array& gu, const Array& packed, Packing packing, bool gelu) {
  QmmBody body;
  body.glu = gelu ? Glu::Gelu : Glu::Silu;
  return qmatmul_packed_impl(gu, packed, packing, nullptr, 0.f, nullptr, body);
}

A qmatmul_packed_norm(const Array& x, const Array& norm_w, float eps, const Array& packed,
                      Packing packing) {
  return qmatmul_packed_impl(x, packed, packing, &norm_w, eps, nullptr);
}

A qmatmul_packed_norm_rope_rows(const Array& x, const Array& norm_w, float eps,
                                const Array& packed, Packing packing,
                                int32_t rope_cols, int32_t head_dim, bool traditional, float base,
                                rust::Slice<const int32_t> positions,
                                rust::Slice<const float> factors) {
  if (head_dim <= 0 || head_dim % 2 != 0 || rope_cols % head_dim != 0 || rope_cols > packing.n ||
      rope_cols <= 0)
    throw std::invalid_argument("qmatmul rope: whole heads of an even size within the output");
  if (x.a.ndim() != 3 || x.a.shape(0) != 1 || (size_t)x.a.shape(1) != positions.size())
    throw std::invalid_argument("qmatmul rope rows: x must be [1, T, in] with T positions");
  QmmBody body;
  body.rope_cols = rope_cols, body.head_dim = head_dim;
  body.rope_positions.assign(positions.begin(), positions.end());
  body.rope_traditional = traditional, body.rope_base = base;
  if (!factors.empty() && factors.size() != size_t(head_dim / 2))
    throw std::invalid_argument("qmatmul rope: one frequency factor per rotated pair");
  body.rope_factors.assign(factors.begin(), factors.end());
  return qmatmul_packed_impl(x, packed, packing, &norm_w, eps, nullptr, body);
}

A qrows_packed(const Array& packed, const Array& ids, Packing packing) {
  const int32_t n = packing.n, group_size = packing.group_size, bits = packing.bits;
  const auto& p = packed.a;
  check_packed(p, n, group_size, bits, "qrows_packed");
  if (ids.a.ndim() != 1) throw std::invalid_argument("qrows_packed: ids must be 1-D");
  return kernel_op("SpecdQRows", QRowsBody{n, group_size, bits},
                   {ids.a.shape(0), p.shape(1) * group_size},
                   {rowmajor(p), rowmajor(mx::astype(ids.a, mx::uint32))});
}

A qmatmul(const Array& x, const Array& w, const Array& scales, const Array& biases,
          int32_t group_size, int32_t bits) {
  check_quant(w.a, scales.a, biases.a, group_size, bits);
  // 8-bit activations are a property of the call, not of the layout.
  const int act = bits & qmm::kActQ8;
  bits &= ~qmm::kActQ8;
  if (mlx_ops())
    return wrap_array(mx::quantized_matmul(x.a, w.a, scales.a, biases.a, true, group_size, bits));
  int flag = scales.a.dtype() == mx::float32 ? qmm::kScaleF32 : 0;
  return qmatmul_packed(x, *qpack(w, scales, biases, group_size, bits),
                        Packing{w.a.shape(0), group_size, bits | flag | act});
}

A attention(const Array& q, const Array& k, const Array& v, float scale, bool causal,
            float softcap) {
  // MLX's fused attention has no soft-capping: a capped model builds its
  // own from MLX's ops where it runs them (llama/gemma2.rs).
  if (mlx_ops() && softcap != 0.f)
    throw std::invalid_argument("attention: soft-capped scores need specd's CPU kernels");
  if (mlx_ops())
    return wrap_array(mx::transpose(
        mx::fast::scaled_dot_product_attention(q.a, k.a, v.a, scale, causal ? "causal" : ""),
        {0, 2, 1, 3}));
  if (q.a.ndim() != 4 || k.a.ndim() != 4 || v.a.ndim() != 4 || q.a.shape(0) != 1)
    throw std::invalid_argument("attention: q, k, v must be [1, heads, len, dim]");
  if (q.a.shape(1) % k.a.shape(1) != 0 || k.a.shape(1) != v.a.shape(1) ||
      k.a.shape(2) != v.a.shape(2) || q.a.shape(3) != k.a.shape(3) ||
      (causal && q.a.shape(2) > k.a.shape(2)))
    throw std::invalid_argument("attention: shapes of q, k, v do not fit together");
  // A softmax over no keys has no value (and the kernels write nothing).
  if (k.a.shape(2) == 0) throw std::invalid_argument("attention: no keys");
  // Keys and values keep their (cache-slice) strides: the kernel reads them
  // in place.
  return kernel_op("SpecdAttention", AttnBody{scale, causal, softcap},
                   {1, q.a.shape(2), q.a.shape(1), v.a.shape(3)}, {f32(q.a), f32(k.a), f32(v.a)});
}

namespace {
// The q/k/v matmul (norm and rope folded in) and the ragged attention that
// reads its rows, as one op: attention_kv_rows takes in the matmul op that
// makes its y when nothing else has asked for y yet. The same matmul call
// writes y's rows into this thread's scratch instead of an array, then the
// same attention reads them, so the same bits, and a layer has one op
// boundary fewer.
struct QkvAttnBody {
  QmmBody qkv;
  RaggedAttnBody attn;
  struct Args {
    QmmBody::Rows rows;
    RaggedArgs attn;
  };
  // in: x, the packed weights, the norm weight, then the caches.
  Args prepare(const std::vector<mx::array>& in, mx::array& out) const {
    return {QmmBody::rows_of(in, 3, "SpecdQkvAttention"), attn.prepare_caches(in, 3, out)};
  }
  void run(const std::vector<mx::array>& in, mx::array& out, Args& a) const {
    const int M = in[0].size() / in[0].shape(-1);
    thread_local Scratch<float> y;
    y.resize((size_t)M * qkv.n);
    qkv.compute(in[0].data<float>(), a.rows, M, in[0].shape(-1), in[1].data<uint32_t>(),
                in[2].data<float>(), nullptr, y.data());
    a.attn.y = y.data(), a.attn.y_row = qkv.n;
    attn.run(in, out, a.attn);
  }
};

// The matmul op that makes `y`, where attention may take it in: a q/k/v
// matmul with its norm and no residual or gate, not yet asked for.
const KernelOp<QmmBody>* fusable_qkv(const mx::array& y) {
  if (y.status() != mx::array::Status::unscheduled || !y.has_primitive()) return nullptr;
  auto* op = dynamic_cast<const KernelOp<QmmBody>*>(&y.primitive());
  if (!op || !op->body().norm || op->body().residual || op->body().glu != Glu::None) return nullptr;
  return y.inputs().size() == 3 ? op : nullptr;
}
}  // namespace

namespace {
// A whole llama layer as one op: QkvAttnBody's q/k/v matmul and ragged
// attention, then TailBody's three matmuls over the attention's rows,
// which stay in this thread's scratch. The same calls on the same rows as
// the two ops, so the same bits, and a layer is one op boundary.
struct LayerBody {
  QkvAttnBody attn;
  TailBody tail;
  // in: QkvAttnBody's (x, W_qkv, its norm weight, the caches), then what
  // TailBody takes after o (x row-major, W_o, the MLP's norm weight,
  // W_gate_up, W_down).
  static constexpr size_t kTailInputs = 5;
  QkvAttnBody::Args prepare(const std::vector<mx::array>& in, mx::array& out) const {
    for (size_t i = in.size() - kTailInputs; i < in.size(); i++)
      if (!in[i].flags().row_contiguous)
        throw std::runtime_error("SpecdLayer: the tail's inputs must be row-contiguous");
    return attn.prepare(in, out);
  }
  void run(const std::vector<mx::array>& in, mx::array& out, QkvAttnBody::Args& a) const {
    const int M = in[0].size() / in[0].shape(-1), width = attn.attn.H * attn.attn.D;
    thread_local Scratch<float> o;
    thread_local QmmBody::Rows o_rows{{}, 1};
    o.resize((size_t)M * width), o_rows.off.resize(M);
    for (int t = 0; t < M; t++) o_rows.off[t] = (int64_t)t * width;
    a.attn.o = o.data();
    attn.run(in, out, a);
    tail.compute(o.data(), o_rows, M, width, in.data() + in.size() - kTailInputs,
                 out.data<float>());
  }
};

// The ragged attention's body and inputs (y, then each sequence's keys and
// values), checked.
struct AttnPlan {
  RaggedAttnBody body;
  std::vector<mx::array> in;
  int T;
};
AttnPlan plan_attention(const Array& y, const ArrayList& caches, rust::Slice<const int32_t> spans,
                        int32_t heads, int32_t kv_heads, int32_t head_dim, float scale) {
  if (mlx_ops()) throw std::invalid_argument("attention_kv_rows: specd's CPU kernels only");
  if (heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 || head_dim <= 0)
    throw std::invalid_argument("attention_kv_rows: heads must be a multiple of kv heads");
  size_t S = caches.v.size() / 2;
  if (S == 0 || caches.v.size() != 2 * S || spans.size() != 2 * S)
    throw std::invalid_argument("attention_kv_rows: one (keys, values) and one span per sequence");
  int T = y.a.ndim() == 3 ? y.a.shape(1) : -1;
  if (T < 0 || y.a.shape(0) != 1 || y.a.shape(2) != (heads + 2 * kv_heads) * head_dim)
    throw std::invalid_argument("attention_kv_rows: y must be [1, T, (heads + 2 kv_heads) * dim]");
  RaggedAttnBody body{heads, kv_heads, head_dim, scale, {}};
  body.half = caches.v[0].dtype() == mx::float16;
  const auto cache_type = body.half ? mx::float16 : mx::float32;
  std::vector<mx::array> in{rowmajor(f32(y.a))};
  int a = 0;
  for (size_t s = 0; s < S; s++) {
    int off = spans[2 * s], n = spans[2 * s + 1];
    const auto &k = caches.v[2 * s], &v = caches.v[2 * s + 1];
    for (auto* c : {&k, &v})
      if (c->ndim() != 4 || c->shape(0) != 1 || c->shape(1) != kv_heads ||
          c->shape(3) != head_dim || c->dtype() != cache_type)
        throw std::invalid_argument(
            "attention_kv_rows: caches must be [1, kv_heads, cap, dim], all float32 or all float16");
    if (n <= 0 || off < 0 || off + n > k.shape(2) || v.shape(2) != k.shape(2))
      throw std::invalid_argument("attention_kv_rows: a sequence's rows do not fit its cache");
    body.seqs.push_back({a, n, off});
    a += n;
    in.push_back(k);
    in.push_back(v);
  }
  if (a != T) throw std::invalid_argument("attention_kv_rows: the spans must cover y's rows");
  return {std::move(body), std::move(in), T};
}

// The q/k/v matmul op's inputs (x, weights, norm weight) followed by the
// plan's caches: what an op that takes the matmul in reads.
std::vector<mx::array> with_qkv_inputs(const mx::array& y, const AttnPlan& p) {
  const auto& src = y.inputs();
  std::vector<mx::array> in{src[0], src[1], src[2]};
  in.insert(in.end(), p.in.begin() + 1, p.in.end());
  return in;
}

// `out`, then `o`, then the plan's caches written in place, as arrays that
// depend on `o`: whatever reads them next (the next step's op, an eval of
// the cache) runs the op that writes them first.
std::unique_ptr<ArrayList> with_caches(std::vector<mx::array> front, const AttnPlan& p,
                                       const mx::array& writer) {
  std::vector<mx::array> kv(p.in.begin() + 1, p.in.end());
  auto out = std::make_unique<ArrayList>();
  out->v = std::move(front);
  for (auto& c : mx::depends(kv, {writer})) out->v.push_back(std::move(c));
  return out;
}

// The attention op over the plan: with the q/k/v matmul taken in where it
// can be.
A attention_op(AttnPlan p, const mx::array& y) {
  const mx::Shape shape{1, p.T, p.body.H * p.body.D};
  if (auto* qkv = fusable_qkv(y))
    return kernel_op("SpecdQkvAttention", QkvAttnBody{qkv->body(), std::move(p.body)}, shape,
                     with_qkv_inputs(y, p));
  return kernel_op("SpecdAttentionKvRows", std::move(p.body), shape, std::move(p.in));
}
}  // namespace

std::unique_ptr<ArrayList> attention_kv_rows(const Array& y, const ArrayList& caches,
                                             rust::Slice<const int32_t> spans, int32_t heads,
                                             int32_t kv_heads, int32_t head_dim, float scale) {
  auto p = plan_attention(y, caches, spans, heads, kv_heads, head_dim, scale);
  auto o = attention_op(p, y.a);
  return with_caches({o->a}, p, o->a);
}

std::unique_ptr<ArrayList> layer_kv_rows(const Array& y, const ArrayList& caches,
                                         rust::Slice<const int32_t> spans, int32_t heads,
                                         int32_t kv_heads, int32_t head_dim, float scale,
                                         const Array& x, const ArrayList& tail,
                                         rust::Slice<const int32_t> params, float eps) {
  auto p = plan_attention(y, caches, spans, heads, kv_heads, head_dim, scale);
  if (x.a.ndim() != 3) throw std::invalid_argument("layer_kv_rows: x must be [1, T, hidden]");
  auto t = plan_tail(heads * head_dim, p.T, x, tail, params, eps);
  if (auto* qkv = fusable_qkv(y.a)) {
    auto in = with_qkv_inputs(y.a, p);
    in.insert(in.end(), t.in.begin(), t.in.end());
    auto out = kernel_op("SpecdLayer", LayerBody{{qkv->body(), p.body}, t.body}, x.a.shape(),
                         std::move(in));
    return with_caches({out->a, out->a}, p, out->a);
  }
  // y already asked for (a profile's probe): the attention and the tail
  // as two ops, and the attention's output to time them apart.
  auto o = attention_op(p, y.a);
  t.in.insert(t.in.begin(), o->a);
  auto out = kernel_op("SpecdLayerTail", t.body, x.a.shape(), std::move(t.in));
  return with_caches({out->a, o->a}, p, o->a);
}

A kv_alloc(const Array& old, bool has_old, int32_t keep, int32_t heads, int32_t cap,
           int32_t dim, bool half) {
  if (heads <= 0 || dim <= 0 || cap <= 0 || keep < 0 || keep > cap)
    throw std::invalid_argument("kv_alloc: bad shape");
  std::vector<mx::array> in;
  if (has_old) {
    const auto& o = old.a;
    if (o.ndim() != 4 || o.shape(0) != 1 || o.shape(1) != heads || o.shape(3) != dim ||
        o.shape(2) < keep)
      throw std::invalid_argument("kv_alloc: the old buffer does not fit");
    in.push_back(half ? mx::astype(o, mx::float16) : f32(o));
  }
  return kernel_op("SpecdKvAlloc", KvAllocBody{keep, has_old}, {1, heads, cap, dim},
                   std::move(in), half ? mx::float16 : mx::float32);
}

A rms_norm_rows(const Array& x, const Array& w, float eps) {
  if (mlx_ops()) return std::make_unique<Array>(mx::fast::rms_norm(x.a, w.a, eps));
  if (w.a.ndim() != 1 || w.a.shape(0) != x.a.shape(-1))
    throw std::invalid_argument("rms_norm: weight must be [dim]");
  return kernel_op("SpecdRmsNorm", RmsNormBody{eps}, x.a.shape(), {f32(x.a), rowmajor(f32(w.a))});
}

A rope_heads(const Array& x, int32_t dims, bool traditional, float base, float scale,
             int32_t offset, rust::Slice<const float> factors) {
  if (x.a.ndim() != 4) throw std::invalid_argument("rope_heads: x must be [B, T, H, D]");
  if (dims % 2 != 0 || dims > x.a.shape(3))
    throw std::invalid_argument("rope_heads: dims must be even and at most D");
  if (!factors.empty() && factors.size() != size_t(dims / 2))
    throw std::invalid_argument("rope_heads: one frequency factor per rotated pair");
  std::vector<float> f(factors.begin(), factors.end());
  if (mlx_ops()) {
    auto xt = mx::transpose(x.a, {0, 2, 1, 3});
    if (f.empty())
      return std::make_unique<Array>(mx::fast::rope(xt, dims, traditional, base, scale, offset));
    return std::make_unique<Array>(mx::fast::rope(xt, dims, traditional, std::nullopt, scale,
                                                  offset, rope_periods(dims, base, f)));
  }
  auto sh = x.a.shape();
  return kernel_op("SpecdRope", RopeBody{dims, traditional, base, scale, offset, f},
                   {sh[0], sh[2], sh[1], sh[3]}, {f32(x.a)});
}

A swiglu(const Array& g, const Array& u) {
  if (g.a.shape() != u.a.shape()) throw std::invalid_argument("swiglu: shapes differ");
  if (mlx_ops())
    return std::make_unique<Array>(mx::multiply(mx::multiply(g.a, mx::sigmoid(g.a)), u.a));
  return kernel_op("SpecdSwiglu", SwigluBody{}, g.a.shape(), {f32(g.a), f32(u.a)});
}

A geglu(const Array& g, const Array& u) {
  if (g.a.shape() != u.a.shape()) throw std::invalid_argument("geglu: shapes differ");
  if (mlx_ops()) {
    auto inner = mx::add(g.a, mx::multiply(mx::multiply(mx::multiply(g.a, g.a), g.a),
                                           mx::array(0.044715f)));
    auto s = mx::sigmoid(mx::multiply(inner, mx::array(1.5957691216057308f)));
    return std::make_unique<Array>(mx::multiply(mx::multiply(g.a, s), u.a));
  }
  return kernel_op("SpecdGeglu", SwigluBody{true}, g.a.shape(), {f32(g.a), f32(u.a)});
}

namespace {
// A row's {argmax, top, second, exact} by MLX's ops (the GPU's path): the
// largest value off and at the argmax; a row whose maximum is not unique,
// or not a number, is left to the host.
mx::array row_top2_ops(const mx::array& l) {
  int V = l.shape(-1);
  auto x = mx::astype(l, mx::float32);
  auto am = mx::argmax(x, -1, true);
  mx::Shape ar(l.ndim(), 1);
  ar.back() = V;
  auto at = mx::equal(mx::reshape(mx::arange(0, V, mx::uint32), ar), am);
  auto ninf = mx::array(-INFINITY);
  auto top = mx::max(x, -1, true);
  auto second = mx::max(mx::where(at, ninf, x), -1, true);
  auto own = mx::max(mx::where(at, x, ninf), -1, true);
  auto exact = mx::logical_and(mx::greater(mx::subtract(top, second), mx::array(0.f)),
                               mx::equal(own, top));
  return mx::concatenate(
      {mx::astype(am, mx::float32), top, second, mx::astype(exact, mx::float32)}, -1);
}

void check_top2_rows(const mx::array& l, int V) {
  if (l.ndim() < 1 || l.shape(-1) < 1 || l.shape(-1) >= (1 << 24))
    throw std::invalid_argument("row_top2: rows of 1 to 2^24 - 1 values (the index is a float)");
  if (V > 0 && l.shape(-1) != V)
    throw std::invalid_argument("row_top2: every array's rows must be of one width");
}
}  // namespace

A row_top2(const Array& logits) {
  const auto& l = logits.a;
  check_top2_rows(l, 0);
  if (mlx_ops()) return wrap_array(row_top2_ops(l));
  mx::Shape shape = l.shape();
  shape.back() = 4;
  return kernel_op("SpecdRowTop2", Top2Body{}, shape, {f32(l)});
}

A row_top2_list(const ArrayList& rows) {
  if (rows.v.empty()) throw std::invalid_argument("row_top2: no arrays");
  int V = rows.v[0].ndim() > 0 ? rows.v[0].shape(-1) : 0;
  int total = 0;
  std::vector<mx::array> in;
  for (const auto& l : rows.v) {
    check_top2_rows(l, V);
    total += l.size() / V;
    in.push_back(f32(l));
  }
  if (mlx_ops()) {
    std::vector<mx::array> parts;
    for (const auto& l : in) parts.push_back(mx::reshape(row_top2_ops(l), {-1, 4}));
    return wrap_array(mx::concatenate(parts, 0));
  }
  return kernel_op("SpecdRowTop2", Top2Body{}, {total, 4}, std::move(in));
}

int32_t kernel_threads() { return pool().size(); }
bool set_kernel_threads(int32_t n) {
  if (n <= 0 || g_pool_made.load()) return false;
  g_requested_threads = n;
  return !g_pool_made.load();
}
rust::String kernel_isa() {
  switch (isa()) {
    case Isa::Avx512: return rust::String("avx512");
    case Isa::Avx2: return rust::String("avx2");
    default: return rust::String("scalar");
  }
}

void set_mlx_ops(bool on) { g_mlx_ops.store(on); }
bool mlx_ops_only() { return mlx_ops(); }
uint64_t own_op_count() { return g_own_ops.load(); }

void begin_waiting() { g_waiting.fetch_add(1); }
void end_waiting() { g_waiting.fetch_sub(1); }

}  // namespace specd_mlx
