// stop.hpp — a cooperative stop for work that may run long on a thread of its own (a step's
// simulation, a trace check run for Python, which cannot otherwise be interrupted): the thread
// that runs it installs a flag with StopScope; the work calls check_stop() at the head of its
// long loops, which throws Aborted once the flag is set (by Ctrl-C in the caller's thread, say).
//
//   std::atomic<bool> stop{false};
//   std::thread([&] { meshsim::StopScope s(&stop); run_step(spec); });  // ... stop = true;
#pragma once

#include <atomic>

#include "meshsim/error.hpp"

namespace meshsim {

namespace detail {
inline thread_local const std::atomic<bool>* stop_flag = nullptr;
}  // namespace detail

class StopScope {
 public:
  explicit StopScope(const std::atomic<bool>* flag) : previous_(detail::stop_flag) { detail::stop_flag = flag; }
  ~StopScope() { detail::stop_flag = previous_; }
  StopScope(const StopScope&) = delete;
  StopScope& operator=(const StopScope&) = delete;

 private:
  const std::atomic<bool>* previous_;
};

// check_stop throws Aborted when this thread's work was asked to stop; otherwise it costs a
// thread-local load.
inline void check_stop() {
  if (detail::stop_flag && detail::stop_flag->load(std::memory_order_relaxed)) {
    throw Aborted("stopped before its end: the caller was interrupted (Ctrl-C)");
  }
}

}  // namespace meshsim
