// Cost of each algebra operation on typical mesh layouts (rank <= 4, nested once), and the
// heap allocations per operation (counted by replacing global operator new in this binary).
// Baseline for ratios: BM_CopyLayout, a plain copy of the same layout, measured in the same run.
#include <benchmark/benchmark.h>

#include "alloc_counter.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "meshsim/algebra.hpp"
#include "meshsim/mesh_layout.hpp"
#include "meshsim/json_tape.hpp"
#include "meshsim/query.hpp"

#include <nlohmann/json.hpp>
#ifdef MESHSIM_BENCH_RAPIDJSON
#include <rapidjson/document.h>
#endif

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

// Table/<op>: issue 15's table, on the Python reference's own inputs (CUTLASS pycute, CuTe's
// convention). Each row prints the reference's figures as recorded where the issue was written
// next to ours:
//   python_ns / cute_ns  the Python reference and CuTe with run-time integers (recorded);
//   vs_python            python_ns / our time (the target is >= 100);
//   vs_cute              our time / cute_ns (CuTe checks nothing: a floor, not a target).
// Recorded figures cannot judge a ratio on another machine: bench/python_reference.py times the
// reference itself in the same run, on the same core, against these rows' `ns`.
const Layout kT_Coalesce = parse_layout("(2,4,8):(32,8,1)");
const Layout kT_Complement = parse_layout("(2,):(4,)");
const Layout kT_ComposeA = parse_layout("(4,2):(2,1)");
const Layout kT_ComposeB = parse_layout("2:1");
const Layout kT_Compose8 = parse_layout("8:1");
const Layout kT_Compose222 = parse_layout("(2,2,2):(4,2,1)");
const Layout kT_DivideA = parse_layout("(4,8):(8,1)");
const Layout kT_DivideB = parse_layout("2:1");
const IntTuple kT_Coord = IntTuple(37);

template <typename F>
void table_row(benchmark::State& state, double python_ns, double cute_ns, F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  run(state, std::forward<F>(f));
  const double ours = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
                      static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations()));
  state.counters["ns"] = ours;
  state.counters["python_ns"] = python_ns;
  state.counters["cute_ns"] = cute_ns;
  state.counters["vs_python"] = python_ns / ours;
  state.counters["vs_cute"] = ours / cute_ns;
}
constexpr Convention kCute = Convention::kCute;
void Table_Coalesce(benchmark::State& s) { table_row(s, 1700, 1.35, [] { return coalesce(kT_Coalesce, kCute); }); }
void Table_Complement(benchmark::State& s) {
  table_row(s, 2100, 2.05, [] { return complement(kT_Complement, 8, kCute); });
}
void Table_Composition(benchmark::State& s) {
  table_row(s, 2000, 6.1, [] { return composition(kT_ComposeA, kT_ComposeB, kCute); });
}
void Table_CompositionByTuple(benchmark::State& s) {
  table_row(s, 3600, 1.5, [] { return composition(kT_Compose8, kT_Compose222, kCute); });
}
void Table_Crd2Idx(benchmark::State& s) { table_row(s, 800, 4.4, [] { return crd2idx(kT_Coord, kT_Coalesce, kCute); }); }
void Table_LogicalDivide(benchmark::State& s) {
  table_row(s, 6100, 20, [] { return logical_divide(kT_DivideA, kT_DivideB, kCute); });
}
// query_lines is the six-op request mix of QueryPipe and the per-request benchmarks.
const std::vector<std::string>& query_lines() {
  static const std::vector<std::string> lines = {
      R"J({"id":1,"op":"composition","a":{"shape":[2,4,8],"stride":[32,8,1]},"b":{"shape":[2,4],"stride":[8,1]}})J",
      R"J({"id":2,"op":"complement_bound","layout":"(2,4):(8,1)","bound":64})J",
      R"J({"id":3,"op":"mesh_unflatten","layout":"64:1","dim":0,"sizes":[2,4,8]})J",
      R"J({"id":4,"op":"coalesce","convention":"cute","layout":"((2,2),4,8):((1,2),4,16)"})J",
      R"J({"id":5,"op":"crd2idx","coords":[37],"layout":"(2,4,8):(32,8,1)"})J",
      R"J({"id":6,"op":"logical_divide","a":"(4,8):(8,1)","b":"2:1","convention":"cute"})J"};
  return lines;
}

// QueryPipe: `meshsim query` as a user runs it, 100K mixed requests written into its stdin
// through a pipe, answers to /dev/null; requests/s of the whole process (start-up included).
void QueryPipe(benchmark::State& state) {
  std::string input;
  constexpr int kRequests = 100000;
  for (int i = 0; i < kRequests; ++i) {
    input += query_lines()[static_cast<std::size_t>(i) % query_lines().size()];
    input += '\n';
  }
  const std::string cmd = std::string(MESHSIM_EXE) + " query > /dev/null";
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    FILE* p = popen(cmd.c_str(), "w");
    if (!p) {
      state.SkipWithError("cannot start meshsim query");
      break;
    }
    fwrite(input.data(), 1, input.size(), p);
    if (pclose(p) != 0) {
      state.SkipWithError("meshsim query failed");
      break;
    }
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  state.SetItemsProcessed(state.iterations() * kRequests);
}
BENCHMARK(QueryPipe)->UseManualTime()->Iterations(3)->Unit(benchmark::kMillisecond);

// Where a request's time goes, per request over query_lines(): the whole answer
// (QueryAnswer; QueryAnswerNlohmann without the fast reader), the fast reader's tape alone
// (QueryTapeRead), nlohmann's parse alone (QueryParseNlohmann), RapidJSON's DOM parse of the same
// text (QueryParseRapidJson, when found at build time: the faster reader measured against it),
// and printing the six results (QueryPrint).
template <typename F>
void per_request(benchmark::State& state, F&& f) {
  const auto& lines = query_lines();
  for (auto _ : state) {
    for (const std::string& l : lines) benchmark::DoNotOptimize(f(l));
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(lines.size()));
}
void QueryAnswer(benchmark::State& s) {
  per_request(s, [](const std::string& l) { return meshsim::query::answer_line(l); });
}
void QueryAnswerNlohmann(benchmark::State& s) {
  per_request(s, [](const std::string& l) { return meshsim::query::answer_line_nlohmann(l); });
}
void QueryTapeRead(benchmark::State& s) {
  per_request(s, [](const std::string& l) {
    meshsim::json::JsonTape tape;
    return tape.read(l);
  });
}
void QueryParseNlohmann(benchmark::State& s) {
  per_request(s, [](const std::string& l) { return nlohmann::json::parse(l).size(); });
}
#ifdef MESHSIM_BENCH_RAPIDJSON
void QueryParseRapidJson(benchmark::State& s) {
  per_request(s, [](const std::string& l) {
    rapidjson::Document d;
    d.Parse(l.data(), l.size());
    return d.MemberCount();
  });
}
BENCHMARK(QueryParseRapidJson);
#endif
void QueryPrint(benchmark::State& s) {
  std::vector<nlohmann::json> results;
  for (const std::string& l : query_lines()) {
    results.push_back(nlohmann::json::parse(meshsim::query::answer_line(l))["result"]);
  }
  std::size_t i = 0;
  per_request(s, [&](const std::string&) { return results[i++ % results.size()].dump(); });
}
// Deliverable of the JSON work: reading and writing a request costs about what its op does.
// QueryLine/i answers line i of query_lines() with answer_line (a new answer string each time;
// `meshsim query` reuses one); QueryOp/i runs only its op, on arguments built once outside the
// loop. The difference is the JSON cost of that request.
void QueryLine(benchmark::State& s) {
  const std::string& line = query_lines()[static_cast<std::size_t>(s.range(0))];
  std::string answer;
  for (auto _ : s) {
    answer = meshsim::query::answer_line(line);
    benchmark::DoNotOptimize(answer.data());
  }
}
void QueryOp(benchmark::State& s) {
  static const Layout a = parse_layout("(2,4,8):(32,8,1)");
  static const Layout b = parse_layout("(2,4):(8,1)");
  static const Layout flat = parse_layout("64:1");
  static const Layout nested = parse_layout("((2,2),4,8):((1,2),4,16)");
  static const Layout divide_a = parse_layout("(4,8):(8,1)");
  static const Layout divide_b = parse_layout("2:1");
  static const std::vector<int64_t> sizes = {2, 4, 8};
  const Convention torch = Convention::kTorch;
  const Convention cute = Convention::kCute;
  switch (s.range(0)) {
    case 0: run(s, [&] { return composition(a, b, torch); }); break;
    case 1: run(s, [&] { return complement(b, 64, torch); }); break;
    case 2: run(s, [&] { return mesh_unflatten(flat, 0, sizes); }); break;
    case 3: run(s, [&] { return coalesce(nested, cute); }); break;
    case 4: run(s, [&] { return crd2idx(IntTuple(37), a, torch); }); break;
    default: run(s, [&] { return logical_divide(divide_a, divide_b, cute); }); break;
  }
}
BENCHMARK(QueryLine)->DenseRange(0, 5);
BENCHMARK(QueryOp)->DenseRange(0, 5);
BENCHMARK(QueryAnswer);
BENCHMARK(QueryAnswerNlohmann);
BENCHMARK(QueryTapeRead);
BENCHMARK(QueryParseNlohmann);
BENCHMARK(QueryPrint);

BENCHMARK(Table_Coalesce);
BENCHMARK(Table_Complement);
BENCHMARK(Table_Composition);
BENCHMARK(Table_CompositionByTuple);
BENCHMARK(Table_Crd2Idx);
BENCHMARK(Table_LogicalDivide);

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
