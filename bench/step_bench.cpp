// meshsim step at the size of real jobs: one torchtitan step of llama3-70b (pp=16, tp=8,
// dp_shard = the rest, 32 microbatches of 1 x 8192 tokens, 1F1B, bytes per link over 8-GPU hosts)
// checked for 2^10 .. 2^17 ranks, each run in a forked child for its time and peak resident
// memory (peak_MB: the child's ru_maxrss, the benchmark's own few MB included).
//   StepByClass/N  the default check: one program per pp rank, each group kind once, one
//                  pipeline group simulated; bytes per link over every rank's groups
//   StepExact/N    --ranks all: every rank simulated, every group compared (to 2^14)
// docs/performance.md reports the times as ratios to StepByClass/10 of the same run.
#include <benchmark/benchmark.h>

#include <chrono>

#include "bench_support.hpp"
#include "meshsim/preset.hpp"
#include "meshsim/step_job.hpp"
#include "meshsim/step_program.hpp"

namespace {

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

void run(benchmark::State& state, bool exact) {
  const int log2 = static_cast<int>(state.range(0));
  const Job job = job_of(log2);
  Options o;
  o.gpus_per_host = 8;
  o.all_ranks = exact;
  double peak = 0;
  for (auto _ : state) {
    auto [s, mb] = meshsim::bench::in_child([&] { return check_step(job, o).ok; });
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
