// `meshsim step --chakra`: Chakra execution traces decoded by protoc (Debian's
// protobuf-compiler) against a .proto this test writes from et_def.proto's field numbers, then
// held to the step's programs: node counts and order, each collective's comm_type, comm_size
// and communicator group, every send meeting one receive with the same tag and size.
#include "meshsim/chakra.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <unistd.h>

#include "meshsim/error.hpp"

namespace meshsim::step {
namespace {

namespace fs = std::filesystem;

// The messages of et_def.proto this export uses, with their field numbers, and a wrapper: the
// file's length-prefixed messages become fields 1 (the metadata) and 2 (each node) of one
// message, so one protoc call decodes a whole file.
constexpr const char* kProto = R"(syntax = "proto3";
message AttributeProto {
  string name = 1;
  oneof value { int32 int32_val = 7; int64 int64_val = 9; uint64 uint64_val = 13; bool bool_val = 27; string string_val = 29; }
}
message GlobalMetadata { string version = 1; repeated AttributeProto attr = 2; }
message Node { uint64 id = 1; string name = 2; int32 type = 3; repeated uint64 ctrl_deps = 4; repeated uint64 data_deps = 5; repeated AttributeProto attr = 10; }
message EtFile { GlobalMetadata metadata = 1; repeated Node node = 2; }
)";

struct Node {
  uint64_t id = 0;
  std::string name;
  int type = 0;
  std::vector<uint64_t> deps;
  std::map<std::string, std::string> attr;  // name -> "int64:N", "int32:N", "bool:true", "string:S"
};

struct File {
  std::string version;
  std::vector<Node> nodes;
};

std::string shell(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  char buf[4096];
  std::size_t n;
  while (p && (n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  *status = p ? ::pclose(p) : -1;
  return out;
}

bool have_protoc() {
  int st = 0;
  shell("protoc --version >/dev/null 2>&1", &st);
  return st == 0;
}

std::string dir_for(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("meshsim_chakra_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

// decode reframes a .et file as an EtFile and parses protoc's text output.
File decode(const std::string& path, const std::string& dir) {
  std::ifstream in(path, std::ios::binary);
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string framed;
  std::size_t pos = 0;
  bool first = true;
  while (pos < data.size()) {
    uint64_t len = 0;
    int shift = 0;
    const std::size_t start = pos;
    while (true) {
      const auto b = static_cast<unsigned char>(data.at(pos++));
      len |= uint64_t(b & 0x7f) << shift;
      shift += 7;
      if (b < 0x80) break;
    }
    framed += first ? '\x0a' : '\x12';
    framed += data.substr(start, pos - start);
    framed += data.substr(pos, len);
    EXPECT_LE(pos + len, data.size()) << path;
    pos += len;
    first = false;
  }
  const std::string bin = dir + "/framed.bin";
  std::ofstream(bin, std::ios::binary) << framed;
  int st = 0;
  const std::string text = shell("protoc --decode=EtFile -I" + dir + " " + dir + "/et.proto < " + bin + " 2>&1", &st);
  EXPECT_EQ(st, 0) << text;
  File f;
  std::istringstream lines(text);
  std::string line, attr_name;
  Node* node = nullptr;
  bool in_attr = false;
  auto value = [](const std::string& l) {
    std::string v = l.substr(l.find(':') + 2);
    if (!v.empty() && v.front() == '"') v = v.substr(1, v.size() - 2);
    return v;
  };
  while (std::getline(lines, line)) {
    line.erase(0, line.find_first_not_of(' '));
    if (line == "node {") {
      f.nodes.emplace_back();
      node = &f.nodes.back();
    } else if (line == "attr {") {
      in_attr = true;
    } else if (line == "}") {
      in_attr = false;
    } else if (line.rfind("version:", 0) == 0) {
      f.version = value(line);
    } else if (node && in_attr && line.rfind("name:", 0) == 0) {
      attr_name = value(line);
    } else if (node && in_attr) {
      const std::string kind = line.substr(0, line.find('_'));
      node->attr[attr_name] = kind + ":" + value(line);
    } else if (node && line.rfind("id:", 0) == 0) {
      node->id = std::stoull(value(line));
    } else if (node && line.rfind("name:", 0) == 0) {
      node->name = value(line);
    } else if (node && line.rfind("type:", 0) == 0) {
      node->type = std::stoi(value(line));
    } else if (node && line.rfind("data_deps:", 0) == 0) {
      node->deps.push_back(std::stoull(value(line)));
    }
  }
  return f;
}

StepRun sixty_four(std::vector<std::string> faults = {}) {
  StepSpec s;
  s.preset = "torchtitan:pp=2,dp_shard=4,cp=2,tp=4";
  s.model = "llama3-debugmodel";
  s.seq_len = 2048;
  s.local_batch_size = 2;
  s.microbatches = 4;
  s.faults = std::move(faults);
  return run_step(s);
}

struct P2p {
  int64_t src, dst, tag, size;
  friend auto operator<=>(const P2p&, const P2p&) = default;
};

P2p p2p_of(const Node& n) {
  return P2p{std::stoll(n.attr.at("comm_src").substr(6)), std::stoll(n.attr.at("comm_dst").substr(6)),
             std::stoll(n.attr.at("comm_tag").substr(6)), std::stoll(n.attr.at("comm_size").substr(6))};
}

// p2p_of: every send and every receive of PREFIX.{0..npus-1}.et.
std::pair<std::multiset<P2p>, std::multiset<P2p>> p2p_of(const std::string& dir, const std::string& prefix, int64_t npus) {
  std::multiset<P2p> sends, recvs;
  for (int64_t npu = 0; npu < npus; ++npu) {
    for (const Node& n : decode(prefix + "." + std::to_string(npu) + ".et", dir).nodes) {
      if (n.type == 5 || n.type == 6) (n.type == 5 ? sends : recvs).insert(p2p_of(n));
    }
  }
  return {sends, recvs};
}

TEST(Chakra, A64RankStepDecodesWithProtocAndMatchesItsPrograms) {
  if (!have_protoc()) GTEST_SKIP() << "protoc is not installed (Debian's protobuf-compiler): the .et files cannot be decoded";
  const std::string dir = dir_for("world");
  std::ofstream(dir + "/et.proto") << kProto;
  const StepRun run = sixty_four();
  ASSERT_TRUE(run.report.ok);
  const std::vector<int64_t> world = chakra_world(run, "all");
  ASSERT_EQ(world.size(), 64u);
  const ChakraExport ex = write_chakra(run, world, dir + "/step");
  EXPECT_TRUE(ex.dropped.empty());
  std::ifstream gin(ex.comm_groups_path);
  const nlohmann::json groups = nlohmann::json::parse(gin);
  EXPECT_EQ(static_cast<int64_t>(groups.size()), ex.groups);
  std::multiset<P2p> sends, recvs;
  int64_t nodes = 0;
  for (int64_t npu = 0; npu < 64; ++npu) {
    const File f = decode(dir + "/step." + std::to_string(npu) + ".et", dir);
    EXPECT_EQ(f.version, "1.0.0");  // Chakra's generator since 2026-05-20 (34f95f9)
    const std::vector<Event> prog = program(run.job, run.report.layout, pp_coordinate(run.job.parallel, npu));
    ASSERT_EQ(f.nodes.size(), prog.size()) << "npu " << npu;
    nodes += static_cast<int64_t>(f.nodes.size());
    for (std::size_t k = 0; k < prog.size(); ++k) {
      const Node& n = f.nodes[k];
      const Event& e = prog[k];
      EXPECT_EQ(n.id, k);
      EXPECT_EQ(n.deps, k ? std::vector<uint64_t>{k - 1} : std::vector<uint64_t>{});
      EXPECT_EQ(n.name, describe(e));
      EXPECT_EQ(n.attr.at("is_cpu_op"), "bool:false");
      if (e.op == Op::kSend || e.op == Op::kRecv) {
        EXPECT_EQ(n.type, e.op == Op::kSend ? 5 : 6);
        const P2p p = p2p_of(n);
        EXPECT_EQ(e.op == Op::kSend ? p.src : p.dst, npu);
        EXPECT_EQ(p.size, e.bytes);
        (e.op == Op::kSend ? sends : recvs).insert(p);
        continue;
      }
      EXPECT_EQ(n.type, 7);
      const int64_t size = dim_size(run.job.parallel, e.dim);
      const std::map<Op, std::string> type{{Op::kAllReduce, "int64:0"}, {Op::kAllGather, "int64:2"},
                                           {Op::kAllToAll, "int64:6"}, {Op::kReduceScatter, "int64:7"}};
      EXPECT_EQ(n.attr.at("comm_type"), type.at(e.op)) << n.name;
      // ASTRA-sim's data size: an all_gather's input, everything else as recorded.
      EXPECT_EQ(n.attr.at("comm_size"), "int64:" + std::to_string(e.op == Op::kAllGather ? e.bytes / size : e.bytes)) << n.name;
      const std::string pg = n.attr.at("pg_name").substr(7);
      ASSERT_TRUE(groups.contains(pg)) << pg;
      std::vector<int64_t> members = groups[pg].get<std::vector<int64_t>>();
      EXPECT_EQ(members, group_members(run.job.parallel, e.dim, npu)) << n.name;
    }
  }
  EXPECT_EQ(nodes, ex.nodes);
  EXPECT_EQ(static_cast<int64_t>(sends.size()), ex.sends);
  EXPECT_EQ(sends, recvs);  // every send meets exactly one receive: same NPUs, tag and size
  EXPECT_GT(ex.sends, 0);
  fs::remove_all(dir);
}

TEST(Chakra, OneReplicaKeepsTheGroupsInsideItAndCountsTheRest) {
  if (!have_protoc()) GTEST_SKIP() << "protoc is not installed (Debian's protobuf-compiler): the .et files cannot be decoded";
  const std::string dir = dir_for("replica");
  std::ofstream(dir + "/et.proto") << kProto;
  const StepRun run = sixty_four();
  const std::vector<int64_t> replica = chakra_world(run, "replica");
  // pp=2 x cp=2 x tp=4 at dp_shard coordinate 0: ranks 0-7 and 32-39.
  std::vector<int64_t> want;
  for (int64_t r : {0, 1, 2, 3, 4, 5, 6, 7, 32, 33, 34, 35, 36, 37, 38, 39}) want.push_back(r);
  EXPECT_EQ(replica, want);
  const ChakraExport ex = write_chakra(run, replica, dir + "/rep");
  EXPECT_GT(ex.dropped.at("fsdp"), 0);
  EXPECT_FALSE(ex.dropped.count("tp"));
  EXPECT_FALSE(ex.dropped.count("cp"));
  EXPECT_FALSE(ex.dropped.count("pp"));
  std::ifstream gin(ex.comm_groups_path);
  const nlohmann::json groups = nlohmann::json::parse(gin);
  for (const auto& [id, members] : groups.items()) {
    for (int64_t m : members.get<std::vector<int64_t>>()) EXPECT_LT(m, 16);
  }
  const auto [sends, recvs] = p2p_of(dir, dir + "/rep", 16);
  EXPECT_FALSE(sends.empty());
  EXPECT_EQ(sends, recvs);
  fs::remove_all(dir);
}

TEST(Chakra, APlantedFaultReachesTheTraces) {
  // wrong-peer@36 sends to itself: its send has no receive anywhere, the hang ASTRA-sim would
  // meet without a word, which `meshsim step` names first.
  if (!have_protoc()) GTEST_SKIP() << "protoc is not installed (Debian's protobuf-compiler): the .et files cannot be decoded";
  const std::string dir = dir_for("fault");
  std::ofstream(dir + "/et.proto") << kProto;
  const StepRun run = sixty_four({"wrong-peer@36"});
  EXPECT_FALSE(run.report.ok);
  const ChakraExport ex = write_chakra(run, chakra_world(run, "replica"), dir + "/f");
  const auto [sends, recvs] = p2p_of(dir, dir + "/f", 16);
  EXPECT_NE(sends, recvs);
  fs::remove_all(dir);
}

TEST(Chakra, VarintsAndBadRequests) {
  EXPECT_EQ(chakra_varint(0), std::string(1, '\0'));
  EXPECT_EQ(chakra_varint(300), std::string("\xac\x02", 2));
  EXPECT_EQ(chakra_varint(~uint64_t{0}).size(), 10u);
  const StepRun run = sixty_four();
  EXPECT_THROW(chakra_world(run, "half"), InvalidArgument);
  EXPECT_THROW(write_chakra(run, chakra_world(run, "replica"), "/nonexistent/dir/step"), InvalidArgument);
  EXPECT_THROW(write_chakra(run, chakra_world(run, "replica"), ""), InvalidArgument);
}

}  // namespace
}  // namespace meshsim::step
