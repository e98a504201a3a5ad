// meshsim step at the size of real jobs: one torchtitan step of llama3-70b (pp=16, tp=8,
// dp_shard = the rest, 32 microbatches of 1 x 8192 tokens, 1F1B, bytes per link over 8-GPU hosts)
// checked for 2^10 .. 2^17 ranks, each run in a forked child for its time and peak resident
// memory (peak_MB: the child's ru_maxrss, the benchmark's own few MB included).
//   StepByClass/N  the default check: one program per pp rank, each group kind once, one
//                  pipeline group simulated; bytes per link over every rank's groups
//   StepExact/N    --ranks all: every rank simulated, every group compared (to 2^14)
// docs/performance.md reports the times as ratios to StepByClass/10 of the same run.
#include <benchmark/benchmark.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>

#include "meshsim/preset.hpp"
#include "meshsim/step_job.hpp"
#include "meshsim/step_program.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using namespace meshsim::step;

Job job_of(int log2) {
  Job j;
  const int64_t world = int64_t{1} << log2;
  j.parallel = titan_parallel(meshsim::preset::torchtitan_views({16, 1, world / 16 / 8, 1, 8, 1, "spmd_types"}, std::nullopt));
  j.model = builtin_model("llama3-70b");
  j.seq_len = 8192;
  j.local_batch_size = 1;
  j.microbatches = 32;
  return j;
}

// in_child checks the step once in a forked child: {seconds, peak MB}, or {-1, -1} on failure.
std::pair<double, double> in_child(const Job& job, const Options& o) {
  int fd[2];
  if (pipe(fd) != 0) return {-1, -1};
  const pid_t pid = fork();
  if (pid == 0) {
    close(fd[0]);
    const auto t0 = Clock::now();
    bool ok = false;
    try {
      ok = check_step(job, o).ok;
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

void run(benchmark::State& state, bool exact) {
  const int log2 = static_cast<int>(state.range(0));
  const Job job = job_of(log2);
  Options o;
  o.gpus_per_host = 8;
  o.all_ranks = exact;
  double peak = 0;
  for (auto _ : state) {
    auto [s, mb] = in_child(job, o);
    if (s < 0) {
      state.SkipWithError("the step check failed");
      break;
    }
    state.SetIterationTime(s);
    peak = std::max(peak, mb);
  }
  state.counters["ranks"] = static_cast<double>(int64_t{1} << log2);
  state.counters["peak_MB"] = peak;
}

void StepByClass(benchmark::State& state) { run(state, false); }
void StepExact(benchmark::State& state) { run(state, true); }

BENCHMARK(StepByClass)->DenseRange(10, 17)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(StepExact)->DenseRange(10, 14, 2)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
