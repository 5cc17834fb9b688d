// The SIMD level the kernels run at, chosen once per process from the
// CPU's features (kernels_isa.cc) or `SPECD_KERNEL_ISA`.
#pragma once

namespace specd_mlx {

// ---- SIMD level ---------------------------------------------------------------

enum class Isa { Scalar, Avx2, Avx512 };

Isa detect_isa();

inline Isa isa() {
  static Isa i = detect_isa();
  return i;
}

}  // namespace specd_mlx
