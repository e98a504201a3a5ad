// rank_threads.hpp (private to sim/) — the runner's rank threads: each with the stack the run
// asks for, and how many this process can start before it tries.
#pragma once

#include <pthread.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace meshsim::detail {

// RankThread is one rank's thread with a given stack size (std::thread has no way to ask for
// one; a rank program needs far less than the 8 MiB default, and 16,384 of those reserve 128 GiB).
class RankThread {
 public:
  RankThread() = default;
  RankThread(RankThread&& o) noexcept : id_(o.id_), joinable_(o.joinable_) { o.joinable_ = false; }
  RankThread& operator=(RankThread&&) = delete;
  ~RankThread();  // a joinable thread is detached: the runner decides, never a terminate
  // start runs fn on a new thread; false (errno in *error) when the system refuses one.
  bool start(std::function<void()> fn, std::size_t stack_bytes, int* error);
  bool joinable() const { return joinable_; }
  void join();
  void detach();

 private:
  pthread_t id_{};
  bool joinable_ = false;
};

// ThreadLimit is how many more threads with `stack_bytes` stacks this process may start, and
// the limit that binds ("/proc/sys/kernel/threads-max", "RLIMIT_NPROC", "cgroup pids.max",
// "RLIMIT_AS", "memory"), with the numbers behind it for an error message.
struct ThreadLimit {
  int64_t threads = 0;
  std::string bound;
  std::string detail;
};
// kThreadCommit is what one rank thread commits besides its program's own data: its kernel
// stack, the pages of its user stack it touches, its TLS and the runner's bookkeeping (measured:
// 16,384 rank threads of `meshsim run` take about 24 KiB each; this leaves room).
inline constexpr uint64_t kThreadCommit = 64 * 1024;
ThreadLimit rank_thread_limit(std::size_t stack_bytes);

}  // namespace meshsim::detail
