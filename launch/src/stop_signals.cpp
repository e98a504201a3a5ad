#include "meshsim/stop_signals.hpp"

namespace meshsim::launch {

namespace {

volatile sig_atomic_t stop_signal = 0;
extern "C" void on_stop_signal(int sig) { stop_signal = sig; }

}  // namespace

StopSignals::StopSignals() {
  stop_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &sa, &old_[i]);
}

StopSignals::~StopSignals() {
  for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &old_[i], nullptr);
}

int StopSignals::caught() { return stop_signal; }

}  // namespace meshsim::launch
