// The attention ops (kernels_attention.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "mlx/array.h"
#include "specd-mlx/src/kernels_attention.h"
#include "specd-mlx/src/kernels_common.h"
#include "specd-mlx/src/qmm.h"

namespace specd_mlx {

// ---- attention ----------------------------------------------------------------
//
// softmax(scale * q k^T + causal) v per (head, query row), keys in order,
// one thread per (head, row) range. Query row t of T sees keys [0, L - T + t].

namespace {

float dot(const float* a, const float* b, int n) {
#if defined(SPECD_X86_KERNELS)
  if (isa() != Isa::Scalar) return qmm::dot_avx2(a, b, n);
#endif
  float r = 0.f;
  for (int i = 0; i < n; i++) r += a[i] * b[i];
  return r;
}

// Row j of a strided [L, n] matrix as a dense pointer (gathered into `tmp`
// when its elements are not adjacent).
inline const float* row_of(const float* base, int64_t row, int64_t col, int j, int n,
                           float* tmp) {
  const float* r = base + j * row;
  if (col == 1) return r;
  for (int i = 0; i < n; i++) tmp[i] = r[i * col];
  return tmp;
}

void axpy(float a, const float* x, float* y, int n) {
#if defined(SPECD_X86_KERNELS)
  if (isa() != Isa::Scalar) return qmm::axpy_avx2(a, x, y, n);
#endif
  for (int i = 0; i < n; i++) y[i] = std::fma(a, x[i], y[i]);
}

float exp_sum(float* p, int n, float shift) {
#if defined(SPECD_X86_KERNELS)
  if (isa() != Isa::Scalar) return qmm::exp_sum_avx2(p, n, shift);
#endif
  float sum = 0.f;
  for (int j = 0; j < n; j++) {
    p[j] = std::exp(p[j] - shift);
    sum += p[j];
  }
  return sum;
}

void attn_rows(const AttnArgs& a, int r0, int r1, Scratch<float>& p) {
  int rep = a.H / a.Hkv;
  p.resize(a.L + 2 * a.D + a.Dv);
  float* ktmp = p.data() + a.L;
  float* vtmp = ktmp + a.D;
  float* qtmp = vtmp + a.Dv;
  for (int hr = r0; hr < r1; hr++) {
    int h = hr / a.T, t = hr % a.T;
    int kvh = h / rep;
    int n = a.causal ? a.L - a.T + t + 1 : a.L;
    const float* q = row_of(a.q + h * a.q_head, a.q_row, a.q_col, t, a.D, qtmp);
    const float* kb = a.k + kvh * a.k_head;
    const float* vb = a.v + kvh * a.v_head;
    float mx = -INFINITY;
    for (int j = 0; j < n; j++) {
      p[j] = dot(q, row_of(kb, a.k_row, a.k_col, j, a.D, ktmp), a.D) * a.scale;
      mx = std::max(mx, p[j]);
    }
    if (a.softcap != 0.f) {
      // The max again over the capped scores, in the same order.
      qmm::softcap_scores(p.data(), n, a.softcap);
      mx = -INFINITY;
      for (int j = 0; j < n; j++) mx = std::max(mx, p[j]);
    }
    float sum = exp_sum(p.data(), n, mx);
    float* o = a.o + ((size_t)t * a.H + h) * a.Dv;
    std::fill(o, o + a.Dv, 0.f);
    for (int j = 0; j < n; j++) {
      const float* vr = row_of(vb, a.v_row, a.v_col, j, a.Dv, vtmp);
      float pj = p[j];
      axpy(pj, vr, o, a.Dv);
    }
    float inv = 1.f / sum;
    for (int d = 0; d < a.Dv; d++) o[d] *= inv;
  }
}

// Head dims the grouped attention (qmm::attn_group_avx512 / _avx2) takes:
// the default model's 64, 128, and Gemma 3's 256.
inline bool grouped_dim(int d) { return d == 64 || d == 128 || d == 256; }

#if defined(SPECD_X86_KERNELS)
// The grouped attention at the CPU's SIMD level (grouped_dim shapes) for
// `rows` query rows of one sequence and kv head (qmm::attn_group_rows_avx512
// / _avx2); `scores` holds heads * (the rows' n summed) floats.
inline void attn_groups(const qmm::AttnGroup* g, int rows, float* scores) {
  if (isa() == Isa::Avx512) {
    // One row: the per-row kernel, which prefetches the cache rows ahead (a
    // batched decode step reads each sequence's cache from memory).
    if (rows == 1 || !qmm::attn_group_rows_avx512(g, rows, scores))
      for (int r = 0; r < rows; r++) {
        qmm::attn_group_avx512(g[r], scores);
        scores += (size_t)g[r].heads * g[r].n;
      }
  } else {
    qmm::attn_group_rows_avx2(g, rows, scores);
  }
}

// Rows [t0, t1) of one sequence over kv head `kvh`, each a copy of `shared`
// (cache, heads, head dim, scale) with its own rows: head h's query and
// output rows of row t at q(t, h) and o(t, h), its keys n(t).
template <class Q, class O, class N>
void attn_block(const qmm::AttnGroup& shared, int kvh, int t0, int t1, Q q, O o, N n,
                Scratch<float>& scores) {
  qmm::AttnGroup g[qmm::kAttnMaxRows];
  size_t need = 0;
  for (int t = t0; t < t1; t++) {
    qmm::AttnGroup& gt = g[t - t0] = shared;
    for (int i = 0; i < shared.heads; i++) {
      gt.q[i] = q(t, kvh * shared.heads + i);
      gt.o[i] = o(t, kvh * shared.heads + i);
    }
    gt.n = n(t);
    need += (size_t)shared.heads * gt.n;
  }
  scores.resize(need);
  attn_groups(g, t1 - t0, scores.data());
}
#endif

// How the grouped attention cuts T query rows of a sequence over Hkv kv
// heads into units: `rows` a unit (they share each read of the cache), up
// to kAttnMaxRows, while there are still units for every thread; `blocks`
// units a kv head. At T = 8 over 3 kv heads on 2 threads: 2 blocks of 4.
struct RowBlocks {
  int rows, blocks;
};
inline RowBlocks row_blocks(int T, int Hkv) {
  if (T == 0) return {1, 0};
  int want = std::max((T + qmm::kAttnMaxRows - 1) / qmm::kAttnMaxRows,
                      std::min(T, (2 * pool().size() + Hkv - 1) / Hkv));
  int rows = (T + want - 1) / want;
  return {rows, (T + rows - 1) / rows};
}

}  // namespace

AttnArgs AttnBody::prepare(const std::vector<mx::array>& in, mx::array& out) const {
  const auto &q = in[0], &k = in[1], &v = in[2];
  return {q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(),
          q.shape(1),      k.shape(1),      q.shape(2),      k.shape(2),
          q.shape(3),      v.shape(3),      q.strides()[1],  q.strides()[2],
          q.strides()[3],  k.strides()[1],  k.strides()[2],  k.strides()[3],
          v.strides()[1],  v.strides()[2],  v.strides()[3],  scale,
          causal,          softcap};
}

void AttnBody::run(const std::vector<mx::array>&, mx::array&, const AttnArgs& a) const {
#if defined(SPECD_X86_KERNELS)
  if (isa() != Isa::Scalar && a.q_col == 1 && a.k_col == 1 && a.v_col == 1 && a.D == a.Dv &&
      grouped_dim(a.D) && a.H / a.Hkv <= qmm::AttnGroup::kMaxHeads) {
    grouped(a);
    return;
  }
#endif
  int rows = a.H * a.T;
  // A row costs ~L*D; below ~64K multiply-adds per call stay on one thread.
  run_ranges(rows, (int64_t)rows * a.L * a.D < 65536, [&](int r0, int r1) {
    thread_local Scratch<float> p;
    attn_rows(a, r0, r1, p);
  });
}

// One unit per (kv head, block of query rows): the query heads sharing
// that kv head, and the block's rows, read each key and value row once.
void AttnBody::grouped(const AttnArgs& a) const {
  int rep = a.H / a.Hkv;
  auto [rb, per_head] = row_blocks(a.T, a.Hkv);
  int units = a.Hkv * per_head;
  run_ranges(units, (int64_t)a.H * a.T * a.L * a.D < 65536, [&](int u0, int u1) {
    thread_local Scratch<float> scores;
    for (int u = u0; u < u1; u++) {
      int kvh = u / per_head, t0 = u % per_head * rb, t1 = std::min(a.T, t0 + rb);
      qmm::AttnGroup shared{};
      shared.heads = rep;
      shared.k = a.k + kvh * a.k_head;
      shared.v = a.v + kvh * a.v_head;
      shared.k_row = a.k_row;
      shared.v_row = a.v_row;
      shared.D = a.D;
      shared.scale = a.scale;
      shared.softcap = a.softcap;
      attn_block(
          shared, kvh, t0, t1, [&](int t, int h) { return a.q + h * a.q_head + t * a.q_row; },
          [&](int t, int h) { return a.o + ((size_t)t * a.H + h) * a.Dv; },
          [&](int t) { return a.causal ? a.L - a.T + t + 1 : a.L; }, scores);
    }
  });
}

// ---- attention over per-sequence caches (continuous batching) -------------------
//
// One op per layer for all the sequences of a step. `y` holds the step's rows
// [1, T, (H + 2 Hkv) * D]: each row's q, k and v, rope applied, as the fused
// q/k/v matmul leaves them. Sequence s owns rows [a_s, a_s + n_s); its cache
// buffers K_s, V_s [1, Hkv, cap_s, D] (contiguous, allocated by `kv_alloc`)
// hold off_s tokens. The op first writes the sequence's new k/v rows at
// off_s.. in place, then computes every row's causal attention over its own
// cache: row t sees keys [0, off_s + t]. Without it a step cost ~15 MLX ops
// per sequence per layer (row slices, head transposes, two slice_updates,
// slices, a concatenate); with it, one op per layer.
//
// Every row runs exactly the arithmetic of AttnBody (the same helpers, keys
// in order, one owner per output row), so a sequence's output does not depend
// on which others share the call, nor on the thread split.

RaggedArgs RaggedAttnBody::prepare(const std::vector<mx::array>& in, mx::array& out) const {
  RaggedArgs r = prepare_caches(in, 1, out);
  r.y = in[0].data<float>();
  r.y_row = in[0].strides()[1];
  if (in[0].strides()[2] != 1) throw std::runtime_error("attention_kv_rows: y must be row-major");
  return r;
}

// Everything but y: the caches are inputs `first`, `first + 1`, ...
RaggedArgs RaggedAttnBody::prepare_caches(const std::vector<mx::array>& in, size_t first,
                                          mx::array& out) const {
  RaggedArgs r;
  for (size_t s = 0; s < seqs.size(); s++) {
    const auto &k = in[first + 2 * s], &v = in[first + 1 + 2 * s];
    for (auto* c : {&k, &v})
      if (!c->flags().row_contiguous || c->data_size() != c->size())
        throw std::runtime_error("attention_kv_rows: cache buffers must be contiguous");
    // The caches are written in place: they are specd's own buffers
    // (KvCache allocates them with kv_alloc and copies before writing
    // while a clone shares them), never another array's data.
    if (half) {
      r.k16.push_back(const_cast<uint16_t*>(reinterpret_cast<const uint16_t*>(k.data<mx::float16_t>())));
      r.v16.push_back(const_cast<uint16_t*>(reinterpret_cast<const uint16_t*>(v.data<mx::float16_t>())));
    } else {
      r.k.push_back(const_cast<float*>(k.data<float>()));
      r.v.push_back(const_cast<float*>(v.data<float>()));
    }
    r.cap.push_back(k.shape(2));
  }
  r.o = out.data<float>();
  return r;
}

void RaggedAttnBody::run(const std::vector<mx::array>&, mx::array&, const RaggedArgs& r) const {
  // The new rows into the caches, before any row reads them.
  for (size_t s = 0; s < seqs.size(); s++) {
    const auto& sp = seqs[s];
    for (int j = 0; j < sp.n; j++) {
      const float* row = r.y + (int64_t)(sp.a + j) * r.y_row;
      for (int h = 0; h < Hkv; h++) {
        int64_t at = ((int64_t)h * r.cap[s] + sp.off + j) * D;
        if (half) {
          to_half(row + (int64_t)(H + h) * D, r.k16[s] + at, D);
          to_half(row + (int64_t)(H + Hkv + h) * D, r.v16[s] + at, D);
          continue;
        }
        std::memcpy(r.k[s] + at, row + (int64_t)(H + h) * D, D * sizeof(float));
        std::memcpy(r.v[s] + at, row + (int64_t)(H + Hkv + h) * D, D * sizeof(float));
      }
    }
  }
  // One unit per (block of a sequence's rows, kv head): the block's rows
  // share each read of the cache (row_blocks; one row a unit on the
  // per-head path). `first[s]` is sequence s's first unit, `rb[s]` its
  // rows per unit.
  std::vector<int> first(seqs.size() + 1, 0), rb(seqs.size());
  int64_t work = 0;
  for (size_t s = 0; s < seqs.size(); s++) {
    RowBlocks b = grouped() ? row_blocks(seqs[s].n, Hkv) : RowBlocks{1, seqs[s].n};
    rb[s] = b.rows;
    first[s + 1] = first[s] + b.blocks * Hkv;
    work += (int64_t)H * seqs[s].n * (seqs[s].off + seqs[s].n) * D;
  }
  int units = first.back();
  // The per-head path reads float rows: a 16-bit cache's rows are widened
  // once a call, every kv head's rows that this call's rows read.
  Widened w;
  if (half && !grouped()) {
    w.k.resize(seqs.size()), w.v.resize(seqs.size());
    for (size_t s = 0; s < seqs.size(); s++) {
      size_t len = (size_t)(seqs[s].off + seqs[s].n) * D;
      w.k[s].resize(Hkv * len), w.v[s].resize(Hkv * len);
      for (int h = 0; h < Hkv; h++) {
        const uint16_t* kh = r.k16[s] + (int64_t)h * r.cap[s] * D;
        const uint16_t* vh = r.v16[s] + (int64_t)h * r.cap[s] * D;
        for (size_t i = 0; i < len; i++) w.k[s][h * len + i] = h2f(kh[i]), w.v[s][h * len + i] = h2f(vh[i]);
      }
    }
  }
  // Below ~64K multiply-adds per call stay on one thread (as AttnBody).
  run_ranges(units, work < 65536, [&](int u0, int u1) {
    thread_local Scratch<float> scratch;
    size_t s = 0;
    for (int u = u0; u < u1; u++) {
      while (u >= first[s + 1]) s++;
      int t0 = (u - first[s]) / Hkv * rb[s], kvh = (u - first[s]) % Hkv;
      unit(r, w, s, t0, std::min(seqs[s].n, t0 + rb[s]), kvh, scratch);
    }
  });
}

// Whether units run the grouped kernel (else the per-head path).
bool RaggedAttnBody::grouped() const {
#if defined(SPECD_X86_KERNELS)
  return isa() != Isa::Scalar && grouped_dim(D) && H / Hkv <= qmm::AttnGroup::kMaxHeads;
#else
  return false;
#endif
}

// Rows [t0, t1) of sequence s, the query heads of kv head `kvh`.
void RaggedAttnBody::unit(const RaggedArgs& r, const Widened& w, size_t s, int t0, int t1,
                          int kvh, Scratch<float>& scratch) const {
  const auto& sp = seqs[s];
  int rep = H / Hkv;
#if defined(SPECD_X86_KERNELS)
  if (grouped()) {
    qmm::AttnGroup shared{};
    shared.heads = rep;
    if (half) {
      shared.k16 = r.k16[s] + (int64_t)kvh * r.cap[s] * D;
      shared.v16 = r.v16[s] + (int64_t)kvh * r.cap[s] * D;
    } else {
      shared.k = r.k[s] + (int64_t)kvh * r.cap[s] * D;
      shared.v = r.v[s] + (int64_t)kvh * r.cap[s] * D;
    }
    shared.k_row = shared.v_row = D;
    shared.D = D;
    shared.scale = scale;
    attn_block(
        shared, kvh, t0, t1,
        [&](int t, int h) { return r.y + (int64_t)(sp.a + t) * r.y_row + (int64_t)h * D; },
        [&](int t, int h) { return r.o + ((size_t)(sp.a + t) * H + h) * D; },
        [&](int t) { return sp.off + t + 1; }, scratch);
    return;
  }
#endif
  // The sequence alone as AttnBody sees it: q [H, n, D] strided in y,
  // keys [Hkv, off + n, D] in its cache (or in its widened copy), causal.
  const float* kp = half ? w.k[s].data() : r.k[s];
  const float* vp = half ? w.v[s].data() : r.v[s];
  int64_t kv_head = half ? (int64_t)(sp.off + sp.n) * D : r.cap[s] * D;
  AttnArgs a{r.y + (int64_t)sp.a * r.y_row,
             kp,
             vp,
             r.o + (size_t)sp.a * H * D,
             H,
             Hkv,
             sp.n,
             sp.off + sp.n,
             D,
             D,
             D,
             r.y_row,
             1,
             kv_head,
             D,
             1,
             kv_head,
             D,
             1,
             scale,
             true};
  for (int t = t0; t < t1; t++)
    for (int i = 0; i < rep; i++) {
      int hr = (kvh * rep + i) * sp.n + t;
      attn_rows(a, hr, hr + 1, scratch);
    }
}

void KvAllocBody::run(const std::vector<mx::array>& in, mx::array& out, int) const {
  std::memset(out.data<void>(), 0, out.nbytes());
  if (!has_old) return;
  if (out.dtype() == mx::float16)
    copy(reinterpret_cast<const uint16_t*>(in[0].data<mx::float16_t>()), in[0],
         reinterpret_cast<uint16_t*>(out.data<mx::float16_t>()), out);
  else
    copy(in[0].data<float>(), in[0], out.data<float>(), out);
}

// The first `keep` positions of `o` (any layout, the out's type) into out.
template <class T>
void KvAllocBody::copy(const T* x, const mx::array& o, T* y, const mx::array& out) const {
  int H = out.shape(1), cap = out.shape(2), D = out.shape(3);
  auto st = o.strides();
  for (int h = 0; h < H; h++)
    for (int j = 0; j < keep; j++) {
      T* dst = y + ((int64_t)h * cap + j) * D;
      const T* src = x + h * st[1] + j * st[2];
      if (st[3] == 1)
        std::memcpy(dst, src, D * sizeof(T));
      else
        for (int d = 0; d < D; d++) dst[d] = src[d * st[3]];
    }
}

}  // namespace specd_mlx
