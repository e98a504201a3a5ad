// Flight Recorder dumps: the bounded pickle reader against Python's own pickles (protocols 0-5)
// and hostile bytes; dumps in the schema's exact shape (written by tests/traces/make_fr_dumps.py
// with Python's pickle and json) checked across ranks, each planted fault named by its rank.
#include "meshsim/flight_recorder.hpp"
#include "meshsim/pickle.hpp"
#include "meshsim/plan_check.hpp"
#include "meshsim/step_job.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

#include "meshsim/error.hpp"

namespace meshsim::trace {
namespace {

namespace fs = std::filesystem;

struct Shell {
  std::string out;
  int status = -1;
};

Shell shell(const std::string& cmd) {
  Shell s;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return s;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) s.out.append(buf, n);
  const int st = ::pclose(p);
  s.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return s;
}

// python_pickle: the bytes Python's pickle writes for EXPR at PROTOCOL.
std::string python_pickle(const std::string& expr, int protocol) {
  const Shell s = shell("python3 -c 'import pickle,sys; sys.stdout.write(pickle.dumps(" + expr + ", protocol=" +
                        std::to_string(protocol) + ").hex())'");
  EXPECT_EQ(s.status, 0) << expr;
  std::string bytes;
  for (std::size_t k = 0; k + 1 < s.out.size(); k += 2) bytes += static_cast<char>(std::stoi(s.out.substr(k, 2), nullptr, 16));
  return bytes;
}

// canonical: the value as Python's repr would write it for these kinds (dict keys in order).
std::string canonical(const PyData& d, uint32_t i, int depth = 0) {
  const auto& n = d.node(i);
  if (depth > 50) return "...";
  switch (n.kind) {
    case PyData::Kind::kNone: return "None";
    case PyData::Kind::kBool: return n.i ? "True" : "False";
    case PyData::Kind::kInt: return std::to_string(n.i);
    case PyData::Kind::kFloat: {
      std::ostringstream o;
      o << n.f;
      return o.str();
    }
    case PyData::Kind::kStr: return "'" + n.s + "'";
    case PyData::Kind::kList:
    case PyData::Kind::kTuple: {
      std::string out = n.kind == PyData::Kind::kList ? "[" : "(";
      for (std::size_t k = 0; k < n.items.size(); ++k) out += (k ? ", " : "") + canonical(d, n.items[k], depth + 1);
      if (n.kind == PyData::Kind::kTuple && n.items.size() == 1) out += ",";
      return out + (n.kind == PyData::Kind::kList ? "]" : ")");
    }
    case PyData::Kind::kDict: {
      std::string out = "{";
      for (std::size_t k = 0; k + 1 < n.items.size(); k += 2) {
        out += (k ? ", " : "") + canonical(d, n.items[k], depth + 1) + ": " + canonical(d, n.items[k + 1], depth + 1);
      }
      return out + "}";
    }
  }
  return "?";
}

TEST(Pickle, ReadsWhatPythonWritesAtEveryProtocol) {
  // Every kind the dumps hold, integers at each opcode's edges and past them, shared objects.
  const std::string expr =
      "{\"version\": \"2.10\", \"ints\": [0, 1, -1, 255, 256, 65535, 65536, -129, 2**31-1, -2**31, 2**31, 2**62, "
      "2**63-1, -2**63], \"f\": [0.25, -1.5e300], \"b\": (True, False, None), \"s\": [\"\", \"caf\\u00e9 \\U0001F600\", "
      "\"x\"*300, \"back\\\\slash\\nnl\"], \"t\": [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)], \"e\": [[], {}], "
      "\"shared\": [[7]]*3}";
  // The canonical text of the same value, as this test prints it.
  const std::string want =
      "{'version': '2.10', 'ints': [0, 1, -1, 255, 256, 65535, 65536, -129, 2147483647, -2147483648, 2147483648, "
      "4611686018427387904, 9223372036854775807, -9223372036854775808], 'f': [0.25, -1.5e+300], 'b': (True, False, None), "
      "'s': ['', 'caf\xc3\xa9 \xf0\x9f\x98\x80', '" + std::string(300, 'x') + "', 'back\\slash\nnl'], 't': [(), (1,), (1, 2), (1, 2, 3), "
      "(1, 2, 3, 4)], 'e': [[], {}], 'shared': [[7], [7], [7]]}";
  for (int protocol = 0; protocol <= 5; ++protocol) {
    const std::string bytes = python_pickle(expr, protocol);
    ASSERT_FALSE(bytes.empty());
    const PyData d = read_pickle(bytes, "test");
    EXPECT_EQ(canonical(d, d.root), want) << "protocol " << protocol;
  }
}

TEST(Pickle, SharedObjectsAreOneObjectAndCyclesAreHarmless) {
  const std::string bytes = python_pickle("(lambda l: [l, l])([1])", 4);
  const PyData d = read_pickle(bytes, "test");
  ASSERT_EQ(d.node(d.root).items.size(), 2u);
  EXPECT_EQ(d.node(d.root).items[0], d.node(d.root).items[1]);
  // A list that contains itself: ] BINPUT 0 BINGET 0 APPEND STOP.
  const std::string cyc = std::string("\x80\x02]q\x00h\x00" "a.", 9);
  const PyData c = read_pickle(cyc, "test");
  ASSERT_EQ(c.node(c.root).items.size(), 1u);
  EXPECT_EQ(c.node(c.root).items[0], c.root);
}

void expect_refused(const std::string& bytes, const std::string& needle) {
  try {
    read_pickle(bytes, "dump 'x'");
    ADD_FAILURE() << "read: " << needle;
  } catch (const ParseError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("dump 'x': offset "), std::string::npos) << m;
    EXPECT_NE(m.find(needle), std::string::npos) << m;
  }
}

TEST(Pickle, RefusesEverythingButPlainDataNamingTheOffset) {
  // A class instance (GLOBAL / STACK_GLOBAL then REDUCE), bytes, a set: refused, never run.
  expect_refused(python_pickle("__import__(\"collections\").OrderedDict()", 2), "(GLOBAL)");
  expect_refused(python_pickle("__import__(\"collections\").OrderedDict()", 4), "(STACK_GLOBAL)");
  expect_refused(python_pickle("[1, b\"x\"]", 3), "BINBYTES");
  expect_refused(python_pickle("{1}", 4), "EMPTY_SET");
  // The classic: os.system by GLOBAL and REDUCE.
  const std::string evil = "cos\nsystem\n(S'touch /tmp/meshsim-pwned'\ntR.";
  expect_refused(evil, "offset 0: opcode 0x63 (GLOBAL) is refused");
  EXPECT_FALSE(fs::exists("/tmp/meshsim-pwned"));
  expect_refused(std::string("\x80\x02]", 3), "ends before its STOP");
  expect_refused(std::string("\x80\x02X\xff\xff\xff\x00", 7), "ends inside an opcode's argument");
  expect_refused(std::string("\x80\x02h\x05.", 5), "memo slot 5 was never stored");
  expect_refused(std::string("\x80\x02}K\x01" "a.", 6), "APPEND onto a dict");
  expect_refused(std::string("\x80\x02.", 3), "STOP with 0 values on the stack");
  expect_refused(std::string("\x80\x09N.", 4), "protocol 9 is newer than 5");
  expect_refused(std::string("\x80\x02\xff", 3), "0xff is not a pickle opcode");
}

TEST(Pickle, IntegersPastInt64AreOverflowErrors) {
  for (const char* expr : {"2**63", "-2**63-1", "2**200", "[1, 10**30]"}) {
    for (int protocol : {0, 2, 4}) {
      EXPECT_THROW(read_pickle(python_pickle(expr, protocol), "test"), OverflowError) << expr << " protocol " << protocol;
    }
  }
  // LONG4 of an absurd length is refused before it is read.
  EXPECT_THROW(read_pickle(std::string("\x80\x02\x8b\xff\xff\xff\x7f", 7), "test"), OverflowError);
}

TEST(Pickle, DeepNestingAndHugeCountsStayBounded) {
  // 200,000 nested lists (Python itself cannot pickle this deep): read without recursion.
  std::string deep = "\x80\x02";
  const int n = 200000;
  deep += std::string(n, ']');
  deep += std::string(n - 1, 'a');
  deep += '.';
  const PyData d = read_pickle(deep, "test");
  EXPECT_EQ(d.nodes.size(), static_cast<std::size_t>(n));
  // Limits: objects, the stack and MARKs.
  PickleLimits small;
  small.max_nodes = 1000;
  small.max_stack = 1000;
  EXPECT_THROW(read_pickle(deep, "test", small), ResourceExhausted);
  EXPECT_THROW(read_pickle("\x80\x02" + std::string(5000, '(') + ".", "test", small), ResourceExhausted);
}

TEST(Pickle, RandomBytesAndMutatedPicklesNeverCrash) {
  const std::string good = python_pickle(
      "{\"version\": \"2.10\", \"pg_config\": {\"0\": {\"name\": \"0\", \"desc\": \"default_pg\", \"ranks\": \"[0, 1]\"}}, "
      "\"entries\": [{\"record_id\": 0, \"input_sizes\": [[4, 4]], \"state\": \"completed\"}]}",
      4);
  std::mt19937_64 rng(7);
  int read = 0, refused = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string b = good;
    if (i % 2) {
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < flips; ++k) b[rng() % b.size()] = static_cast<char>(rng());
      if (rng() % 4 == 0) b.resize(rng() % b.size());
    } else {
      b.resize(rng() % 64);
      for (char& c : b) c = static_cast<char>(rng());
      if (!b.empty() && rng() % 2) b[0] = '\x80';
    }
    try {
      read_pickle(b, "fuzz");
      ++read;
    } catch (const Error&) {
      ++refused;
    }
  }
  EXPECT_GT(refused, 1000);
  EXPECT_EQ(read + refused, 20000);
}

// --- dumps -------------------------------------------------------------------------------------

std::string temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("meshsim_trace_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  return p.string();
}

// make_dumps writes a job's dumps with tests/traces/make_fr_dumps.py.
std::string make_dumps(const std::string& name, const std::string& args) {
  const std::string dir = temp_dir(name);
  const Shell s = shell("python3 " MESHSIM_TRACE_GEN " " + dir + " " + args + " 2>&1");
  EXPECT_EQ(s.status, 0) << s.out;
  return dir;
}

std::set<int64_t> culprits(const CheckReport& r) {
  std::set<int64_t> out;
  for (const auto& c : r.culprits) out.insert(c.rank);
  return out;
}

std::set<std::string> kinds(const CheckReport& r) {
  std::set<std::string> out;
  for (const auto& p : r.problems) out.insert(std::string(problem_kind_name(p.kind)));
  return out;
}

std::string text(const CheckReport& r, const DumpSet& s) { return report_text(r, s); }

TEST(FlightRecorder, AHealthyJobIsOkInEveryForm) {
  for (const std::string form : {"--format pickle --protocol 2", "--format pickle --protocol 5", "--format json",
                                 "--format pickle --ring 9", "--coalesced"}) {
    const std::string dir = make_dumps("ok", "--pp 3 --dp 2 --tp 2 --steps 4 " + form);
    const DumpSet set = read_dump_dir(dir, std::nullopt);
    EXPECT_EQ(set.prefix, "rank_");
    ASSERT_EQ(set.dumps.size(), 12u);
    const CheckReport r = check_dumps(set.dumps);
    EXPECT_TRUE(r.ok) << form << "\n" << text(r, set);
    EXPECT_EQ(r.groups, 1 + 6 + 6 + 4);  // world, TP, DP (split: one name), PP
    EXPECT_GT(r.collectives_checked, 0);
    EXPECT_GT(r.p2p_checked, 0);
    fs::remove_all(dir);
  }
}

TEST(FlightRecorder, TheDumpsFieldsAreReadAsWritten) {
  const std::string dir = make_dumps("fields", "--pp 2 --dp 1 --tp 2 --steps 1");
  const DumpSet set = read_dump_dir(dir, "rank_");
  const Dump& d = set.dumps.at(1);
  EXPECT_EQ(d.rank, 1);
  EXPECT_EQ(d.format, "pickle");
  EXPECT_EQ(d.version, "2.10");
  ASSERT_EQ(d.entries.size(), 5u);  // all_gather, send, reduce_scatter, DP reduce_scatter, all_reduce
  const Entry& send = d.entries[1];
  EXPECT_EQ(send.op, "send");
  EXPECT_EQ(send.src, 0);
  EXPECT_EQ(send.dst, 1);
  EXPECT_TRUE(send.is_p2p);
  EXPECT_EQ(send.input_sizes, (std::vector<std::vector<int64_t>>{{8, 1024}}));
  const Entry& ag = d.entries[0];
  EXPECT_EQ(ag.profiling_name, "nccl:all_gather");
  EXPECT_EQ(ag.desc, "mesh_tp");
  EXPECT_EQ(ag.collective_seq_id, 1);
  EXPECT_EQ(ag.output_sizes, (std::vector<std::vector<int64_t>>{{2048, 512}}));
  EXPECT_EQ(ag.input_dtypes, std::vector<std::string>{"BFloat16"});
  EXPECT_EQ(ag.state, EntryState::kCompleted);
  auto world = std::find_if(d.groups.begin(), d.groups.end(), [](const GroupConfig& g) { return g.name == "0"; });
  ASSERT_NE(world, d.groups.end());
  EXPECT_EQ(world->ranks, (std::vector<int64_t>{0, 1, 2, 3}));
  fs::remove_all(dir);
}

// A dump's records that hold the same sizes or dtypes share one list, and the same names one
// string (the reader keeps the lists and names it made); lists that differ anywhere, in a dim, in where one tensor ends, in a dtype, stay their
// own and read as written, also past the 4,096 lists after which the reader starts over.
TEST(FlightRecorder, RecordsThatHoldTheSameSizesDtypesAndNamesShareOneCopy) {
  const std::vector<std::vector<std::vector<int64_t>>> sizes = {
      {{4, 4}}, {{4, 4}}, {{4}, {4}}, {{44}}, {{4, 5}}, {}, {{}}, {{4, 4}}, {{0}}, {{4, 4}, {}}};
  const std::vector<std::vector<std::string>> dtypes = {
      {"Float"}, {"Float"}, {"Half"}, {"Float", "Float"}, {}, {"Float"}, {"FloatFloat"}, {"Float"}, {"Half"}, {""}};
  const std::size_t n = sizes.size();
  constexpr int kDistinct = 5000;  // past the reader's 4,096 lists
  nlohmann::json j;
  j["version"] = "2.10";
  j["pg_config"]["0"] = {{"name", "0"}, {"desc", "default_pg"}, {"ranks", "[0]"}};
  auto& es = j["entries"] = nlohmann::json::array();
  auto add = [&](const std::vector<std::vector<int64_t>>& sz, const std::vector<std::string>& dt) {
    const auto s = static_cast<int64_t>(es.size()) + 1;
    es.push_back({{"record_id", s - 1}, {"process_group", {"0", "default_pg"}}, {"collective_seq_id", s}, {"p2p_seq_id", 0},
                  {"profiling_name", "nccl:all_reduce"}, {"input_sizes", sz}, {"output_sizes", sz}, {"input_dtypes", dt},
                  {"output_dtypes", dt}, {"state", "completed"}});
  };
  for (std::size_t k = 0; k < n; ++k) add(sizes[k], dtypes[k]);
  for (int k = 0; k < kDistinct; ++k) add({{k, 3}}, {"Float"});
  for (std::size_t k = 0; k < n; ++k) add(sizes[k], dtypes[k]);
  const Dump d = parse_dump(j.dump(), 0, "shapes");
  ASSERT_EQ(d.entries.size(), 2 * n + kDistinct);
  auto at = [&](std::size_t k) -> const Entry& { return d.entries[k < n ? k : k - n + n + kDistinct]; };
  for (std::size_t k = 0; k < 2 * n; ++k) {
    const Entry& e = at(k);
    EXPECT_EQ(e.input_sizes, sizes[k % n]) << k;
    EXPECT_EQ(e.output_sizes, sizes[k % n]) << k;
    EXPECT_EQ(e.input_dtypes, dtypes[k % n]) << k;
    EXPECT_TRUE(e.input_sizes.same(e.output_sizes)) << k << ": a record's equal input and output sizes are two lists";
    for (std::size_t o = k - k % n; o < k; ++o) {  // the same half: the reader started over between them
      EXPECT_EQ(at(o).input_sizes.same(e.input_sizes), sizes[o % n] == sizes[k % n]) << o << " " << k;
      EXPECT_EQ(at(o).input_dtypes.same(e.input_dtypes), dtypes[o % n] == dtypes[k % n]) << o << " " << k;
    }
  }
  for (int k = 0; k < kDistinct; ++k) {
    EXPECT_EQ(d.entries[n + static_cast<std::size_t>(k)].input_sizes, (std::vector<std::vector<int64_t>>{{k, 3}})) << k;
  }
  // The names every record repeats: one copy each, read as written.
  const Entry &first = d.entries.front(), &last = d.entries.back();
  EXPECT_EQ(first.group, "0");
  EXPECT_EQ(last.desc, "default_pg");
  EXPECT_EQ(last.profiling_name, "nccl:all_reduce");
  EXPECT_EQ(last.op, "all_reduce");
  EXPECT_TRUE(first.group.same(last.group));
  EXPECT_TRUE(first.desc.same(last.desc));
  EXPECT_TRUE(first.profiling_name.same(last.profiling_name));
  EXPECT_TRUE(first.op.same(last.op));
}

struct Plant {
  std::string args;
  std::set<int64_t> culprits;
  std::string kind;
};

TEST(FlightRecorder, EveryPlantedFaultIsNamedByItsRank) {
  // tp = 4, so an odd one out has a majority against it.
  const std::vector<Plant> plants = {
      {"--plant hang@21", {21}, "never-issued"},
      {"--plant dtype@6", {6}, "dtype"},
      {"--plant size@9", {9}, "size"},
      {"--plant type@14", {14}, "type"},
      {"--plant p2psize@3", {3, 19}, "p2p"},          // a send and its receive disagree: both named
      {"--plant extrarecv@17", {1}, "unmatched-p2p"},  // rank 17 waits for a send rank 1 never posts
      {"--plant membership@5", {5}, "membership"},
      {"--plant missing@7", {}, "missing-dump"},
      {"--plant hang@21 --plant dtype@6", {6, 21}, "dtype"},
      {"--coalesced --plant bundle@13", {13}, "type"},  // a coalesced block one op short
      {"--plant stuckin@10", {10}, "never-issued"},     // stuck inside a collective its peers completed
      {"--coalesced --plant hang@2", {2}, "never-issued"},
      // Batched ring exchanges (batch_isend_irecv around a ring of 4): a send larger than its
      // receive names both; a rank that leaves out its block is the one its ring peers wait on
      // (each waits on every peer its block left unmet, not only on its oldest record's).
      {"--ring-exchange --plant ringsize@6", {6, 7}, "p2p"},
      {"--ring-exchange --plant ringskip@9", {9}, "unmatched-p2p"},
      {"--ring-exchange --plant ringskip@28", {28}, "never-issued"},
  };
  for (const auto& p : plants) {
    for (const std::string form : {"", " --format json", " --ring 11"}) {
      const std::string dir = make_dumps("plant", "--pp 2 --dp 4 --tp 4 --steps 4 " + p.args + form);
      const DumpSet set = read_dump_dir(dir, std::nullopt);
      const CheckReport r = check_dumps(set.dumps);
      EXPECT_FALSE(r.ok) << p.args << form;
      EXPECT_EQ(culprits(r), p.culprits) << p.args << form << "\n" << text(r, set);
      EXPECT_TRUE(kinds(r).count(p.kind)) << p.args << form << "\n" << text(r, set);
      fs::remove_all(dir);
    }
  }
}

TEST(FlightRecorder, AThousandDumpsWithAHangAndADtypeMismatchNameExactlyThePlantedRanks) {
  const std::string dir = make_dumps("1024", "--pp 4 --dp 32 --tp 8 --steps 6 --plant hang@517 --plant dtype@300");
  const DumpSet set = read_dump_dir(dir, "rank_");
  ASSERT_EQ(set.dumps.size(), 1024u);
  const CheckReport r = check_dumps(set.dumps);
  EXPECT_EQ(culprits(r), (std::set<int64_t>{300, 517})) << text(r, set);
  const std::string t = text(r, set);
  // The hang: rank 517 never issued its DP group's reduce_scatter that its 31 peers wait in.
  EXPECT_NE(t.find("rank 517 never issued it"), std::string::npos) << t;
  EXPECT_NE(t.find("31 ranks (525,533,...,765 (31 ranks, stride 8)) wait in it"), std::string::npos) << t;
  // The dtype: rank 300 against the 7 other ranks of its TP group, both entries shown.
  EXPECT_NE(t.find("rank 300 issued nccl:all_gather in [[1024, 512]] Float"), std::string::npos) << t;
  EXPECT_NE(t.find("7 ranks (296-299,301-303) issued nccl:all_gather in [[1024, 512]] BFloat16"), std::string::npos) << t;
  fs::remove_all(dir);
}

TEST(FlightRecorder, RecordsTheRingBufferDroppedAreNotTakenForMissingOnes) {
  // Every rank keeps only its newest 7 records; a rank that issued fewer records (the hung one)
  // holds older ones than its peers. Nothing but the hang is reported.
  const std::string dir = make_dumps("ring", "--pp 2 --dp 4 --tp 2 --steps 6 --ring 7 --plant hang@9");
  const DumpSet set = read_dump_dir(dir, std::nullopt);
  const CheckReport r = check_dumps(set.dumps);
  EXPECT_EQ(culprits(r), (std::set<int64_t>{9})) << text(r, set);
  EXPECT_EQ(kinds(r), (std::set<std::string>{"never-issued"})) << text(r, set);
  fs::remove_all(dir);
}

void write(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST(FlightRecorder, MalformedDumpsNameTheFileAndTheField) {
  const std::string dir = temp_dir("bad");
  auto refused = [&](const std::string& bytes, const std::string& needle) {
    write(dir + "/rank_0", bytes);
    try {
      read_dump_dir(dir, "rank_");
      ADD_FAILURE() << needle;
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("rank_0"), std::string::npos) << m;
      EXPECT_NE(m.find(needle), std::string::npos) << m;
    }
  };
  refused("", "neither a pickle");
  refused("garbage", "neither a pickle");
  refused(python_pickle("[1]", 4), "the top level is a list, not a dict");
  refused(python_pickle("{\"version\": \"3.0\", \"pg_config\": {}}", 4), "'3.0' is not 2.x");
  refused(python_pickle("{\"version\": \"2.10\"}", 4), "has no field 'pg_config'");
  refused(python_pickle("{\"version\": \"2.10\", \"pg_config\": {\"0\": {\"desc\": \"d\", \"ranks\": \"[0, x]\"}}}", 4),
          "pg_config['0'].ranks 'x' is not a rank");
  refused(python_pickle("{\"version\": \"2.10\", \"pg_config\": {}, \"entries\": [{\"record_id\": 0}]}", 4),
          "entries[0] has no field 'process_group'");
  refused(R"({"version": "2.10", "pg_config": {}, "entries": [{"record_id": 18446744073709551615}]})", "does not fit in int64");
  refused("{\"version\": " + std::string(100000, '[') + std::string(100000, ']') + "}", "nested 100001 deep");
  refused(R"({"version": "2.10", "pg_config": {)", "is not valid JSON");
  fs::remove_all(dir);
}

TEST(FlightRecorder, DirectoriesPrefixesAndDuplicatesAreClearErrors) {
  EXPECT_THROW(read_dump_dir("/nonexistent/meshsim", std::nullopt), InvalidArgument);
  const std::string dir = make_dumps("dirs", "--pp 1 --dp 2 --tp 1 --steps 1");
  EXPECT_THROW(read_dump_dir(dir + "/rank_0", std::nullopt), InvalidArgument);  // a file, not a directory
  EXPECT_THROW(read_dump_dir(dir, "nccl_trace_rank_"), InvalidArgument);        // no file has that prefix
  write(dir + "/sub/rank_1.json", "{}");
  EXPECT_THROW(read_dump_dir(dir, "rank_"), InvalidArgument);  // two dumps of rank 1
  fs::remove(dir + "/sub/rank_1.json");
  write(dir + "/other_7", "x");
  EXPECT_THROW(read_dump_dir(dir, std::nullopt), InvalidArgument);  // two prefixes: give --prefix
  EXPECT_EQ(read_dump_dir(dir, "rank_").dumps.size(), 2u);
  fs::remove_all(dir);
}

TEST(FlightRecorder, FormatRanks) {
  EXPECT_EQ(format_rank_runs({0, 1, 2, 3, 5, 7, 8}), "0-3,5,7-8");
  EXPECT_EQ(format_rank_runs({5, 13, 21, 29, 37, 45}), "5,13,...,45 (6 ranks, stride 8)");
  EXPECT_EQ(format_rank_runs({5, 13, 21, 29}), "5,13,21,29");
  EXPECT_EQ(format_rank_runs({1, 3, 5}), "1,3,5");
  EXPECT_EQ(format_rank_runs({0, 2, 3, 5, 6, 9}, 2), "0,2-3,... (6 ranks)");
  EXPECT_EQ(format_rank_runs({}), "");
}

TEST(FlightRecorder, TheToolExitsByTheVerdict) {
  const std::string ok = make_dumps("cli_ok", "--pp 2 --dp 2 --tp 2 --steps 2");
  Shell s = shell(std::string(MESHSIM_EXE) + " trace check " + ok);
  EXPECT_EQ(s.status, 0) << s.out;
  EXPECT_NE(s.out.find("\nOK\n"), std::string::npos) << s.out;
  const std::string bad = make_dumps("cli_bad", "--pp 2 --dp 2 --tp 2 --steps 2 --plant hang@3");
  s = shell(std::string(MESHSIM_EXE) + " trace check " + bad + " --format json");
  EXPECT_EQ(s.status, 1) << s.out;
  EXPECT_NE(s.out.find("\"ok\": false"), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("\"rank\": 3"), std::string::npos) << s.out;
  write(bad + "/rank_2", "cos\nsystem\n(S'true'\ntR.");
  s = shell(std::string(MESHSIM_EXE) + " trace check " + bad + " 2>&1");
  EXPECT_EQ(s.status, 2) << s.out;
  EXPECT_NE(s.out.find("neither a pickle"), std::string::npos) << s.out;
  write(bad + "/rank_2", std::string("\x80\x02") + "cos\nsystem\n(S'true'\ntR.");
  s = shell(std::string(MESHSIM_EXE) + " trace check " + bad + " 2>&1");
  EXPECT_EQ(s.status, 2) << s.out;
  EXPECT_NE(s.out.find("rank_2': offset 2: opcode 0x63 (GLOBAL) is refused"), std::string::npos) << s.out;
  s = shell(std::string(MESHSIM_EXE) + " trace check /nonexistent/meshsim 2>&1");
  EXPECT_EQ(s.status, 2) << s.out;
  fs::remove_all(ok);
  fs::remove_all(bad);
}

// --- dumps against the plan ---------------------------------------------------------------------

step::StepSpec plan_spec(int64_t microbatches) {
  step::StepSpec s;
  s.preset = "torchtitan:pp=2,dp_shard=2,tp=2";
  s.model = "llama3-debugmodel";
  s.seq_len = 256;
  s.local_batch_size = 1;
  s.microbatches = microbatches;
  s.ranks = "all";
  return s;
}

// planned_dumps: the dumps of a job that ran the planned step `steps` times (written by the
// generator from the plan's Chrome trace), with plants.
std::string planned_dumps(const std::string& name, const step::StepRun& run, const std::string& args) {
  const std::string trace = temp_dir(name + "_trace.json");
  std::ofstream(trace) << step::trace_json(run, step::traced_ranks(run)).dump();
  const std::string dir = make_dumps(name, "--from-trace " + trace + " " + args);
  fs::remove(trace);
  return dir;
}

std::set<int64_t> leaving(const PlanReport& p) {
  std::set<int64_t> out;
  for (const auto& d : p.divergences) out.insert(d.rank);
  return out;
}

TEST(PlanCheck, AJobThatRanThePlanAgreesWithItWrappedOrNot) {
  const step::StepRun run = step::run_step(plan_spec(2));
  for (const std::string args : {"--steps 2", "--steps 3 --ring 50", "--steps 2 --format pickle --protocol 2"}) {
    const std::string dir = planned_dumps("plan_ok", run, args);
    const DumpSet set = read_dump_dir(dir, std::nullopt);
    const PlanReport p = check_against_plan(set.dumps, run);
    EXPECT_TRUE(p.ok) << args << ": " << (p.divergences.empty() ? "" : p.divergences.front().message);
    EXPECT_EQ(p.ranks_compared, 8);
    EXPECT_GE(p.records_compared, 8 * 50);
    EXPECT_TRUE(check_dumps(set.dumps).ok);
    fs::remove_all(dir);
  }
}

// The generator's --world-mesh form (a trace of one rank per pp coordinate, every other rank's
// groups from the mesh, how the 2^16-rank benchmark job is written) writes the dumps its
// every-rank form writes: per rank, the same records on the same members; held to the plan, and
// a planted record named by its rank.
TEST(PlanCheck, AJobWrittenFromOneTracedRankPerStageIsTheJobWrittenFromEveryRank) {
  const step::StepRun run = step::run_step(plan_spec(2));
  step::StepSpec few = plan_spec(2);
  few.ranks = "0,4";
  const step::StepRun sampled = step::run_step(few);
  const std::string trace = temp_dir("plan_mesh_trace.json");
  std::ofstream(trace) << step::trace_json(sampled, step::traced_ranks(sampled)).dump();
  const std::string full = planned_dumps("plan_full", run, "--steps 2");
  const std::string mesh = make_dumps("plan_mesh", "--from-trace " + trace + " --world-mesh 2,2,2 --steps 2 --frames 0");
  const DumpSet a = read_dump_dir(full, std::nullopt), b = read_dump_dir(mesh, std::nullopt);
  ASSERT_EQ(a.dumps.size(), 8u);
  ASSERT_EQ(b.dumps.size(), 8u);
  auto members = [](const Dump& d, const std::string& name) -> const std::vector<int64_t>& {
    return std::find_if(d.groups.begin(), d.groups.end(), [&](const GroupConfig& g) { return g.name == name; })->ranks.get();
  };
  for (std::size_t r = 0; r < 8; ++r) {
    const Dump &x = a.dumps[r], &y = b.dumps[r];
    ASSERT_EQ(x.entries.size(), y.entries.size()) << r;
    for (std::size_t k = 0; k < x.entries.size(); ++k) {
      const Entry &e = x.entries[k], &f = y.entries[k];
      EXPECT_EQ(e.profiling_name, f.profiling_name) << r << " " << k;
      EXPECT_EQ(e.input_sizes, f.input_sizes.get()) << r << " " << k;
      EXPECT_EQ(e.output_sizes, f.output_sizes.get()) << r << " " << k;
      EXPECT_EQ(e.collective_seq_id, f.collective_seq_id) << r << " " << k;
      EXPECT_EQ(members(x, e.group), members(y, f.group)) << r << " " << k;
    }
  }
  EXPECT_TRUE(check_against_plan(b.dumps, run).ok);
  const std::string planted = make_dumps("plan_mesh_op", "--from-trace " + trace + " --world-mesh 2,2,2 --steps 2 --plant planop@6");
  EXPECT_EQ(leaving(check_against_plan(read_dump_dir(planted, std::nullopt).dumps, run)), (std::set<int64_t>{6}));
  // A mesh the trace's groups do not fit: refused.
  const Shell bad = shell("python3 " MESHSIM_TRACE_GEN " " + temp_dir("plan_mesh_bad") + " --from-trace " + trace +
                          " --world-mesh 2,4,1 2>&1");
  EXPECT_NE(bad.status, 0) << bad.out;
  for (const auto& d : {full, mesh, planted, temp_dir("plan_mesh_bad")}) fs::remove_all(d);
  fs::remove(trace);
}

TEST(PlanCheck, TheFirstRecordThatLeavesThePlanIsNamed) {
  const step::StepRun run = step::run_step(plan_spec(2));
  {
    const std::string dir = planned_dumps("plan_op", run, "--steps 2 --plant planop@3");
    const PlanReport p = check_against_plan(read_dump_dir(dir, std::nullopt).dumps, run);
    EXPECT_EQ(leaving(p), (std::set<int64_t>{3}));
    ASSERT_EQ(p.divergences.size(), 1u);
    const std::string& m = p.divergences[0].message;
    EXPECT_NE(m.find("rank 3 issued nccl:reduce_scatter #"), std::string::npos) << m;
    EXPECT_NE(m.find("where the plan has all_gather on tp [2, 3]"), std::string::npos) << m;
    fs::remove_all(dir);
  }
  {
    const std::string dir = planned_dumps("plan_swap", run, "--steps 3 --ring 120 --plant planswap@5");
    const PlanReport p = check_against_plan(read_dump_dir(dir, std::nullopt).dumps, run);
    EXPECT_EQ(leaving(p), (std::set<int64_t>{5}));
    fs::remove_all(dir);
  }
}

// An MoE's routed all-to-alls (the combine, the dispatch's gradient) move the tokens the router
// sent this rank: any bytes are the plan's. One of a fixed size (the token counts, the dispatch)
// whose bytes differ leaves the plan, named at its rank.
TEST(PlanCheck, ARoutedAllToAllsBytesAreTheRoutersAFixedOnesAreNot) {
  step::StepSpec s;
  s.preset = "torchtitan:dp_shard=2,ep=2";
  s.model = "deepseek_v3-debugmodel";
  s.seq_len = 256;
  s.local_batch_size = 1;
  s.ranks = "all";
  const step::StepRun run = step::run_step(s);
  const std::string routed = planned_dumps("plan_routed", run, "--steps 2 --plant planrouted@1");
  const DumpSet planted = read_dump_dir(routed, std::nullopt);
  // Rank 1's routed all-to-alls hold other bytes than its dispatches (rank 0's: the same).
  for (const Dump& d : planted.dumps) {
    std::set<std::vector<std::vector<int64_t>>> sizes;
    for (const Entry& e : d.entries) {
      if (e.profiling_name == "nccl:all_to_all") sizes.insert(e.input_sizes.get());
    }
    EXPECT_EQ(sizes.size(), d.rank == 1 ? 3u : 2u) << d.rank;  // the counts, the dispatch (, the routed)
  }
  const PlanReport ok = check_against_plan(planted.dumps, run);
  EXPECT_TRUE(ok.ok) << (ok.divergences.empty() ? "" : ok.divergences.front().message);
  EXPECT_EQ(ok.ranks_compared, 2);
  const std::string fixed = planned_dumps("plan_fixed", run, "--steps 2 --plant plansize@0");
  const PlanReport bad = check_against_plan(read_dump_dir(fixed, std::nullopt).dumps, run);
  EXPECT_EQ(leaving(bad), (std::set<int64_t>{0}));
  ASSERT_FALSE(bad.divergences.empty());
  EXPECT_NE(bad.divergences[0].message.find("all_to_all"), std::string::npos) << bad.divergences[0].message;
  fs::remove_all(routed);
  fs::remove_all(fixed);
}

TEST(PlanCheck, DumpsThatAgreeWithEachOtherButNotWithThePlanAreCaught) {
  // The job ran 2 microbatches; the plan says 4. Every rank agrees with every other (the
  // cross-rank check passes) and every rank leaves the plan.
  const std::string dir = planned_dumps("plan_other", step::run_step(plan_spec(2)), "--steps 2");
  const DumpSet set = read_dump_dir(dir, std::nullopt);
  EXPECT_TRUE(check_dumps(set.dumps).ok);
  const PlanReport p = check_against_plan(set.dumps, step::run_step(plan_spec(4)));
  EXPECT_EQ(leaving(p).size(), 8u);
  // A plan of another world: refused.
  step::StepSpec small = plan_spec(2);
  small.preset = "torchtitan:pp=2,dp_shard=1,tp=2";
  EXPECT_THROW(check_against_plan(set.dumps, step::run_step(small)), OutOfRange);
  fs::remove_all(dir);
}

TEST(PlanCheck, APlanOfFourMillionRanksCopiesNoGroupPerEvent) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's shadow memory does not start under the address-space limit this test sets";
#else
  // Five 1.6 KB dumps held to a plan of 2^22 ranks (dp_shard 2^20 x tp 4), under a 150 MB
  // address-space limit: each planned event and record points at its group's members (one list
  // per dim and per pg_config group) instead of copying them (269 MB peak when they were copied).
  const std::string dir = make_dumps("plan_huge", "--dp 2 --tp 2 --steps 1");
  for (int r : {1, 2, 3}) fs::remove(dir + "/rank_" + std::to_string(r));
  const Shell s = shell("ulimit -v 150000; " + std::string(MESHSIM_EXE) + " trace check " + dir +
                        " --against '--preset torchtitan:dp_shard=1048576,tp=4 --model llama3-debugmodel --seq-len 256 "
                        "--local-batch-size 1' 2>&1");
  EXPECT_EQ(s.status, 1) << s.out;
  EXPECT_NE(s.out.find("FAILED plan: rank 0: none of its"), std::string::npos) << s.out;
  fs::remove_all(dir);
#endif
}

TEST(PlanCheck, TheToolTakesThePlansFlagsOrAFileOfThem) {
  const step::StepRun run = step::run_step(plan_spec(2));
  const std::string dir = planned_dumps("plan_cli", run, "--steps 2 --plant planop@3");
  const std::string flags = "--preset torchtitan:pp=2,dp_shard=2,tp=2 --model llama3-debugmodel --seq-len 256 "
                            "--local-batch-size 1 --microbatches 2";
  Shell s = shell(std::string(MESHSIM_EXE) + " trace check " + dir + " --against '" + flags + "'");
  EXPECT_EQ(s.status, 1) << s.out;
  EXPECT_NE(s.out.find("FAILED plan: rank 3 issued nccl:reduce_scatter"), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("1 rank leaves the plan"), std::string::npos) << s.out;
  // The plan breaks the two-rank tp group's tie: rank 3 is the culprit, rank 2 is not.
  EXPECT_NE(s.out.find("culprits: rank 3;"), std::string::npos) << s.out;
  EXPECT_EQ(s.out.find("culprit: rank 2:"), std::string::npos) << s.out;
  const std::string file = dir + "_plan.txt";
  std::ofstream(file) << flags << "\n";
  s = shell(std::string(MESHSIM_EXE) + " trace check " + dir + " --format json --against @" + file);
  EXPECT_EQ(s.status, 1) << s.out;
  EXPECT_NE(s.out.find("\"divergences\""), std::string::npos) << s.out;
  s = shell(std::string(MESHSIM_EXE) + " trace check " + dir + " --against '--preset torchtitan:tp=2 --bogus 1' 2>&1");
  EXPECT_EQ(s.status, 2) << s.out;
  EXPECT_NE(s.out.find("'--bogus' is not one of the flags that define a step"), std::string::npos) << s.out;
  fs::remove(file);
  fs::remove_all(dir);
}

TEST(PlanCheck, AnEmptyAgainstIsRefusedAndItsWordsAreAShells) {
  const std::string dir = make_dumps("plan_words", "--dp 2 --tp 2 --steps 1");
  const std::string tool = std::string(MESHSIM_EXE) + " trace check " + dir;
  // An unset shell variable ("$PLAN") or blanks: refused (exit 2), never a check without a plan.
  for (const std::string& empty : {std::string("''"), std::string("'   '")}) {
    const Shell s = shell(tool + " --against " + empty + " 2>&1");
    EXPECT_EQ(s.status, 2) << empty << ": " << s.out;
    EXPECT_NE(s.out.find("holds no flags"), std::string::npos) << s.out;
  }
  const std::string file = dir + "_empty.txt";
  std::ofstream(file) << "\n";
  Shell s = shell(tool + " --against @" + file + " 2>&1");
  EXPECT_EQ(s.status, 2) << s.out;
  EXPECT_NE(s.out.find("holds no flags"), std::string::npos) << s.out;
  // Quoted values are one word, as in a shell: the refusal is about the job, not the quotes.
  s = shell(tool + " --against \"--preset torchtitan:tp=2 --megatron-args '--tensor-model-parallel-size 2 --num-layers 4'\" 2>&1");
  EXPECT_EQ(s.status, 2) << s.out;
  EXPECT_NE(s.out.find("--megatron-args gives the job; --preset or --job gives it again"), std::string::npos) << s.out;
  s = shell(tool + " --against \"--preset 'torchtitan:tp=2\" 2>&1");
  EXPECT_EQ(s.status, 2) << s.out;
  EXPECT_NE(s.out.find("an unclosed ' quote, opened at byte 9"), std::string::npos) << s.out;
  s = shell(tool + " --against '--preset \"torchtitan:tp=2' 2>&1");
  EXPECT_NE(s.out.find("an unclosed \" quote, opened at byte 9"), std::string::npos) << s.out;
  fs::remove(file);
  fs::remove_all(dir);
}

// --- hostile dumps: cost in proportion to the bytes ---------------------------------------------

// A pickle assembled opcode by opcode (protocol 4): what no Flight Recorder writes but an
// attacker can, memo references that name one big value many times.
struct Pk {
  std::string b = "\x80\x04";
  Pk& str(const std::string& s) {
    b += '\x8c';
    b += static_cast<char>(s.size());
    b += s;
    return *this;
  }
  Pk& num(int32_t v) {
    b += 'J';
    for (int k = 0; k < 4; ++k) b += static_cast<char>((static_cast<uint32_t>(v) >> (8 * k)) & 0xff);
    return *this;
  }
  Pk& op(char c) {
    b += c;
    return *this;
  }
  Pk& get(uint32_t slot) {
    b += 'j';
    for (int k = 0; k < 4; ++k) b += static_cast<char>((slot >> (8 * k)) & 0xff);
    return *this;
  }
  // A dump's top: version and a one-group pg_config of ranks "[0]", then "entries" and a list's
  // MARK: the caller adds the records, then end().
  Pk& top() {
    op('}').op('(').str("version").str("2.10").str("pg_config").op('}').op('(').str("0");
    op('}').op('(').str("desc").str("default_pg").str("ranks").str("[0]").op('u').op('u');
    return str("entries").op(']').op('(');
  }
  // The fields of one record (inside a dict's MARK), with input_sizes [[1] * dims].
  Pk& fields(int32_t seq, int dims) {
    str("record_id").num(seq).str("pg_id").num(0).str("process_group").str("0").str("default_pg").op('\x86');
    str("collective_seq_id").num(seq).str("p2p_seq_id").num(0).str("op_id").num(seq);
    str("profiling_name").str("nccl:all_reduce");
    str("input_sizes").op(']').op('(').op(']').op('(');
    for (int k = 0; k < dims; ++k) num(1);
    op('e').op('e');
    str("output_sizes").op(']').op('(').op(']').op('(');
    for (int k = 0; k < dims; ++k) num(1);
    op('e').op('e');
    str("input_dtypes").op(']').op('(').str("Float").op('e').str("output_dtypes").op(']').op('(').str("Float").op('e');
    return str("state").str("completed").str("is_p2p").op('\x89');
  }
  std::string end() { return b + "eu."; }
};

TEST(HostileDumps, OneRecordSharedByMemoIsRefusedNotCopiedPerReference) {
  // 10,000 references to one record whose sizes hold 30,000 numbers: 0.3 MB that would decode
  // to 4.8 GB of copies. Refused (a typed error naming the bound) before it is built.
  Pk p;
  p.top().op('}').op('(').fields(0, 30000).op('u').op('\x94');
  for (int k = 1; k < 10000; ++k) p.get(0);
  const std::string bytes = p.end();
  ASSERT_LT(bytes.size(), std::size_t{1} << 20);
  try {
    parse_dump(bytes, 0, "shared_record");
    FAIL() << "a dump decoding to 4.8 GB was read";
  } catch (const ResourceExhausted& e) {
    EXPECT_NE(std::string(e.what()).find("decode to more than"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("shared_record"), std::string::npos) << e.what();
  }
  // The same record once is read, sizes and all.
  Pk once;
  once.top().op('}').op('(').fields(0, 30000).op('u');
  const Dump d = parse_dump(once.end(), 0, "one_record");
  ASSERT_EQ(d.entries.size(), 1u);
  EXPECT_EQ(d.entries[0].input_sizes.at(0).size(), 30000u);
}

TEST(HostileDumps, GroupsThatShareOneHugeRankListAreRefused) {
  // 2,000 group names whose value is one dict of 100,000 ranks (0.3 MB; 1.6 GB as copies).
  Pk p;
  p.op('}').op('(').str("version").str("2.10").str("pg_config").op('}').op('(').str("g0").op('}').op('(');
  p.str("desc").str("x").str("ranks").op(']').op('(');
  for (int k = 0; k < 100000; ++k) p.num(k);
  p.op('e').op('u').op('\x94');
  for (int k = 1; k < 2000; ++k) p.str("g" + std::to_string(k)).get(0);
  p.op('u').str("entries").op(']').op('u').op('.');
  const std::string bytes = p.b;
  ASSERT_LT(bytes.size(), std::size_t{1} << 20);
  EXPECT_THROW(parse_dump(bytes, 0, "shared_group"), ResourceExhausted);
}

TEST(HostileDumps, ARecordDictOfOneKeySetAMillionTimesIsLookedUpOnce) {
  // One record whose dict sets the key "x" 200,000 times (Python keeps the last), named by 5,000
  // records: each field lookup is a hash lookup, not a walk over 400,000 items per record.
  Pk p;
  p.top().op('}').op('(').fields(0, 1);
  for (int k = 0; k < 200000; ++k) p.str("x").num(k);
  p.op('u').op('\x94');
  for (int k = 1; k < 5000; ++k) p.get(0);
  const Dump d = parse_dump(p.end(), 0, "repeated_key");
  ASSERT_EQ(d.entries.size(), 5000u);
  EXPECT_EQ(d.entries.back().op, "all_reduce");
  // Python's last-wins: a later "state" overrides the first.
  Pk q;
  q.top().op('}').op('(').fields(0, 1);
  for (int k = 0; k < 100; ++k) q.str("pad" + std::to_string(k)).num(k);
  q.str("state").str("started").op('u');
  EXPECT_EQ(parse_dump(q.end(), 0, "last_wins").entries.at(0).state, EntryState::kStarted);
}

// A dump (as JSON, which parse_dump reads too) of `rank` in one group of `members` ranks,
// with `records` all_reduces, the last one started, dtype `odd` at sequence ids s % 2 == parity.
std::string json_dump(const std::string& members, int records, int parity) {
  nlohmann::json j;
  j["version"] = "2.10";
  j["pg_config"]["0"] = {{"name", "0"}, {"desc", "default_pg"}, {"ranks", members}};
  auto& es = j["entries"] = nlohmann::json::array();
  for (int s = 1; s <= records; ++s) {
    const std::string dt = s % 2 == parity ? "Half" : "Float";
    es.push_back({{"record_id", s - 1}, {"pg_id", 0}, {"process_group", {"0", "default_pg"}}, {"collective_seq_id", s},
                  {"p2p_seq_id", 0}, {"op_id", s}, {"profiling_name", "nccl:all_reduce"}, {"input_sizes", {{4}}},
                  {"output_sizes", {{4}}}, {"input_dtypes", {dt}}, {"output_dtypes", {dt}},
                  {"state", s == records ? "started" : "completed"}, {"is_p2p", false}});
  }
  return j.dump();
}

TEST(HostileDumps, AHugeGroupCostsItsRecordsNotItsMembersTimesItsSequenceIds) {
  // Two dumps of a group of ~670,000 scattered ranks (no two runs alike: 220,000 ranges), 3,000
  // records each, every record a dtype mismatch between the two (none merge: the sides
  // alternate), the last started. Reports stay bounded: each problem names its group in at most
  // 64 ranges (text and JSON), the JSON lists the group once, and the ~670,000 members without
  // dumps are one note, not a culprit line each.
  std::vector<int64_t> ranks;
  std::string members = "[";
  for (int64_t r = 0; r < 1000000; ++r) {
    if ((r * 2654435761u) % 3 == 0 && r > 1) continue;
    members += (ranks.empty() ? "" : ", ") + std::to_string(r);
    ranks.push_back(r);
  }
  members += "]";
  std::vector<Dump> dumps;
  std::size_t input = 0;
  for (int rank : {0, 1}) {
    const std::string bytes = json_dump(members, 3000, rank);
    input += bytes.size();
    dumps.push_back(parse_dump(bytes, rank, "rank_" + std::to_string(rank)));
  }
  const CheckReport r = check_dumps(dumps);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.collectives_checked, 3000);
  EXPECT_EQ(culprits(r), (std::set<int64_t>{0, 1}));
  EXPECT_TRUE(kinds(r).count("dtype")) << r.problems.front().message;
  EXPECT_TRUE(kinds(r).count("missing-dump"));
  DumpSet set;
  set.dir = "huge";
  set.prefix = "rank_";
  const std::string t = report_text(r, set);
  const std::string js = report_json(r, set).dump();
  EXPECT_LT(t.size(), std::size_t{4} << 20) << t.substr(0, 2000);
  EXPECT_LT(js.size(), input) << "the JSON report is not bounded by its input";
  // The whole group, once: parsed back, it is the group's ranks.
  const auto j = nlohmann::json::parse(js);
  ASSERT_EQ(j["group_list"].size(), 1u);
  EXPECT_EQ(j["group_list"][0]["size"], ranks.size());
  EXPECT_EQ(j["group_list"][0]["ranks"], format_rank_runs(ranks, SIZE_MAX));
  EXPECT_NE(t.find("members without dumps"), std::string::npos);
}

TEST(HostileDumps, AChainOfWaitsIsFollowedOnceNotFromEveryRank) {
  // 20,000 ranks, rank i waiting in group {i, i+1} on rank i+1, which never issued it because
  // it waits in its own next group: the last rank holds everyone up, and the walk is linear.
  const int n = 20000;
  std::vector<Dump> dumps(n);
  for (int i = 0; i < n; ++i) {
    Dump& d = dumps[i];
    d.rank = i;
    d.path = "rank_" + std::to_string(i);
    for (int g : {i - 1, i}) {
      if (g < 0 || g + 1 >= n) continue;
      d.groups.push_back(GroupConfig{"g" + std::to_string(g), "", {g, g + 1}});
    }
    if (i + 1 < n) {
      Entry e;
      e.group = "g" + std::to_string(i);
      e.collective_seq_id = 1;
      e.profiling_name = "nccl:all_reduce";
      e.op = "all_reduce";
      e.input_sizes = e.output_sizes = {{4}};
      e.input_dtypes = e.output_dtypes = {"Float"};
      e.state = EntryState::kStarted;
      d.entries.push_back(e);
    }
  }
  const CheckReport r = check_dumps(dumps);
  EXPECT_FALSE(r.ok);
  ASSERT_TRUE(culprits(r).count(n - 1)) << r.culprits.size();
  for (const auto& c : r.culprits) {
    if (c.rank == n - 1) EXPECT_NE(c.why.find("19999 ranks"), std::string::npos) << c.why;
  }
}

// --- what PyTorch's analyzer compares, and what it misses -------------------------------------

// four_ranks: dumps of ranks 0-3 in one group, one collective each, as `make(rank)` builds it.
std::vector<Dump> four_ranks(const std::function<Entry(int)>& make) {
  std::vector<Dump> dumps(4);
  for (int r = 0; r < 4; ++r) {
    dumps[r].rank = r;
    dumps[r].path = "rank_" + std::to_string(r);
    dumps[r].groups.push_back(GroupConfig{"0", "default_pg", {0, 1, 2, 3}});
    Entry e = make(r);
    e.group = "0";
    e.desc = "default_pg";
    e.collective_seq_id = 1;
    e.profiling_name = "nccl:" + e.op;
    e.state = EntryState::kCompleted;
    dumps[r].entries.push_back(e);
  }
  return dumps;
}

TEST(FlightRecorder, AGathersAndScattersNonRootRanksRecordNoDtypeToCompare) {
  // Non-root ranks of a gather record no output, of a scatter no input (c10d's records): their
  // missing dtypes are no mismatch (PyTorch's analyzer skips exactly these).
  const auto gather = four_ranks([](int r) {
    Entry e;
    e.op = "gather";
    e.input_sizes = {{4}};
    e.input_dtypes = {"Float"};
    if (r == 0) {
      e.output_sizes = {{16}};
      e.output_dtypes = {"Float"};
    }
    return e;
  });
  CheckReport r = check_dumps(gather);
  EXPECT_TRUE(r.ok) << (r.problems.empty() ? "" : r.problems.front().message);
  const auto scatter = four_ranks([](int r) {
    Entry e;
    e.op = "scatter";
    e.output_sizes = {{4}};
    e.output_dtypes = {"Float"};
    if (r == 0) {
      e.input_sizes = {{16}};
      e.input_dtypes = {"Float"};
    }
    return e;
  });
  r = check_dumps(scatter);
  EXPECT_TRUE(r.ok) << (r.problems.empty() ? "" : r.problems.front().message);
  // A dtype every rank records still counts: rank 3's gather input in Half is named.
  auto odd = gather;
  odd[3].entries[0].input_dtypes = {"Half"};
  r = check_dumps(odd);
  EXPECT_EQ(culprits(r), std::set<int64_t>{3});
  EXPECT_TRUE(kinds(r).count("dtype"));
}

TEST(FlightRecorder, AnAllToAllWhoseSizesDoNotAddUpNamesTheRankThatBrokeAnEvenExchange) {
  auto a2a = [](std::vector<int64_t> in, std::vector<int64_t> out) {
    return four_ranks([in, out](int r) {
      Entry e;
      e.op = "all_to_all";
      e.input_sizes = {{in[r]}};
      e.output_sizes = {{out[r]}};
      e.input_dtypes = e.output_dtypes = {"BFloat16"};
      return e;
    });
  };
  // Uneven splits (a mixture of experts) that add up: fine.
  CheckReport r = check_dumps(a2a({8, 6, 10, 8}, {6, 10, 8, 8}));
  EXPECT_TRUE(r.ok) << (r.problems.empty() ? "" : r.problems.front().message);
  // An even exchange where rank 2 sends 6 elements but receives 8: 30 in, 32 out, rank 2 named.
  r = check_dumps(a2a({8, 8, 6, 8}, {8, 8, 8, 8}));
  ASSERT_FALSE(r.ok);
  EXPECT_EQ(culprits(r), std::set<int64_t>{2});
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_EQ(r.problems[0].kind, ProblemKind::kSize);
  EXPECT_NE(r.problems[0].message.find("inputs total 30 elements over the group but its outputs 32"), std::string::npos)
      << r.problems[0].message;
  // Totals that differ with no odd minority: the group is named, no rank blamed.
  r = check_dumps(a2a({8, 6, 10, 8}, {6, 10, 8, 9}));
  ASSERT_FALSE(r.ok);
  EXPECT_TRUE(r.culprits.empty());
  EXPECT_EQ(r.problems.at(0).ranks, (std::vector<int64_t>{0, 1, 2, 3}));
  // A recording's dumps (meshsim record, the fake backend moved no data): totals not compared,
  // said in a note; a dtype that differs is still named.
  r = check_dumps(a2a({8, 6, 10, 8}, {6, 10, 8, 9}), CheckOptions{.all_to_all_totals = false});
  EXPECT_TRUE(r.ok) << (r.problems.empty() ? "" : r.problems.front().message);
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("1 all_to_all collectives' totals over their groups not compared"), std::string::npos) << r.notes[0];
  auto odd = a2a({8, 8, 8, 8}, {8, 8, 8, 8});
  odd[1].entries[0].input_dtypes = {"Half"};
  EXPECT_TRUE(kinds(check_dumps(odd, CheckOptions{.all_to_all_totals = false})).count("dtype"));
}

TEST(HostileDumps, APrefixRefusalNamesAFewPrefixesNotAll) {
  const std::string dir = temp_dir("prefixes");
  fs::create_directories(dir);
  for (int k = 0; k < 3000; ++k) std::ofstream(dir + "/p" + std::to_string(k) + "x_0") << "{}";
  try {
    read_dump_dir(dir, std::nullopt);
    FAIL() << "3,000 prefixes were taken for one";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_LT(what.size(), 1000u) << what.substr(0, 2000);
    EXPECT_NE(what.find("and 2992 more"), std::string::npos) << what;
    EXPECT_NE(what.find("give --prefix"), std::string::npos) << what;
  }
  fs::remove_all(dir);
}

// A problem's kind is an enum with one wording each, the reports' word; every name reads back.
// A world of dumps whose groups each rank lists as `groups(r)` (name, ranks, desc), every record
// completed (as the fake backend's under meshsim record): one all_reduce per group it lists.
std::vector<Dump> named_groups(int world, const std::function<std::vector<GroupConfig>(int)>& groups) {
  std::vector<Dump> out;
  for (int r = 0; r < world; ++r) {
    Dump d;
    d.rank = r;
    d.path = "rank" + std::to_string(r);
    d.format = "pickle";
    d.version = "2.10";
    d.groups = groups(r);
    for (const auto& g : d.groups) {
      Entry e;
      e.record_id = static_cast<int64_t>(d.entries.size());
      e.group = g.name;
      e.desc = g.desc;
      e.collective_seq_id = 1;
      e.profiling_name = "nccl:all_reduce";
      e.op = "all_reduce";
      e.input_sizes = e.output_sizes = {{4}};
      e.input_dtypes = e.output_dtypes = {"Float"};
      e.state = EntryState::kCompleted;
      d.entries.push_back(e);
    }
    out.push_back(std::move(d));
  }
  return out;
}

TEST(GroupNames, OneGroupNamedDifferentlyByItsMembersIsNamedFirstWithBothSides) {
  // A world of n ranks; a group of ranks [0, n) that ranks below `split` call "2" and the others
  // "1" (PyTorch 2.14's counter after a local-sync group of the first ranks): one group-name
  // problem, before any other, naming both sides; the same world named alike passes.
  for (int n : {2, 3, 4, 8, 64}) {
    for (int split = 1; split < n; split += std::max(1, n / 4)) {
      std::vector<int64_t> all(n);
      std::iota(all.begin(), all.end(), 0);
      const auto dumps = named_groups(n, [&](int r) {
        return std::vector<GroupConfig>{{"0", "default_pg", all}, {r < split ? "2" : "1", "undefined", all}};
      });
      const CheckReport rep = check_dumps(dumps);
      ASSERT_FALSE(rep.ok);
      ASSERT_EQ(problem_kind_name(rep.problems.front().kind), "group-name") << rep.problems.front().message;
      int names = 0;
      for (const auto& p : rep.problems) names += p.kind == ProblemKind::kGroupName;
      EXPECT_EQ(names, 1) << n << " " << split;
      const std::string& m = rep.problems.front().message;
      const std::string low = split == 1 ? "rank 0" : "ranks 0-" + std::to_string(split - 1);
      const std::string high = split == n - 1 ? "rank " + std::to_string(n - 1) : "ranks " + std::to_string(split) + "-" + std::to_string(n - 1);
      EXPECT_NE(m.find(low + " as '2', " + high + " as '1'"), std::string::npos) << m;
      EXPECT_EQ(rep.problems.front().ranks, all);
      const auto alike = named_groups(n, [&](int) { return std::vector<GroupConfig>{{"0", "default_pg", all}, {"1", "undefined", all}}; });
      EXPECT_TRUE(check_dumps(alike).ok);
    }
  }
}

TEST(GroupNames, ChainedLocalGroupsAndAMemberThatListsNoneAreNamed) {
  // Ranks 0 and 3 hash their [0, 3] group differently (each its own count of groups held):
  // named with both sides; the other ranks are not in it and not named.
  const std::vector<int64_t> all{0, 1, 2, 3};
  auto dumps = named_groups(4, [&](int r) {
    std::vector<GroupConfig> g{{"0", "default_pg", all}};
    if (r < 2) g.push_back({"h01", "undefined", {0, 1}});
    if (r == 0) g.push_back({"h03-after-two", "undefined", {0, 3}});
    if (r == 3) g.push_back({"h03-after-one", "undefined", {0, 3}});
    return g;
  });
  CheckReport rep = check_dumps(dumps);
  ASSERT_FALSE(rep.ok);
  EXPECT_EQ(rep.problems.front().kind, ProblemKind::kGroupName);
  EXPECT_EQ(rep.problems.front().ranks, (std::vector<int64_t>{0, 3}));
  EXPECT_NE(rep.problems.front().message.find("rank 0 as 'h03-after-two', rank 3 as 'h03-after-one'"), std::string::npos)
      << rep.problems.front().message;
  // A member that lists no group of these ranks at all: a membership problem naming it.
  dumps = named_groups(4, [&](int r) {
    std::vector<GroupConfig> g{{"0", "default_pg", all}};
    if (r != 2) g.push_back({"5", "mesh_tp", {0, 1, 2}});
    return g;
  });
  rep = check_dumps(dumps);
  ASSERT_FALSE(rep.ok);
  EXPECT_EQ(rep.problems.front().kind, ProblemKind::kMembership);
  EXPECT_NE(rep.problems.front().message.find("rank 2, a member, lists no group of these ranks"), std::string::npos)
      << rep.problems.front().message;
}

TEST(GroupNames, CompletedWithoutOneMemberAndDescribedInAnotherOrderNameTheRank) {
  // Every record completed (the fake backend completes alone): a rank that never issued a
  // collective the others completed is the culprit, as is the rank whose groups' descriptions
  // are another dim order's (its mesh built ("tp", "dp") where the others built ("dp", "tp")).
  const std::vector<int64_t> all{0, 1, 2, 3};
  for (int odd = 0; odd < 4; ++odd) {
    auto dumps = named_groups(4, [&](int) { return std::vector<GroupConfig>{{"0", "default_pg", all}}; });
    dumps[odd].entries.clear();
    CheckReport rep = check_dumps(dumps);
    EXPECT_EQ(culprits(rep), std::set<int64_t>{odd}) << odd;
    // 2x2 mesh: dp groups {0,2},{1,3} named "1"; tp groups {0,1},{2,3} named "2".
    dumps = named_groups(4, [&](int r) {
      const std::vector<int64_t> dp{r % 2, r % 2 + 2}, tp{r / 2 * 2, r / 2 * 2 + 1};
      if (r == odd) return std::vector<GroupConfig>{{"0", "default_pg", all}, {"1", "mesh_tp", dp}, {"2", "mesh_dp", tp}};
      return std::vector<GroupConfig>{{"0", "default_pg", all}, {"1", "mesh_dp", dp}, {"2", "mesh_tp", tp}};
    });
    rep = check_dumps(dumps);
    EXPECT_EQ(culprits(rep), std::set<int64_t>{odd}) << odd;
  }
}

TEST(ProblemKinds, EachKindHasOneWordingThatReadsBack) {
  std::set<std::string> names;
  for (int k = 0; k < kProblemKinds; ++k) {
    const auto kind = static_cast<ProblemKind>(k);
    const std::string name(problem_kind_name(kind));
    EXPECT_FALSE(name.empty()) << k;
    EXPECT_TRUE(names.insert(name).second) << name << " words two kinds";
    ASSERT_TRUE(parse_problem_kind(name).has_value()) << name;
    EXPECT_EQ(*parse_problem_kind(name), kind) << name;
  }
  EXPECT_EQ(names, (std::set<std::string>{"membership", "missing-dump", "unknown-group", "never-issued", "absent", "type",
                                          "size", "dtype", "state", "p2p", "unmatched-p2p", "wait-cycle", "group-name"}));
  for (const char* unknown : {"stuck", "", "Size", "size "}) EXPECT_FALSE(parse_problem_kind(unknown).has_value()) << unknown;
}

// The dumps read on any number of threads are the dumps read on one: the same report, byte
// for byte, in both forms, with frames and planted faults.
TEST(ParallelRead, EveryJobCountReadsTheSameDumpsAndTheSameReport) {
  for (const std::string form : {"--format pickle", "--format json"}) {
    const std::string dir = make_dumps("par", "--pp 2 --dp 4 --tp 4 --steps 3 --frames 8 --plant hang@9 --plant dtype@20 " + form);
    const DumpSet one = read_dump_dir(dir, std::nullopt, {}, 1);
    ASSERT_EQ(one.dumps.size(), 32u);
    const std::string want = text(check_dumps(one.dumps), one);
    EXPECT_NE(want.find("FAILED"), std::string::npos) << want;
    for (unsigned jobs : {2u, 3u, 8u, 64u}) {
      const DumpSet many = read_dump_dir(dir, std::nullopt, {}, jobs);
      ASSERT_EQ(many.dumps.size(), one.dumps.size());
      for (std::size_t k = 0; k < one.dumps.size(); ++k) {
        EXPECT_EQ(many.dumps[k].rank, one.dumps[k].rank);
        ASSERT_EQ(many.dumps[k].entries.size(), one.dumps[k].entries.size()) << k;
        for (std::size_t e = 0; e < one.dumps[k].entries.size(); ++e) {
          EXPECT_EQ(many.dumps[k].entries[e].profiling_name, one.dumps[k].entries[e].profiling_name);
          EXPECT_EQ(many.dumps[k].entries[e].input_sizes, one.dumps[k].entries[e].input_sizes);
        }
      }
      EXPECT_EQ(text(check_dumps(many.dumps), many), want) << form << " jobs " << jobs;
    }
    fs::remove_all(dir);
  }
}

// Two bad files: whatever the threads, the error is the one a reader going file by file meets
// first (file order is the names' order: rank_11 before rank_3).
TEST(ParallelRead, TheErrorIsTheFirstFilesInOrderWhateverTheJobs) {
  const std::string dir = make_dumps("parerr", "--pp 2 --dp 2 --tp 4 --steps 2");
  for (const char* bad : {"rank_3", "rank_11"}) {
    std::ofstream(fs::path(dir) / bad, std::ios::trunc) << "\x80\x02garbage";
  }
  for (unsigned jobs : {1u, 2u, 5u, 16u}) {
    try {
      read_dump_dir(dir, std::nullopt, {}, jobs);
      ADD_FAILURE() << "jobs " << jobs << ": no error";
    } catch (const ParseError& e) {
      EXPECT_NE(std::string(e.what()).find("rank_11'"), std::string::npos) << "jobs " << jobs << ": " << e.what();
    }
  }
  fs::remove_all(dir);
}

// drop_rank_from_default_group rewrites one pickled dump: its default group's ranks lose `rank`
// (a rank whose long list differs from every other dump's in one rank).
void drop_rank_from_default_group(const std::string& path, int rank) {
  const Shell s = shell("python3 -c 'import pickle,sys; p=sys.argv[1]; d=pickle.load(open(p,\"rb\")); "
                        "r=d[\"pg_config\"][\"0\"]; r[\"ranks\"]=r[\"ranks\"].replace(\", " + std::to_string(rank) +
                        ",\", \",\"); pickle.dump(d, open(p, \"wb\"))' " + path);
  ASSERT_EQ(s.status, 0) << s.out;
}

// The reader keeps the rank lists it read from long strings (the default group's, in every
// dump): a rank whose long list differs in one rank is still read as written.
TEST(ParallelRead, ALongRankListThatDiffersInOneRankIsReadAsWritten) {
  const std::string dir = make_dumps("parlong", "--pp 2 --dp 8 --tp 8 --steps 2");  // 128 ranks: "[0, ..., 127]"
  drop_rank_from_default_group(dir + "/rank_100", 77);
  for (unsigned jobs : {1u, 2u}) {
    const DumpSet set = read_dump_dir(dir, std::nullopt, {}, jobs);
    for (const Dump& d : set.dumps) {
      const GroupConfig& world = *std::find_if(d.groups.begin(), d.groups.end(), [](const GroupConfig& g) { return g.name == "0"; });
      EXPECT_EQ(world.ranks.size(), d.rank == 100 ? 127u : 128u) << d.rank;
    }
    const CheckReport r = check_dumps(set.dumps);
    EXPECT_FALSE(r.ok);
    EXPECT_TRUE(kinds(r).count("membership")) << text(r, set);
  }
  fs::remove_all(dir);
}

// Every dump lists the default group's ranks in the same words: the readers, on any number of
// threads, keep one list for all of them (a 2^16-rank job's dumps would otherwise hold 2^32
// ranks), while a list that differs is its own and equal lists of short strings stay equal.
TEST(ParallelRead, OneLongRankListIsOneListForEveryDumpOnEveryThread) {
  const std::string dir = make_dumps("parshare", "--pp 2 --dp 8 --tp 8 --steps 2");  // 128 ranks: "[0, ..., 127]"
  drop_rank_from_default_group(dir + "/rank_100", 77);
  auto world = [](const Dump& d) -> const GroupConfig& {
    return *std::find_if(d.groups.begin(), d.groups.end(), [](const GroupConfig& g) { return g.name == "0"; });
  };
  for (unsigned jobs : {1u, 2u, 7u}) {
    const DumpSet set = read_dump_dir(dir, std::nullopt, {}, jobs);
    ASSERT_EQ(set.dumps.size(), 128u);
    const RankList& first = world(set.dumps[0]).ranks;
    std::vector<int64_t> all(128);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(first, all);
    for (const Dump& d : set.dumps) {
      const RankList& mine = world(d).ranks;
      if (d.rank == 100) {
        EXPECT_FALSE(mine.same(first));
        EXPECT_EQ(mine.size(), 127u);
      } else {
        EXPECT_TRUE(mine.same(first)) << "jobs " << jobs << ": rank " << d.rank << " holds a copy of the default group's list";
      }
    }
    // A TP group's short list ("[8, 9, ..., 15]"): read per dump, equal across its members.
    auto tp = [](const Dump& d) {
      return *std::find_if(d.groups.begin(), d.groups.end(), [](const GroupConfig& g) { return g.desc == "mesh_tp"; });
    };
    EXPECT_EQ(tp(set.dumps[8]).ranks, tp(set.dumps[9]).ranks);
    EXPECT_FALSE(tp(set.dumps[8]).ranks == tp(set.dumps[0]).ranks);
  }
  fs::remove_all(dir);
}

// A job whose default group never talks: no dump lists it (c10d records a group when it sets up
// its communicator), the mesh's groups are checked alone and a planted fault is still named.
TEST(ParallelRead, AJobWhoseDefaultGroupIsIdleIsCheckedOnItsMeshGroups) {
  const std::string ok = make_dumps("paridle", "--pp 2 --dp 4 --tp 4 --steps 3 --idle-default-group");
  const DumpSet set = read_dump_dir(ok, std::nullopt, {}, 2);
  for (const Dump& d : set.dumps) {
    EXPECT_EQ(d.groups.size(), 3u) << d.rank;
    for (const GroupConfig& g : d.groups) EXPECT_NE(g.name, "0");
  }
  const CheckReport r = check_dumps(set.dumps);
  EXPECT_TRUE(r.ok) << text(r, set);
  fs::remove_all(ok);
  const std::string bad = make_dumps("paridlebad", "--pp 2 --dp 4 --tp 4 --steps 3 --idle-default-group --plant dtype@6 --plant hang@13");
  const DumpSet b = read_dump_dir(bad, std::nullopt, {}, 2);
  const CheckReport rb = check_dumps(b.dumps);
  EXPECT_FALSE(rb.ok);
  EXPECT_EQ(culprits(rb), (std::set<int64_t>{6, 13})) << text(rb, b);
  EXPECT_TRUE(kinds(rb).count("never-issued") && kinds(rb).count("dtype")) << text(rb, b);
  fs::remove_all(bad);
}

// Ranks past what a rank can be, in the string form's fast path: refused by value, never wrapped.
TEST(ParallelRead, ARankListsHugeNumbersAreRefusedNotWrapped) {
  const std::string dir = make_dumps("parhuge", "--pp 2 --dp 1 --tp 2 --steps 1");
  for (const char* huge : {"99999999999999999999999", "9223372036854775808", "2147483648", "0000000000000000000001x"}) {
    const Shell s = shell(std::string("python3 -c 'import pickle,sys; p=sys.argv[1]; d=pickle.load(open(p,\"rb\")); "
                                      "d[\"pg_config\"][\"0\"][\"ranks\"]=\"[0, ") + huge + "]\"; "
                          "pickle.dump(d, open(p, \"wb\"))' " + dir + "/rank_1");
    ASSERT_EQ(s.status, 0) << s.out;
    try {
      read_dump_dir(dir, std::nullopt, {}, 2);
      ADD_FAILURE() << huge << ": read";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("rank_1'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::string(huge).substr(0, 10)), std::string::npos) << e.what();
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace meshsim::trace
