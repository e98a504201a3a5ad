// MESHSIM_SPMD_TEST and run_on_every_rank: the body runs on every rank once per backend, as
// separate test instances; a failing rank's assertion is reported with the rank; a fatal one stops
// every rank fast; exceptions, stalls and skips are reported as the user expects.
#include "meshsim/testing/spmd_test.hpp"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <numeric>

#include "meshsim/error.hpp"

namespace meshsim {
namespace {

using namespace std::chrono_literals;
using Names = std::vector<std::string>;

// On every rank and every dim, the communicator's group is the group the mesh computes, and
// all_gather of the global ranks over it returns that group in order.
void check_every_dim(RankContext& ctx, const DeviceMesh& mesh) {
  ctx.check_mesh_agreement(mesh);
  for (int d = 0; d < mesh.ndim(); ++d) {
    Communicator& c = ctx.comm(mesh, d);
    const std::optional<std::vector<int64_t>> group = mesh.group_of(ctx.rank(), d);
    ASSERT_TRUE(group.has_value()) << "rank " << ctx.rank() << " is not in " << mesh.to_string();
    const std::vector<int64_t>& want = *group;
    ASSERT_EQ(c.global_ranks(), want) << "dim " << d;
    const int64_t me = ctx.rank();
    std::vector<int64_t> got(static_cast<std::size_t>(c.size()));
    c.all_gather(std::span<const int64_t>(&me, 1), std::span<int64_t>(got));
    EXPECT_EQ(got, want) << "dim " << d;
  }
}

MESHSIM_SPMD_TEST(SpmdMacro, GroupsOfA3dMeshMatchAllGather, 8) {
  check_every_dim(ctx, DeviceMesh::init(std::vector<int64_t>{2, 2, 2}, Names{"dp", "cp", "tp"}));
}

MESHSIM_SPMD_TEST(SpmdMacro, PermutedRankMapSlicedAndFlattened, 12) {
  std::vector<int64_t> ranks(12);
  std::iota(ranks.begin(), ranks.end(), int64_t{0});
  std::reverse(ranks.begin(), ranks.end());
  std::rotate(ranks.begin(), ranks.begin() + 5, ranks.end());
  const DeviceMesh mesh = DeviceMesh::from_ranks(std::vector<int64_t>{3, 2, 2}, ranks, Names{"dp", "cp", "tp"});
  check_every_dim(ctx, mesh);
  check_every_dim(ctx, mesh.slice({"dp", "tp"}));
  check_every_dim(ctx, mesh.slice({"cp", "tp"}).flatten());
}

// PyTorch's backend_override options object: the timeout and every key, unknown ones
// included, travel into group creation on every backend and come back from the group.
MESHSIM_SPMD_TEST(SpmdMacro, BackendOptionsTravelWithTheGroup, 4) {
  BackendConfig with_options;
  with_options.timeout = std::chrono::milliseconds(20000);
  with_options.extras = {{"fake_option", int64_t{42}}, {"label", std::string("dp")}, {"ratio", 0.5}, {"on", true}};
  const DeviceMesh mesh = DeviceMesh::init(std::vector<int64_t>{2, 2}, Names{"dp", "tp"},
                                           {.backend_override = {with_options, BackendConfig{}}});
  Communicator& dp = ctx.comm(mesh, 0);
  EXPECT_EQ(dp.config(), with_options);
  EXPECT_EQ(std::get<int64_t>(dp.config().extras.at("fake_option")), 42);
  EXPECT_EQ(ctx.comm(mesh, 1).config(), BackendConfig{});
  EXPECT_EQ(mesh.get_group(ctx.rank(), "dp").config, with_options);
  int64_t one = 1;
  dp.all_reduce(std::span<int64_t>(&one, 1), ReduceOp::kSum);
  EXPECT_EQ(one, 2);
}

MESHSIM_SPMD_TEST(SpmdMacro, UnflattenedWorldOfFive, 5) {
  check_every_dim(ctx, DeviceMesh::init(std::vector<int64_t>{5}, Names{"world"}));
  // A world of 5 with a mesh of 4: rank 4 is outside and holds no group.
  if (ctx.rank() < 4) {
    const DeviceMesh m = DeviceMesh::init(std::vector<int64_t>{4}, Names{"w"}, {.world_size = 5})
                             .unflatten(0, std::vector<int64_t>{2, 2}, Names{"dp", "tp"});
    for (int d = 0; d < 2; ++d) EXPECT_EQ(ctx.comm(m, d).size(), 2);
  }
}

MESHSIM_SPMD_TEST(SpmdMacro, OneRank, 1) {
  int64_t v = 41;
  ctx.world().all_reduce(std::span<int64_t>(&v, 1), ReduceOp::kSum);
  EXPECT_EQ(v, 41);
  EXPECT_EQ(ctx.world_size(), 1);
}

// Runs `fn` through run_on_every_rank and keeps what it reported instead of failing this test.
struct Intercepted {
  ::testing::TestPartResultArray results;
  RunReport report;
  std::vector<std::string> messages(::testing::TestPartResult::Type type) const {
    std::vector<std::string> out;
    for (int i = 0; i < results.size(); ++i) {
      if (results.GetTestPartResult(i).type() == type) out.push_back(results.GetTestPartResult(i).message());
    }
    return out;
  }
};

std::unique_ptr<Intercepted> intercept(int64_t world, const std::function<void(RankContext&)>& fn,
                                       std::chrono::milliseconds timeout = 5000ms,
                                       const std::string& backend = "threaded") {
  auto out = std::make_unique<Intercepted>();
  ::testing::ScopedFakeTestPartResultReporter r(
      ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &out->results);
  out->report = testing::run_on_every_rank(world, backend, fn, timeout);
  return out;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(SpmdMacroReports, RegistersOneInstancePerBackend) {
  const ::testing::UnitTest& ut = *::testing::UnitTest::GetInstance();
  std::vector<std::string> names;
  for (int i = 0; i < ut.total_test_suite_count(); ++i) {
    const ::testing::TestSuite& s = *ut.GetTestSuite(i);
    if (std::string(s.name()) != "SpmdMacro") continue;
    for (int j = 0; j < s.total_test_count(); ++j) names.push_back(s.GetTestInfo(j)->name());
  }
  std::vector<std::string> backends{"threaded", "gloo", "fiber"};
#ifdef MESHSIM_WITH_NCCL
  backends.push_back("nccl");
#endif
  EXPECT_EQ(testing::spmd_backends(), backends);
  std::vector<std::string> want;
  for (const char* t : {"BackendOptionsTravelWithTheGroup", "GroupsOfA3dMeshMatchAllGather", "OneRank", "PermutedRankMapSlicedAndFlattened",
                        "UnflattenedWorldOfFive"}) {
    for (const std::string& b : backends) want.push_back(std::string(t) + "/" + b);
  }
  std::sort(names.begin(), names.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(names, want);
}

TEST(SpmdMacroReports, NonFatalFailureNamesEachFailingRank) {
  auto got = intercept(6, [](RankContext& ctx) {
    int64_t v = ctx.rank();
    ctx.world().all_reduce(std::span<int64_t>(&v, 1), ReduceOp::kSum);
    EXPECT_EQ(v, 15);
    EXPECT_NE(ctx.rank() % 3, 1) << "planted";
  });
  EXPECT_TRUE(got->report.ok) << got->report.summary();
  auto failed = got->messages(::testing::TestPartResult::kNonFatalFailure);
  std::sort(failed.begin(), failed.end());
  ASSERT_EQ(failed.size(), 2u);
  EXPECT_TRUE(contains(failed[0], "[rank 1] ") && contains(failed[0], "planted")) << failed[0];
  EXPECT_TRUE(contains(failed[1], "[rank 4] ") && contains(failed[1], "planted")) << failed[1];
}

TEST(SpmdMacroReports, FatalFailureStopsEveryRankFast) {
  const auto start = std::chrono::steady_clock::now();
  auto got = intercept(
      8,
      [](RankContext& ctx) {
        ASSERT_NE(ctx.rank(), 5) << "planted fatal";
        ctx.world().barrier();  // rank 5 never arrives: the others must not wait for the timeout
      },
      20000ms);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(s, 10.0) << "the other ranks waited for the timeout";
  EXPECT_FALSE(got->report.ok);
  ASSERT_EQ(got->report.failures.size(), 1u) << got->report.summary();
  EXPECT_EQ(got->report.failures[0].ranks, std::vector<int64_t>{5});
  EXPECT_EQ(to_string(got->report.failures[0].kind), "assertion");
  const auto failed = got->messages(::testing::TestPartResult::kNonFatalFailure);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_TRUE(contains(failed[0], "[rank 5] ") && contains(failed[0], "planted fatal")) << failed[0];
}

TEST(SpmdMacroReports, ExceptionAndStallFailTheTestWithTheDiagnosis) {
  auto thrown = intercept(4, [](RankContext& ctx) {
    if (ctx.rank() == 3) throw InvalidArgument("planted exception");
    ctx.world().barrier();
  });
  auto failed = thrown->messages(::testing::TestPartResult::kNonFatalFailure);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_TRUE(contains(failed[0], "rank 3") && contains(failed[0], "planted exception")) << failed[0];

  auto stalled = intercept(
      3, [](RankContext& ctx) {
        if (ctx.rank() == 0) {
          try {
            ctx.sleep_for(10000ms);
          } catch (const Aborted&) {
            return;
          }
        }
        ctx.world().barrier();
      },
      300ms);
  failed = stalled->messages(::testing::TestPartResult::kNonFatalFailure);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_TRUE(contains(failed[0], "stall") && contains(failed[0], "rank 0")) << failed[0];
}

TEST(SpmdMacroReports, SkipOnEveryRankSkipsTheTest) {
  auto got = intercept(3, [](RankContext&) { GTEST_SKIP() << "no accelerator"; });
  EXPECT_TRUE(got->report.ok);
  EXPECT_TRUE(got->messages(::testing::TestPartResult::kNonFatalFailure).empty());
  const auto skipped = got->messages(::testing::TestPartResult::kSkip);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_TRUE(contains(skipped[0], "[rank 0] no accelerator")) << skipped[0];
}

// Local mode: every rank a fiber of one thread, so results are attributed at each switch.
TEST(SpmdMacroReportsFiber, EachRanksFailuresCarryItsRankAndAFatalOneStopsTheRun) {
  auto got = intercept(6, [](RankContext& ctx) {
    int64_t v = ctx.rank();
    EXPECT_NE(ctx.rank(), 2) << "planted before";
    ctx.world().all_reduce(std::span<int64_t>(&v, 1), ReduceOp::kSum);
    EXPECT_EQ(v, 15);
    EXPECT_NE(ctx.rank() % 3, 1) << "planted after";
  }, 5000ms, "fiber");
  EXPECT_TRUE(got->report.ok) << got->report.summary();
  auto failed = got->messages(::testing::TestPartResult::kNonFatalFailure);
  std::sort(failed.begin(), failed.end());
  ASSERT_EQ(failed.size(), 3u);
  EXPECT_TRUE(contains(failed[0], "[rank 1] ") && contains(failed[0], "planted after")) << failed[0];
  EXPECT_TRUE(contains(failed[1], "[rank 2] ") && contains(failed[1], "planted before")) << failed[1];
  EXPECT_TRUE(contains(failed[2], "[rank 4] ") && contains(failed[2], "planted after")) << failed[2];

  got = intercept(8, [](RankContext& ctx) {
    ASSERT_NE(ctx.rank(), 5) << "planted fatal";
    ctx.world().barrier();
  }, 5000ms, "fiber");
  ASSERT_EQ(got->report.failures.size(), 1u) << got->report.summary();
  EXPECT_EQ(got->report.failures[0].ranks, std::vector<int64_t>{5});
  EXPECT_EQ(to_string(got->report.failures[0].kind), "assertion");
}

TEST(SpmdMacroReportsFiber, WhatOneThreadCannotExpressIsRefusedAndADeadlockIsNamedAtOnce) {
  auto slept = intercept(3, [](RankContext& ctx) {
    if (ctx.rank() == 1) ctx.sleep_for(10ms);
    ctx.world().barrier();
  }, 5000ms, "fiber");
  auto failed = slept->messages(::testing::TestPartResult::kNonFatalFailure);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_TRUE(contains(failed[0], "rank 1") && contains(failed[0], "cannot express")) << failed[0];

  // Ranks 0 and 1 enter their groups in opposite orders: nothing can complete, and in one
  // thread that is known at once (no timeout to wait for).
  const auto start = std::chrono::steady_clock::now();
  auto crossed = intercept(2, [](RankContext& ctx) {
    DeviceMesh m = DeviceMesh::init(std::vector<int64_t>{2}, std::vector<std::string>{"x"});
    Communicator& w = ctx.world();
    Communicator& x = ctx.comm(m, 0);
    if (ctx.rank() == 0) {
      w.barrier();
      x.barrier();
    } else {
      x.barrier();
      w.barrier();
    }
  }, 60000ms, "fiber");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  ASSERT_FALSE(crossed->report.ok);
  ASSERT_FALSE(crossed->report.failures.empty());
  EXPECT_EQ(to_string(crossed->report.failures[0].kind), "stall") << crossed->report.summary();
  EXPECT_EQ(crossed->report.failures[0].waiting, (std::vector<int64_t>{0, 1}));
}

TEST(SpmdMacroReportsFiber, ExceptionsMismatchesAndDeparturesNameTheRank) {
  auto thrown = intercept(4, [](RankContext& ctx) {
    if (ctx.rank() == 3) throw InvalidArgument("planted exception");
    ctx.world().barrier();
  }, 5000ms, "fiber");
  ASSERT_EQ(thrown->report.failures.size(), 1u);
  EXPECT_EQ(thrown->report.failures[0].ranks, std::vector<int64_t>{3});
  auto odd = intercept(5, [](RankContext& ctx) {
    std::vector<float> v(ctx.rank() == 2 ? 3 : 2, 1.0f);
    ctx.world().all_reduce(std::span<float>(v), ReduceOp::kSum);
  }, 5000ms, "fiber");
  ASSERT_EQ(odd->report.failures.size(), 1u);
  EXPECT_EQ(to_string(odd->report.failures[0].kind), "mismatch");
  EXPECT_EQ(odd->report.failures[0].ranks, std::vector<int64_t>{2});
  auto gone = intercept(4, [](RankContext& ctx) {
    if (ctx.rank() == 1) return;
    ctx.world().barrier();
  }, 5000ms, "fiber");
  ASSERT_EQ(gone->report.failures.size(), 1u);
  EXPECT_EQ(to_string(gone->report.failures[0].kind), "departed");
  EXPECT_EQ(gone->report.failures[0].ranks, std::vector<int64_t>{1});
  auto skipped = intercept(3, [](RankContext&) { GTEST_SKIP() << "no accelerator"; }, 5000ms, "fiber");
  EXPECT_TRUE(skipped->report.ok);
  ASSERT_EQ(skipped->messages(::testing::TestPartResult::kSkip).size(), 1u);
}

TEST(SpmdMacroReports, TimeoutFromTheEnvironmentIsChecked) {
  ::setenv("MESHSIM_TEST_TIMEOUT", "2.5", 1);
  EXPECT_EQ(testing::default_timeout(), 2500ms);
  for (const char* bad : {"0", "-1", "nan", "1e9", "3s", "inf"}) {
    ::setenv("MESHSIM_TEST_TIMEOUT", bad, 1);
    EXPECT_THROW(testing::default_timeout(), InvalidArgument) << bad;
  }
  ::unsetenv("MESHSIM_TEST_TIMEOUT");
  EXPECT_EQ(testing::default_timeout(), 30000ms);
}

}  // namespace
}  // namespace meshsim
