// bench/bench_support.hpp — what the benchmarks share: one run in a forked child (its time and
// peak memory), a timed loop on every rank of a world, and a row's mean over its iterations.
#pragma once

#include <benchmark/benchmark.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <utility>

namespace meshsim::bench {

using Clock = std::chrono::steady_clock;

// in_child runs `work` (true: it succeeded) once in a forked child: {seconds, peak resident MB,
// the child's ru_maxrss}, or {-1, -1} when it failed, threw or the child could not report.
template <class Work>
std::pair<double, double> in_child(Work work) {
  int fd[2];
  if (pipe(fd) != 0) return {-1, -1};
  const pid_t pid = fork();
  if (pid == 0) {
    close(fd[0]);
    const auto t0 = Clock::now();
    bool ok = false;
    try {
      ok = work();
    } catch (...) {
    }
    double r[2] = {std::chrono::duration<double>(Clock::now() - t0).count(), -1};
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    r[1] = static_cast<double>(ru.ru_maxrss) / 1024.0;
    if (!ok) r[0] = r[1] = -1;
    (void)!write(fd[1], r, sizeof r);
    _exit(0);
  }
  close(fd[1]);
  double r[2] = {-1, -1};
  if (read(fd[0], r, sizeof r) != static_cast<ssize_t>(sizeof r)) r[0] = r[1] = -1;
  close(fd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return {r[0], r[1]};
}

// on_every_rank runs `op` once (a warm-up: first touch of buffers and the group's scratch), then
// `iters` times between two barriers on every rank of `run_spmd(options)`; rank 0's seconds for
// the `iters` calls. A failed run throws its summary.
template <class RunSpmd, class Options, class Op>
double on_every_rank(RunSpmd run_spmd, const Options& options, int64_t iters, Op op) {
  double seconds = 0;
  auto rep = run_spmd(options, [&](auto& ctx) {
    op(ctx);
    ctx.world().barrier();
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < iters; ++i) op(ctx);
    ctx.world().barrier();
    if (ctx.rank() == 0) seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  });
  if (!rep.ok) throw std::runtime_error(rep.summary());
  return seconds;
}

// mean_time runs `once` (its seconds) for every iteration of the row, sets each as the
// iteration's time and returns their mean.
template <class Once>
double mean_time(benchmark::State& state, Once once) {
  double total = 0;
  for (auto _ : state) {
    const double s = once();
    state.SetIterationTime(s);
    total += s;
  }
  return total / static_cast<double>(state.iterations());
}

}  // namespace meshsim::bench
