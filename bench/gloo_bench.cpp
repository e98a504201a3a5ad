// Gloo against the threaded backend, in one run, and what connecting Gloo ranks costs.
//
//   AllReduceLatency/<backend>/<ranks>    8-byte int64 sum all_reduce over the world, per call
//   AllReduceBandwidth/<backend>/<ranks>  16 MiB float32 sum all_reduce over the world
//   Connect/<ranks>                       a world of Gloo rank threads connected and torn down
//
// backend: 0 threaded, 1 gloo (meshsim's agreement check off: raw Gloo), 2 gloo with the check
// (the default: one small all-gather before each collective). Every Gloo row also measures the
// threaded backend on the same call right before it, and reports
//   threaded_us / threaded_GBps  the baseline, measured in the same process;
//   vs_threaded                  gloo time / threaded time (latency) or gloo GB/s / threaded GB/s
//                                (bandwidth).
// Connect reports run_s (every rank connected, one barrier, every context destroyed: wall time)
// and connect_s (time in connectFullMesh, averaged over ranks).
#include <benchmark/benchmark.h>

#include <chrono>
#include <vector>

#include "bench_support.hpp"
#include "meshsim/gloo_backend.hpp"
#include "meshsim/spmd.hpp"

namespace {

using namespace meshsim;
using Clock = std::chrono::steady_clock;

SpmdOptions options(int64_t ranks, int backend) {
  SpmdOptions o;
  o.world_size = ranks;
  o.timeout = std::chrono::seconds(120);
  o.backend = backend == 0 ? "threaded" : "gloo";
  if (backend != 0) o.backend_options = GlooBackend::Options{.verify = backend == 2};
  return o;
}

// per_call runs `iters` calls of `op` on every rank; returns rank 0's seconds per call, from a
// barrier before the first timed call to a barrier after the last.
template <typename Op>
double per_call(int64_t ranks, int backend, int64_t iters, Op op) {
  return bench::on_every_rank(run_spmd, options(ranks, backend), iters, op) / static_cast<double>(iters);
}

void small(RankContext& ctx) {
  int64_t v = ctx.rank();
  ctx.world().all_reduce(std::span<int64_t>(&v, 1), ReduceOp::kSum);
  benchmark::DoNotOptimize(v);
}

constexpr std::size_t kBytes = std::size_t{16} << 20;

void big(RankContext& ctx) {
  thread_local std::vector<float> buf;
  if (buf.empty()) buf.assign(kBytes / sizeof(float), 1.0f);
  std::fill(buf.begin(), buf.begin() + 16, 1.0f);
  ctx.world().all_reduce(std::span<float>(buf), ReduceOp::kSum);
}

void AllReduceLatency(benchmark::State& state) {
  const int backend = static_cast<int>(state.range(0));
  const int64_t ranks = state.range(1);
  const int64_t iters = backend == 0 ? 2000 : 200;
  const double base = backend == 0 ? 0 : per_call(ranks, 0, 2000, small);
  const double mean = bench::mean_time(state, [&] { return per_call(ranks, backend, iters, small); });
  state.counters["ranks"] = static_cast<double>(ranks);
  state.counters["us"] = mean * 1e6;
  if (backend != 0) {
    state.counters["threaded_us"] = base * 1e6;
    state.counters["vs_threaded"] = mean / base;
  }
}

void AllReduceBandwidth(benchmark::State& state) {
  const int backend = static_cast<int>(state.range(0));
  const int64_t ranks = state.range(1);
  const int64_t iters = 3;
  auto gbps = [&](double s) { return static_cast<double>(ranks) * static_cast<double>(kBytes) / s / 1e9; };
  const double base = backend == 0 ? 0 : per_call(ranks, 0, iters, big);
  const double mean = bench::mean_time(state, [&] { return per_call(ranks, backend, iters, big); });
  state.counters["ranks"] = static_cast<double>(ranks);
  state.counters["algbw_GBps"] = gbps(mean);
  if (backend != 0) {
    state.counters["threaded_GBps"] = gbps(base);
    state.counters["vs_threaded"] = gbps(mean) / gbps(base);
  }
}

void Connect(benchmark::State& state) {
  const int64_t ranks = state.range(0);
  double connect = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    RunReport rep = run_spmd(options(ranks, 1), [](RankContext& ctx) { ctx.world().barrier(); });
    if (!rep.ok) {
      state.SkipWithError(rep.summary().c_str());
      break;
    }
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - t0).count());
    connect += rep.connect_seconds / static_cast<double>(ranks);
  }
  state.counters["ranks"] = static_cast<double>(ranks);
  state.counters["connect_s"] = connect / static_cast<double>(std::max<int64_t>(1, state.iterations()));
}

}  // namespace

BENCHMARK(AllReduceLatency)->ArgsProduct({{0, 1, 2}, {2, 4, 8}})->UseManualTime()->Iterations(3)->Unit(benchmark::kMicrosecond);
BENCHMARK(AllReduceBandwidth)->ArgsProduct({{0, 1}, {2, 4, 8}})->UseManualTime()->Iterations(2)->Unit(benchmark::kMillisecond);
BENCHMARK(Connect)->Arg(8)->Arg(32)->Arg(64)->UseManualTime()->Iterations(2)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
