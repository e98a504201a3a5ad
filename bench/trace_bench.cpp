// meshsim trace check at the size of real jobs: the Flight Recorder dumps of a tp=8 x dp x pp=4
// job (one per rank, c10d's pickle shape written by a minimal protocol-2 pickler here: dicts,
// lists, tuples, str, int, as c10d's own pickler writes them), 48 records each (8 steps of a TP
// all-gather, a pipeline send/receive, a TP reduce-scatter, a DP reduce-scatter and a world
// all-reduce), read and checked.
//   ParseDumps/N   every rank's bytes read into dumps (the pickle reader and the schema)
//   CheckDumps/N   the cross-rank check of N ranks' dumps
// docs/traces.md reports the times as ratios to ParseDumps/256 of the same run.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "meshsim/flight_recorder.hpp"

namespace {

using namespace meshsim::trace;

// A protocol-2 pickle writer for the values a dump holds.
struct Pickler {
  std::string out = std::string("\x80\x02", 2);
  void str(const std::string& s) {
    out += 'X';
    const auto n = static_cast<uint32_t>(s.size());
    for (int k = 0; k < 4; ++k) out += static_cast<char>((n >> (8 * k)) & 0xff);
    out += s;
  }
  void integer(int64_t v) {
    out += 'J';
    const auto u = static_cast<uint32_t>(static_cast<int32_t>(v));
    for (int k = 0; k < 4; ++k) out += static_cast<char>((u >> (8 * k)) & 0xff);
  }
  void sizes(const std::vector<std::vector<int64_t>>& s) {
    out += "](";
    for (const auto& t : s) {
      out += "](";
      for (int64_t d : t) integer(d);
      out += 'e';
    }
    out += 'e';
  }
  void strs(const std::vector<std::string>& s) {
    out += "](";
    for (const auto& x : s) str(x);
    out += 'e';
  }
  void key(const char* k) { str(k); }
};

std::vector<std::string> make_dumps(int64_t world) {
  const int64_t tp = 8, pp = 4, dp = world / tp / pp;
  std::vector<std::string> dumps;
  for (int64_t r = 0; r < world; ++r) {
    const int64_t p = r / (dp * tp), d = (r / tp) % dp, t = r % tp;
    auto ranks = [](const std::vector<int64_t>& v) {
      std::string s = "[";
      for (std::size_t k = 0; k < v.size(); ++k) s += (k ? ", " : "") + std::to_string(v[k]);
      return s + "]";
    };
    std::vector<int64_t> tpg, dpg, ppg, all;
    for (int64_t k = 0; k < tp; ++k) tpg.push_back((p * dp + d) * tp + k);
    for (int64_t k = 0; k < dp; ++k) dpg.push_back((p * dp + k) * tp + t);
    for (int64_t k = 0; k < pp; ++k) ppg.push_back((k * dp + d) * tp + t);
    for (int64_t k = 0; k < world; ++k) all.push_back(k);
    const std::string tpn = "tp" + std::to_string(p * dp + d), dpn = "dp" + std::to_string(p * tp + t),
                      ppn = "pp" + std::to_string(d * tp + t);
    Pickler w;
    w.out += "}(";
    w.key("version");
    w.str("2.10");
    w.key("pg_config");
    w.out += "}(";
    for (const auto& [name, desc, members] : {std::tuple{std::string("0"), "default_pg", all}, std::tuple{tpn, "mesh_tp", tpg},
                                              std::tuple{dpn, "mesh_dp", dpg}, std::tuple{ppn, "mesh_pp", ppg}}) {
      w.str(name);
      w.out += "}(";
      w.key("name");
      w.str(name);
      w.key("desc");
      w.str(desc);
      w.key("ranks");
      w.str(ranks(members));
      w.out += 'u';
    }
    w.out += 'u';
    w.key("entries");
    w.out += "](";
    int64_t record = 0, tps = 0, dps = 0, worlds = 0, p2ps = 0;
    auto entry = [&](const std::string& group, const char* desc, int64_t seq, int64_t p2p, const std::string& name,
                     std::vector<std::vector<int64_t>> in, std::vector<std::vector<int64_t>> out, const char* dtype, bool is_p2p) {
      w.out += "}(";
      w.key("record_id");
      w.integer(record++);
      w.key("process_group");
      w.str(group);
      w.str(desc);
      w.out += '\x86';
      w.key("collective_seq_id");
      w.integer(seq);
      w.key("p2p_seq_id");
      w.integer(p2p);
      w.key("profiling_name");
      w.str(name);
      w.key("input_sizes");
      w.sizes(in);
      w.key("input_dtypes");
      w.strs(std::vector<std::string>(in.size(), dtype));
      w.key("output_sizes");
      w.sizes(out);
      w.key("output_dtypes");
      w.strs(std::vector<std::string>(out.size(), dtype));
      w.key("state");
      w.str("completed");
      w.key("is_p2p");
      w.out += is_p2p ? '\x88' : '\x89';
      w.out += 'u';
    };
    for (int step = 0; step < 8; ++step) {
      entry(tpn, "mesh_tp", ++tps, 0, "nccl:all_gather", {{1024, 512}}, {{8192, 512}}, "BFloat16", false);
      if (p > 0) entry(ppn, "mesh_pp", 0, ++p2ps, "nccl:recv " + std::to_string(p) + "<-" + std::to_string(p - 1), {}, {{8, 1024}}, "BFloat16", true);
      if (p < pp - 1) entry(ppn, "mesh_pp", 0, ++p2ps, "nccl:send " + std::to_string(p) + "->" + std::to_string(p + 1), {{8, 1024}}, {{8, 1024}}, "BFloat16", true);
      entry(tpn, "mesh_tp", ++tps, 0, "nccl:reduce_scatter", {{8192, 512}}, {{1024, 512}}, "BFloat16", false);
      entry(dpn, "mesh_dp", ++dps, 0, "nccl:reduce_scatter", {{dp * 256}}, {{256}}, "Float", false);
      entry("0", "default_pg", ++worlds, 0, "nccl:all_reduce", {{1}}, {{1}}, "Float", false);
    }
    w.out += "eu.";
    dumps.push_back(std::move(w.out));
  }
  return dumps;
}

void ParseDumps(benchmark::State& state) {
  const auto bytes = make_dumps(state.range(0));
  for (auto _ : state) {
    std::vector<Dump> dumps;
    for (std::size_t r = 0; r < bytes.size(); ++r) dumps.push_back(parse_dump(bytes[r], static_cast<int64_t>(r), "bench"));
    benchmark::DoNotOptimize(dumps.data());
  }
}
BENCHMARK(ParseDumps)->Arg(256)->Arg(1024)->Arg(4096)->Unit(benchmark::kMillisecond);

void CheckDumps(benchmark::State& state) {
  const auto bytes = make_dumps(state.range(0));
  std::vector<Dump> dumps;
  for (std::size_t r = 0; r < bytes.size(); ++r) dumps.push_back(parse_dump(bytes[r], static_cast<int64_t>(r), "bench"));
  for (auto _ : state) {
    const CheckReport report = check_dumps(dumps);
    if (!report.ok) state.SkipWithError("the generated dumps do not check");
    benchmark::DoNotOptimize(report.collectives_checked);
  }
}
BENCHMARK(CheckDumps)->Arg(256)->Arg(1024)->Arg(4096)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
