// The kernels' thread pool: `pool().run` splits a call into chunks that the
// caller and the workers claim (the workers' side is kernels_pool.cc).
#pragma once
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace specd_mlx {

// ---- thread pool --------------------------------------------------------------
//
// Decode calls a kernel a few hundred times per token, tens of microseconds
// apart, so workers spin briefly before sleeping: a condition-variable wake
// per call would cost more than many of the calls themselves.
//
// A spinning worker holds a core, though, and three threads share the
// cores: the stream's (the caller of every kernel), the worker's and the
// engine's, which builds graphs, dispatches them and reads results. Unless
// the engine is blocked on the stream (`Waiting`, waiting.h), a worker idle
// for `kYieldAfter` yields its core at each turn of its wait instead of
// only pausing, so the engine's work runs beside the kernels' rather than
// after the scheduler takes the core back from a spinner. A shorter wait
// keeps spinning: within a forward the calls come microseconds apart, and a
// yield would delay the next pickup. Measured on 2 cores (int8, `bench serve
// --concurrency 1,8`, 3 runs each alternated): 8 streams 620-683 ->
// 682-727 tok/s, one stream unchanged (241-258 / 239-248); yielding from the
// first idle turn gave 8 streams as much but cost one stream 3-4%.
//
// A call is split into more chunks than threads and every participant
// (the caller included) claims chunks until none are left. The caller never
// waits for a worker to show up, only for chunks already claimed: on a busy
// machine a descheduled worker costs nothing but its own absence.
extern std::atomic<int> g_waiting;

class Pool {
 public:
  explicit Pool(int threads);
  ~Pool();
  int size() const { return n_; }

  // Runs f(0..chunks-1) across the pool; returns when all are done.
  template <class F>
  void run(int chunks, F&& f) {
    if (chunks <= 1 || n_ == 1) {
      for (int c = 0; c < chunks; c++) f(c);
      return;
    }
    std::lock_guard<std::mutex> serial(submit_);
    auto call = [&](int c) { f(c); };
    Job job{[](void* ctx, int c) { (*static_cast<decltype(call)*>(ctx))(c); }, &call, chunks};
    cur_.store(&job);
    gen_.fetch_add(1);
    if (sleeping_.load() > 0) {
      std::lock_guard<std::mutex> lk(m_);
      cv_.notify_all();
    }
    job.drain();
    for (int spins = 0; job.done.load() < chunks; spins++) backoff(spins);
    // A worker that picked up `job` may still be looking at it.
    cur_.store(nullptr);
    for (int spins = 0; users_.load() > 0; spins++) backoff(spins);
  }

 private:
  struct Job {
    void (*fn)(void*, int);
    void* ctx;
    int total;
    std::atomic<int> next{0}, done{0};
    void drain() {
      for (int c; (c = next.fetch_add(1)) < total;) {
        fn(ctx, c);
        done.fetch_add(1);
      }
    }
  };
  static void pause() {
#if defined(__x86_64__)
    _mm_pause();
#else
    std::this_thread::yield();
#endif
  }
  static void backoff(int spins) {
    if (spins < 2000)
      pause();
    else
      std::this_thread::yield();
  }
  void work();
  void idle(uint64_t seen);

  int n_;
  std::vector<std::thread> workers_;
  std::mutex submit_, m_;
  std::condition_variable cv_;
  std::atomic<uint64_t> gen_{0};
  std::atomic<int> sleeping_{0}, users_{0};
  std::atomic<Job*> cur_{nullptr};
  std::atomic<bool> stop_{false};
};

// Set by set_kernel_threads before the pool exists (bench --threads); 0: none.
extern std::atomic<int> g_requested_threads;
extern std::atomic<bool> g_pool_made;

Pool& pool();

// Splits [0, n) into `parts` contiguous ranges, aligned to `align`.
std::pair<int, int> share(int n, int parts, int part, int align);

// f(first, end) over the items [0, n) on the pool: one range when `alone`
// (too little work to be worth a second thread), else up to 4 ranges a
// thread, so a thread that finishes early takes another.
template <class F>
void run_ranges(int n, bool alone, F f) {
  int chunks = alone ? 1 : std::min(4 * pool().size(), n);
  pool().run(chunks, [&](int i) {
    auto [first, end] = share(n, chunks, i, 1);
    f(first, end);
  });
}

}  // namespace specd_mlx
