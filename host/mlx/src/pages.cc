// Weights are carved from 2 MB-aligned mappings advised MADV_HUGEPAGE, so
// the kernel backs them with huge pages when THP is `always` or `madvise`
// (Debian's default is `madvise`: plain malloc never gets them). Small
// tensors (a layer's matrix is ~0.2-0.6 MB) share a chunk; a mapping is
// unmapped when the last array carved from it is freed, so unloading a
// model returns its memory.
#include "specd-mlx/src/pages.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>

#include "mlx/allocator.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace specd_mlx {
namespace mx = mlx::core;

namespace {

constexpr size_t kHuge = size_t{2} << 20;
constexpr size_t kChunk = size_t{32} << 20;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Zeroed memory of `size` bytes (a multiple of kHuge), 2 MB aligned.
struct Mapping {
  char* base = nullptr;
  size_t size = 0;
  explicit Mapping(size_t bytes) : size(bytes) {
#if defined(__linux__)
    // Over-map by one huge page and trim both ends to the alignment.
    void* m = mmap(nullptr, size + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    char* raw = static_cast<char*>(m);
    base = reinterpret_cast<char*>(round_up(reinterpret_cast<uintptr_t>(raw), kHuge));
    if (base > raw) munmap(raw, base - raw);
    if (size_t tail = raw + size + kHuge - (base + size)) munmap(base + size, tail);
    // Advice only: without THP the pages stay 4 KB and nothing else changes.
    madvise(base, size, MADV_HUGEPAGE);
#else
    base = static_cast<char*>(::operator new(size, std::align_val_t(kHuge)));
    std::memset(base, 0, size);
#endif
  }
  ~Mapping() {
#if defined(__linux__)
    munmap(base, size);
#else
    ::operator delete(base, std::align_val_t(kHuge));
#endif
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
};

std::mutex chunk_mutex;
// The chunk small tensors are carved from, while any array in it lives
// (once they are all freed, the next tensor starts a new one).
std::weak_ptr<Mapping> chunk;
size_t chunk_used = 0;

// Whether an array can own memory carved here: MLX's CPU buffers are a
// size_t header followed by the data (Buffer::raw_ptr skips the header), so
// a carved buffer is laid out the same. Checked once against the linked MLX;
// where it differs, weights take MLX's own allocation (4 KB pages).
bool carved_buffers_fit() {
  static const bool fit = [] {
    mx::allocator::Buffer b = mx::allocator::allocator().malloc(64);
    bool ok = b.ptr() && b.raw_ptr() == static_cast<char*>(b.ptr()) + sizeof(size_t);
    mx::allocator::allocator().free(b);
    return ok;
  }();
  return fit;
}

}  // namespace

mx::array weight_array(const mx::Shape& shape, mx::Dtype dtype) {
  size_t bytes = dtype.size();
  for (int d : shape) bytes *= static_cast<size_t>(d);
  if (!carved_buffers_fit()) {
    mx::array a(mx::allocator::malloc(bytes), shape, dtype);
    std::memset(a.data<char>(), 0, bytes);
    return a;
  }
  // 64 bytes ahead of the data hold its header; the data stays 64-aligned.
  const size_t slot = round_up(bytes, 64) + 64;
  std::shared_ptr<Mapping> owner;
  char* at;
  if (slot > kChunk / 4) {
    owner = std::make_shared<Mapping>(round_up(slot, kHuge));
    at = owner->base;
  } else {
    std::lock_guard<std::mutex> lk(chunk_mutex);
    owner = chunk.lock();
    if (!owner || chunk_used + slot > owner->size) {
      owner = std::make_shared<Mapping>(kChunk);
      chunk = owner;
      chunk_used = 0;
    }
    at = owner->base + chunk_used;
    chunk_used += slot;
  }
  char* header = at + 64 - sizeof(size_t);
  *reinterpret_cast<size_t*>(header) = bytes;
  // The deleter holds the mapping: it goes with the last array in it.
  mx::allocator::Data data(mx::allocator::Buffer(header),
                           [owner](mx::allocator::Buffer) {});
  return mx::array(std::move(data), shape, dtype);
}

mx::allocator::Data aligned_data(size_t bytes) {
  if (!carved_buffers_fit()) return mx::allocator::malloc(bytes);
  // One cache line ahead of the data holds its header, as in weight_array.
  char* base = static_cast<char*>(std::aligned_alloc(64, round_up(bytes, 64) + 64));
  if (!base) throw std::bad_alloc();
  char* header = base + 64 - sizeof(size_t);
  *reinterpret_cast<size_t*>(header) = bytes;
  return mx::allocator::Data(mx::allocator::Buffer(header),
                             [base](mx::allocator::Buffer) { std::free(base); });
}

}  // namespace specd_mlx
