// Threads blocked on the CPU stream's results (an eval, a read back), counted
// so that the kernels' idle pool workers can tell whether the thread that
// builds and dispatches graphs is working, and needs a core (kernels_pool.h).
#pragma once

namespace specd_mlx {

void begin_waiting();
void end_waiting();

// Counts the calling thread as waiting for the stream while in scope.
struct Waiting {
  Waiting() { begin_waiting(); }
  ~Waiting() { end_waiting(); }
  Waiting(const Waiting&) = delete;
  Waiting& operator=(const Waiting&) = delete;
};

}  // namespace specd_mlx
