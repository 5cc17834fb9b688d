// What several of the kernels' sections share: scratch rows on cache
// lines, float16 conversions, and the RMS norm row and rotary embedding
// that a fused op and the op alone both use, so both round identically
// (kernels_common.cc).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include "mlx/array.h"
#include "specd-mlx/src/kernels_isa.h"
#include "specd-mlx/src/kernels_pool.h"

namespace specd_mlx {
namespace mx = mlx::core;

// Scratch rows (a fused op's intermediates, attention scores, prepared
// activations) on cache lines, as kernel outputs are (pages.cc
// `aligned_data`): std::vector's malloc gives 16 bytes, and a 64-byte
// vector at 16 past a line is two loads.
template <class T>
struct LineAligned {
  using value_type = T;
  LineAligned() = default;
  template <class U>
  LineAligned(const LineAligned<U>&) {}
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64)));
  }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  template <class U>
  bool operator==(const LineAligned<U>&) const {
    return true;
  }
};
template <class T>
using Scratch = std::vector<T, LineAligned<T>>;

inline float h2f(uint16_t h) {
  mx::float16_t f;
  std::memcpy(&f, &h, 2);
  return static_cast<float>(f);
}

void to_half(const float* x, uint16_t* y, int n);
void rms_norm_row(const float* xr, int64_t col, const float* w, int D, float eps, float* yr);

// MLX's `fast::rope` periods (`freqs`: 1 / frequency) for `dims` rotated
// values at `base`, each frequency divided by its factor (see Rope).
inline mx::array rope_periods(int dims, float base, const std::vector<float>& factors) {
  int half = dims / 2;
  std::vector<float> p(half);
  float step = std::log(base) / half;
  for (int i = 0; i < half; i++) p[i] = std::exp(float(i) * step) * factors[i];
  return mx::array(p.data(), {half}, mx::float32);
}

// Rotary embedding of head rows at one position, shared by the rope op and
// the rope folded into the q/k/v matmul so both round identically. The angle
// is computed per (position, frequency) exactly as MLX's fallback does:
// theta = (pos * scale) * exp(-i * log(base) / half).
//
// `factors` (half of them, or empty) divide the frequencies, as llama.cpp
// applies a GGUF's `rope_freqs` and as Llama 3's, Phi-3's and YaRN's
// scalings come out: theta = (pos * scale) * (exp(-i * log(base) / half) / f_i).
struct Rope {
  int dims, half;
  bool traditional;
  float base, scale;
  std::vector<float> cs, sn;
  // The divided frequencies, where `factors` were given.
  std::vector<float> scaled;
  Rope(int dims, bool traditional, float base, float scale, const std::vector<float>& factors = {})
      : dims(dims), half(dims / 2), traditional(traditional), base(base), scale(scale),
        cs(half), sn(half) {
    if (!factors.empty()) {
      const auto& f = freq();
      scaled.resize(half);
      for (int i = 0; i < half; i++) scaled[i] = f[i] / factors[i];
    }
  }
  // The frequencies depend on (dims, base) only: computed once per thread.
  const std::vector<float>& freq() const {
    thread_local std::vector<float> f;
    thread_local int f_dims = -1;
    thread_local float f_base = 0.f;
    if (f_dims != dims || f_base != base) {
      float step = std::log(base) / half;
      f.resize(half);
      for (int i = 0; i < half; i++) f[i] = std::exp(-float(i) * step);
      f_dims = dims, f_base = base;
    }
    return f;
  }
  void at(int position) {
    const auto& f = scaled.empty() ? freq() : scaled;
    float pos = float(position) * scale;
    for (int i = 0; i < half; i++) {
      float theta = pos * f[i];
      cs[i] = std::cos(theta);
      sn[i] = std::sin(theta);
    }
  }
  // y = rope(x) over one head of D values (x's values `col` apart); y may be x.
  void row(const float* x, int64_t col, float* y, int D) const {
    for (int i = 0; i < half; i++) {
      int i1 = traditional ? 2 * i : i, i2 = traditional ? 2 * i + 1 : i + half;
      float x1 = x[i1 * col], x2 = x[i2 * col];
      y[i1] = x1 * cs[i] - x2 * sn[i];
      y[i2] = x1 * sn[i] + x2 * cs[i];
    }
    for (int i = dims; i < D; i++) y[i] = x[i * col];
  }
};

}  // namespace specd_mlx
