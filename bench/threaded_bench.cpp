// The threaded backend against memory speed, and the main job's cost as the world grows.
//
//   AllReduceLatency/<ranks>      8-byte int64 sum all_reduce over the world, per call
//   AllReduceBandwidth/ranks:<n>/aligned:<0|1>  64 MiB float32 sum all_reduce over the world, the
//                                 ranks' buffers staggered across 2 MiB, or each at a 2 MiB boundary
//   Memcpy/<bytes>                one thread copying the same bytes (the baseline)
//   MeshsimRun/<ranks>            `meshsim run` over dp x cp x tp meshes of 64, 256, 1024 ranks
//   LocalRun/<log2 world>         `meshsim run --backend local` at 2^6 .. 2^24 ranks
//   ThreadedRun/<log2 world>      the same job over rank threads at 2^6 .. 2^14 (16,384: the most
//                                 one process runs)
//   FiberRun/<log2 world>         the same job with every rank a fiber of one thread, 2^6 .. 2^16
//
// LocalRun, ThreadedRun and FiberRun run each job once in a forked child and report its peak resident
// memory (peak_MB, the child's ru_maxrss: the benchmark process's own few MB included) and
// ns_per_rank; rows of one run compare the three modes at equal worlds.
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
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <sstream>
#include <thread>
#include <vector>


#include "bench_support.hpp"
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


void AllReduceLatency(benchmark::State& state) {
  const int64_t ranks = state.range(0);
  const int64_t iters = 2000;
  for (auto _ : state) {
    const double s = bench::on_every_rank(run_spmd, world_of(ranks), iters, [](RankContext& ctx) {
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

// RankBuffers are the ranks' 64 MiB buffers, placed on purpose: where several large buffers
// start at the same offset modulo 2 MiB (transparent huge pages map them so), the same offset in
// each falls in the same cache sets, and the all_reduce below ran about 1.35x slower for it. Left
// to malloc, that placement depended on unrelated allocations (it changed with the backend's
// own), so each row fixes it: `aligned` puts every buffer at a 2 MiB boundary (as a caching
// allocator's large blocks are), the other rows stagger them evenly across 2 MiB.
class RankBuffers {
 public:
  static constexpr std::size_t kHuge = std::size_t{2} << 20;
  RankBuffers(int64_t ranks, bool aligned) {
    const auto n = static_cast<std::size_t>(ranks);
    const std::size_t stagger = aligned ? 0 : kHuge / n + 64;
    stride_ = kBig + stagger;
    const std::size_t total = (stride_ * n + kHuge - 1) / kHuge * kHuge;
    base_ = static_cast<std::byte*>(std::aligned_alloc(kHuge, total));
    if (base_ == nullptr) throw std::bad_alloc();
  }
  ~RankBuffers() { std::free(base_); }
  RankBuffers(const RankBuffers&) = delete;
  RankBuffers& operator=(const RankBuffers&) = delete;
  std::span<float> of(int64_t rank) const {
    return {reinterpret_cast<float*>(base_ + stride_ * static_cast<std::size_t>(rank)), kBig / sizeof(float)};
  }

 private:
  std::byte* base_ = nullptr;
  std::size_t stride_ = 0;
};

void AllReduceBandwidth(benchmark::State& state) {
  const int64_t ranks = state.range(0);
  const bool aligned = state.range(1) != 0;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const double memcpy = memcpy_gbps(static_cast<int>(std::min<int64_t>(ranks, cores)));
  const int64_t iters = 3;
  double total = 0;
  for (auto _ : state) {
    RankBuffers buffers(ranks, aligned);
    const double s = bench::on_every_rank(run_spmd, world_of(ranks), iters, [&buffers, first = std::make_shared<std::vector<char>>(ranks, 1)](RankContext& ctx) {
      const std::span<float> buf = buffers.of(ctx.rank());
      char& fresh = (*first)[static_cast<std::size_t>(ctx.rank())];
      if (fresh) {  // the untimed warm-up call: the rank touches its own buffer first
        std::fill(buf.begin(), buf.end(), 1.0f);
        fresh = 0;
      }
      ctx.world().all_reduce(buf, ReduceOp::kSum);
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

// job_of: the (dp, cp=16, tp) mesh of 2^log2 ranks both modes run.
run::Options job_of(int log2, const std::string& backend) {
  const int64_t world = int64_t{1} << log2;
  const int64_t tp = std::min<int64_t>(1024, std::max<int64_t>(1, world / 16));
  run::Options o;
  o.recipe.mesh = "dp=" + std::to_string(std::max<int64_t>(1, world / 16 / tp)) + ",cp=" +
                  std::to_string(std::min<int64_t>(16, world)) + ",tp=" + std::to_string(tp);
  o.backend = backend;
  return o;
}

void run_job(benchmark::State& state, const std::string& backend) {
  const int log2 = static_cast<int>(state.range(0));
  const int64_t world = int64_t{1} << log2;
  const run::Options o = job_of(log2, backend);
  double peak = 0, seconds = 0;
  for (auto _ : state) {
    auto [s, mb] = bench::in_child([&] {
      std::ostringstream out;
      return run::run(o, out) == 0;
    });
    if (s < 0) {
      state.SkipWithError(("meshsim run --backend " + backend + " failed").c_str());
      break;
    }
    state.SetIterationTime(s);
    seconds += s;
    peak = std::max(peak, mb);
  }
  state.counters["ranks"] = static_cast<double>(world);
  state.counters["peak_MB"] = peak;
  state.counters["ns_per_rank"] = seconds / static_cast<double>(std::max<int64_t>(1, state.iterations())) /
                                  static_cast<double>(world) * 1e9;
}

// LocalRun: `meshsim run --backend local`; the cost per rank must stay flat as the world grows.
void LocalRun(benchmark::State& state) { run_job(state, "local"); }
// ThreadedRun: the same job over rank threads, up to the 16,384 one process runs.
void ThreadedRun(benchmark::State& state) { run_job(state, "threaded"); }
// FiberRun: the same job with every rank a fiber of one thread, up to the 65,536 it runs.
void FiberRun(benchmark::State& state) { run_job(state, "fiber"); }

BENCHMARK(Memcpy)->Arg(8)->Arg(kBig)->Unit(benchmark::kMicrosecond);
BENCHMARK(AllReduceLatency)->Arg(2)->Arg(4)->Arg(8)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(3);
BENCHMARK(AllReduceBandwidth)->ArgNames({"ranks", "aligned"})->ArgsProduct({{2, 4, 8}, {0, 1}})->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(2);
BENCHMARK(MeshsimRun)->Arg(64)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(LocalRun)->DenseRange(6, 20, 2)->Arg(22)->Arg(24)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(ThreadedRun)->DenseRange(6, 14, 2)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(FiberRun)->DenseRange(6, 16, 2)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
