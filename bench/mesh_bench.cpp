// Cost of DeviceMesh bookkeeping as the world grows: build, slice, flatten, unflatten,
// coordinate and own-group on a (dp, cp=4, tp=4) mesh of 2^6, 2^12, 2^20 and 2^24 ranks. Each
// benchmark's argument is log2(world). Times and heap bytes per op must not grow with the world
// (compare the /24 and /6 rows of one run; this VM is noisy, so run with
// --benchmark_enable_random_interleaving=true --benchmark_repetitions=9 and read the medians).
// Heap use is counted by replacing operator new.
#include <benchmark/benchmark.h>

#include "alloc_counter.hpp"

#include <atomic>
#include <cstdlib>
#include <new>

#include "meshsim/device_mesh.hpp"

using meshsim::bench::g_allocs;
using meshsim::bench::g_bytes;

namespace {

using namespace meshsim;
using Names = std::vector<std::string>;

DeviceMesh make_root(int log2_world) {
  const int64_t world = int64_t{1} << log2_world;
  return DeviceMesh::init({world / 16, 4, 4}, Names{"dp", "cp", "tp"});
}

template <typename F>
void run(benchmark::State& state, F&& f) {
  const long allocs = g_allocs.load();
  const long bytes = g_bytes.load();
  for (auto _ : state) benchmark::DoNotOptimize(f());
  const auto n = static_cast<double>(state.iterations());
  state.counters["allocs/op"] = benchmark::Counter(static_cast<double>(g_allocs.load() - allocs) / n);
  state.counters["bytes/op"] = benchmark::Counter(static_cast<double>(g_bytes.load() - bytes) / n);
  state.counters["world"] = benchmark::Counter(static_cast<double>(int64_t{1} << state.range(0)));
}

void BM_Build(benchmark::State& s) {
  const int lg = static_cast<int>(s.range(0));
  run(s, [&] { return make_root(lg); });
}

void BM_Slice(benchmark::State& s) {
  DeviceMesh root = make_root(static_cast<int>(s.range(0)));
  const Names sel{"dp", "tp"};
  run(s, [&] { return root.slice(sel); });
}

void BM_Flatten(benchmark::State& s) {
  DeviceMesh sub = make_root(static_cast<int>(s.range(0))).slice({"dp", "tp"});
  run(s, [&] { return sub.flatten(); });  // registered once, then found by name and layout
}

void BM_Unflatten(benchmark::State& s) {
  DeviceMesh root = make_root(static_cast<int>(s.range(0)));
  const std::vector<int64_t> sizes{2, 2};
  const Names names{"tp_a", "tp_b"};
  run(s, [&] { return root.unflatten(2, sizes, names); });
}

void BM_Coordinate(benchmark::State& s) {
  const int lg = static_cast<int>(s.range(0));
  DeviceMesh mesh = make_root(lg).slice({"dp", "tp"}).flatten().unflatten(0, std::vector<int64_t>{
      (int64_t{1} << lg) / 16, 4}, Names{"a", "b"});
  const int64_t rank = (int64_t{1} << lg) - 1;
  run(s, [&] { return mesh.coordinate(rank); });
}

void BM_OwnGroup(benchmark::State& s) {
  const int lg = static_cast<int>(s.range(0));
  DeviceMesh mesh = make_root(lg).slice({"dp", "tp"});
  const int64_t rank = (int64_t{1} << lg) - 1;
  run(s, [&] { return mesh.group_of(rank, 1); });
}

void BM_Hash(benchmark::State& s) {
  DeviceMesh a = make_root(static_cast<int>(s.range(0))).slice({"dp", "tp"});
  DeviceMesh b = a.root().slice({"dp", "tp"});
  run(s, [&] { return a == b && a.hash() == b.hash(); });
}

// Every group of the tp dim (world / 4 groups of 4): one buffer (group_table) against one vector
// per group (groups, PyTorch's shape), allocations per listing side by side.
void BM_GroupTable(benchmark::State& s) {
  DeviceMesh mesh = make_root(static_cast<int>(s.range(0)));
  run(s, [&] { return mesh.group_table(2); });
}

void BM_GroupsNested(benchmark::State& s) {
  DeviceMesh mesh = make_root(static_cast<int>(s.range(0)));
  run(s, [&] { return mesh.groups(2); });
}

#define MESHSIM_WORLDS ->Arg(6)->Arg(12)->Arg(20)->Arg(24)
BENCHMARK(BM_Build) MESHSIM_WORLDS;
BENCHMARK(BM_Slice) MESHSIM_WORLDS;
BENCHMARK(BM_Flatten) MESHSIM_WORLDS;
BENCHMARK(BM_Unflatten) MESHSIM_WORLDS;
BENCHMARK(BM_Coordinate) MESHSIM_WORLDS;
BENCHMARK(BM_OwnGroup) MESHSIM_WORLDS;
BENCHMARK(BM_Hash) MESHSIM_WORLDS;
BENCHMARK(BM_GroupTable)->Arg(6)->Arg(12)->Arg(20);
BENCHMARK(BM_GroupsNested)->Arg(6)->Arg(12)->Arg(20);

}  // namespace

BENCHMARK_MAIN();
