// Cost of each algebra operation on typical mesh layouts (rank <= 4, nested once), and the
// heap allocations per operation (counted by replacing global operator new in this binary).
// Baseline for ratios: BM_CopyLayout, a plain copy of the same layout, measured in the same run.
#include <benchmark/benchmark.h>

#include "alloc_counter.hpp"

#include <atomic>
#include <cstdlib>
#include <new>
#include <sstream>

#include "meshsim/algebra.hpp"
#include "meshsim/mesh_layout.hpp"
#include "meshsim/query.hpp"

using meshsim::bench::g_allocs;
using meshsim::bench::g_bytes;

namespace {

using namespace meshsim;

const Layout kMesh = parse_layout("((2,2),4,8):((64,32),8,1)");  // dp(2x2 nested), cp, tp
const Layout kTile = parse_layout("(2,4):(8,1)");
const Layout kFlat = parse_layout("(2,4,8):(32,8,1)");

template <typename F>
void run(benchmark::State& state, F&& f) {
  long before = g_allocs.load();
  for (auto _ : state) benchmark::DoNotOptimize(f());
  state.counters["allocs/op"] = benchmark::Counter(
      static_cast<double>(g_allocs.load() - before) / static_cast<double>(state.iterations()));
}

void BM_CopyLayout(benchmark::State& s) { run(s, [] { return Layout(kMesh); }); }
void BM_Size(benchmark::State& s) { run(s, [] { return size(kMesh); }); }
void BM_Cosize(benchmark::State& s) { run(s, [] { return cosize(kMesh); }); }
void BM_CompactStride(benchmark::State& s) {
  run(s, [] { return compact_stride(kMesh.shape()); });
}
void BM_Crd2Idx(benchmark::State& s) { run(s, [] { return crd2idx(37, kMesh); }); }
void BM_Idx2Crd(benchmark::State& s) { run(s, [] { return idx2crd(37, kMesh.shape()); }); }
void BM_Coalesce(benchmark::State& s) { run(s, [] { return coalesce(kMesh); }); }
void BM_Filter(benchmark::State& s) { run(s, [] { return filter(kMesh); }); }
void BM_Complement(benchmark::State& s) { run(s, [] { return complement(kTile, 64); }); }
void BM_Composition(benchmark::State& s) { run(s, [] { return composition(kFlat, kTile); }); }
void BM_LogicalDivide(benchmark::State& s) {
  run(s, [] { return logical_divide(kFlat, parse_layout("4:2")); });
}
void BM_LogicalProduct(benchmark::State& s) {
  run(s, [] { return logical_product(kTile, parse_layout("4:1")); });
}
void BM_RightInverse(benchmark::State& s) { run(s, [] { return right_inverse(kMesh); }); }
void BM_LeftInverse(benchmark::State& s) { run(s, [] { return left_inverse(kTile); }); }
void BM_MeshFlatten(benchmark::State& s) { run(s, [] { return mesh_flatten(kFlat); }); }
void BM_MeshUnflatten(benchmark::State& s) {
  static const int64_t sizes[] = {2, 4, 8};
  run(s, [] { return mesh_unflatten(parse_layout("64:1"), 0, sizes); });
}
void BM_MeshCheckNonOverlap(benchmark::State& s) {
  run(s, [] { return mesh_check_non_overlap(kMesh); });
}
void BM_ParseLayout(benchmark::State& s) {
  run(s, [] { return parse_layout("((2,2),4,8):((64,32),8,1)"); });
}

// Throughput of `meshsim query`: requests per second through the JSON-lines engine.
void BM_QueryThroughput(benchmark::State& state) {
  const std::string lines =
      R"J({"id":1,"op":"composition","a":{"shape":[2,4,8],"stride":[32,8,1]},"b":{"shape":[2,4],"stride":[8,1]}})J"
      "\n"
      R"J({"id":2,"op":"complement_bound","layout":"(2,4):(8,1)","bound":64})J"
      "\n"
      R"J({"id":3,"op":"mesh_unflatten","layout":"64:1","dim":0,"sizes":[2,4,8]})J"
      "\n"
      R"J({"id":4,"op":"coalesce","convention":"cute","layout":"((2,2),4,8):((1,2),4,16)"})J"
      "\n";
  for (auto _ : state) {
    std::istringstream in(lines);
    std::ostringstream out;
    benchmark::DoNotOptimize(meshsim::query::run(in, out));
  }
  state.SetItemsProcessed(state.iterations() * 4);
}

BENCHMARK(BM_CopyLayout);
BENCHMARK(BM_Size);
BENCHMARK(BM_Cosize);
BENCHMARK(BM_CompactStride);
BENCHMARK(BM_Crd2Idx);
BENCHMARK(BM_Idx2Crd);
BENCHMARK(BM_Coalesce);
BENCHMARK(BM_Filter);
BENCHMARK(BM_Complement);
BENCHMARK(BM_Composition);
BENCHMARK(BM_LogicalDivide);
BENCHMARK(BM_LogicalProduct);
BENCHMARK(BM_RightInverse);
BENCHMARK(BM_LeftInverse);
BENCHMARK(BM_MeshFlatten);
BENCHMARK(BM_MeshUnflatten);
BENCHMARK(BM_MeshCheckNonOverlap);
BENCHMARK(BM_ParseLayout);
BENCHMARK(BM_QueryThroughput);

}  // namespace

BENCHMARK_MAIN();
