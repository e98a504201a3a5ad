// meshsim/stop_signals.hpp — SIGINT, SIGTERM and SIGHUP caught while a tool's children run, so
// the tool can forward the stop to them and report, instead of dying with them still running
// (meshsim launch forwards it to every rank, meshsim record to its runner's process group).
//
//   const StopSignals stops;                     // the previous handlers come back at scope end
//   while (...) if (const int sig = StopSignals::caught()) forward(sig);
//
// Thread safety: one StopSignals at a time in a process (the handlers are process-wide);
// caught() is async-signal-safe to read from any thread.
#pragma once

#include <csignal>

namespace meshsim::launch {

class StopSignals {
 public:
  StopSignals();   // clears what was caught before
  ~StopSignals();  // restores the handlers that were there
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // caught: the last of the three signals that arrived since construction, 0 if none.
  static int caught();

 private:
  static constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGHUP};
  struct sigaction old_[3];
};

}  // namespace meshsim::launch
