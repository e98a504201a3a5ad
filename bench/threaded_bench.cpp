// The threaded backend against memory speed, and the main job's cost as the world grows.
//
//   AllReduceLatency/<ranks>      8-byte int64 sum all_reduce over the world, per call
//   AllReduceBandwidth/<ranks>    64 MiB float32 sum all_reduce over the world
//   Memcpy/<bytes>                one thread copying the same bytes (the baseline)
//   MeshsimRun/<ranks>            `meshsim run` over dp x cp x tp meshes of 64, 256, 1024 ranks
//   LocalRun/<log2 world>         `meshsim run --backend local` at 2^10 .. 2^24 ranks
//
// Each bandwidth row also measures memcpy itself in the same process, right before, and reports
//   memcpy_GBps  min(ranks, cores) threads each copying 64 MiB at once (aggregate bytes/s);
//   algbw_GBps   world x 64 MiB / time: every rank's buffer read once and written once, which is
//                what the least a shared-memory all_reduce moves (one memcpy's worth per rank);
//   vs_memcpy    algbw_GBps / memcpy_GBps: the share of what memcpy on the cores the ranks can
//                use allows for those bytes. Target: >= 0.5.
// Times are the ranks' own (threads started before, manual timing), so thread start-up is not in
// the collective numbers; MeshsimRun is wall time of the whole job, start-up included.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>
#include <vector>

#include "meshsim/run.hpp"
#include "meshsim/spmd.hpp"

namespace {

using namespace meshsim;
using Clock = std::chrono::steady_clock;

SpmdOptions world_of(int64_t n) {
  SpmdOptions o;
  o.world_size = n;
  o.timeout = std::chrono::seconds(120);
  return o;
}

// time_on_ranks runs `iters` calls of `op` on every rank; returns rank 0's seconds from a
// barrier before the first call to a barrier after the last.
template <typename Op>
double time_on_ranks(int64_t ranks, int64_t iters, Op op) {
  double seconds = 0;
  RunReport rep = run_spmd(world_of(ranks), [&](RankContext& ctx) {
    op(ctx);  // warm-up: first-touch of buffers and the group's scratch
    ctx.world().barrier();
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < iters; ++i) op(ctx);
    ctx.world().barrier();
    if (ctx.rank() == 0) seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  });
  if (!rep.ok) throw std::runtime_error(rep.summary());
  return seconds;
}

void AllReduceLatency(benchmark::State& state) {
  const int64_t ranks = state.range(0);
  const int64_t iters = 2000;
  for (auto _ : state) {
    const double s = time_on_ranks(ranks, iters, [](RankContext& ctx) {
      int64_t v = ctx.rank();
      ctx.world().all_reduce(std::span<int64_t>(&v, 1), ReduceOp::kSum);
      benchmark::DoNotOptimize(v);
    });
    state.SetIterationTime(s / static_cast<double>(iters));
  }
  state.counters["ranks"] = static_cast<double>(ranks);
}

constexpr std::size_t kBig = std::size_t{64} << 20;

// memcpy_gbps is the aggregate rate of `threads` threads each copying its own 64 MiB at once
// (best of 5).
double memcpy_gbps(int threads) {
  std::vector<std::vector<char>> a(static_cast<std::size_t>(threads)), b(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i].assign(kBig, 1);
    b[i].assign(kBig, 2);
  }
  double best = 1e9;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    std::vector<std::thread> ts;
    for (std::size_t i = 0; i < a.size(); ++i) {
      ts.emplace_back([&, i] {
        std::memcpy(b[i].data(), a[i].data(), kBig);
        benchmark::DoNotOptimize(b[i].data());
      });
    }
    for (auto& t : ts) t.join();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return static_cast<double>(kBig) * threads / best / 1e9;
}

void AllReduceBandwidth(benchmark::State& state) {
  const int64_t ranks = state.range(0);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const double memcpy = memcpy_gbps(static_cast<int>(std::min<int64_t>(ranks, cores)));
  const int64_t iters = 3;
  double total = 0;
  for (auto _ : state) {
    const double s = time_on_ranks(ranks, iters, [](RankContext& ctx) {
      // Each rank thread's buffer, filled by the untimed warm-up call.
      thread_local std::vector<float> buf;
      if (buf.empty()) buf.assign(kBig / sizeof(float), 1.0f);
      ctx.world().all_reduce(std::span<float>(buf), ReduceOp::kSum);
    });
    const double per = s / static_cast<double>(iters);
    state.SetIterationTime(per);
    total += per;
  }
  const double per = total / static_cast<double>(state.iterations());
  const double algbw = static_cast<double>(ranks) * static_cast<double>(kBig) / per / 1e9;
  state.counters["ranks"] = static_cast<double>(ranks);
  state.counters["memcpy_GBps"] = memcpy;
  state.counters["algbw_GBps"] = algbw;
  state.counters["vs_memcpy"] = algbw / memcpy;
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * ranks * static_cast<int64_t>(kBig));
}

void Memcpy(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<char> a(bytes, 1), b(bytes, 2);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), bytes);
    benchmark::DoNotOptimize(b.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}

void MeshsimRun(benchmark::State& state) {
  const int64_t ranks = state.range(0);
  run::Options o;
  o.recipe.mesh = ranks == 64 ? "dp=4,cp=4,tp=4" : ranks == 256 ? "dp=4,cp=8,tp=8" : "dp=8,cp=8,tp=16";
  o.format = "json";
  for (auto _ : state) {
    std::ostringstream out;
    if (run::run(o, out) != 0) {
      state.SkipWithError("meshsim run failed");
      break;
    }
  }
  state.counters["ranks"] = static_cast<double>(ranks);
}

// LocalRun: `meshsim run --backend local` over (dp, cp=16, tp) meshes of 2^10 .. 2^24 ranks; the
// cost per rank must stay flat as the world grows (compare ns_per_rank across rows of one run).
void LocalRun(benchmark::State& state) {
  const int log2 = static_cast<int>(state.range(0));
  const int64_t world = int64_t{1} << log2;
  const int64_t tp = std::min<int64_t>(1024, world / 16);
  run::Options o;
  o.recipe.mesh = "dp=" + std::to_string(world / 16 / tp) + ",cp=16,tp=" + std::to_string(tp);
  o.backend = "local";
  for (auto _ : state) {
    std::ostringstream out;
    if (run::run(o, out) != 0) {
      state.SkipWithError("meshsim run --backend local failed");
      break;
    }
  }
  state.counters["ranks"] = static_cast<double>(world);
  state.counters["ns_per_rank"] = benchmark::Counter(
      static_cast<double>(world) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

BENCHMARK(Memcpy)->Arg(8)->Arg(kBig)->Unit(benchmark::kMicrosecond);
BENCHMARK(AllReduceLatency)->Arg(2)->Arg(4)->Arg(8)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(3);
BENCHMARK(AllReduceBandwidth)->Arg(2)->Arg(4)->Arg(8)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(2);
BENCHMARK(MeshsimRun)->Arg(64)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(LocalRun)->DenseRange(10, 20, 2)->Arg(24)->Unit(benchmark::kMillisecond)->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
