// The backend registry: the built-in names, a backend a program registers, and the refusals.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "meshsim/backend_registry.hpp"
#include "meshsim/error.hpp"
#include "meshsim/gloo_backend.hpp"
#include "meshsim/spmd.hpp"
#include "meshsim/threaded_backend.hpp"

using namespace meshsim;

TEST(BackendRegistry, ListsTheBuiltInsInOrderAndDescribesEach) {
  const std::vector<std::string> names = backend_names();
  ASSERT_GE(names.size(), 4u);
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + 4),
            (std::vector<std::string>{"threaded", "gloo", "fiber", "nccl"}));
  for (const std::string& n : names) {
    const BackendEntry* e = find_backend(n);
    ASSERT_NE(e, nullptr) << n;
    EXPECT_FALSE(e->description.empty()) << n;
  }
  EXPECT_TRUE(find_backend("gloo")->spans_processes);
  EXPECT_FALSE(find_backend("threaded")->spans_processes);
  EXPECT_EQ(find_backend("gloo")->max_rank_threads, GlooBackend::kMaxThreadRanks);
  EXPECT_EQ(find_backend("no-such"), nullptr);
}

TEST(BackendRegistry, AProgramsOwnBackendRunsUnderItsNameThroughRunSpmd) {
  // A backend registered by name is created by the runner with the request's world and timeout.
  static std::atomic<int> made{0};
  static std::atomic<int64_t> world_seen{0};
  register_backend({"counting-threaded", "the threaded backend, counted", false, 16384, [](const BackendRequest& r) {
                      ++made;
                      world_seen = r.world_size;
                      return std::shared_ptr<SpmdBackend>(std::make_shared<ThreadedBackend>(
                          ThreadedBackend::Options{.world_size = r.world_size, .timeout = r.timeout}));
                    }});
  SpmdOptions o;
  o.world_size = 4;
  o.backend = "counting-threaded";
  RunReport rep = run_spmd(o, [](RankContext& ctx) {
    int64_t v = 1;
    ctx.world().all_reduce(std::span<int64_t>(&v, 1), ReduceOp::kSum);
    if (v != 4) ctx.fail("sum " + std::to_string(v));
  });
  EXPECT_TRUE(rep.ok) << rep.summary();
  EXPECT_EQ(made.load(), 1);
  EXPECT_EQ(world_seen.load(), 4);
  // Its name joins the list every error and --help reads.
  EXPECT_NE(backend_names_text().find("counting-threaded"), std::string::npos);
  // A name is registered once.
  EXPECT_THROW(register_backend({"counting-threaded", "again", false, 1, [](const BackendRequest&) {
                                   return std::shared_ptr<SpmdBackend>();
                                 }}),
               AlreadyExists);
  EXPECT_THROW(register_backend({"", "no name", false, 1, [](const BackendRequest&) { return std::shared_ptr<SpmdBackend>(); }}),
               InvalidArgument);
  EXPECT_THROW(register_backend({"no-factory", "none", false, 1, nullptr}), InvalidArgument);
}

TEST(BackendRegistry, UnknownNamesAndAnotherBackendsOptionsAreRefusedNamingWhatIsKnown) {
  try {
    create_backend("mpi", BackendRequest{.world_size = 2});
    ADD_FAILURE() << "an unknown backend was created";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'mpi'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("threaded, gloo, fiber, nccl"), std::string::npos) << e.what();
  }
  SpmdOptions o;
  o.world_size = 2;
  o.backend = "mpi";
  EXPECT_THROW(run_spmd(o, [](RankContext&) {}), InvalidArgument);
  // Gloo's options given to the threaded backend: refused, naming the backend.
  BackendRequest r{.world_size = 2};
  r.options = GlooBackend::Options{};
  try {
    create_backend("threaded", r);
    ADD_FAILURE() << "options of another backend were accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'threaded'"), std::string::npos) << e.what();
  }
  // A backend's own options reach it; the request's common fields override theirs.
  r.options = ThreadedBackend::Options{.world_size = 99};
  EXPECT_EQ(create_backend("threaded", r)->world_size(), 2);
  // Ranks over several processes need a backend that spans them.
  SpmdOptions spread;
  spread.world_size = 4;
  spread.first_rank = 2;
  spread.local_ranks = 1;
  spread.backend = "threaded";
  try {
    run_spmd(spread, [](RankContext&) {});
    ADD_FAILURE() << "a threaded run accepted ranks of several processes";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("gloo"), std::string::npos) << e.what();
  }
}

TEST(Diagnoses, AMismatchOfManyDifferentCallsListsTheFirstAndCountsTheRest) {
  // Every rank of 40 called its own count: the line names 16 calls and counts the other 24,
  // and every rank is still at fault.
  std::vector<int64_t> group;
  std::vector<std::pair<std::string, std::vector<int64_t>>> calls;
  for (int64_t r = 0; r < 40; ++r) {
    group.push_back(r);
    calls.push_back({"all_reduce(sum, int64, count=" + std::to_string(r + 1) + ")", {r}});
  }
  const Diagnosis d = mismatch_diagnosis("#0", group, calls);
  EXPECT_NE(d.message.find("rank 15 called all_reduce(sum, int64, count=16); ... and 24 more different calls"),
            std::string::npos) << d.message;
  EXPECT_EQ(d.message.find("count=17)"), std::string::npos) << d.message;
  EXPECT_EQ(d.ranks.size(), 40u);
  EXPECT_LT(d.message.size(), 1200u);
}

TEST(Diagnoses, AStallWhereEveryRankArrivedSaysSoAndNamesNobodyAsMissing) {
  // Every member of the group is waiting in it: nobody is missing, the collective is slow.
  std::vector<WaitInfo> waits;
  for (int64_t r = 0; r < 4; ++r) {
    WaitInfo w;
    w.rank = r;
    w.group = {0, 1, 2, 3};
    w.seq = 3;
    w.desc = CollectiveDesc{CollectiveOp::kAllReduce, DType::kInt64, 1, -1, ReduceOp::kSum};
    waits.push_back(w);
  }
  const Diagnosis d = stall_diagnosis(waits, "no progress for 1000 ms");
  EXPECT_NE(d.message.find("every rank arrived in the collective it waits in"), std::string::npos) << d.message;
  EXPECT_EQ(d.message.find("ranks []"), std::string::npos) << d.message;
  EXPECT_EQ(d.message.find("for ranks []"), std::string::npos) << d.message;
  EXPECT_NE(d.message.find("(every member arrived; it has not completed)"), std::string::npos) << d.message;
}
