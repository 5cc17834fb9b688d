// Packed weights on 2 MB pages (transparent huge pages, where the kernel
// offers them).
#pragma once
#include "mlx/array.h"

namespace specd_mlx {

// A zeroed array of `shape` x `dtype` that the model keeps for its lifetime
// (packed weights). A step streams every weight once: on 4 KB pages that is
// ~25K pages per token for the default model, and each TLB miss is a page
// walk (nested, under a hypervisor) that the matmul waits on.
mlx::core::array weight_array(const mlx::core::Shape& shape, mlx::core::Dtype dtype);

// `bytes` of uninitialized memory for a kernel's output, its data 64-byte
// aligned (MLX's CPU allocator gives malloc's 16 bytes plus its 8-byte
// header, so every 64-byte vector of a KV cache row or an activation row
// straddles two cache lines and costs two loads).
mlx::core::allocator::Data aligned_data(size_t bytes);

}  // namespace specd_mlx
