// The SIMD level (kernels_isa.h).
#include <cstdlib>
#include <string>

#include "specd-mlx/src/kernels_isa.h"

namespace specd_mlx {

Isa detect_isa() {
  if (const char* s = std::getenv("SPECD_KERNEL_ISA")) {
    std::string v(s);
    if (v == "scalar") return Isa::Scalar;
    if (v == "avx2") return Isa::Avx2;
  }
#if defined(SPECD_X86_KERNELS)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) return Isa::Avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c"))
    return Isa::Avx2;
#endif
  return Isa::Scalar;
}

}  // namespace specd_mlx
