// Gloo's own paths: ranks of several "processes" (one run_spmd per rank, each with its own
// device) meeting through a TCP store, a rank that exits abruptly, argument checks, and the
// store form of a diagnosis.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "meshsim/error.hpp"
#include "meshsim/gloo_backend.hpp"
#include "meshsim/spmd.hpp"

namespace meshsim {
namespace {

using namespace std::chrono_literals;

// run_as_processes runs `fn` as `world` single-rank runs (one per thread, as separate processes
// would), meeting through one TCP store; returns each rank's report.
std::vector<RunReport> run_as_processes(int64_t world, std::chrono::milliseconds timeout,
                                        const std::function<void(RankContext&)>& fn) {
  TcpStoreServer server({});
  std::vector<std::future<RunReport>> futures;
  for (int64_t r = 0; r < world; ++r) {
    futures.push_back(std::async(std::launch::async, [&, r] {
      SpmdOptions o;
      o.backend = "gloo";
      o.world_size = world;
      o.placement.first_rank = r;
      o.placement.local_ranks = 1;
      o.timeout = timeout;
      o.placement.store = std::make_shared<TcpStoreClient>(TcpStoreOptions{.port = server.port()});
      return run_spmd(o, fn);
    }));
  }
  std::vector<RunReport> out;
  for (auto& f : futures) out.push_back(f.get());
  return out;
}

bool names(const RunReport& rep, int64_t rank, const std::string& kind) {
  for (const Diagnosis& d : rep.failures) {
    if (d.ranks == std::vector<int64_t>{rank} && to_string(d.kind) == kind) return true;
  }
  return false;
}

TEST(GlooProcesses, CollectivesAcrossSeparateBackends) {
  auto reps = run_as_processes(4, 10s, [](RankContext& ctx) {
    DeviceMesh mesh = DeviceMesh::init({2, 2}, std::vector<std::string>{"dp", "tp"});
    for (int d = 0; d < 2; ++d) {
      Communicator& c = ctx.comm(mesh, d);
      std::vector<int64_t> got(2);
      const int64_t me = ctx.rank();
      c.all_gather(std::span<const int64_t>(&me, 1), std::span<int64_t>(got));
      if (got != *mesh.group_of(me, d)) ctx.fail("dim " + std::to_string(d) + " gathered the wrong group");
    }
    std::vector<double> v{1.0, static_cast<double>(ctx.rank())};
    ctx.world().all_reduce(std::span<double>(v), ReduceOp::kSum);
    if (v[0] != 4.0 || v[1] != 6.0) ctx.fail("world all_reduce");
  });
  for (const auto& rep : reps) EXPECT_TRUE(rep.ok) << rep.summary();
}

TEST(GlooProcesses, AThrowingProcessIsNamedByEveryOther) {
  const auto start = std::chrono::steady_clock::now();
  auto reps = run_as_processes(4, 20s, [](RankContext& ctx) {
    ctx.world().barrier();
    if (ctx.rank() == 2) throw InvalidArgument("planted");
    ctx.world().barrier();
  });
  for (const auto& rep : reps) {
    EXPECT_FALSE(rep.ok);
    EXPECT_TRUE(names(rep, 2, "error")) << rep.summary();
  }
  // Far sooner than the 20 s deadline: the failed rank's connections close and the peers read
  // the diagnosis from the store.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
}

TEST(GlooProcesses, AStallIsNamedFromTheStoreAtTheDeadline) {
  auto reps = run_as_processes(3, 800ms, [](RankContext& ctx) {
    if (ctx.rank() == 1) ctx.sleep_for(4s);
    ctx.world().barrier();
  });
  for (std::size_t r = 0; r < reps.size(); ++r) {
    EXPECT_FALSE(reps[r].ok);
    if (r != 1) EXPECT_TRUE(names(reps[r], 1, "stall")) << reps[r].summary();
  }
}

TEST(GlooProcesses, ARankThatReturnedEarlyIsNamedAtTheDeadlineWithoutSettling) {
  const auto start = std::chrono::steady_clock::now();
  auto reps = run_as_processes(3, 3s, [](RankContext& ctx) {
    ctx.world().barrier();
    if (ctx.rank() == 1) return;  // skips the second barrier
    ctx.world().barrier();
  });
  for (std::size_t r : {0, 2}) {  // rank 1's own program ended without an error
    EXPECT_FALSE(reps[r].ok);
    EXPECT_TRUE(names(reps[r], 1, "departed")) << reps[r].summary();
  }
  // The peers learn of the departure at their 3 s deadline; the census then has every member
  // (waiting, or departed) and ends at once, instead of settling 3 s more for a rank that can
  // never arrive.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
}

TEST(GlooProcesses, AMismatchNamesTheOddRank) {
  auto reps = run_as_processes(3, 10s, [](RankContext& ctx) {
    std::vector<int64_t> v(ctx.rank() == 0 ? 3 : 2, 1);
    ctx.world().all_reduce(std::span<int64_t>(v), ReduceOp::kSum);
  });
  for (const auto& rep : reps) EXPECT_TRUE(names(rep, 0, "mismatch")) << rep.summary();
}

TEST(GlooThreads, ARankThatExitsAbruptlyIsNamed) {
  for (int64_t bad : {0, 3}) {
    SpmdOptions o;
    o.backend = "gloo";
    o.world_size = 4;
    o.timeout = 20s;
    RunReport rep = run_spmd(o, [bad](RankContext& ctx) {
      ctx.world().barrier();
      if (ctx.rank() == bad) ctx.exit_abruptly();
      std::vector<float> v(1 << 16, 1.0f);
      ctx.world().all_reduce(std::span<float>(v), ReduceOp::kSum);
    });
    EXPECT_FALSE(rep.ok);
    EXPECT_TRUE(names(rep, bad, "exit")) << rep.summary();
    EXPECT_LT(rep.seconds, 10.0) << "the exit was found only at the deadline";
  }
}

TEST(GlooThreads, ExitAfterTheLastCollectiveIsStillReported) {
  SpmdOptions o;
  o.backend = "gloo";
  o.world_size = 2;
  o.timeout = 5s;
  RunReport rep = run_spmd(o, [](RankContext& ctx) {
    ctx.world().barrier();
    if (ctx.rank() == 1) ctx.exit_abruptly();
  });
  EXPECT_FALSE(rep.ok);
  EXPECT_TRUE(names(rep, 1, "exit")) << rep.summary();
}

TEST(GlooBackend, RejectsBadGroupsAndArguments) {
  GlooBackend b({.world_size = 4});
  EXPECT_THROW(b.new_group(0, std::vector<int64_t>{1, 2}, {}), InvalidArgument);
  EXPECT_THROW(b.new_group(1, std::vector<int64_t>{1, 1}, {}), InvalidArgument);
  EXPECT_THROW(b.new_group(1, std::vector<int64_t>{1, 9}, {}), OutOfRange);
  EXPECT_THROW(b.new_group(9, std::vector<int64_t>{9}, {}), OutOfRange);
  EXPECT_THROW(b.new_group(0, std::vector<int64_t>{0}, BackendConfig{.backend = "nccl"}), InvalidArgument);
  EXPECT_THROW(b.new_group(0, std::vector<int64_t>{0}, BackendConfig{.options = GlooOptions{.devices = {"eth0"}}}),
               InvalidArgument);
  EXPECT_THROW(GlooBackend({.world_size = 0}), InvalidArgument);
  EXPECT_THROW(GlooBackend({.world_size = 65}), InvalidArgument);  // over kMaxThreadRanks threads
  EXPECT_THROW(GlooBackend({.world_size = 4, .placement = {.first_rank = 3, .local_ranks = 2}}), OutOfRange);
  EXPECT_THROW(GlooBackend({.world_size = 4, .placement = {.first_rank = 1, .local_ranks = 1}}), InvalidArgument);  // no store
  EXPECT_THROW(GlooBackend({.world_size = 2, .hostname = "", .iface = "no-such-interface0"}), InvalidArgument);
  auto solo = b.new_group(0, std::vector<int64_t>{0}, {});
  int64_t x = 1;
  EXPECT_THROW(solo->all_reduce(&x, -1, DType::kInt64, ReduceOp::kSum), InvalidArgument);
  EXPECT_THROW(solo->broadcast(&x, 1, DType::kInt64, 1), OutOfRange);
  EXPECT_THROW(solo->send(&x, 1, DType::kInt64, 0), OutOfRange);
  solo->all_reduce(&x, 1, DType::kInt64, ReduceOp::kSum);
  EXPECT_EQ(x, 1);
}

TEST(GlooBackend, DiagnosisRoundTripsThroughTheStoreForm) {
  Diagnosis d{DiagnosisKind::kMismatch, {4, 17}, "rank 4 called x\nand more", {}, {}};
  auto back = decode_diagnosis(encode_diagnosis(d));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->kind, d.kind);
  EXPECT_EQ(back->ranks, d.ranks);
  EXPECT_EQ(back->message, d.message);
  EXPECT_FALSE(decode_diagnosis("no newline"));
  EXPECT_FALSE(decode_diagnosis("kind\nx,y\nmsg"));
}

}  // namespace
}  // namespace meshsim
