// Runs the installed-shape `meshsim` executable on a request file: the CLI contract end to end.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <chrono>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "meshsim/group_names.hpp"
#include "meshsim/store.hpp"

namespace {

using Json = nlohmann::json;

// free_port is a TCP port of 127.0.0.1 that was free a moment ago (the kernel's pick), for a
// server the test starts at a fixed port (a port derived from the pid can be taken).
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket failed");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  close(fd);
  if (!ok) throw std::runtime_error("cannot find a free port");
  return ntohs(a.sin_port);
}

struct Result {
  int status;
  std::vector<std::string> lines;
};

// run_shell runs a shell command line; its stdout lines and exit status.
Result run_shell(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("popen failed");
  std::string out;
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  int status = pclose(p);
  Result r{WIFEXITED(status) ? WEXITSTATUS(status) : -1, {}};
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);) r.lines.push_back(l);
  return r;
}

Result run(const std::string& args) {
  return run_shell(std::string(MESHSIM_EXE) + " " + args + " 2>/dev/null");
}

TEST(Cli, QueryFileAnswersEveryLineInOrderIncludingMalformedOnes) {
  std::string path = ::testing::TempDir() + "/meshsim_cli_requests.jsonl";
  {
    std::ofstream f(path);
    f << R"J({"id": 1, "op": "complement_bound", "layout": "(2,2):(4,1)", "bound": 16})J" << '\n'
      << R"J({"id": 2, "op": "composition", "a": "(6,2):(2,1)", "b": "3:2", "convention": "cute"})J"
      << '\n'
      << "{this is not json\n"
      << R"J({"id": 4, "op": "mesh_global_ranks", "layout": "(2,4):(4,1)", "world_size": 16})J"
      << '\n'
      << R"J({"id": 5, "op": "frobnicate"})J" << '\n';
  }
  Result r = run("query --file " + path);
  EXPECT_EQ(r.status, 0);
  ASSERT_EQ(r.lines.size(), 5u);
  EXPECT_EQ(Json::parse(r.lines[0])["result"], Json::parse(R"J({"shape":[2,2],"stride":[8,2]})J"));
  EXPECT_EQ(Json::parse(r.lines[1])["result"], Json::parse(R"J({"shape":3,"stride":4})J"));
  Json bad = Json::parse(r.lines[2]);
  EXPECT_FALSE(bad["ok"].get<bool>());
  EXPECT_EQ(bad["error"]["type"], "ParseError");
  EXPECT_EQ(Json::parse(r.lines[3])["result"],
            Json::parse("[[0,1,2,3,4,5,6,7],[8,9,10,11,12,13,14,15]]"));
  EXPECT_EQ(Json::parse(r.lines[4])["error"]["type"], "NotFound");
}

TEST(Cli, QueryReadsStdin) {
  std::string path = ::testing::TempDir() + "/meshsim_cli_stdin.jsonl";
  std::ofstream(path) << R"J({"op":"size","layout":"(2,3):(3,1)"})J" << '\n';
  Result r = run("query < " + path);
  EXPECT_EQ(r.status, 0);
  ASSERT_EQ(r.lines.size(), 1u);
  EXPECT_EQ(Json::parse(r.lines[0])["result"], 6);
}

TEST(Cli, AFifoNothingWritesToIsRefusedAtOnceWhereverAFileIsRead) {
  // Opening a FIFO without a writer waits for one forever unless asked not to: every input path
  // (--job, @FILE of --megatron-args and --against, --recipe, --process-groups) must come back.
  const std::string fifo = ::testing::TempDir() + "meshsim_cli_fifo";
  std::remove(fifo.c_str());
  ASSERT_EQ(run_shell("mkfifo " + fifo).status, 0);
  const std::string exe = std::string(MESHSIM_EXE);
  for (const std::string& args : {"step --job " + fifo, "step --megatron-args @" + fifo, "show --recipe " + fifo,
                                  "show --mesh w=4 --creation-plan --process-groups @" + fifo}) {
    const Result r = run_shell("timeout 20 " + exe + " " + args + " 2>&1");
    EXPECT_EQ(r.status, 2) << args;
    ASSERT_FALSE(r.lines.empty()) << args;
    EXPECT_NE(r.lines[0].find("it is a pipe or FIFO and nothing wrote to it"), std::string::npos) << args << ": " << r.lines[0];
  }
  // A pipe with a writer (a shell's process substitution) is read as a file.
  const Result piped = run_shell("bash -c \"" + exe + " show --recipe <(echo '{\\\"world_size\\\": 4, \\\"build\\\": "
                                 "{\\\"init_device_mesh\\\": {\\\"mesh_shape\\\": [4]}}}')\"");
  EXPECT_EQ(piped.status, 0);
  std::remove(fifo.c_str());
}

TEST(Cli, AStepsOutputsNeverReplaceItsInputsOrEachOther) {
  // Each refusal is checked before anything is written: the inputs stay as they were and no
  // output appears.
  const std::string dir = ::testing::TempDir() + "meshsim_cli_outputs/";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string job = dir + "job.toml";
  const std::string job_text = "[model]\nname = \"llama3\"\nflavor = \"debugmodel\"\n[training]\nlocal_batch_size = 2\n"
                               "seq_len = 256\n[parallelism]\ndata_parallel_shard_degree = 2\npipeline_parallel_degree = 2\n"
                               "pipeline_parallel_microbatch_size = 1\n";
  std::ofstream(job) << job_text;
  const std::string step = std::string(MESHSIM_EXE) + " step --job " + job + " ";
  ASSERT_EQ(run_shell(step + "--dump-schedule " + dir + "s.csv > /dev/null").status, 0);
  const std::vector<std::pair<std::string, std::string>> cases{
      {step + "--trace " + job, "is the file --job reads"},
      {step + "--trace " + dir + "../meshsim_cli_outputs/job.toml", "is the file --job reads"},
      {step + "--trace " + dir + "x.json --dump-schedule " + dir + "x.json", "are one file"},
      {step + "--trace " + dir + "P.comm_groups.json --chakra " + dir + "P", "are one file"},
      {step + "--chakra " + dir + "newdir/", "not a directory"},
      {step + "--chakra " + dir, "not a directory"},
      {std::string(MESHSIM_EXE) + " step --schedule " + dir + "s.csv --microbatches 2 --dump-schedule " + dir + "s.csv",
       "is the file --schedule reads"},
  };
  for (const auto& [cmd, words] : cases) {
    const Result r = run_shell(cmd + " 2>&1");
    EXPECT_EQ(r.status, 2) << cmd;
    ASSERT_FALSE(r.lines.empty()) << cmd;
    EXPECT_NE(r.lines[0].find(words), std::string::npos) << cmd << ": " << r.lines[0];
  }
  // A directory where the fourth Chakra file goes: refused before the first three are written.
  std::filesystem::create_directories(dir + "Q.3.et");
  const Result q = run_shell(step + "--chakra " + dir + "Q 2>&1");
  EXPECT_EQ(q.status, 2);
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    EXPECT_TRUE(name == "job.toml" || name == "s.csv" || name == "Q.3.et") << name << " was written";
  }
  std::ifstream in(job);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), job_text);
  std::filesystem::remove_all(dir);
}

TEST(Cli, AStepsRefusalBlamesWhatTheUserGave) {
  const std::string dir = ::testing::TempDir() + "meshsim_cli_blame/";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "big.toml") << "[model]\nname = \"llama3\"\nflavor = \"debugmodel\"\n[training]\n"
                                     "seq_len = 9223372036854775807\n[parallelism]\ndata_parallel_shard_degree = 2\n";
  // The file's key, not a --seq-len that was never given.
  Result r = run_shell(std::string(MESHSIM_EXE) + " step --job " + dir + "big.toml 2>&1");
  EXPECT_EQ(r.status, 2);
  ASSERT_FALSE(r.lines.empty());
  EXPECT_NE(r.lines[0].find("training.seq_len = 9223372036854775807 is out of range"), std::string::npos) << r.lines[0];
  EXPECT_EQ(r.lines[0].find("--seq-len"), std::string::npos) << r.lines[0];
  // An unknown schedule name is not "a missing file" alone: the names meshsim builds are listed.
  r = run_shell(std::string(MESHSIM_EXE) + " step --preset torchtitan:pp=2,dp_shard=2 --model llama3-debugmodel "
                "--seq-len 256 --local-batch-size 1 --microbatches 2 --schedule Interleaved1F1b2 2>&1");
  EXPECT_EQ(r.status, 2);
  ASSERT_FALSE(r.lines.empty());
  EXPECT_NE(r.lines[0].find("is neither a schedule meshsim builds (GPipe, 1F1B"), std::string::npos) << r.lines[0];
  std::filesystem::remove_all(dir);
}

TEST(Cli, MissingFileIsANonZeroExit) {
  EXPECT_NE(run("query --file /nonexistent/requests.jsonl").status, 0);
}

// A caller that sends one request and waits for its answer before the next (a driver on a pipe,
// without --flush) gets each answer: answers are batched, but flushed before a read may block.
TEST(Cli, QueryAnswersEachRequestBeforeTheNextArrives) {
  int to_child[2];
  int from_child[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(from_child), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(to_child[0], 0);
    dup2(from_child[1], 1);
    close(to_child[1]);
    close(from_child[0]);
    execl(MESHSIM_EXE, MESHSIM_EXE, "query", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(to_child[0]);
  close(from_child[1]);
  // read_line waits up to 20 s for one answer line.
  std::string pending;
  auto read_line = [&]() -> std::string {
    for (;;) {
      if (const auto nl = pending.find('\n'); nl != std::string::npos) {
        std::string l = pending.substr(0, nl);
        pending.erase(0, nl + 1);
        return l;
      }
      pollfd p{from_child[0], POLLIN, 0};
      if (poll(&p, 1, 20000) != 1) return "(no answer within 20 s)";
      char buf[4096];
      const ssize_t n = read(from_child[0], buf, sizeof buf);
      if (n <= 0) return "(the tool closed its output)";
      pending.append(buf, static_cast<std::size_t>(n));
    }
  };
  for (int id = 1; id <= 3; ++id) {
    const std::string req = R"({"id":)" + std::to_string(id) +
                            R"J(,"op":"size","layout":"(2,4):(8,1)"})J" + "\n";
    ASSERT_EQ(write(to_child[1], req.data(), req.size()), static_cast<ssize_t>(req.size()));
    const std::string answer = read_line();
    EXPECT_EQ(answer, R"({"id":)" + std::to_string(id) + R"(,"ok":true,"result":8})")
        << "request " << id;  // 2 x 4 coordinates
    if (answer.starts_with("(")) break;   // no answer: the tool is waiting; end it below
  }
  close(to_child[1]);
  int status = 0;
  waitpid(pid, &status, 0);
  close(from_child[0]);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(Cli, OpsListsTheQueryOps) {
  Result r = run("ops");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(std::find(r.lines.begin(), r.lines.end(), "left_inverse"), r.lines.end());
  EXPECT_NE(std::find(r.lines.begin(), r.lines.end(), "mesh_unflatten"), r.lines.end());
}

bool has_line(const Result& r, const std::string& needle) {
  for (const auto& l : r.lines) {
    if (l.find(needle) != std::string::npos) return true;
  }
  return false;
}

TEST(Cli, ShowPrintsTheMeshGroupsAndCoordinatesAfterTransformations) {
  Result r = run("show --mesh dp=2,cp=2,tp=4 --rank-map 8..23 --slice dp,tp --rank 9");
  ASSERT_EQ(r.status, 0);
  EXPECT_TRUE(has_line(r, "  dp=0 | 8 9 10 11"));
  EXPECT_TRUE(has_line(r, "  dp=1 | 16 17 18 19"));
  EXPECT_TRUE(has_line(r, "dp (size 2, 8 groups): [8 16] [9 17]"));
  EXPECT_TRUE(has_line(r, "rank 9: coordinate (0 1), dp group [9 17], tp group [8 9 10 11]"));
}

TEST(Cli, ShowAppliesTransformationsInCommandLineOrderAndPrintsJson) {
  Result r = run("show --shape 8 --names w --unflatten w:2,4:dp,tp --slice dp --format json");
  ASSERT_EQ(r.status, 0);
  std::string text;
  for (const auto& l : r.lines) text += l;
  Json j = Json::parse(text);
  EXPECT_EQ(j["groups_by_dim"]["dp"], Json::parse("[[0,4],[1,5],[2,6],[3,7]]"));
  EXPECT_EQ(j["mesh_dim_names"], Json::parse(R"(["dp"])"));
}

// meshsim show --creation-plan: each rank's process-group calls, in PyTorch's order (the rows of
// each dim in complement order: device_mesh.py's remap_to_tensor), written down by hand.
TEST(Cli, ShowPrintsTheCreationPlanCallByCall) {
  Result r = run("show --mesh dp=2,tp=4 --rank-map 8..15 --world-size 16 --creation-plan");
  ASSERT_EQ(r.status, 0);
  EXPECT_TRUE(has_line(r, "  root (DeviceMesh): creates 6 groups, reuses 0"));  // a rank map: DeviceMesh(mesh)
  // Rank 0 is outside the mesh: every new_group hands it GroupMember.NON_GROUP_MEMBER.
  EXPECT_TRUE(has_line(r, "    dp: new_group(ranks=[8, 12], backend='gloo', group_desc='mesh_dp') -> NON_GROUP_MEMBER"));
  EXPECT_TRUE(has_line(r, "    tp: new_group(ranks=[12, 13, 14, 15], backend='gloo', group_desc='mesh_tp') -> NON_GROUP_MEMBER"));
  // Rank 9 is in dp group [9, 13] (the second new_group after the default group "0": "2") and in
  // tp group [8..11] (the first tp call: 1 + 4 dp calls).
  Result nine = run("show --mesh dp=2,tp=4 --rank-map 8..15 --world-size 16 --creation-plan --rank 9");
  EXPECT_TRUE(has_line(nine, "    dp: new_group(ranks=[9, 13], backend='gloo', group_desc='mesh_dp') -> '2'"));
  EXPECT_TRUE(has_line(nine, "    tp: new_group(ranks=[8, 9, 10, 11], backend='gloo', group_desc='mesh_tp') -> '5'"));
  Result split = run("show --mesh dp=2,tp=4 --creation-plan --device-type cuda --bound-device true");
  ASSERT_EQ(split.status, 0);
  // Rank 0's split of dp is [0, 4], hashed with the counter (2.14, the default): 1.
  EXPECT_TRUE(has_line(split, "    dp: split_group(parent=default, split_ranks=[[0, 4], [1, 5], [2, 6], [3, 7]], "
                              "backend='nccl', group_desc='mesh_dp') -> '" + meshsim::hashed_group_name({0, 4}, 1) + "'"));
  // --max-rows bounds the calls listed per dim; the rest are counted.
  Result few = run("show --mesh dp=8,tp=2 --creation-plan --max-rows 3");
  EXPECT_TRUE(has_line(few, "    tp: ... 5 more new_group calls (raise --max-rows)"));
  // A backend that cannot split, under a bound device: refused naming the dim and backend.
  Result no = run_shell(std::string(MESHSIM_EXE) + " show --mesh dp=2,tp=4 --creation-plan --device-type xpu "
                        "--default-backend xccl --bound-device true 2>&1");
  EXPECT_EQ(no.status, 2);
  ASSERT_FALSE(no.lines.empty());
  EXPECT_NE(no.lines[0].find("dim 'dp' of root"), std::string::npos) << no.lines[0];
  EXPECT_NE(no.lines[0].find("'xccl' cannot split"), std::string::npos) << no.lines[0];
  // A JSON answer is bounded by --max-elements, which its refusal names.
  Result big = run_shell(std::string(MESHSIM_EXE) + " show --mesh dp=64,tp=64 --creation-plan --format json "
                         "--max-elements 1000 2>&1");
  EXPECT_EQ(big.status, 2);
  ASSERT_FALSE(big.lines.empty());
  EXPECT_NE(big.lines[0].find("ResourceExhausted"), std::string::npos) << big.lines[0];
  EXPECT_NE(big.lines[0].find("--max-elements"), std::string::npos) << big.lines[0];
  EXPECT_EQ(run("show --mesh dp=64,tp=64 --creation-plan --format json --max-elements 100000").status, 0);
  // The world's setup flags belong to --creation-plan.
  EXPECT_EQ(run("show --mesh dp=2 --bound-device true").status, 2);
  // JSON: one object a call.
  Result j = run("show --mesh dp=2,tp=2 --slice tp --creation-plan --format json");
  ASSERT_EQ(j.status, 0);
  std::string text;
  for (const auto& l : j.lines) text += l;
  const Json plan = Json::parse(text)["creation_plan"];
  EXPECT_EQ(plan["calls"].size(), 4u);
  EXPECT_EQ(plan["calls"][3], Json::parse(R"({"call": "new_group", "dim": "tp", "view": "root", "ranks": [2, 3],
      "backend": "gloo", "group_desc": "mesh_tp", "use_local_synchronization": false, "new_group_use_split_group": false,
      "group_name": null, "result": "NON_GROUP_MEMBER"})"));
  EXPECT_EQ(plan["calls"][2]["group_name"], "3");  // [0, 1]: after "0" (default) and dp's "1", "2"
  EXPECT_EQ(plan["torch_version"], "2.14");
  EXPECT_EQ(plan["problems"], Json::array());
  EXPECT_EQ(plan["steps"][1], Json::parse(R"({"op": "slice", "view": "ops[0]", "created": 0, "reused": 2,
      "created_again": 0, "pytorch": true})"));
}

TEST(Cli, EmptyDimNamesAreRefusedNamingTheFlag) {
  const std::vector<std::pair<std::string, std::string>> bad{
      {"--mesh =2", "--mesh: name 0 of 1 is empty"},
      {"--mesh dp=2,=2", "--mesh: name 1 of 2 is empty"},
      {"--shape 2,2 --names ,tp", "--names: name 0 of 2 is empty"},
      {"--shape 2,2 --names dp,", "--names: name 1 of 2 is empty"},
      {"--mesh dp=2,tp=4 --unflatten tp:2,2:a,", "--unflatten: name 1 of 2 is empty"},
      {"--mesh dp=2,tp=4 --slice dp,", "--slice: name 1 of 2 is empty"},
  };
  for (const auto& [flags, needle] : bad) {
    for (const std::string cmd : {"show ", "run "}) {
      Result r = run_shell(std::string(MESHSIM_EXE) + " " + cmd + flags + " 2>&1");
      EXPECT_EQ(r.status, 2) << cmd << flags;
      ASSERT_FALSE(r.lines.empty()) << cmd << flags;
      EXPECT_NE(r.lines[0].find(needle), std::string::npos) << cmd << flags << ": " << r.lines[0];
    }
  }
}

TEST(Cli, ShowPrintsOnlyMaxRowsOfEachTable) {
  Result r = run("show --mesh dp=4,tp=4 --max-rows 2");
  ASSERT_EQ(r.status, 0);
  EXPECT_TRUE(has_line(r, "  dp=0 | 0 1 2 3"));
  EXPECT_TRUE(has_line(r, "  dp=1 | 4 5 6 7"));
  EXPECT_FALSE(has_line(r, "  dp=2 | 8 9 10 11"));
  EXPECT_TRUE(has_line(r, "  dp (size 4, 4 groups): [0 4 8 12] [1 5 9 13] ..."));
  EXPECT_TRUE(has_line(r, "  tp (size 4, 4 groups): [0 1 2 3] [4 5 6 7] ..."));
  // A permuted rank map: the coordinates table still lists the smallest ranks first.
  Result p = run("show --shape 2,2 --rank-map 7,5,3,1 --max-rows 2");
  ASSERT_EQ(p.status, 0);
  std::vector<std::string> coords;
  for (std::size_t i = 0; i < p.lines.size(); ++i) {
    if (p.lines[i] == "coordinates:") coords.assign(p.lines.begin() + static_cast<std::ptrdiff_t>(i) + 2, p.lines.end());
  }
  ASSERT_GE(coords.size(), 3u);
  EXPECT_EQ(coords[0].substr(0, 10), "         1");
  EXPECT_EQ(coords[1].substr(0, 10), "         3");
  EXPECT_EQ(coords[2], "  ... (more rows; raise --max-rows)");
}

TEST(Cli, ShowOfAHugeWorldListsTwoRowsWithoutBuildingEveryGroup) {
  // 2^24 ranks over 17 dims: building every group of every dim took 11-20 s; two rows of each
  // table are computed directly.
  Result r = run("show --shape 16777216,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1 --max-rows 2");
  ASSERT_EQ(r.status, 0);
  // Dim 0's one group holds every rank: its first 64 are printed, then its size.
  std::string first = "  0 (size 16777216, 1 groups): [0";
  for (int i = 1; i < 64; ++i) first += " " + std::to_string(i);
  EXPECT_TRUE(has_line(r, first + " ... (16777216 ranks)]"));
  bool second_dim = false;
  for (const std::string& l : r.lines) {
    if (l.rfind("  1 (size 1, 16777216 groups): [0] [1] ...", 0) == 0) second_dim = true;
  }
  EXPECT_TRUE(second_dim);
  EXPECT_TRUE(has_line(r, "  ... (more rows; raise --max-rows)"));
}

TEST(Cli, ShowViewsCountEveryRankOfAGroupWhoseRowIsCut) {
  // pp=2, tp=2 over 4096 ranks: dp_shard is 4096 / 4 = 1024 ranks 2 apart. The view's rows are
  // cut to their first 64 ranks; the size printed after them is the group's, not the cut's.
  const Result r = run("show --preset torchtitan:tp=2,pp=2 --world-size 4096");
  ASSERT_EQ(r.status, 0);
  std::string first = "[0";
  for (int i = 1; i < 16; ++i) first += ", " + std::to_string(2 * i);
  first += ", ... (1024 ranks)]";
  bool seen = false;
  for (const std::string& l : r.lines) {
    if (l.find("dp_shard (4 groups of 1024): " + first) != std::string::npos) seen = true;
    EXPECT_EQ(l.find("(64 ranks)"), std::string::npos) << l;
  }
  EXPECT_TRUE(seen);
}

TEST(Cli, ShowRejectsBadMeshesWithAnError) {
  EXPECT_EQ(run("show --mesh dp=2,tp=4 --slice tp,dp").status, 2);
  EXPECT_EQ(run("show --mesh dp=x").status, 2);
  EXPECT_EQ(run("show --mesh dp=2 --rank-map 1..5").status, 2);
  EXPECT_EQ(run("show").status, 2);
}

}  // namespace

namespace {

// meshsim run: the groups reported are the mesh's, checked over the backend; every planted
// fault at any rank ends with exit 1 and a failure naming that rank; bad input exits 2.
Json run_json(const std::string& args, int* status) {
  Result r = run("run " + args + " --format json");
  *status = r.status;
  if (r.lines.size() != 1) return nullptr;
  return Json::parse(r.lines[0]);
}

TEST(CliRun, PassesAndReportsTheCheckedGroups) {
  int status = -1;
  Json j = run_json("--mesh dp=2,cp=2,tp=4 --slice dp,tp", &status);
  ASSERT_EQ(status, 0) << j;
  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_EQ(j["world_size"], 16);
  ASSERT_EQ(j["meshes"].size(), 2u);
  EXPECT_EQ(j["meshes"][1]["groups_by_dim"]["dp"][0], Json({0, 8}));
  EXPECT_EQ(j["meshes"][1]["groups_by_dim"]["tp"][1], Json({4, 5, 6, 7}));
  EXPECT_EQ(j["failures"].size(), 0u);
  EXPECT_GT(j["checks"].get<int64_t>(), 0);
}

TEST(CliRun, EveryFaultKindAtEveryRankIsDiagnosedNamingIt) {
  for (const std::string kind : {"throw", "skip", "mismatch", "mesh", "stall", "reorder"}) {
    for (int rank : {0, 3, 5}) {
      int status = -1;
      Json j = run_json("--mesh dp=2,tp=3 --timeout 0.5 --fault " + kind + "@" + std::to_string(rank), &status);
      EXPECT_EQ(status, 1) << kind << "@" << rank;
      ASSERT_TRUE(j.is_object()) << kind << "@" << rank;
      ASSERT_FALSE(j["failures"].empty()) << kind << "@" << rank;
      bool named = false;
      for (const Json& f : j["failures"]) named = named || f["rank"] == rank;
      EXPECT_TRUE(named) << kind << "@" << rank << ": " << j["failures"];
      if (kind == "stall") EXPECT_EQ(j["failures"][0]["missing"], Json({rank}));
    }
  }
}

TEST(CliRun, LocalBackendReportsWhatTheThreadedOneDoes) {
  // The same arguments over both backends: the reports agree but for the backend and the time.
  for (const std::string args : {"--mesh dp=2,cp=2,tp=4", "--mesh dp=2,cp=2,tp=4 --slice dp,tp --flatten",
                                 "--mesh dp=3,tp=4 --rank-map 5..16 --world-size 20 --unflatten tp:2,2:a,b",
                                 "--mesh dp=2,tp=2 --world-size 7"}) {
    int st = -1, sl = -1;
    Json t = run_json(args, &st);
    Json l = run_json(args + " --backend local", &sl);
    ASSERT_EQ(st, 0) << args << t;
    ASSERT_EQ(sl, 0) << args << l;
    EXPECT_EQ(l["backend"], "local");
    for (const char* k : {"ok", "world_size", "meshes", "checks", "collectives", "failures"}) {
      EXPECT_EQ(t[k], l[k]) << args << ": " << k;
    }
  }
}

TEST(CliRun, LocalBackendDiagnosesEveryFaultNamingTheRank) {
  for (const std::string kind : {"throw", "skip", "mismatch", "mesh", "reorder"}) {
    for (int rank : {0, 3, 5}) {
      int status = -1;
      Json j = run_json("--backend local --mesh dp=2,tp=3 --fault " + kind + "@" + std::to_string(rank), &status);
      EXPECT_EQ(status, 1) << kind << "@" << rank;
      ASSERT_TRUE(j.is_object()) << kind << "@" << rank;
      ASSERT_FALSE(j["failures"].empty()) << kind << "@" << rank;
      bool named = false;
      for (const Json& f : j["failures"]) named = named || f["rank"] == rank;
      EXPECT_TRUE(named) << kind << "@" << rank << ": " << j["failures"];
      // The same kind of diagnosis as the threaded run gives.
      const std::map<std::string, std::string> want{{"throw", "error"}, {"skip", "departed"},
                                                    {"mismatch", "mismatch"}, {"mesh", "mesh"}, {"reorder", "check"}};
      EXPECT_EQ(j["failures"][0]["kind"], want.at(kind)) << j["failures"];
    }
  }
  // A stall cannot happen when every rank runs in one thread: refused as bad usage.
  EXPECT_EQ(run("run --backend local --mesh dp=2 --fault stall@1").status, 2);
}

TEST(CliRun, GlooRankThreadsReportWhatTheThreadedRunDoes) {
  for (const std::string args : {"--mesh dp=2,tp=4", "--mesh dp=2,cp=2,tp=2 --slice dp,tp --flatten"}) {
    int st = -1, sg = -1;
    Json t = run_json(args, &st);
    Json g = run_json(args + " --backend gloo", &sg);
    ASSERT_EQ(st, 0) << args << t;
    ASSERT_EQ(sg, 0) << args << g;
    EXPECT_EQ(g["backend"], "gloo");
    for (const char* k : {"ok", "world_size", "meshes", "checks", "collectives", "failures"}) {
      EXPECT_EQ(t[k], g[k]) << args << ": " << k;
    }
  }
}

TEST(CliRun, OneFaultReadsTheSameOnEveryBackend) {
  // The diagnosis is the product: the same planted fault gives the same message, word for word
  // (the collective's number, its arguments, the waiting ranks in full), whichever backend ran
  // it: threaded, gloo, fiber and local mode (which cannot stall: one thread).
  for (const std::string mesh : {"dp=2,tp=2", "dp=2,cp=2,tp=2"}) {
    for (const std::string fault : {"throw@3", "skip@3", "skip@1", "mismatch@3", "mismatch@0", "mesh@2", "stall@3",
                                    "reorder@3", "reorder@0"}) {
      const std::string args = "--mesh " + mesh + " --timeout 2 --fault " + fault;
      int st = -1;
      Json t = run_json(args, &st);
      EXPECT_EQ(st, 1) << fault;
      ASSERT_FALSE(t["failures"].empty()) << fault << t;
      for (const std::string backend : {"gloo", "fiber", "local"}) {
        if (fault.rfind("stall", 0) == 0 && backend != "gloo") continue;
        int s = -1;
        Json o = run_json(args + " --backend " + backend, &s);
        EXPECT_EQ(s, 1) << backend << " " << fault;
        ASSERT_FALSE(o["failures"].empty()) << backend << " " << fault << o;
        EXPECT_EQ(t["failures"][0], o["failures"][0]) << backend << " " << mesh << " " << fault;
      }
    }
  }
}

TEST(CliRun, GlooRankThreadsDiagnoseEveryFaultNamingTheRank) {
  const std::map<std::string, std::string> want{{"throw", "error"}, {"skip", "departed"}, {"mismatch", "mismatch"},
                                                {"mesh", "mesh"}, {"stall", "stall"}, {"exit", "exit"},
                                                {"reorder", "check"}};
  for (const auto& [kind, diagnosis] : want) {
    for (int rank : {0, 5}) {
      int status = -1;
      Json j = run_json("--backend gloo --mesh dp=2,tp=3 --timeout 1 --fault " + kind + "@" + std::to_string(rank), &status);
      EXPECT_EQ(status, 1) << kind << "@" << rank;
      ASSERT_TRUE(j.is_object()) << kind << "@" << rank;
      ASSERT_FALSE(j["failures"].empty()) << kind << "@" << rank;
      EXPECT_EQ(j["failures"][0]["rank"], rank) << kind << "@" << rank << ": " << j["failures"];
      EXPECT_EQ(j["failures"][0]["kind"], diagnosis) << j["failures"];
    }
  }
}

// launch_output runs `meshsim launch` with `args` and returns (exit status, every output line).
std::pair<int, std::string> launch_output(const std::string& args) {
  const std::string cmd = std::string(MESHSIM_EXE) + " launch " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {-1, ""};
  std::string out;
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(CliLaunch, GlooRanksAsProcessesPassAndEachReportsItsGroups) {
  auto [status, out] = launch_output("-n 4 -- " + std::string(MESHSIM_EXE) +
                                     " run --backend gloo --mesh dp=2,tp=2 --timeout 20");
  ASSERT_EQ(status, 0) << out;
  for (int r = 1; r < 4; ++r) {
    EXPECT_NE(out.find("[rank " + std::to_string(r) + "] meshsim run: rank " + std::to_string(r) + " of 4"),
              std::string::npos) << out;
  }
  EXPECT_NE(out.find("[rank 0] meshsim run: 4 ranks over the gloo backend, one per process"), std::string::npos) << out;
  EXPECT_NE(out.find("[rank 0]     tp: 2 groups of 2 [0, 1] [2, 3]"), std::string::npos) << out;
  EXPECT_NE(out.find("[rank 3]     tp: 2 groups of 2 [2, 3]"), std::string::npos) << out;
  EXPECT_NE(out.find("[rank 1]     dp: 2 groups of 2 [1, 3]"), std::string::npos) << out;
  // Rank 0 gathers every rank's view through the store: its JSON report is the threaded run's
  // (but for the backend and the time).
  for (const std::string args : {"--mesh dp=2,tp=2", "--mesh dp=2,cp=2,tp=2 --slice dp,tp --flatten"}) {
    int st = -1;
    Json t = run_json(args, &st);
    ASSERT_EQ(st, 0) << t;
    auto [code, lines] = launch_output("-n " + std::to_string(t["world_size"].get<int>()) + " -- " +
                                       std::string(MESHSIM_EXE) + " run --backend gloo --format json " + args);
    ASSERT_EQ(code, 0) << lines;
    const auto at = lines.find("[rank 0] {");
    ASSERT_NE(at, std::string::npos) << lines;
    const Json g = Json::parse(lines.substr(at + 9, lines.find('\n', at) - at - 9));
    EXPECT_FALSE(g.contains("rank"));
    for (const char* k : {"ok", "world_size", "meshes", "checks", "collectives", "failures"}) {
      EXPECT_EQ(t[k], g[k]) << args << ": " << k;
    }
  }
}

TEST(CliLaunch, AProcessThatDiesMidRunIsNamedByTheOthersNotAHang) {
  for (const std::string fault : {"exit@2", "throw@1"}) {
    const auto t0 = std::chrono::steady_clock::now();
    auto [status, out] = launch_output("-n 4 -- " + std::string(MESHSIM_EXE) +
                                       " run --backend gloo --mesh dp=2,tp=2 --timeout 30 --fault " + fault);
    EXPECT_NE(status, 0) << out;
    const std::string rank = fault.substr(fault.find('@') + 1);
    const std::string kind = fault.rfind("exit", 0) == 0 ? "exit" : "error";
    // Another process names the dead one, long before the 30 s deadline.
    const std::string other = rank == "2" ? "[rank 0]" : "[rank 3]";
    EXPECT_NE(out.find(other + " FAILED rank " + rank + " [" + kind + "]"), std::string::npos) << out;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15)) << out;
  }
}

TEST(CliLaunch, ARankThatNeverStartedIsNamedByTheOthersAndByTheLauncher) {
  // Rank 2's process ends with status 0 before it runs meshsim: it never reaches the store. The
  // others name it (not themselves, never "ranks []") within the timeout, and so does the
  // launcher, which saw it end first.
  const auto t0 = std::chrono::steady_clock::now();
  auto [status, out] = launch_output("-n 4 -- sh -c 'if [ $RANK = 2 ]; then exit 0; fi; exec " +
                                     std::string(MESHSIM_EXE) + " run --backend gloo --mesh dp=2,tp=2 --timeout 4'");
  EXPECT_EQ(status, 1) << out;
  EXPECT_EQ(out.find("ranks []"), std::string::npos) << out;
  for (const char* who : {"[rank 0]", "[rank 1]", "[rank 3]"}) {
    EXPECT_NE(out.find(std::string(who) + " FAILED rank 2 [stall]: stall: rank 2 never arrived: no process claimed it "
                                          "in the store (it never reached the store)"),
              std::string::npos)
        << who << "\n" << out;
  }
  EXPECT_NE(out.find("meshsim launch: rank 2 exited with status 0 before any rank failed"), std::string::npos) << out;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15)) << out;
}

// socket_count is how many sockets process `pid` holds (0 once it is gone).
int socket_count(pid_t pid) {
  int n = 0;
  std::error_code ec;
  for (const auto& fd : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    std::error_code ec2;
    n += std::filesystem::read_symlink(fd.path(), ec2).string().rfind("socket:", 0) == 0;
  }
  return n;
}

TEST(CliLaunch, AProcessKilledWithSigkillMidCollectiveIsNamedByItsPeers) {
  // Rank 1 stalls (the others wait for it inside a collective); the test then kills it with
  // SIGKILL, as an OOM killer or a lost node would. Its store connection drops, the server
  // publishes its will, and the waiting ranks name it long before their 60 s deadline.
  char dir_template[] = "/tmp/meshsim-kill-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string cmd = std::string(MESHSIM_EXE) + " launch -n 3 -- sh -c 'echo $$ > " + dir +
                          "/pid.$MESHSIM_RANK; exec " + std::string(MESHSIM_EXE) +
                          " run --backend gloo --mesh dp=3 --timeout 60 --fault stall@1' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  pid_t victim = 0;
  for (int i = 0; i < 200 && victim == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::ifstream in(dir + "/pid.1");
    in >> victim;
  }
  ASSERT_GT(victim, 0);
  // Rank 1 is in its stall once it holds its store connection (with its will) and its two Gloo
  // pairs: three sockets (a fixed sleep raced a slow start under sanitizers).
  for (int i = 0; i < 600 && socket_count(victim) < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the others are in the collective
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  std::string out;
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  pclose(p);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30)) << out;
  EXPECT_NE(out.find("[rank 0] FAILED rank 1 [exit]"), std::string::npos) << out;
  EXPECT_NE(out.find("[rank 2] FAILED rank 1 [exit]"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 1 was killed by signal 9"), std::string::npos) << out;
  std::remove((dir + "/pid.0").c_str());
  std::remove((dir + "/pid.1").c_str());
  std::remove((dir + "/pid.2").c_str());
  ::rmdir(dir.c_str());
}

TEST(CliLaunch, AProcessKilledWhileConnectingEndsEveryRankNearItsTimeout) {
  // Rank 3 of 8 is SIGKILLed as soon as it holds its store connection and its 7 pair sockets of
  // the world group: inside Gloo's connect. A survivor whose pair waits for rank 3 (or for a
  // survivor that gave up) waited five times the timeout per pair (20 s with --timeout 4); now
  // the whole connect ends within about the timeout. The launcher's grace is long, so the time
  // measured is the ranks' own.
  char dir_template[] = "/tmp/meshsim-kill-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::string cmd = std::string(MESHSIM_EXE) + " launch -n 8 --report-grace 60 -- sh -c 'echo $$ > " + dir +
                          "/pid.$MESHSIM_RANK; exec " + std::string(MESHSIM_EXE) +
                          " run --backend gloo --mesh dp=2,tp=4 --timeout 4' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  pid_t victim = 0;
  for (int i = 0; i < 2000 && victim == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::ifstream in(dir + "/pid.3");
    in >> victim;
  }
  ASSERT_GT(victim, 0);
  for (int i = 0; i < 20000 && socket_count(victim) < 8; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto killed = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  std::string out;
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  pclose(p);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  EXPECT_LT(took, 4.0 + 4.0) << out;  // the timeout and a grace for 8 processes on 2 cores
  EXPECT_NE(out.find("rank 3 was killed by signal 9"), std::string::npos) << out;
  // Every survivor ends with a diagnosis (the dead rank, or what it saw), none with OK.
  EXPECT_EQ(out.find("OK: every rank"), std::string::npos) << out;
  for (int r = 0; r < 8; ++r) std::remove((dir + "/pid." + std::to_string(r)).c_str());
  ::rmdir(dir.c_str());
}

TEST(CliLaunch, MoreRanksThanDescriptorsIsRefusedUpFrontNamingTheLimit) {
  // Two pipes per rank and a store connection each: 100 ranks under a hard limit of 200 open
  // files cannot be run, and the launcher says so before starting any rank.
  Result r = run_shell("ulimit -n 200 && " + std::string(MESHSIM_EXE) + " launch -n 100 -- sh -c 'echo started' 2>&1");
  EXPECT_NE(r.status, 0);
  std::string all;
  for (const std::string& l : r.lines) all += l + "\n";
  EXPECT_NE(all.find("-n 100 needs about"), std::string::npos) << all;
  EXPECT_NE(all.find("ulimit -n"), std::string::npos) << all;
  EXPECT_EQ(all.find("started"), std::string::npos) << all;
  // Under a soft limit the hard one allows past, the launcher raises its own and runs.
  Result ok = run_shell("ulimit -Sn 200 && " + std::string(MESHSIM_EXE) + " launch -n 100 -- sh -c 'echo started'");
  EXPECT_EQ(ok.status, 0);
  EXPECT_EQ(std::count_if(ok.lines.begin(), ok.lines.end(),
                          [](const std::string& l) { return l.find("started") != std::string::npos; }),
            100);
}

TEST(CliLaunch, TorchrunStyleVariablesSetByHandWork) {
  // Four processes started by hand with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT: rank 0 serves
  // the store, as torchrun's rank 0 does.
  const int port = 20000 + static_cast<int>(getpid() % 20000);
  std::string cmd = "pids=''; for r in 0 1 2 3; do RANK=$r WORLD_SIZE=4 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                    std::to_string(port) + " " + std::string(MESHSIM_EXE) +
                    " run --backend gloo --mesh dp=2,tp=2 --timeout 20 --format json & pids=\"$pids $!\"; done; "
                    "fail=0; for p in $pids; do wait $p || fail=1; done; exit $fail";
  Result r = run_shell(cmd);
  EXPECT_EQ(r.status, 0);
  ASSERT_EQ(r.lines.size(), 4u);
  std::set<int64_t> ranks;
  for (const std::string& l : r.lines) {
    Json j = Json::parse(l);
    EXPECT_TRUE(j["ok"].get<bool>()) << l;
    // Ranks 1..3 report their own groups; rank 0 reports the whole job.
    ranks.insert(j.contains("rank") ? j["rank"].get<int64_t>() : 0);
    if (!j.contains("rank")) EXPECT_EQ(j["checks"], 24) << l;
  }
  EXPECT_EQ(ranks, (std::set<int64_t>{0, 1, 2, 3}));
}

TEST(CliLaunch, SlurmVariablesSetByHandWork) {
  // What srun gives each task (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID), with the
  // store at MASTER_ADDR:MASTER_PORT as PyTorch requires under srun: rank 0 serves it.
  const int port = free_port();
  std::string cmd = "pids=''; for r in 0 1 2 3; do SLURM_PROCID=$r SLURM_NTASKS=4 SLURM_LOCALID=$r SLURM_NODEID=0 "
                    "MASTER_ADDR=localhost MASTER_PORT=" + std::to_string(port) + " " + std::string(MESHSIM_EXE) +
                    " run --backend gloo --mesh dp=2,tp=2 --timeout 20 & pids=\"$pids $!\"; done; "
                    "fail=0; for p in $pids; do wait $p || fail=1; done; exit $fail";
  Result r = run_shell(cmd);
  EXPECT_EQ(r.status, 0);
  int ok = 0;
  for (const std::string& l : r.lines) {
    ok += l == "OK: every rank's groups match the mesh on every dim";
    if (l.rfind("meshsim run: 4 ranks", 0) == 0) EXPECT_NE(l.find("launched by slurm"), std::string::npos) << l;
  }
  EXPECT_EQ(ok, 4);
}

TEST(CliStore, ServesClientsAndStopsOnSigterm) {
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(out[1], 1);
    close(out[0]);
    execl(MESHSIM_EXE, MESHSIM_EXE, "store", "--port", "0", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  FILE* f = fdopen(out[0], "r");
  char line[256] = {0};
  ASSERT_NE(fgets(line, sizeof line, f), nullptr);
  const std::string text(line);
  const auto colon = text.rfind(':');
  ASSERT_NE(text.find("meshsim store listening on 127.0.0.1:"), std::string::npos) << text;
  const auto port = static_cast<uint16_t>(std::stoi(text.substr(colon + 1)));
  {
    meshsim::TcpStoreClient a({.port = port}), b({.port = port});
    a.set("rank_0", "addr0");
    EXPECT_EQ(b.get("rank_0", std::chrono::seconds(2)), "addr0");
    EXPECT_EQ(b.add("arrived", 1), 1);
  }
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  fclose(f);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(run("store --host not-an-ip").status, 2);
  EXPECT_EQ(run("store --token-file /nonexistent/token").status, 2);
}

TEST(CliLaunch, StartsRanksWithTheirEnvironmentAndPrefixesOutput) {
  Result r = run("launch -n 3 -- sh -c 'echo rank=$MESHSIM_RANK of=$MESHSIM_WORLD_SIZE torch=$RANK/$WORLD_SIZE'");
  ASSERT_EQ(r.status, 0);
  std::sort(r.lines.begin(), r.lines.end());
  ASSERT_EQ(r.lines.size(), 3u);
  for (int k = 0; k < 3; ++k) {
    const std::string want = "[rank " + std::to_string(k) + "] rank=" + std::to_string(k) + " of=3 torch=" +
                             std::to_string(k) + "/3";
    EXPECT_EQ(r.lines[static_cast<std::size_t>(k)], want);
  }
  // Processes meet through the launcher's store.
  r = run("launch -n 4 -- " + std::string(MESHSIM_EXE) + " rendezvous --timeout 20");
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.lines.size(), 4u);
  for (const auto& l : r.lines) EXPECT_NE(l.find("met every rank"), std::string::npos) << l;
}

TEST(CliLaunch, OneFailingRankStopsTheOthersAndIsNamed) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string cmd = std::string(MESHSIM_EXE) +
                    " launch -n 3 --report-grace 1 -- sh -c 'if [ $MESHSIM_RANK = 1 ]; then exit 3; fi; sleep 60' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 3) << status;
  EXPECT_NE(out.find("rank 1 exited with status 3"), std::string::npos) << out;
  EXPECT_EQ(run("launch -n 2 --timeout 0.5 -- sleep 60").status, 124);
  EXPECT_EQ(run("launch -n 1 -- /nonexistent/program").status, 127);
}

TEST(CliLaunch, BadUsageExitsTwo) {
  for (const std::string args : {"launch -n 0 -- true", "launch -n 2", "launch -n 2 --world 3 -- true",
                                 "launch -n 2 --world 4 --rank-offset 3 --store 127.0.0.1:1 -- true",
                                 "launch -n 2 --store nohost -- true", "launch -n 2 --timeout -1 -- true",
                                 "launch -n 99999 -- true", "rendezvous"}) {
    EXPECT_EQ(run(args).status, 2) << args;
  }
}

TEST(CliRun, BadUsageExitsTwo) {
  for (const std::string args : {"--mesh dp=0", "--mesh dp=-2", "--mesh dp=2,dp=2",
                                 "--mesh dp=4 --world-size 2", "--mesh dp=9223372036854775807,tp=2",
                                 "--mesh dp=2 --fault nope@1", "--mesh dp=2 --fault throw@2",
                                 "--mesh dp=2 --backend mpi", "--mesh dp=2 --timeout 0",
                                 "--mesh dp=8192,tp=4096 --backend local"}) {
    EXPECT_EQ(run("run " + args).status, 2) << args;
  }
}

}  // namespace

namespace {

// alive is whether process `pid` exists and is not a zombie (an orphan's zombie may wait long
// for a reaper in a container).
bool alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const auto paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
}

// launch_sleepers starts `meshsim launch -n 3` whose ranks record their pids in `file` and sleep;
// returns the launcher's pid once every rank has started.
pid_t launch_sleepers(const std::string& file, std::vector<pid_t>& ranks) {
  std::remove(file.c_str());
  const pid_t launcher = fork();
  if (launcher == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    dup2(null, 1);
    dup2(null, 2);
    const std::string script = "echo $$ >> " + file + "; exec sleep 60";
    execl(MESHSIM_EXE, "meshsim", "launch", "-n", "3", "--", "sh", "-c", script.c_str(), nullptr);
    _exit(127);
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < until) {
    ranks.clear();
    std::ifstream in(file);
    for (pid_t p; in >> p;) ranks.push_back(p);
    if (ranks.size() == 3) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return launcher;
}

// wait_exit waits up to 20 s for `pid`; its wait status, or -1.
int wait_exit(pid_t pid) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < until) {
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid, SIGKILL);
  return -1;
}

TEST(CliLaunch, EveryStopSignalReachesEveryRankAndTheLauncherExitsWith128PlusIt) {
  const std::string file = testing::TempDir() + "meshsim_launch_signal_" + std::to_string(getpid());
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    std::vector<pid_t> ranks;
    const pid_t launcher = launch_sleepers(file, ranks);
    ASSERT_EQ(ranks.size(), 3u) << "the ranks did not start";
    kill(launcher, sig);
    const int st = wait_exit(launcher);
    ASSERT_TRUE(WIFEXITED(st)) << "signal " << sig << ": status " << st;
    EXPECT_EQ(WEXITSTATUS(st), 128 + sig);
    for (pid_t r : ranks) EXPECT_FALSE(alive(r)) << "signal " << sig << ": rank process " << r << " outlived the launcher";
  }
}

TEST(CliLaunch, NoRankOutlivesALauncherKilledWithSigkill) {
  const std::string file = testing::TempDir() + "meshsim_launch_sigkill_" + std::to_string(getpid());
  std::vector<pid_t> ranks;
  const pid_t launcher = launch_sleepers(file, ranks);
  ASSERT_EQ(ranks.size(), 3u) << "the ranks did not start";
  kill(launcher, SIGKILL);
  wait_exit(launcher);
  for (pid_t r : ranks) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (alive(r) && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_FALSE(alive(r)) << "rank process " << r << " outlived a launcher killed with SIGKILL";
  }
}

TEST(CliLaunch, ReportGraceIsValidatedLikeTimeout) {
  for (const std::string v : {"inf", "nan", "-1", "1e300"}) {
    EXPECT_EQ(run("launch -n 1 --report-grace " + v + " -- true").status, 2) << v;
  }
}

}  // namespace

namespace {

// StoreProcess is `meshsim store --port 0` as a process of its own: its pid and address.
struct StoreProcess {
  FILE* out = nullptr;
  pid_t pid = 0;
  std::string addr;
  StoreProcess() {
    out = popen(("sh -c 'echo $$; exec " + std::string(MESHSIM_EXE) + " store --port 0'").c_str(), "r");
    char line[256] = {};
    if (!out || !fgets(line, sizeof line, out)) return;
    pid = static_cast<pid_t>(std::stol(line));
    if (!fgets(line, sizeof line, out)) return;
    const std::string text(line);
    const auto at = text.find("127.0.0.1:");
    if (at != std::string::npos) addr = text.substr(at, text.find_last_not_of("\n") + 1 - at);
  }
  ~StoreProcess() {
    if (pid > 0) ::kill(pid, SIGTERM);
    if (out) pclose(out);
  }
};

// No process reports success alone: a duplicate rank, a store reused from an earlier run and a
// launcher's variables without a rank are refused, naming them.
TEST(CliLaunch, ADuplicateRankIsRefusedNamingItAndTheOthersStillMeet) {
  const int port = free_port();
  const std::string base = "WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) + " " +
                           std::string(MESHSIM_EXE) + " run --backend gloo --mesh dp=2 --timeout 10";
  const std::string cmd = "pids=''; for r in 0 1 1; do RANK=$r " + base +
                          " & pids=\"$pids $!\"; done; n=0; for p in $pids; do wait $p || n=$((n+1)); done; "
                          "echo failed=$n";
  Result r = run_shell("(" + cmd + ") 2>&1");
  std::string out;
  for (const auto& l : r.lines) out += l + "\n";
  EXPECT_NE(out.find("failed=1"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 1 is already held"), std::string::npos) << out;
  EXPECT_NE(out.find("two processes were started as rank 1"), std::string::npos) << out;
}

TEST(CliLaunch, AStoreReusedByALaterRunIsNamedAtOnce) {
  StoreProcess store;
  ASSERT_FALSE(store.addr.empty()) << "meshsim store did not start";
  const std::string& addr = store.addr;
  const pid_t store_pid = store.pid;
  auto both = [&](const std::string& what) {
    return run_shell("pids=''; for r in 0 1; do MESHSIM_RANK=$r MESHSIM_WORLD_SIZE=2 MESHSIM_STORE=" + addr + " " +
                     std::string(MESHSIM_EXE) + " " + what +
                     " 2>&1 & pids=\"$pids $!\"; done; n=0; for p in $pids; do wait $p || n=$((n+1)); done; "
                     "echo failed=$n");
  };
  for (const std::string what : {"rendezvous --timeout 5", "run --backend gloo --mesh dp=2 --timeout 5"}) {
    Result first = both(what);
    ASSERT_FALSE(first.lines.empty());
    EXPECT_EQ(first.lines.back(), "failed=0") << what;
    const auto t0 = std::chrono::steady_clock::now();
    Result again = both(what);
    std::string out;
    for (const auto& l : again.lines) out += l + "\n";
    EXPECT_NE(out.find("failed=2"), std::string::npos) << what << ": " << out;
    EXPECT_NE(out.find("an earlier run used this store"), std::string::npos) << what << ": " << out;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5)) << what;  // not the timeout
  }
  // Runs with their own MESHSIM_RUN_ID share the store.
  Result scoped = run_shell("pids=''; for r in 0 1; do MESHSIM_RUN_ID=fresh MESHSIM_RANK=$r MESHSIM_WORLD_SIZE=2 "
                            "MESHSIM_STORE=" + addr + " " + std::string(MESHSIM_EXE) +
                            " rendezvous --timeout 5 & pids=\"$pids $!\"; done; n=0; for p in $pids; do wait $p || "
                            "n=$((n+1)); done; echo failed=$n");
  ASSERT_FALSE(scoped.lines.empty());
  EXPECT_EQ(scoped.lines.back(), "failed=0");
  ::kill(store_pid, SIGTERM);
}

TEST(CliRun, ALaunchersVariablesWithoutARankAreRefusedOnProcessBackends) {
  for (const std::string var : {"LOCAL_RANK=0", "MASTER_ADDR=127.0.0.1 MASTER_PORT=29500", "MASTER_PORT=29500"}) {
    Result r = run_shell(var + " " + std::string(MESHSIM_EXE) + " run --backend gloo --mesh dp=2 2>&1");
    EXPECT_EQ(r.status, 2) << var;
    ASSERT_FALSE(r.lines.empty());
    EXPECT_NE(r.lines[0].find("is set but RANK and WORLD_SIZE are not"), std::string::npos) << r.lines[0];
    // The threaded backend ignores them, as before.
    EXPECT_EQ(run_shell(var + " " + std::string(MESHSIM_EXE) + " run --mesh dp=2 >/dev/null 2>&1").status, 0) << var;
  }
  // An address that does not resolve is refused naming the variable and the name.
  Result bad = run_shell("RANK=0 WORLD_SIZE=2 MASTER_ADDR=no-such-host.invalid MASTER_PORT=29500 " +
                         std::string(MESHSIM_EXE) + " run --backend gloo --mesh dp=2 --timeout 5 2>&1");
  EXPECT_EQ(bad.status, 1);
  ASSERT_FALSE(bad.lines.empty());
  EXPECT_NE(bad.lines[0].find("MASTER_ADDR='no-such-host.invalid'"), std::string::npos) << bad.lines[0];
  // MPICH's and Intel MPI's variables are read: one rank of two, its store named by MASTER_*.
  Result mpich = run_shell("PMI_RANK=1 PMI_SIZE=2 " + std::string(MESHSIM_EXE) + " run --backend gloo --mesh dp=2 2>&1");
  EXPECT_EQ(mpich.status, 2);
  ASSERT_FALSE(mpich.lines.empty());
  EXPECT_NE(mpich.lines[0].find("launched by mpich but no store is named"), std::string::npos) << mpich.lines[0];
}

}  // namespace

namespace {

// store_killed_under_run starts 4 gloo ranks over a store, kills the store after `delay`
// (seconds) and checks that every rank names the store within 20 s and no rank is blamed.
void store_killed_under_run(const std::string& delay) {
  StoreProcess store;
  ASSERT_FALSE(store.addr.empty()) << "meshsim store did not start";
  const std::string& addr = store.addr;
  const pid_t store_pid = store.pid;
  // Rank 1 stalls, so the others wait inside a collective when the store dies under them.
  const std::string cmd = "pids=''; for r in 0 1 2 3; do MESHSIM_RANK=$r MESHSIM_WORLD_SIZE=4 MESHSIM_STORE=" + addr + " " +
                          std::string(MESHSIM_EXE) +
                          " run --backend gloo --mesh dp=2,tp=2 --timeout 5 --fault stall@1 2>&1 | sed \"s/^/[$r] /\" & "
                          "pids=\"$pids $!\"; done; sleep " + delay + "; kill -9 " + std::to_string(store_pid) +
                          "; for p in $pids; do wait $p; done";
  const auto t0 = std::chrono::steady_clock::now();
  Result r = run_shell(cmd);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  std::string out;
  for (const auto& l : r.lines) out += l + "\n";
  for (int k = 0; k < 4; ++k) {
    bool named = false;
    for (const auto& l : r.lines) {
      // A FAILED line naming the store, or (a rank that never reached the store before it died,
      // on a slow start) the error exit naming it.
      const bool failed = l.find("FAILED") != std::string::npos || l.find("meshsim run: Unavailable") != std::string::npos;
      if (l.rfind("[" + std::to_string(k) + "] ", 0) == 0 && failed && l.find(addr) != std::string::npos &&
          l.find("store") != std::string::npos) {
        named = true;
      }
    }
    EXPECT_TRUE(named) << "rank " << k << " does not name the store " << addr << ":\n" << out;
  }
  EXPECT_EQ(out.find("never arrived"), std::string::npos) << out;
}

TEST(CliLaunch, AStoreKilledMidRunIsNamedByEveryRankNotTheOtherRanks) { store_killed_under_run("1.5"); }

// Killed while the ranks still connect their groups (a slow start): a rank whose peer connects
// time out names the store too, not a stall.
TEST(CliLaunch, AStoreKilledWhileRanksConnectIsNamedByEveryRank) { store_killed_under_run("0.3"); }

}  // namespace

namespace {

std::string joined(const Result& r) {
  std::string out;
  for (const auto& l : r.lines) out += l + "\n";
  return out;
}

TEST(CliPlacement, ShowReportsWhereEachDimsGroupsLandAndRequireBreaksNamingTheGroup) {
  Result ok = run("show --mesh dp=4,tp=8 --gpus-per-host 8 --require tp=host --format json");
  ASSERT_EQ(ok.status, 0) << joined(ok);
  const Json j = Json::parse(joined(ok));
  EXPECT_EQ(j["placement"]["tp"]["max_hosts"], 1);
  EXPECT_EQ(j["placement"]["tp"]["groups_crossing_hosts"], 0);
  EXPECT_EQ(j["placement"]["dp"]["max_hosts"], 4);
  EXPECT_EQ(j["placement"]["dp"]["groups_crossing_hosts"], 8);
  EXPECT_EQ(j["placement"]["dp"]["max_domains"], 4);
  EXPECT_TRUE(j["placement_failures"].empty());

  Result bad = run("show --mesh dp=4,tp=8 --gpus-per-host 8 --require dp=host");
  EXPECT_EQ(bad.status, 1);
  const std::string text = joined(bad);
  EXPECT_NE(text.find("dp: a group spans at most 4 hosts (4 domains); 8 of 8 groups cross a host"), std::string::npos) << text;
  EXPECT_NE(text.find("FAILED placement: dim dp of"), std::string::npos) << text;
  EXPECT_NE(text.find("group [0, 8, 16, 24] spans hosts [0, 1, 2, 3]"), std::string::npos) << text;

  // The rank map is honoured: ranks 2048..4095 live on hosts 256..511.
  Result mapped = run("show --mesh dp=256,tp=8 --rank-map 2048..4095 --gpus-per-host 8 --nvlink-domain 64 "
                      "--require tp=host --require dp=domain --max-rows 0");
  EXPECT_EQ(mapped.status, 1);
  const std::string mt = joined(mapped);
  EXPECT_NE(mt.find("group [2048, 2056, 2064"), std::string::npos) << mt;
  EXPECT_NE(mt.find("spans domains [32, 33, 34"), std::string::npos) << mt;
  EXPECT_EQ(mt.find("dim tp of"), std::string::npos) << mt;
}

TEST(CliPlacement, RunChecksTheGroupsAndFailsABrokenRequirementOnEveryBackend) {
  for (const std::string backend : {"threaded", "local"}) {
    int status = -1;
    Json j = run_json("--backend " + backend + " --mesh dp=2,tp=4 --slice tp --gpus-per-host 4 --require tp=host", &status);
    ASSERT_EQ(status, 0) << backend << j;
    ASSERT_EQ(j["meshes"].size(), 2u);
    for (const Json& m : j["meshes"]) EXPECT_EQ(m["placement"]["tp"]["max_hosts"], 1) << backend << m;
    EXPECT_EQ(j["meshes"][0]["placement"]["dp"]["groups_crossing_hosts"], 4) << backend;
    Result bad = run("run --backend " + backend + " --mesh dp=2,tp=4 --gpus-per-host 2 --require tp=host");
    EXPECT_EQ(bad.status, 1) << backend;
    const std::string text = joined(bad);
    EXPECT_NE(text.find("OK: every rank's groups match"), std::string::npos) << text;  // the groups are right
    EXPECT_NE(text.find("FAILED placement: dim tp of"), std::string::npos) << text;
    EXPECT_NE(text.find("group [0, 1, 2, 3] spans hosts [0, 1]"), std::string::npos) << text;
  }
}

// CLI11 alone clamps an integer beyond int64 to the limit and goes on (show accepted
// --world-size 9223372036854775808 as 2^63 - 1): every integer flag refuses it as typed.
TEST(Cli, IntegersBeyondInt64AreRefusedAsTyped) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"show --mesh dp=2 --world-size 9223372036854775808", "9223372036854775808"},
      {"show --mesh dp=2 --rank 99999999999999999999", "99999999999999999999"},
      {"show --mesh dp=2 --max-rows -99999999999999999999", "-99999999999999999999"},
      {"run --mesh dp=2 --gpus-per-host 18446744073709551617", "18446744073709551617"},
      {"launch -n 99999999999999999999 -- true", "99999999999999999999"},
      {"launch -n 2 --rank-offset 9223372036854775808 -- true", "9223372036854775808"},
  };
  for (const auto& [args, typed] : cases) {
    Result r = run_shell(std::string(MESHSIM_EXE) + " " + args + " 2>&1");
    EXPECT_EQ(r.status, 2) << args << "\n" << joined(r);
    EXPECT_NE(joined(r).find(typed + " does not fit in a 64-bit signed integer"), std::string::npos)
        << args << "\n" << joined(r);
  }
}

TEST(CliPlacement, HostileFlagsAreRefusedWithExitTwo) {
  for (const std::string flags : {"--gpus-per-host 0", "--gpus-per-host -3", "--gpus-per-host 99999999999999999999",
                                  "--gpus-per-host 4611686018427387904", "--gpus-per-host x",
                                  "--gpus-per-host 8 --require tp=rack", "--gpus-per-host 8 --require nope=host",
                                  "--gpus-per-host 8 --require =host", "--nvlink-domain 4", "--require tp=host",
                                  "--gpus-per-host 8 --nvlink-domain 0"}) {
    for (const std::string cmd : {"show", "run"}) {
      Result r = run(cmd + " --mesh dp=2,tp=4 " + flags);
      EXPECT_EQ(r.status, 2) << cmd << " " << flags << "\n" << joined(r);
    }
  }
}

}  // namespace

namespace {

// write_file writes `text` to a file under the test's temp dir and returns its path.
std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// meshsim step (in progress): one pipeline group's schedule, lowered and checked.
TEST(CliStep, ABuiltInScheduleProgressesAndADeadlockingCsvIsNamed) {
  Result ok = run("step --schedule 1F1B --pp 4 --microbatches 8");
  EXPECT_EQ(ok.status, 0);
  EXPECT_TRUE(has_line(ok, "OK: 4 pipeline ranks, 4 stages, 8 microbatches: every send meets its receive under rendezvous sends"));
  EXPECT_EQ(run("step --schedule interleaved1f1b --pp 4 --stages 8 --microbatches 8").status, 0);
  EXPECT_EQ(run("step --schedule Interleaved1F1B --pp 4 --microbatches 8").status, 2);  // --stages needed
  // pytorch/pytorch#172668's two ranks, each sending before it receives: the file docs/step.md's
  // example reads, as shipped.
  const std::string csv = std::string(MESHSIM_TEST_DATA) + "/../../docs/examples/deadlock.csv";
  Result dead = run("step --schedule " + csv + " --microbatches 2");
  EXPECT_EQ(dead.status, 1);
  // PyTorch's _format_pipeline_order grid, its error marker on the step where both ranks wait.
  EXPECT_TRUE(has_line(dead, "        Rank 0   Rank 1  "));
  EXPECT_TRUE(has_line(dead, "Step 3: 0SEND_F1 1SEND_B0 <-- ERROR HERE: rank 0, rank 1 wait"));
  EXPECT_TRUE(has_line(dead, "Step 4: 0RECV_B0 1RECV_F1"));
  EXPECT_TRUE(has_line(dead, "FAILED ranks [0, 1]: pipeline deadlock under rendezvous sends: rank 0 waits in its send "
                             "0SEND_F1 (action 3) to rank 1 (1RECV_F1), while rank 1 waits in its send 1SEND_B0 (action 3) "
                             "to rank 0 (0RECV_B0)"));
  EXPECT_EQ(run("step --schedule " + csv + " --microbatches 2 --send-semantics eager").status, 0);
  // The lowered schedule written back reads back the same, and checks the same.
  const std::string dumped = testing::TempDir() + "/meshsim_dumped.csv";
  EXPECT_EQ(run("step --schedule GPipe --pp 3 --microbatches 4 --dump-schedule " + dumped).status, 0);
  Result again = run("step --schedule " + dumped + " --microbatches 4 --format json");
  ASSERT_EQ(again.status, 0);
  const Json j = Json::parse(again.lines.at(0));
  EXPECT_EQ(j["ok"], true);
  EXPECT_EQ(j["pp"], 3);
  // PyTorch's Schedule1F1B refuses fewer microbatches than stages, in its words.
  Result few = run_shell(std::string(MESHSIM_EXE) + " step --schedule 1F1B --pp 2 --microbatches 1 2>&1");
  EXPECT_EQ(few.status, 2);
  ASSERT_FALSE(few.lines.empty());
  EXPECT_NE(few.lines.back().find("Number of microbatches (1) must be greater than or equal to the number of stages (2)"),
            std::string::npos) << few.lines.back();
  EXPECT_EQ(run("step --schedule GPipe --pp 2 --microbatches 1").status, 0);  // GPipe takes it
  // Bad usage: exit 2, the reason named.
  for (const std::string bad : {"step --schedule 1F1B --microbatches 4", "step --schedule 1F1B --pp 2 --microbatches 0",
                                "step --schedule 1F1B --pp 2 --microbatches 2 --send-semantics lazy",
                                "step --schedule /nonexistent.csv --microbatches 2"}) {
    EXPECT_EQ(run(bad).status, 2) << bad;
  }
}

// A lowered CSV's compute actions are checked with or without --preset: a compute action twice,
// a stage on another rank's row are refused naming the action, never passed as progressing.
TEST(CliStep, ALoweredCsvIsCheckedWithoutPresetAsWithIt) {
  const std::string dir = testing::TempDir();
  const std::string good = dir + "/meshsim_lowered_ok.csv", twice = dir + "/meshsim_lowered_twice.csv",
                    moved = dir + "/meshsim_lowered_moved.csv";
  std::ofstream(good) << "0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n";
  std::ofstream(twice) << "0F0,0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n";
  std::ofstream(moved) << "0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,0F0,1B0,1SEND_B0\n";
  EXPECT_EQ(run("step --schedule " + good + " --microbatches 1").status, 0);
  Result r = run_shell(std::string(MESHSIM_EXE) + " step --schedule " + twice + " --microbatches 1 2>&1");
  EXPECT_EQ(r.status, 2);
  ASSERT_FALSE(r.lines.empty());
  EXPECT_NE(r.lines.back().find("rank 0 action 1 (0F0): runs a second time"), std::string::npos) << r.lines.back();
  r = run_shell(std::string(MESHSIM_EXE) + " step --schedule " + moved + " --microbatches 1 2>&1");
  EXPECT_EQ(r.status, 2);
  ASSERT_FALSE(r.lines.empty());
  EXPECT_NE(r.lines.back().find("rank 1 action 1 (0F0): stage 0 lives on rank 0"), std::string::npos) << r.lines.back();
}

// A torchtitan step's multi-stage pipeline runs as PyTorch's runtime lowers it: a stage's FSDP
// all-gather at each UNSHARD of the lowered schedule (4 stages on a rank, 3 kept unsharded: some
// are evicted and gathered again), not once per stage as the plain _add_send_recv form has it.
TEST(CliStep, APipelinesFsdpGathersComeAtTheRuntimesUnshards) {
  const std::string dir = testing::TempDir();
  const std::string job = "step --preset torchtitan:pp=2,dp_shard=2 --model llama3-debugmodel --seq-len 256 "
                          "--local-batch-size 1 --schedule Interleaved1F1B --stages 8 --microbatches 4 --format json";
  int64_t gathers[2] = {0, 0};
  int64_t unshards = 0;
  for (int k = 0; k < 2; ++k) {
    const std::string csv = dir + "/meshsim_runtime_" + std::to_string(k) + ".csv";
    Result r = run(job + " --dump-schedule " + csv + (k == 0 ? "" : " --lowering add_send_recv"));
    ASSERT_EQ(r.status, 0);
    ASSERT_EQ(r.lines.size(), 1u);
    const Json j = Json::parse(r.lines[0]);
    EXPECT_EQ(j["lowering"], k == 0 ? "runtime" : "add_send_recv");
    gathers[k] = j["by_dim"]["fsdp"]["all_gather"]["calls"].get<int64_t>();
    std::ifstream in(csv);
    std::string rank0;
    std::getline(in, rank0);
    if (k == 0) {
      for (std::size_t at = rank0.find("UNSHARD"); at != std::string::npos; at = rank0.find("UNSHARD", at + 1)) ++unshards;
    } else {
      EXPECT_EQ(rank0.find("UNSHARD"), std::string::npos) << rank0;
    }
  }
  EXPECT_GT(unshards, 4);              // rank 0's 4 stages, some unsharded again
  EXPECT_EQ(gathers[0], unshards);     // each stage here is one FSDP unit
  EXPECT_EQ(gathers[1], 4);            // once per stage, at its first forward
  EXPECT_EQ(run(job + " --lowering eager").status, 2);
}

// A forward placed before the receive it needs never has its input: a hang naming the rank and
// the action under eager sends too (PyTorch's _simulate_comms_compute stops there).
TEST(CliStep, AComputeBeforeItsReceiveIsAHangUnderEagerSends) {
  const std::string csv = testing::TempDir() + "/meshsim_compute_first.csv";
  std::ofstream(csv) << "0F0,0SEND_F0,0RECV_B0,0B0\n1F0,1RECV_F0,1B0,1SEND_B0\n";
  for (const char* sem : {"eager", "rendezvous"}) {
    Result r = run("step --schedule " + csv + " --microbatches 1 --send-semantics " + sem);
    EXPECT_EQ(r.status, 1) << sem;
    EXPECT_TRUE(has_line(r, std::string("FAILED ranks [1]: pipeline hang under ") + sem +
                                " sends: rank 1's 1F0 (action 0) lacks its input: 1RECV_F0 must run on rank 1 before it "
                                "(PyTorch's _simulate_comms_compute stops here too)"))
        << sem;
  }
}

// A file name is any bytes: JSON output names it with its invalid UTF-8 replaced, never an abort
// from the JSON writer.
TEST(CliStep, JsonOutputNamesAFileWhoseNameIsNotUtf8) {
  const std::string dir = ::testing::TempDir() + "/meshsim_non_utf8";
  std::filesystem::create_directories(dir);
  Result r = run_shell(std::string(MESHSIM_EXE) + " step --preset torchtitan:dp_shard=2 --model llama3-debugmodel "
                       "--seq-len 128 --local-batch-size 1 --format json --chakra \"" + dir + "/x$(printf '\\377')\" 2>&1");
  ASSERT_EQ(r.status, 0) << (r.lines.empty() ? "" : r.lines.back());
  ASSERT_FALSE(r.lines.empty());
  const Json j = Json::parse(r.lines.back());
  EXPECT_EQ(j["chakra"]["prefix"], dir + "/x\xEF\xBF\xBD");  // U+FFFD
}

// Outputs: their directories are made (as mkdir -p), an empty path or --dump-schedule without a
// pipeline is refused, and a refused run writes none of its files.
TEST(CliStep, OutputsGetTheirDirectoriesAndARefusedRunWritesNothing) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "meshsim_step_outputs";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string job = "step --preset torchtitan:dp_shard=2 --model llama3-debugmodel --seq-len 128 --local-batch-size 1";
  // --chakra out/step: out/ is made.
  Result made = run(job + " --chakra " + (dir / "out" / "step").string());
  EXPECT_EQ(made.status, 0) << joined(made);
  EXPECT_TRUE(fs::exists(dir / "out" / "step.0.et"));
  // A refused run (the Chakra prefix's directory cannot be made: a file is in the way) leaves
  // the trace it would also have written unwritten.
  std::ofstream(dir / "afile") << "x";
  const fs::path trace = dir / "trace.json";
  Result refused = run_shell(std::string(MESHSIM_EXE) + " " + job + " --trace " + trace.string() + " --chakra " +
                             (dir / "afile" / "sub" / "step").string() + " 2>&1");
  EXPECT_EQ(refused.status, 2) << joined(refused);
  EXPECT_NE(joined(refused).find("--chakra"), std::string::npos) << joined(refused);
  EXPECT_FALSE(fs::exists(trace));
  // --dump-schedule without pipeline parallelism, and empty output paths: refused.
  Result no_pp = run_shell(std::string(MESHSIM_EXE) + " " + job + " --dump-schedule " + (dir / "s.csv").string() + " 2>&1");
  EXPECT_EQ(no_pp.status, 2);
  EXPECT_NE(joined(no_pp).find("no pipeline parallelism (pp=1)"), std::string::npos) << joined(no_pp);
  EXPECT_FALSE(fs::exists(dir / "s.csv"));
  for (const std::string flag : {"--trace", "--chakra", "--dump-schedule"}) {
    Result empty = run_shell(std::string(MESHSIM_EXE) + " " + job + " " + flag + " '' 2>&1");
    EXPECT_EQ(empty.status, 2) << flag << "\n" << joined(empty);
  }
}

// A dim's name may be any string (PyTorch's rule), but the tool never writes the bytes a terminal
// acts on: in text output ESC and the other C0 controls (newline and tab aside) are escaped as
// \xHH, in errors too; JSON escapes them itself.
TEST(Cli, ControlBytesInNamesAreEscapedInTextOutput) {
  const std::string recipe = write_file("meshsim_control_names.json",
      "{\"world_size\": 4, \"build\": {\"init_device_mesh\": {\"mesh_shape\": [2, 2], "
      "\"mesh_dim_names\": [\"a\\u001b[31m\", \"b\\u0007\"]}}}");
  Result text = run_shell(std::string(MESHSIM_EXE) + " show --recipe " + recipe + " 2>&1");
  ASSERT_EQ(text.status, 0);
  bool named = false;
  for (const std::string& l : text.lines) {
    EXPECT_EQ(l.find('\x1b'), std::string::npos) << l;
    EXPECT_EQ(l.find('\x07'), std::string::npos) << l;
    named = named || l.find("a\\x1b[31m") != std::string::npos;
  }
  EXPECT_TRUE(named);
  Result err = run_shell(std::string(MESHSIM_EXE) + " show --mesh x=2 --slice \"$(printf 'y\\033[2J')\" 2>&1");
  EXPECT_EQ(err.status, 2);
  ASSERT_FALSE(err.lines.empty());
  for (const std::string& l : err.lines) EXPECT_EQ(l.find('\x1b'), std::string::npos) << l;
  EXPECT_NE(err.lines.front().find("'y\\x1b[2J'"), std::string::npos) << err.lines.front();
  Result js = run("show --recipe " + recipe + " --format json");
  ASSERT_EQ(js.status, 0);
  std::string all;
  for (const std::string& l : js.lines) all += l + "\n";
  EXPECT_EQ(Json::parse(all)["mesh_dim_names"][0], "a\x1b[31m");
}

// meshsim step --preset: a torchtitan job's step on every rank. The issue's own command: the
// table and OK; a planted fault and a deadlocking CSV each one FAILED line naming the ranks.
TEST(CliStep, MegatronsInterleavedScheduleAndItsEvenOddRule) {
  Result ok = run("step --schedule MegatronInterleaved --pp 4 --stages 8 --microbatches 8");
  EXPECT_EQ(ok.status, 0);
  EXPECT_TRUE(has_line(ok, "OK: 4 pipeline ranks, 8 stages, 8 microbatches: every send meets its receive under rendezvous sends"));
  Result off = run("step --schedule MegatronInterleaved --pp 4 --stages 8 --microbatches 8 --fault no-parity@2");
  EXPECT_EQ(off.status, 1);
  bool named = false;
  for (const auto& l : off.lines) {
    named = named || (l.rfind("FAILED ranks [0, 1, 2, 3]: pipeline deadlock under rendezvous sends: rank 0 waits in its send", 0) == 0);
  }
  EXPECT_TRUE(named);
  EXPECT_EQ(run("step --schedule MegatronInterleaved --pp 4 --stages 8 --microbatches 8 --fault no-parity@4").status, 2);
  EXPECT_EQ(run("step --schedule MegatronInterleaved --pp 4 --stages 8 --microbatches 8 --fault skip@1").status, 2);
  EXPECT_EQ(run("step --schedule MegatronInterleaved --pp 4 --stages 8 --microbatches 6").status, 2);
  EXPECT_EQ(run("step --schedule 1F1B --pp 4 --microbatches 8 --fault no-parity@1").status, 2);
  // A no-parity rank past the world is the fault's error, not --ranks'.
  Result far = run_shell(std::string(MESHSIM_EXE) + " step --preset megatron:tp=2,pp=3,dp=2 --model llama3-debugmodel "
                         "--seq-len 1024 --local-batch-size 1 --microbatches 6 --stages 6 --fault no-parity@99 2>&1");
  EXPECT_EQ(far.status, 2);
  EXPECT_NE(joined(far).find("--fault 'no-parity@99': rank 99 is out of range [0, 12)"), std::string::npos) << joined(far);
  EXPECT_EQ(joined(far).find("--ranks"), std::string::npos) << joined(far);
}

TEST(CliStep, AChakraTraceWithNoNodesSaysSo) {
  const std::string prefix = testing::TempDir() + "/meshsim_chakra_one/step";
  Result r = run_shell(std::string(MESHSIM_EXE) + " step --preset torchtitan:dp_shard=1 --model llama3-debugmodel --seq-len 256 "
                       "--local-batch-size 1 --chakra " + prefix + " 2>&1");
  EXPECT_EQ(r.status, 0);
  EXPECT_TRUE(has_line(r, "meshsim step: warning: the Chakra traces hold no nodes: no collective, send or receive of this "
                          "step runs between the 1 NPU written (one NPU, or every group reaches outside --chakra-world)"));
}

TEST(CliStep, ChakraTracesAreWrittenPerNpuWithTheirGroups) {
  const std::string dir = ::testing::TempDir() + "/meshsim_cli_chakra";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string prefix = dir + "/step";
  const std::string job = "step --preset torchtitan:pp=2,dp_shard=2,tp=2 --model llama3-debugmodel --seq-len 256 "
                          "--local-batch-size 1 --microbatches 2 --chakra " + prefix;
  Result r = run(job + " --chakra-world replica");
  ASSERT_EQ(r.status, 0);
  bool said = false;
  for (const auto& l : r.lines) {
    said = said || (l.find("chakra: " + prefix + ".{0..3}.et (4 NPUs") != std::string::npos && l.find("left out") != std::string::npos);
  }
  EXPECT_TRUE(said);
  for (int npu = 0; npu < 4; ++npu) EXPECT_TRUE(std::filesystem::exists(prefix + "." + std::to_string(npu) + ".et"));
  EXPECT_FALSE(std::filesystem::exists(prefix + ".4.et"));
  std::ifstream groups(prefix + ".comm_groups.json");
  EXPECT_FALSE(Json::parse(groups).empty());
  r = run(job + " --format json");
  ASSERT_EQ(r.status, 0);
  const Json j = Json::parse(r.lines.at(0));
  EXPECT_EQ(j["chakra"]["npus"], 8);
  EXPECT_TRUE(j["chakra"]["dropped"].empty());
  EXPECT_EQ(run(job + " --chakra-world half").status, 2);
  EXPECT_EQ(run("step --schedule 1F1B --pp 2 --microbatches 2 --chakra " + prefix).status, 2);
}

TEST(CliStep, ATorchtitanStepIsCheckedAndCounted) {
  const std::string job = "step --preset torchtitan:pp=4,dp_shard=8,tp=2 --model llama3-8b --seq-len 8192 "
                          "--local-batch-size 8 --microbatches 8";
  Result ok = run(job + " --gpus-per-host 8");
  ASSERT_EQ(ok.status, 0);
  EXPECT_TRUE(has_line(ok, "step: torchtitan pp=4 dp_replicate=1 dp_shard=8 cp=1 tp=2 (64 ranks); llama3-8b "
                           "(8,030,261,248 parameters), seq 8192, local batch 8"));
  // torchtitan's split of 32 layers (+1 for the embeddings, +1 for the output) over 4 stages.
  EXPECT_TRUE(has_line(ok, "pipeline: 1F1B, 4 stages (8+9+8+7 layers), 8 microbatches, rendezvous sends"));
  const auto okline = std::find_if(ok.lines.begin(), ok.lines.end(), [](const std::string& l) { return l.rfind("OK: 64 ranks", 0) == 0; });
  EXPECT_NE(okline, ok.lines.end());
  // Rank 0 (stage 0, 8 layers): a microbatch's tp all-gathers: 2 per layer each way, 2 more per
  // layer recomputed in backward (selective AC), the embedding's in backward: (8 x 6 + 1) x 8
  // microbatches = 392, each 8 x 8192 x 4096 x 2 bytes.
  Result js = run(job + " --gpus-per-host 8 --format json");
  ASSERT_EQ(js.status, 0);
  const Json j = Json::parse(js.lines.at(0));
  EXPECT_EQ(j["ok"], true);
  EXPECT_TRUE(j["diagnosis"].is_null());
  EXPECT_EQ(j["world_size"], 64);
  EXPECT_EQ(j["rank"], 0);
  EXPECT_EQ(j["by_dim"]["tp"]["all_gather"]["calls"], 392);
  EXPECT_EQ(j["by_dim"]["tp"]["all_gather"]["bytes"], int64_t{392} * 8 * 8192 * 4096 * 2);
  EXPECT_EQ(j["by_dim"]["pp"]["send"]["calls"], 8);
  EXPECT_EQ(j["by_dim"]["pp"]["send"]["bytes"], int64_t{8} * 8 * 8192 * 4096 * 2 / 2);
  // tp pairs sit inside a host of 8; fsdp groups (stride 2 over 16 ranks) span two hosts.
  EXPECT_EQ(j["link_by_dim"]["tp"]["inter_host"], 0);
  EXPECT_GT(j["link_by_dim"]["fsdp"]["inter_host"], 0);
  EXPECT_EQ(j["by_link"]["intra_host"].get<int64_t>() + j["by_link"]["inter_host"].get<int64_t>(),
            [&] {
              int64_t t = 0;
              for (const auto& [dim, l] : j["link_by_dim"].items()) t += l["intra_host"].get<int64_t>() + l["inter_host"].get<int64_t>();
              return t;
            }());
  for (const std::string fault : {"skip@5", "swap@17", "wrong-group@33", "wrong-peer@50"}) {
    Result bad = run(job + " --fault " + fault);
    EXPECT_EQ(bad.status, 1) << fault;
    const std::string rank = fault.substr(fault.find('@') + 1);
    const auto failed = std::count_if(bad.lines.begin(), bad.lines.end(), [](const std::string& l) { return l.rfind("FAILED", 0) == 0; });
    EXPECT_EQ(failed, 1) << fault;
    EXPECT_NE(bad.lines.back().find("rank " + rank + " "), std::string::npos) << bad.lines.back();
    Result bj = run(job + " --fault " + fault + " --format json");
    const Json b = Json::parse(bj.lines.at(0));
    EXPECT_EQ(b["ok"], false);
    const auto ranks = b["ranks"].get<std::vector<int64_t>>();
    EXPECT_NE(std::find(ranks.begin(), ranks.end(), std::stoll(rank)), ranks.end()) << fault;
  }
  // pytorch/pytorch#172668's schedule, lifted to every pipeline group of a pp=2 x tp=2 job.
  const std::string csv = write_file("meshsim_step_deadlock.csv", "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
                                     "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n");
  const std::string small = "step --preset torchtitan:pp=2,dp_shard=2,tp=2 --model llama3-debugmodel --seq-len 256 "
                            "--local-batch-size 2 --microbatches 2 --schedule " + csv;
  Result dead = run(small);
  EXPECT_EQ(dead.status, 1);
  EXPECT_NE(dead.lines.back().find("rank 0 waits in its send to rank 4"), std::string::npos) << dead.lines.back();
  // The schedule's own grid, its stuck step marked as PyTorch marks it.
  EXPECT_TRUE(has_line(dead, "Step 3: 0SEND_F1 1SEND_B0 <-- ERROR HERE: rank 0, rank 1 wait"));
  EXPECT_FALSE(has_line(ok, "        Rank 0   Rank 1  "));
  EXPECT_EQ(run(small + " --send-semantics eager").status, 0);
  // A trace for chosen ranks: one track each, a slice per event with its group and bytes.
  const std::string trace = testing::TempDir() + "/meshsim_step_trace.json";
  ASSERT_EQ(run(job + " --ranks 0,17 --trace " + trace).status, 0);
  std::ifstream in(trace);
  const Json t = Json::parse(in);
  std::set<int64_t> tracks;
  int64_t slices = 0;
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] == "X") {
      ++slices;
      tracks.insert(e["tid"].get<int64_t>());
      EXPECT_TRUE(e["args"].contains("bytes"));
      EXPECT_TRUE(e["args"].contains("group"));
      EXPECT_TRUE(e["args"].contains("view"));
    }
  }
  EXPECT_EQ(tracks, (std::set<int64_t>{0, 17}));
  EXPECT_GT(slices, 1000);
  // A model from a TOML file: the debug model's fields give the debug model's bytes.
  const std::string toml = write_file("meshsim_model.toml", "[model]\nname = \"tiny\"\nn_layers = 6\ndim = 256\n"
                                      "ffn_dim = 768\nn_heads = 16\nn_kv_heads = 16\nvocab_size = 2048\n");
  const std::string base = "step --preset torchtitan:dp_shard=2,tp=2 --seq-len 256 --local-batch-size 2 --format json --model ";
  Result a = run(base + "llama3-debugmodel"), b = run(base + toml);
  ASSERT_EQ(a.status, 0);
  ASSERT_EQ(b.status, 0);
  EXPECT_EQ(Json::parse(a.lines.at(0))["by_dim"], Json::parse(b.lines.at(0))["by_dim"]);
  // Every key of the model file is known and of its type: a misspelt key of any type is named
  // unknown, a known key of another type is named with both types.
  const std::string fields = "[model]\nn_layers = 6\ndim = 256\nffn_dim = 768\nn_heads = 16\nn_kv_heads = 16\n"
                             "vocab_size = 2048\n";
  for (const auto& [extra, needle] : std::vector<std::pair<std::string, std::string>>{
           {"foo = true\n", "unknown key model.'foo' (a boolean;"},
           {"n_layerz = \"3\"\n", "unknown key model.'n_layerz' (a string;"},
           {"enable_weight_tying = \"true\"\n", "model.enable_weight_tying is a string, not a boolean"},
           {"name = 3\n", "model.name is an integer, not a string"},
           {"num_experts = 1.5\n", "model.num_experts is a float, not an integer"}}) {
    const std::string bad_model = write_file("meshsim_bad_model.toml", fields + extra);
    Result r = run_shell(std::string(MESHSIM_EXE) + " " + base + bad_model + " 2>&1");
    EXPECT_EQ(r.status, 2) << extra;
    EXPECT_NE(joined(r).find(needle), std::string::npos) << extra << "\n" << joined(r);
  }
  // Each faulted rank's program is a copy: the copies count against the events' bound (127
  // faults of a long program took 6.9 GB).
  const std::string deep = write_file("meshsim_deep_model.toml", "[model]\nn_layers = 60000\ndim = 256\nffn_dim = 768\n"
                                      "n_heads = 16\nn_kv_heads = 16\nvocab_size = 2048\n");
  std::string many = "step --preset torchtitan:dp_shard=8,tp=2 --seq-len 128 --local-batch-size 1 --model " + deep;
  for (int r = 1; r <= 7; ++r) many += " --fault skip@" + std::to_string(r);
  Result copies = run_shell(std::string(MESHSIM_EXE) + " " + many + " 2>&1");
  EXPECT_EQ(copies.status, 2) << joined(copies);
  EXPECT_NE(joined(copies).find("faulted ranks (each a copy of its program) hold over 4194304 events"), std::string::npos)
      << joined(copies);
  // A deepseek_v3 MoE job: its all-to-alls over ep, its experts' gathers over efsdp.
  Result moe = run("step --preset torchtitan:pp=2,dp_shard=8,tp=2,ep=8 --model deepseek_v3-16b --seq-len 4096 "
                   "--local-batch-size 2 --microbatches 4 --format json");
  ASSERT_EQ(moe.status, 0);
  const Json mj = Json::parse(moe.lines.at(0));
  EXPECT_EQ(mj["model"]["parameters"], 15'706'484'224);
  EXPECT_GT(mj["by_dim"]["ep"]["all_to_all"]["calls"].get<int64_t>(), 0);
  EXPECT_GT(mj["by_dim"]["efsdp"]["all_gather"]["calls"].get<int64_t>(), 0);
  // Bad usage: exit 2.
  for (const std::string& bad : std::vector<std::string>{
           "step --preset torchtitan:pp=4,dp_shard=8,tp=2 --model llama3-8b --seq-len 8192",  // no batch size
           "step --preset torchtitan:tp=3 --model llama3-8b --seq-len 8192 --local-batch-size 1",  // 32 heads
           "step --preset torchtitan:pp=2 --model llama3-8b --seq-len 8192 --local-batch-size 1 --schedule 1F1B --stages 4",
           "step --preset torchtitan:dp_shard=-1 --model llama3-8b --seq-len 8192 --local-batch-size 1",  // no world size
           "step --preset torchtitan:tp=2 --model nope --seq-len 8 --local-batch-size 1",
           "step --preset torchtitan:tp=2 --model " + testing::TempDir() + " --seq-len 8 --local-batch-size 1",
           "step --preset torchtitan:tp=2 --model llama3-8b --seq-len 8 --local-batch-size 1 --fault skip@2",
           "step --preset torchtitan:tp=2 --model llama3-8b --seq-len 8 --local-batch-size 1 --ranks 0-9",
           "step --preset torchtitan:tp=2 --model llama3-8b --seq-len 8 --local-batch-size 1 --rank -1",
           "step --model llama3-8b --schedule 1F1B --pp 2 --microbatches 2",
           "step --preset torchtitan:dp_shard=2,ep=2 --model llama3-8b --seq-len 8 --local-batch-size 1"}) {
    EXPECT_EQ(run(bad).status, 2) << bad;
  }
}


const char* kViewsRecipe = R"J({"world_size": 16,
  "build": {"init_device_mesh": {"mesh_shape": [16], "mesh_dim_names": ["world"]}},
  "ops": [{"on": "root", "unflatten": {"dim": "world", "sizes": [2, 2, 4], "names": ["pp", "dp", "tp"]}, "let": "dense"},
          {"on": "root", "unflatten": {"dim": "world", "sizes": [2, 4, 2], "names": ["pp", "ep", "etp"]}, "let": "sparse"},
          {"on": "dense", "slice": ["dp", "tp"], "let": "dp_tp"}]})J";

// groups_of is the groups of `dim` of a row-major mesh of `sizes` over ranks 0..n-1, in the
// order of their smallest rank (an independent enumeration).
std::vector<std::vector<int64_t>> groups_of(const std::vector<int64_t>& sizes, std::size_t dim) {
  int64_t n = 1, stride = 1;
  for (int64_t s : sizes) n *= s;
  for (std::size_t k = dim + 1; k < sizes.size(); ++k) stride *= sizes[k];
  std::vector<std::vector<int64_t>> out;
  for (int64_t r = 0; r < n; ++r) {
    if ((r / stride) % sizes[dim] != 0) continue;  // r is its group's first member
    std::vector<int64_t> g;
    for (int64_t i = 0; i < sizes[dim]; ++i) g.push_back(r + i * stride);
    out.push_back(g);
  }
  return out;
}

TEST(CliRecipe, SlicingAFlattenedDimFromTheRootWarnsOnStderrAndInJson) {
  const std::string path = write_file("meshsim_flat_from_root.json", R"J({"world_size": 8,
    "build": {"init_device_mesh": {"mesh_shape": [2, 2, 2], "mesh_dim_names": ["dp", "cp", "tp"]}},
    "ops": [{"slice": ["dp", "cp"], "let": "dpcp"}, {"on": "dpcp", "flatten": "dp_cp", "let": "flat"},
            {"on": "root", "slice": ["dp_cp", "tp"], "let": "v"}]})J");
  for (const char* cmd : {"show", "run"}) {
    // stderr alone: one warning line naming the step and the dim; stdout stays the answer.
    Result err = run_shell(std::string(MESHSIM_EXE) + " " + cmd + " --recipe " + path + " 2>&1 >/dev/null");
    ASSERT_EQ(err.status, 0) << cmd << ": " << joined(err);
    ASSERT_EQ(err.lines.size(), 1u) << cmd << ": " << joined(err);
    EXPECT_EQ(err.lines[0].rfind(std::string("meshsim ") + cmd + ": warning: ops[2]: slicing 'dp_cp'", 0), 0u) << err.lines[0];
    EXPECT_NE(err.lines[0].find("pytorch/pytorch#164993"), std::string::npos) << err.lines[0];
    Result json = run(std::string(cmd) + " --recipe " + path + " --format json");
    ASSERT_EQ(json.status, 0) << cmd;
    const Json j = Json::parse(joined(json));
    ASSERT_EQ(j["warnings"].size(), 1u) << cmd << ": " << j.dump();
    EXPECT_EQ(j["warnings"][0].get<std::string>().rfind("ops[2]: slicing 'dp_cp'", 0), 0u);
  }
  // A recipe of many such slices: 16 shown, then the count, on stderr and in JSON alike.
  std::string ops = R"J([{"slice": ["dp", "cp"], "let": "dpcp"}, {"on": "dpcp", "flatten": "dp_cp", "let": "flat"})J";
  for (int i = 0; i < 40; ++i) ops += R"J(, {"on": "root", "slice": ["dp_cp", "tp"]})J";
  const std::string many = write_file("meshsim_flat_many.json", R"J({"world_size": 8,
    "build": {"init_device_mesh": {"mesh_shape": [2, 2, 2], "mesh_dim_names": ["dp", "cp", "tp"]}}, "ops": )J" + ops + "]}");
  Result err = run_shell(std::string(MESHSIM_EXE) + " show --recipe " + many + " 2>&1 >/dev/null");
  ASSERT_EQ(err.lines.size(), 17u) << joined(err);
  EXPECT_EQ(err.lines[16], "meshsim show: warning: ... and 24 more warnings");
  const Json j = Json::parse(joined(run("run --recipe " + many + " --format json")));
  ASSERT_EQ(j["warnings"].size(), 17u);
  EXPECT_EQ(j["warnings"][16], "... and 24 more warnings");
  // Slicing the root's own dims warns of nothing, and the JSON has no "warnings" then.
  Result quiet = run_shell(std::string(MESHSIM_EXE) + " show --mesh dp=2,cp=2,tp=2 --slice dp,tp 2>&1 >/dev/null");
  EXPECT_EQ(quiet.status, 0);
  EXPECT_TRUE(quiet.lines.empty()) << joined(quiet);
  EXPECT_FALSE(Json::parse(joined(run("show --mesh dp=2,tp=2 --format json"))).contains("warnings"));
}

TEST(CliRecipe, ShowAndRunTakeSeveralViewsOfOneRootFromAFile) {
  const std::string path = write_file("meshsim_views.json", kViewsRecipe);
  Result shown = run("show --recipe " + path + " --format json");
  ASSERT_EQ(shown.status, 0) << joined(shown);
  const Json s = Json::parse(joined(shown));
  ASSERT_EQ(s["views"].size(), 4u) << s["views"];
  const std::vector<std::string> names{"root", "dense", "sparse", "dp_tp"};
  for (std::size_t i = 0; i < names.size(); ++i) EXPECT_EQ(s["views"][i]["name"], names[i]);
  for (std::size_t d = 0; d < 3; ++d) {
    const std::string dim = std::vector<std::string>{"pp", "dp", "tp"}[d];
    auto want = groups_of({2, 2, 4}, d);
    auto got = s["views"][1]["groups_by_dim"][dim].get<std::vector<std::vector<int64_t>>>();
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, want) << dim;
  }
  auto ep = s["views"][2]["groups_by_dim"]["ep"].get<std::vector<std::vector<int64_t>>>();
  std::sort(ep.begin(), ep.end());
  EXPECT_EQ(ep, groups_of({2, 4, 2}, 1));
  for (const std::string backend : {"threaded", "local"}) {
    int status = -1;
    Json j = run_json("--backend " + backend + " --recipe " + path, &status);
    ASSERT_EQ(status, 0) << backend << j;
    EXPECT_EQ(j["meshes"].size(), 4u);  // the root and every step, each checked over the backend
    ASSERT_EQ(j["views"].size(), 4u);
    EXPECT_EQ(j["views"][2]["name"], "sparse");
    EXPECT_EQ(j["views"][2]["groups_by_dim"], s["views"][2]["groups_by_dim"]) << backend;
  }
}

TEST(CliRecipe, BadRecipeFilesAreRefusedNamingTheFile) {
  const std::map<std::string, std::string> bad{
      {"not_json", "{\"world_size\": 4,"},
      {"not_object", "[1, 2]"},
      {"bad_field", R"({"world_size": 4, "build": 7})"},
      {"deep", std::string(200, '[') + std::string(200, ']')},
      {"huge", R"({"world_size": 4, "build": {"init_device_mesh": {"mesh_shape": [9223372036854775807, 2]}}})"},
  };
  for (const auto& [name, text] : bad) {
    const std::string path = write_file("meshsim_bad_" + name + ".json", text);
    for (const std::string cmd : {"show", "run"}) {
      Result r = run_shell(std::string(MESHSIM_EXE) + " " + cmd + " --recipe " + path + " 2>&1");
      EXPECT_EQ(r.status, 2) << cmd << " " << name << "\n" << joined(r);
      EXPECT_NE(joined(r).find(path), std::string::npos) << cmd << " " << name << "\n" << joined(r);
    }
  }
  Result missing = run_shell(std::string(MESHSIM_EXE) + " show --recipe /nonexistent/recipe.json 2>&1");
  EXPECT_EQ(missing.status, 2);
  EXPECT_NE(joined(missing).find("cannot be read"), std::string::npos) << joined(missing);
  const std::string path = write_file("meshsim_views2.json", kViewsRecipe);
  Result mixed = run_shell(std::string(MESHSIM_EXE) + " show --recipe " + path + " --mesh dp=2 2>&1");
  EXPECT_EQ(mixed.status, 2);
  EXPECT_NE(joined(mixed).find("is the whole recipe"), std::string::npos) << joined(mixed);
}

// The done-when configurations: a torchtitan and a Megatron job of 64 ranks, 8 GPUs per host,
// tp required on one host, every view's groups checked over the threaded and the local backend.
TEST(CliPreset, SixtyFourRankFrameworkJobsRunWithTpOnOneHost) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> jobs{
      {"torchtitan:pp=2,dp_replicate=2,dp_shard=4,cp=2,tp=2,ep=4",
       {"root", "dataloading", "loss", "dense", "spmd_dense_for_fwdbwd", "sparse", "spmd_sparse_for_fwdbwd"}},
      {"megatron:tp=4,pp=2,cp=2,ep=2,etp=2,order=tp-cp-ep-dp-pp", {"root", "dense", "dp_cp", "mp", "expert"}},
  };
  for (const auto& [preset, names] : jobs) {
    const std::string flags = "--preset " + preset + " --world-size 64 --gpus-per-host 8 --require tp=host";
    Result shown = run("show " + flags + " --format json");
    ASSERT_EQ(shown.status, 0) << preset << joined(shown);
    const Json s = Json::parse(joined(shown));
    ASSERT_EQ(s["views"].size(), names.size()) << preset;
    for (std::size_t i = 0; i < names.size(); ++i) {
      EXPECT_EQ(s["views"][i]["name"], names[i]) << preset;
      if (s["views"][i]["placement"].contains("tp")) {
        EXPECT_EQ(s["views"][i]["placement"]["tp"]["max_hosts"], 1) << preset << " " << names[i];
      }
    }
    for (const std::string backend : {"threaded", "local"}) {
      int status = -1;
      Json j = run_json("--backend " + backend + " " + flags, &status);
      ASSERT_EQ(status, 0) << preset << " " << backend << j;
      EXPECT_EQ(j["ok"], true) << preset << " " << backend;
      EXPECT_EQ(j["meshes"].size(), names[1] == "dataloading" ? 9u : 7u) << preset;  // every step, unbound ones too
      ASSERT_EQ(j["views"].size(), names.size());
      for (std::size_t i = 0; i < names.size(); ++i) {
        EXPECT_EQ(j["views"][i]["groups_by_dim"], s["views"][i]["groups_by_dim"]) << preset << " " << backend;
      }
    }
    // tp across hosts: with 1 GPU per host every tp group of 2+ ranks breaks the requirement.
    Result broken = run_shell(std::string(MESHSIM_EXE) + " run --preset " + preset +
                              " --world-size 64 --gpus-per-host 1 --require tp=host 2>&1");
    EXPECT_EQ(broken.status, 1) << joined(broken);
    EXPECT_NE(joined(broken).find("FAILED placement: dim tp"), std::string::npos) << joined(broken);
  }
}

TEST(CliPreset, TorchtitanJobFileGivesTheSameViewsAsTheKeys) {
  const std::string toml = write_file("meshsim_train.toml", R"([job]
description = "llama3 8b"

[parallelism]
data_parallel_replicate_degree = 2
data_parallel_shard_degree = -1
tensor_parallel_degree = 2
context_parallel_degree = 2
pipeline_parallel_degree = 2
expert_parallel_degree = 4
pipeline_parallel_schedule = "1F1B"
spmd_backend = "partial_dtensor"
)");
  Result from_file = run("show --preset torchtitan:" + toml + " --world-size 64 --format json");
  Result from_keys = run("show --preset torchtitan:pp=2,dp_replicate=2,cp=2,tp=2,ep=4,spmd_backend=partial_dtensor "
                         "--world-size 64 --format json");
  ASSERT_EQ(from_file.status, 0) << joined(from_file);
  ASSERT_EQ(from_keys.status, 0) << joined(from_keys);
  const Json f = Json::parse(joined(from_file)), k = Json::parse(joined(from_keys));
  EXPECT_EQ(f["views"], k["views"]);
  EXPECT_EQ(f["views"][3]["mesh_dim_names"], Json({"pp", "dp_replicate", "fsdp", "tp"}));
  EXPECT_EQ(f["views"][3]["shape"], Json({2, 2, 8, 2}));  // dp_shard inferred as 4, fsdp = 4 * 2

  const std::map<std::string, std::pair<std::string, std::string>> bad{
      {"not_toml", {"[parallelism\ntensor_parallel_degree = ", "is not TOML"}},
      {"string_degree", {"[parallelism]\ntensor_parallel_degree = \"2\"\n", "tensor_parallel_degree"}},
      {"etp", {"[parallelism]\nexpert_tensor_parallel_degree = 2\n", "expert_tensor_parallel_degree"}},
      {"zero", {"[parallelism]\npipeline_parallel_degree = 0\n", "pp=0"}},
      {"huge", {"[parallelism]\ntensor_parallel_degree = 9223372036854775807\npipeline_parallel_degree = 2\n",
                "overflows"}},
  };
  for (const auto& [name, file] : bad) {
    const std::string path = write_file("meshsim_bad_" + name + ".toml", file.first);
    Result r = run_shell(std::string(MESHSIM_EXE) + " show --preset torchtitan:" + path + " --world-size 8 2>&1");
    EXPECT_EQ(r.status, 2) << name << "\n" << joined(r);
    EXPECT_NE(joined(r).find(file.second), std::string::npos) << name << "\n" << joined(r);
  }
  Result missing = run_shell(std::string(MESHSIM_EXE) + " show --preset torchtitan:/nonexistent/train.toml 2>&1");
  EXPECT_EQ(missing.status, 2);
  EXPECT_NE(joined(missing).find("cannot be read"), std::string::npos) << joined(missing);
}

TEST(CliPreset, HostileFlagsExitTwoNamingTheKey) {
  const std::vector<std::pair<std::string, std::string>> bad{
      {"--preset torchtitan:tp=0 --world-size 8", "tp=0"},
      {"--preset torchtitan:tp=-1 --world-size 8", "tp=-1"},
      {"--preset torchtitan:tp=3 --world-size 8", "WORLD_SIZE(8)"},
      {"--preset torchtitan:tp=9223372036854775807,pp=2,dp_shard=1", "overflows"},
      {"--preset torchtitan:tpp=2 --world-size 8", "unknown key 'tpp'"},
      {"--preset torchtitan:ep=3 --world-size 8", "ep=3 must divide"},
      {"--preset megatron:tp=3 --world-size 8", "world_size (8) is not divisible"},
      {"--preset megatron:tp=2,order=tp-dp-pp-tp --world-size 8", "names tp twice"},
      {"--preset megatron:tp=2,pp=2,ep=2,order=tp-pp-ep-dp --world-size 16", "data parallel size"},
      {"--preset megatron:tp=2 --world-size 8 --mesh dp=8", "is the whole recipe"},
      {"--preset megatron:tp=2 --world-size -4", "--world-size -4"},
      {"--preset megatron:tp=2,dp=3 --world-size 8", "dp=3"},
  };
  for (const auto& [flags, needle] : bad) {
    for (const std::string cmd : {"show", "run"}) {
      Result r = run_shell(std::string(MESHSIM_EXE) + " " + cmd + " " + flags + " 2>&1");
      EXPECT_EQ(r.status, 2) << cmd << " " << flags << "\n" << joined(r);
      EXPECT_NE(joined(r).find(needle), std::string::npos) << cmd << " " << flags << "\n" << joined(r);
    }
  }
}

}  // namespace

// Bad input in the newest surfaces: refused with exit 2 naming the file or value and the rule,
// never a crash, a prefix taken for the whole, or a default taken for a misspelled key.
namespace {

// shell_with_errors runs the tool with `args`, stderr kept: its exit status (-1 for a signal)
// and its text.
Result shell_with_errors(const std::string& args) { return run_shell(std::string(MESHSIM_EXE) + " " + args + " 2>&1"); }

void expect_refused(const Result& r, const std::string& needle, const std::string& what) {
  EXPECT_EQ(r.status, 2) << what << "\n" << joined(r);
  EXPECT_NE(joined(r).find(needle), std::string::npos) << what << "\n" << joined(r);
}

TEST(CliHostile, AJobFileKeyOfManyPartsIsRefusedBeforeTheTomlParser) {
  std::string dotted = "a";
  for (int i = 0; i < 40000; ++i) dotted += ".a";
  const std::string key = write_file("meshsim_dotted_key.toml",
                                     dotted + " = 1\n[parallelism]\ndata_parallel_shard_degree = 4\n");
  expect_refused(shell_with_errors("show --preset torchtitan:" + key), "line 1 has over 64 dotted parts", "key");
  const std::string header = write_file("meshsim_dotted_header.toml", "[parallelism]\ndata_parallel_shard_degree = 4\n[" +
                                                                          dotted + "]\nx = 1\n");
  expect_refused(shell_with_errors("show --preset torchtitan:" + header), "line 3 has over 64 dotted parts", "header");
  // Over the job file's 1 MiB: refused by size, not parsed.
  const std::string big = write_file("meshsim_big_job.toml", "[job]\n" + std::string(1 << 21, '#') + "\n");
  expect_refused(shell_with_errors("show --preset torchtitan:" + big), "is over 1048576 bytes", "big");
  // Dots that are not a key's: floats in arrays, strings, comments, inline tables' short keys.
  std::string floats = "[";
  for (int i = 0; i < 200; ++i) floats += std::to_string(i) + ".5, ";
  const std::string fine = write_file("meshsim_fine_job.toml",
                                      "[job]\ndescription = \"" + std::string(300, '.') + "\" # " + std::string(300, '.') +
                                          "\nx = " + floats + "1.0]\ny = [\n  1.5,\n  {a.b.c = 2.5, d = 1},\n]\n"
                                          "z = '''\n" + std::string(300, '.') + "\n'''\n[parallelism]\ntensor_parallel_degree = 2\n");
  Result ok = shell_with_errors("show --preset torchtitan:" + fine + " --world-size 8 --format json");
  EXPECT_EQ(ok.status, 0) << joined(ok);
}

TEST(CliHostile, AFileThatCannotBeReadIsRefusedAsSuchNeverTakenForAnEmptyOrShortFile) {
  const std::string dir = ::testing::TempDir();
  expect_refused(shell_with_errors("run --preset torchtitan:" + dir + " --world-size 8"), "is a directory", "titan dir");
  expect_refused(shell_with_errors("run --recipe " + dir), "cannot be read: it is a directory", "recipe dir");
  // A read that fails part-way (here at once: /proc/self/mem at offset 0) is an error, not EOF.
  expect_refused(shell_with_errors("run --preset torchtitan:/proc/self/mem --world-size 8"), "cannot be read: ",
                 "read error");
  expect_refused(shell_with_errors("run --recipe /proc/self/mem"), "cannot be read: ", "recipe read error");
  // An endless file is cut at the limit.
  expect_refused(shell_with_errors("run --recipe /dev/zero"), "is over 16777216 bytes", "endless");
}

TEST(CliHostile, AMisspelledTableOrKeyOfTheJobFileIsRefusedNamingTheNearest) {
  const std::map<std::string, std::pair<std::string, std::string>> bad{
      {"key", {"[parallelism]\ntensor_paralel_degree = 2\n",
               "unknown key parallelism.'tensor_paralel_degree': torchtitan's config has no such key (did you mean "
               "'tensor_parallel_degree'?)"}},
      {"table", {"[Parallelism]\ntensor_parallel_degree = 2\n",
                 "unknown table 'Parallelism': torchtitan's job config has no such section (did you mean 'parallelism'?)"}},
      {"far", {"[parallelism]\nzzz = 2\n", "unknown key parallelism.'zzz'"}},
  };
  for (const auto& [name, file] : bad) {
    const std::string path = write_file("meshsim_misspelled_" + name + ".toml", file.first);
    Result r = shell_with_errors("run --preset torchtitan:" + path + " --world-size 8");
    expect_refused(r, file.second, name);
    EXPECT_EQ(joined(r).find("OK"), std::string::npos) << joined(r);
  }
  // Every key torchtitan's [parallelism] declares is accepted; a job that extends torchtitan's
  // config with its own module may add tables.
  const std::string known = write_file("meshsim_known_keys.toml", R"([parallelism]
tensor_parallel_degree = 2
enable_async_tensor_parallel = true
pipeline_parallel_schedule = "1F1B"
fsdp_reshard_after_forward = "default"
context_parallel_rotate_method = "allgather"
[experimental]
custom_args_module = "my.module"
[my_extension]
x = 1
)");
  Result ok = shell_with_errors("run --preset torchtitan:" + known + " --world-size 8");
  EXPECT_EQ(ok.status, 0) << joined(ok);
  const std::string plain = write_file("meshsim_extra_table.toml", "[my_extension]\nx = 1\n");
  expect_refused(shell_with_errors("run --preset torchtitan:" + plain + " --world-size 8"), "unknown table 'my_extension'",
                 "extra table without a module");
}

TEST(CliHostile, ALetNameBindsOneViewAndIsNotEmpty) {
  const std::string twice = write_file("meshsim_let_twice.json", R"J({"world_size": 8,
  "build": {"init_device_mesh": {"mesh_shape": [8], "mesh_dim_names": ["world"]}},
  "ops": [{"on": "root", "unflatten": {"dim": "world", "sizes": [2, 4], "names": ["dp", "tp"]}, "let": "v"},
          {"on": "root", "unflatten": {"dim": "world", "sizes": [4, 2], "names": ["dp", "tp"]}, "let": "v"}]})J");
  for (const char* cmd : {"show", "run"}) {
    expect_refused(shell_with_errors(std::string(cmd) + " --recipe " + twice), "'let' binds 'v' a second time", cmd);
  }
  const std::string empty = write_file("meshsim_let_empty.json", R"J({"world_size": 8,
  "build": {"init_device_mesh": {"mesh_shape": [8], "mesh_dim_names": ["world"]}},
  "ops": [{"on": "root", "unflatten": {"dim": "world", "sizes": [2, 4], "names": ["dp", "tp"]}, "let": ""}]})J");
  expect_refused(shell_with_errors("show --recipe " + empty), "'let' names no view", "empty");
  Json req = Json::parse(R"J({"op": "mesh.program", "world_size": 8,
  "build": {"init_device_mesh": {"mesh_shape": [8], "mesh_dim_names": ["world"]}},
  "ops": [{"on": "root", "unflatten": {"dim": "world", "sizes": [2, 4], "names": ["dp", "tp"]}, "let": "v"},
          {"on": "v", "slice": ["tp"], "let": "v"}]})J");
  Result q = run_shell("echo '" + req.dump() + "' | " + std::string(MESHSIM_EXE) + " query");
  ASSERT_EQ(q.status, 0);
  const Json a = Json::parse(joined(q));
  EXPECT_FALSE(a["ok"].get<bool>()) << a;
  EXPECT_NE(a.dump().find("a second time"), std::string::npos) << a;
}

TEST(CliHostile, ARefusedShowLeavesTheSvgFileAsItWas) {
  const std::string svg = write_file("meshsim_kept.svg", "the old picture\n");
  auto kept = [&] {
    std::ifstream in(svg);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  expect_refused(shell_with_errors("show --mesh dp=2,tp=4 --gpus-per-host 4 --require nosuch=host --svg " + svg),
                 "'nosuch'", "require");
  EXPECT_EQ(kept(), "the old picture\n");
  Result big = shell_with_errors("show --mesh dp=8192,tp=4096 --svg " + svg);
  EXPECT_EQ(big.status, 2) << joined(big);
  EXPECT_NE(joined(big).find("over the limit"), std::string::npos) << joined(big);
  EXPECT_EQ(kept(), "the old picture\n");
  // An accepted one replaces it whole, and leaves no temporary file beside it.
  Result ok = shell_with_errors("show --mesh dp=2,tp=4 --svg " + svg);
  ASSERT_EQ(ok.status, 0) << joined(ok);
  EXPECT_EQ(kept().rfind("<?xml", 0), 0u) << kept().substr(0, 100);
  for (const auto& e : std::filesystem::directory_iterator(::testing::TempDir())) {
    EXPECT_EQ(e.path().filename().string().find("meshsim_kept.svg.meshsim-"), std::string::npos) << e.path();
  }
}

TEST(CliHostile, EveryAnswerIsChargedToTheBudgetWithSizesNear2To63NamedAsTheyAre) {
  // my_groups on a 2^48-rank mesh: refused by the budget in an instant, not 400 MB of answer.
  const Json groups = Json::parse(R"J({"op": "mesh.program", "world_size": 281474976710656, "rank": 0,
    "build": {"init_device_mesh": {"mesh_shape": [16777216, 16777216], "mesh_dim_names": ["a", "b"]}},
    "want": ["my_groups"]})J");
  const Json handle = Json::parse(R"J({"op": "mesh.program", "world_size": 9223372036854775807,
    "build": {"init_device_mesh": {"mesh_shape": [9223372036854775807], "mesh_dim_names": ["a"]}},
    "want": ["get_group"]})J");
  for (const Json& req : {groups, handle}) {
    Result q = run_shell("echo '" + req.dump() + "' | " + std::string(MESHSIM_EXE) + " query");
    ASSERT_EQ(q.status, 0);
    ASSERT_EQ(q.lines.size(), 1u) << joined(q).substr(0, 300);
    const Json a = Json::parse(q.lines[0]);
    EXPECT_EQ(a["error"]["type"], "ResourceExhausted") << a;
    const std::string m = a["error"]["message"];
    EXPECT_EQ(m.find(" x -"), std::string::npos) << m;  // never a wrapped, negative size
    EXPECT_NE(m.find(req["want"][0] == "my_groups" ? "1 x 16777216" : "1 x 9223372036854775807"), std::string::npos) << m;
  }
  // Within the budget my_groups answers the rank's groups.
  const Json small = Json::parse(R"J({"op": "mesh.program", "world_size": 8, "rank": 5,
    "build": {"init_device_mesh": {"mesh_shape": [2, 4], "mesh_dim_names": ["dp", "tp"]}}, "want": ["my_groups"]})J");
  Result q = run_shell("echo '" + small.dump() + "' | " + std::string(MESHSIM_EXE) + " query");
  EXPECT_EQ(Json::parse(joined(q))["result"]["my_groups"], Json::parse(R"({"dp": [1, 5], "tp": [4, 5, 6, 7]})"));
}

TEST(CliHostile, RunsJsonReportIsBoundedByTheQuerysBudgetBeforeAnyRankStarts) {
  // 2^24 local ranks: the report would list every group of both dims, in the root mesh and in
  // its view "root"; refused at once naming its size (2 x 2 dims x (2^24 ranks + 4096 groups)).
  Result big = shell_with_errors("run --backend local --format json --mesh dp=4096,tp=4096");
  expect_refused(big, "would hold 67125248 elements", "json budget");
  EXPECT_NE(joined(big).find("budget of 2097152"), std::string::npos) << joined(big);
  // Within a raised budget the same policy lets it through, and every group is listed.
  // 2 x ((32 ranks + 8 dp groups) + (32 ranks + 4 tp groups)) = 152 elements.
  Result ok = run("run --format json --mesh dp=4,tp=8 --max-elements 152");
  ASSERT_EQ(ok.status, 0) << joined(ok);
  const Json j = Json::parse(joined(ok));
  EXPECT_EQ(j["meshes"][0]["groups_by_dim"]["tp"], Json(groups_of({4, 8}, 1)));
  EXPECT_EQ(j["meshes"][0]["groups_by_dim"]["dp"].size(), 8u);
  expect_refused(shell_with_errors("run --format json --mesh dp=4,tp=8 --max-elements 151"), "would hold 152 elements",
                 "one under");
  expect_refused(shell_with_errors("run --format json --mesh dp=4,tp=8 --max-elements 0"), "--max-elements 0", "zero");
}

TEST(CliHostile, RunsTextReportKeepsWhatItPrintsTheFirstGroupsAsGathered) {
  // 16 tp groups: the report prints the first 8, as every backend gathered them, then "...".
  for (const char* backend : {"threaded", "local", "fiber"}) {
    Result r = run(std::string("run --backend ") + backend + " --mesh dp=16,tp=64");
    ASSERT_EQ(r.status, 0) << backend << "\n" << joined(r);
    const std::string want = "    tp: 16 groups of 64";
    const std::string text = joined(r);
    const auto at = text.find(want);
    ASSERT_NE(at, std::string::npos) << backend << "\n" << text;
    const std::string line = text.substr(at, text.find('\n', at) - at);
    EXPECT_NE(line.find("[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, ... (64 ranks)] [64, 65,"),
              std::string::npos) << backend << ": " << line;
    EXPECT_NE(line.find("[448, 449,"), std::string::npos) << backend << ": " << line;  // the 8th group
    EXPECT_EQ(line.find("[512,"), std::string::npos) << backend << ": " << line;       // not the 9th
    EXPECT_EQ(line.substr(line.size() - 4), " ...") << backend << ": " << line;
  }
}

TEST(CliHostile, AReportListsTheFirstRanksOfOneDiagnosisAndCountsTheRest) {
  // 100 ranks build another mesh: 64 FAILED lines, then one line counting the other 36 (the
  // report does not grow with the ranks at fault); in JSON 64 failures and their count.
  std::string faults;
  for (int r = 0; r < 100; ++r) faults += " --fault mesh@" + std::to_string(r);
  for (const char* backend : {"local", "threaded"}) {
    Result r = run(std::string("run --backend ") + backend + " --mesh dp=128" + faults);
    EXPECT_EQ(r.status, 1) << backend;
    const std::string text = joined(r);
    EXPECT_EQ(std::count_if(r.lines.begin(), r.lines.end(), [](const std::string& l) { return l.rfind("FAILED", 0) == 0; }),
              65) << backend << "\n" << text;
    EXPECT_NE(text.find("FAILED rank 63 [mesh]"), std::string::npos) << backend;
    EXPECT_NE(text.find("FAILED ranks [64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, ... (36 ranks)] "
                        "[mesh]: the same diagnosis as the 64 lines above it"),
              std::string::npos) << backend << "\n" << text;
  }
  Result j = run("run --backend local --format json --mesh dp=128" + faults);
  const Json report = Json::parse(joined(j));
  EXPECT_EQ(report["failures"].size(), 64u);
  EXPECT_EQ(report["failures_count"], 100);
}

TEST(CliHostile, ARecipeBeyondWhatTheProcessMayUseIsRefusedBeforeAnyRankStarts) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's shadow memory does not start under the address-space limit this test sets";
#else
  // 1,024 ranks each building 1,025 meshes, under a 1.5 GB address-space limit: refused up front
  // naming the footprint and the limit, never a bad_alloc, a thread that cannot start or an abort.
  Json ops = Json::array();
  for (int k = 0; k < 1024; ++k) {
    const int a = 1 << (k % 10 + 1);
    ops.push_back({{"on", "root"}, {"unflatten", {{"dim", "w"}, {"sizes", {a, 1024 / a}}, {"names", {"a", "b"}}}},
                   {"let", "v" + std::to_string(k)}});
  }
  const Json program{{"world_size", 1024},
                     {"build", {{"init_device_mesh", {{"mesh_shape", {1024}}, {"mesh_dim_names", {"w"}}}}}},
                     {"ops", ops}};
  const std::string path = write_file("meshsim_1024_views.json", program.dump());
  Result r = run_shell("sh -c 'ulimit -v 1500000; exec " + std::string(MESHSIM_EXE) + " run --recipe " + path + "' 2>&1");
  expect_refused(r, "the job's ranks would hold about", "footprint");
  EXPECT_NE(joined(r).find("(1024 ranks x 1025 meshes x "), std::string::npos) << joined(r);
  EXPECT_NE(joined(r).find("(RLIMIT_AS)"), std::string::npos) << joined(r);
#endif
}

TEST(CliHostile, MoreRankThreadsThanTheAddressSpaceHoldsAreRefusedUpFrontNamingTheLimit) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's shadow memory does not start under the address-space limit this test sets";
#else
  // 4,096 rank threads of 8 MiB stacks need 32 GiB of address space: under a 4 GiB limit the
  // run is refused before any thread starts, naming the limit (it failed half-way: "could not
  // start the thread of rank 1785: Resource temporarily unavailable"). With the default 512 KiB
  // stacks the same world runs.
  const std::string limit = "sh -c 'ulimit -v 4000000; exec " + std::string(MESHSIM_EXE);
  Result r = run_shell(limit + " run --mesh dp=64,tp=64 --rank-stack-kib 8192' 2>&1");
  expect_refused(r, "4096 rank threads are more than this process may start", "rank threads");
  EXPECT_NE(joined(r).find("by RLIMIT_AS"), std::string::npos) << joined(r);
  EXPECT_NE(joined(r).find("or the fiber backend"), std::string::npos) << joined(r);
  Result ok = run_shell(limit + " run --mesh dp=64,tp=64' 2>&1");
  EXPECT_EQ(ok.status, 0) << joined(ok);
#endif
}

TEST(CliHostile, FibersPastTheAddressSpaceAreRefusedAndTheDefaultStackFitsA16GBLimit) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's shadow memory does not start under the address-space limit this test sets";
#else
  // 65,536 fibers: their stacks are reserved where the backend is made, so a world the address
  // space cannot hold is a clean refusal (it was an uncaught ResourceExhausted, SIGABRT), naming
  // how many it could hold and the flag; the default stack shrinks to fit a 16 GB limit.
  const auto under = [](const std::string& kib, const std::string& args) {
    return run_shell("sh -c 'ulimit -v " + kib + "; exec " + std::string(MESHSIM_EXE) + " run --backend fiber " + args +
                     "' 2>&1");
  };
  Result small = under("4000000", "--mesh dp=1024,tp=64");
  expect_refused(small, "fiber backend: cannot reserve 65536 rank stacks of ", "--rank-stack-kib");
  EXPECT_NE(joined(small).find("holds about "), std::string::npos) << joined(small);
  Result big = under("16000000", "--mesh dp=1024,tp=64 --rank-stack-kib 1024");
  expect_refused(big, "fiber backend: cannot reserve 65536 rank stacks of 1052672 bytes", "--rank-stack-kib");
  Result ok = under("16000000", "--mesh dp=1024,tp=64 --timeout 60");
  EXPECT_EQ(ok.status, 0) << joined(ok);
  EXPECT_NE(joined(ok).find("OK: every rank's groups match the mesh on every dim"), std::string::npos) << joined(ok);
#endif
}

TEST(CliHostile, ABackendWhosePreconditionFailsIsRefusedBeforeAnyRankStarts) {
  // The registry's precondition for NCCL (a GPU per rank): 64 ranks on this machine are refused,
  // exit 2, naming the backend and why (no NCCL in this build, or fewer GPUs than ranks).
  Result r = run_shell(std::string(MESHSIM_EXE) + " run --mesh dp=64 --backend nccl 2>&1");
  expect_refused(r, "meshsim run: FailedPrecondition: --backend nccl: ", "nccl");
  const std::string text = joined(r);
  EXPECT_TRUE(text.find("this build has no NCCL") != std::string::npos || text.find("sees") != std::string::npos) << text;
}

TEST(CliHostile, ARankStackOutsideItsRangeIsRefused) {
  for (const std::string& kib : {"0x10", "63", "1048577", "-1", "9223372036854775807"}) {
    Result r = run_shell(std::string(MESHSIM_EXE) + " run --mesh dp=2 --rank-stack-kib " + kib + " 2>&1");
    EXPECT_EQ(r.status, 2) << kib << "\n" << joined(r);
  }
  Result r = run_shell(std::string(MESHSIM_EXE) + " run --mesh dp=2 --rank-stack-kib 63 2>&1");
  EXPECT_NE(joined(r).find("--rank-stack-kib 63 is out of range [64, 1048576]"), std::string::npos) << joined(r);
  Result ok = run("run --mesh dp=2,tp=2 --backend fiber --rank-stack-kib 64");
  EXPECT_EQ(ok.status, 0) << joined(ok);
}

TEST(CliScale, SixteenThousandFibersRunInSeconds) {
  // Each arrival, suspension and wake-up is O(1): 16,384 rank fibers of a dp x cp x tp mesh pass
  // in seconds (2,048 under a sanitizer, whose instrumented fibers are several times slower).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  const std::string mesh = "dp=2,cp=16,tp=64";
  const std::string world = "2048";
#else
  const std::string mesh = "dp=16,cp=16,tp=64";
  const std::string world = "16384";
#endif
  Result r = run("run --backend fiber --timeout 60 --mesh " + mesh);
  ASSERT_EQ(r.status, 0) << joined(r);
  EXPECT_NE(joined(r).find("meshsim run: " + world + " ranks over the fiber backend"), std::string::npos) << joined(r);
  EXPECT_NE(joined(r).find("OK: every rank's groups match the mesh on every dim"), std::string::npos) << joined(r);
}

}  // namespace
