// run_spmd_results (ranks fill their own results, kept as far as they got) and finish_launched
// (the end of one process of a launched run: publish, barrier, rank 0 gathers), over an
// in-process store shared by threads that stand in for the processes.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "meshsim/launched.hpp"
#include "meshsim/spmd.hpp"
#include "meshsim/store.hpp"

namespace meshsim {
namespace {

TEST(RunSpmdResults, EveryRankFillsItsOwnAndAFailedRankKeepsWhatItGot) {
  SpmdOptions o;
  o.world_size = 4;
  o.timeout = std::chrono::seconds(5);
  SpmdResults<std::vector<int64_t>> run =
      run_spmd_results<std::vector<int64_t>>(o, [](RankContext& ctx, std::vector<int64_t>& out) {
        int64_t v = ctx.rank();
        ctx.world().all_reduce(std::span<int64_t>(&v, 1), ReduceOp::kSum);
        out.push_back(v);
        if (ctx.rank() == 2) ctx.fail("planted after the first collective");
        out.push_back(ctx.rank());
        ctx.world().barrier();
      });
  EXPECT_FALSE(run.report.ok);
  ASSERT_EQ(run.results.size(), 4u);
  for (int64_t r = 0; r < 4; ++r) {
    ASSERT_TRUE(run.results[static_cast<std::size_t>(r)].has_value()) << r;
    const std::vector<int64_t>& got = *run.results[static_cast<std::size_t>(r)];
    // Every rank got through the all_reduce (0+1+2+3); rank 2 stopped there, the others were
    // aborted in the barrier after recording their own rank.
    ASSERT_FALSE(got.empty()) << r;
    EXPECT_EQ(got[0], 6) << r;
    EXPECT_EQ(got.size(), r == 2 ? 1u : 2u) << r;
  }
  ASSERT_FALSE(run.report.failures.empty());
  EXPECT_EQ(run.report.failures[0].ranks, std::vector<int64_t>{2});
}

TEST(RunSpmdResults, RankStatusesHaveOneNameEach) {
  EXPECT_EQ(to_string(RankStatus::kOk), "ok");
  EXPECT_EQ(to_string(RankStatus::kFailed), "failed");
  EXPECT_EQ(to_string(RankStatus::kAborted), "aborted");
  EXPECT_EQ(to_string(RankStatus::kStuck), "stuck");
}

// processes runs finish_launched for `n` ranks at once (threads as processes), rank r with
// report reports[r] and result "r<r>".
std::vector<LaunchedEnd> processes(int64_t n, std::vector<RunReport> reports, std::shared_ptr<Store> store,
                                   std::chrono::milliseconds timeout) {
  std::vector<LaunchedEnd> ends(static_cast<std::size_t>(n));
  std::vector<std::thread> ts;
  for (int64_t r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      LaunchedJob job{store, "job", n, r, timeout, {}};
      auto& rep = reports[static_cast<std::size_t>(r)];
      ends[static_cast<std::size_t>(r)] =
          finish_launched(job, rep, rep.ok ? std::optional<std::string>("r" + std::to_string(r)) : std::nullopt);
    });
  }
  for (auto& t : ts) t.join();
  return ends;
}

TEST(FinishLaunched, RankZeroGathersEveryResultInRankOrderTheOthersKeepTheirOwn) {
  auto store = std::make_shared<InProcessStore>();
  std::vector<LaunchedEnd> ends = processes(5, std::vector<RunReport>(5), store, std::chrono::seconds(5));
  ASSERT_TRUE(ends[0].ok);
  EXPECT_EQ(ends[0].results, (std::vector<std::string>{"r0", "r1", "r2", "r3", "r4"}));
  for (int64_t r = 1; r < 5; ++r) {
    ASSERT_TRUE(ends[static_cast<std::size_t>(r)].ok) << r;
    EXPECT_EQ(ends[static_cast<std::size_t>(r)].results, std::vector<std::string>{"r" + std::to_string(r)});
  }
  // Every process left, so the one serving the store may stop.
  EXPECT_EQ(store->add("job/left", 0), 5);
}

TEST(FinishLaunched, AFailurePublishedByOneProcessFailsEveryOtherNamingTheRank) {
  auto store = std::make_shared<InProcessStore>();
  std::vector<RunReport> reports(3);
  const Diagnosis d{DiagnosisKind::kDeparted, {1}, "rank 1 ended its program early", {}, {}};
  reports[1].ok = false;
  reports[1].failures = {d};
  store->set("job/failure", encode_diagnosis(d));  // what rank 1's backend published
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<LaunchedEnd> ends = processes(3, reports, store, std::chrono::seconds(20));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));  // adopted, not timed out
  for (const LaunchedEnd& e : ends) {
    EXPECT_FALSE(e.ok);
    EXPECT_TRUE(e.results.empty());
    ASSERT_EQ(e.failures.size(), 1u);
    EXPECT_EQ(e.failures[0].ranks, std::vector<int64_t>{1});
    EXPECT_EQ(e.failures[0].message, d.message);
  }
}

TEST(FinishLaunched, AProcessThatNeverArrivesEndsTheBarrierAtItsDeadline) {
  auto store = std::make_shared<InProcessStore>();
  RunReport ok;
  LaunchedJob job{store, "job", 2, 0, std::chrono::milliseconds(50), {}};
  bool done_hook = false;
  job.on_done = [&] { done_hook = true; };
  const auto t0 = std::chrono::steady_clock::now();
  LaunchedEnd end = finish_launched(job, ok, std::string("r0"));
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_TRUE(done_hook);
  EXPECT_FALSE(end.ok);
  ASSERT_EQ(end.failures.size(), 1u);
  EXPECT_EQ(end.failures[0].kind, DiagnosisKind::kStall);
  EXPECT_NE(end.failures[0].message.find("not every rank reached the end"), std::string::npos) << end.failures[0].message;
  EXPECT_LT(took, std::chrono::seconds(8));  // 2 x 50 ms + 5 s, not a hang
}

}  // namespace
}  // namespace meshsim
