// The thread pool's workers (kernels_pool.h).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "specd-mlx/src/kernels_pool.h"

namespace specd_mlx {

std::atomic<int> g_waiting{0};

Pool::Pool(int threads) : n_(std::max(1, threads)) {
  for (int i = 1; i < n_; i++) workers_.emplace_back([this] { work(); });
}

Pool::~Pool() {
  {
    std::lock_guard<std::mutex> lk(m_);
    stop_ = true;
    gen_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void Pool::work() {
  // Generation 0 is the pool's birth: a run submitted before this thread
  // got here must still be seen as new.
  uint64_t seen = 0;
  for (;;) {
    idle(seen);
    if (gen_.load() == seen) {
      std::unique_lock<std::mutex> lk(m_);
      sleeping_.fetch_add(1);
      cv_.wait(lk, [&] { return gen_.load() != seen; });
      sleeping_.fetch_sub(1);
    }
    seen = gen_.load();
    if (stop_) return;
    users_.fetch_add(1);
    if (Job* j = cur_.load()) j->drain();
    users_.fetch_sub(1);
  }
}

// Waits up to `kSleepAfter` for a run newer than `seen`: pausing, and
// past `kYieldAfter` yielding while no thread waits on the stream.
void Pool::idle(uint64_t seen) {
  using clock = std::chrono::steady_clock;
  constexpr auto kYieldAfter = std::chrono::microseconds(60);
  constexpr auto kSleepAfter = std::chrono::milliseconds(2);
  const auto t0 = clock::now();
  bool yielding = false;
  for (int spins = 1; gen_.load() == seen; spins++) {
    if (yielding && g_waiting.load(std::memory_order_relaxed) == 0)
      std::this_thread::yield();
    else
      pause();
    if (spins % 64 == 0) {
      auto waited = clock::now() - t0;
      if (waited > kSleepAfter) return;
      yielding = waited > kYieldAfter;
    }
  }
}

// Set by set_kernel_threads before the pool exists (bench --threads); 0: none.
std::atomic<int> g_requested_threads{0};
std::atomic<bool> g_pool_made{false};

namespace {

int default_threads() {
  if (int n = g_requested_threads.load(); n > 0) return n;
  if (const char* s = std::getenv("SPECD_THREADS")) {
    int n = std::atoi(s);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace

Pool& pool() {
  static Pool p = [] {
    g_pool_made = true;
    return Pool(default_threads());
  }();
  return p;
}

// Splits [0, n) into `parts` contiguous ranges, aligned to `align`.
std::pair<int, int> share(int n, int parts, int part, int align) {
  int blocks = (n + align - 1) / align;
  int per = blocks / parts, extra = blocks % parts;
  int b0 = part * per + std::min(part, extra);
  int b1 = b0 + per + (part < extra ? 1 : 0);
  return {std::min(n, b0 * align), std::min(n, b1 * align)};
}

}  // namespace specd_mlx
