// The backend registry: the built-in names, a backend a program registers, and the refusals.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
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
  spread.placement.first_rank = 2;
  spread.placement.local_ranks = 1;
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

TEST(Diagnoses, AStallOfAWholeWorldIsOneEntryPerDistinctWaitAndStaysSmall) {
  // 20,000 ranks wait in the world's barrier for rank 5, sharing one group and one missing list
  // (as the backends hand them out); two more wait in a pair group for each other's peer.
  const int64_t n = 20000;
  std::vector<int64_t> all(static_cast<std::size_t>(n));
  for (int64_t r = 0; r < n; ++r) all[static_cast<std::size_t>(r)] = r;
  const SharedRanks world(all), five{5};
  std::vector<WaitInfo> waits;
  for (int64_t r = 0; r < n; ++r) {
    if (r == 5 || r == 7 || r == 9) continue;
    WaitInfo w;
    w.rank = r;
    w.group = world;
    w.desc = CollectiveDesc{CollectiveOp::kBarrier, DType::kInt64, 0, -1, ReduceOp::kSum};
    w.missing = five;
    waits.push_back(w);
  }
  for (int64_t r : {7, 9}) {
    WaitInfo w;
    w.rank = r;
    w.group = {7, 9, 5};
    w.seq = 2;
    w.desc = CollectiveDesc{CollectiveOp::kAllReduce, DType::kInt64, 1, -1, ReduceOp::kSum};
    w.missing = {5};
    waits.push_back(w);
  }
  const Diagnosis d = stall_diagnosis(waits, "no progress for 1000 ms");
  EXPECT_EQ(d.ranks, std::vector<int64_t>{5});
  EXPECT_EQ(d.missing, std::vector<int64_t>{5});
  EXPECT_EQ(d.waiting.size(), static_cast<std::size_t>(n - 1));
  EXPECT_NE(d.message.find("; ranks [0, 1, 2, 3, 4, 6, 8, 10, "), std::string::npos) << d.message;
  EXPECT_NE(d.message.find("(19997 ranks)] wait in barrier"), std::string::npos) << d.message;
  EXPECT_NE(d.message.find("; ranks [7, 9] wait in all_reduce(sum, int64, count=1) #2 of group [7, 9, 5] for rank 5"),
            std::string::npos) << d.message;
  EXPECT_LT(d.message.size(), 1000u) << d.message;
}

TEST(Diagnoses, AStallListsSixteenDistinctWaitsThenCountsTheRest) {
  std::vector<WaitInfo> waits;
  for (int64_t r = 0; r < 40; ++r) {
    WaitInfo w;
    w.rank = 2 * r;
    w.group = {2 * r, 2 * r + 1};
    w.desc = CollectiveDesc{CollectiveOp::kBarrier, DType::kInt64, 0, -1, ReduceOp::kSum};
    w.missing = {2 * r + 1};
    waits.push_back(w);
  }
  const Diagnosis d = stall_diagnosis(waits, "no progress for 1000 ms");
  EXPECT_EQ(d.ranks.size(), 40u);
  EXPECT_NE(d.message.find("rank 30 waits in barrier() #0 of group [30, 31] for rank 31; ... 24 more distinct waits"),
            std::string::npos) << d.message;
  EXPECT_EQ(d.message.find("rank 32 waits"), std::string::npos) << d.message;
}

TEST(RankThreads, AStallOfTwoThousandRanksNamesTheOneThatNeverArrivedInOneShortMessage) {
  // Rank 5 sleeps past the timeout outside any collective; the other 2,047 wait for it in the
  // world's barrier. The diagnosis names rank 5 alone, lists the waiters as one entry, and the
  // report holds one failure (it held one per waiting rank's copy of the world's members).
  SpmdOptions o;
  o.world_size = 2048;
  o.timeout = std::chrono::milliseconds(2000);
  RunReport rep = run_spmd(o, [](RankContext& ctx) {
    if (ctx.rank() == 5) ctx.sleep_for(std::chrono::seconds(60));
    ctx.world().barrier();
  });
  ASSERT_FALSE(rep.ok);
  ASSERT_EQ(rep.failures.size(), 1u);
  EXPECT_EQ(rep.failures[0].ranks, std::vector<int64_t>{5});
  EXPECT_EQ(rep.failures[0].kind, DiagnosisKind::kStall);
  EXPECT_EQ(rep.failures[0].missing, std::vector<int64_t>{5});
  EXPECT_EQ(rep.failures[0].waiting.size(), 2047u);
  EXPECT_NE(rep.failures[0].message.find("(2047 ranks)] wait in barrier() #0 of group [0, 1, 2, "), std::string::npos)
      << rep.failures[0].message;
  EXPECT_LT(rep.failures[0].message.size(), 1000u);
  EXPECT_LT(rep.seconds, 30.0);  // the run ends (rank 5's sleep is cut short by the abort)
}

TEST(RankThreads, EachBackendNamesTheStackItsRankThreadsNeed) {
  // NCCL and the CUDA runtime run on the rank's thread: 8 MiB; the others take the runner's.
  EXPECT_EQ(find_backend("nccl")->rank_stack_bytes, std::size_t{8} << 20);
  for (const char* name : {"threaded", "gloo", "fiber"}) EXPECT_EQ(find_backend(name)->rank_stack_bytes, 0u) << name;
}

TEST(RankThreads, AStackOutsideItsRangeIsRefusedNamingIt) {
  SpmdOptions o;
  o.world_size = 2;
  o.stack_bytes = 4096;
  try {
    run_spmd(o, [](RankContext&) {});
    FAIL() << "a 4 KiB stack was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("stack of 4096 bytes is out of range [64 KiB, 1 GiB]"), std::string::npos)
        << e.what();
  }
}

TEST(RankThreads, RanksRunOnTheStackSizeAsked) {
  // A rank touching 1 MiB of its stack needs more than the default 512 KiB: with 2 MiB it runs.
  SpmdOptions o;
  o.world_size = 4;
  o.stack_bytes = 2 << 20;
  RunReport rep = run_spmd(o, [](RankContext& ctx) {
    volatile char big[1 << 20];
    for (std::size_t i = 0; i < sizeof big; i += 4096) big[i] = static_cast<char>(i);
    int64_t v = big[4096];
    ctx.world().all_reduce(std::span<int64_t>(&v, 1), ReduceOp::kSum);
    if (v != 4 * static_cast<char>(4096)) ctx.fail("sum " + std::to_string(v));
  });
  EXPECT_TRUE(rep.ok) << rep.summary();
}

namespace {

// work_per_arrival runs `n` ranks of `backend` through world collectives and collectives of
// groups of 16, and returns the bookkeeping steps per arrival or completion.
double work_per_arrival(int64_t n, const std::string& backend = "fiber") {
  SpmdOptions o;
  o.world_size = n;
  o.backend = backend;
  RunReport rep = run_spmd(o, [n](RankContext& ctx) {
    int64_t v = 1;
    ctx.world().all_reduce(std::span<int64_t>(&v, 1), ReduceOp::kSum);
    DeviceMesh mesh = DeviceMesh::init({n / 16, 16}, std::vector<std::string>{"dp", "tp"});
    Communicator& tp = ctx.comm(mesh, "tp");
    for (int i = 0; i < 4; ++i) tp.all_reduce(std::span<int64_t>(&v, 1), ReduceOp::kSum);
    ctx.world().barrier();
  });
  EXPECT_TRUE(rep.ok) << rep.summary();
  EXPECT_GT(rep.steps, 0);
  EXPECT_GT(rep.progress, 6 * n);
  return static_cast<double>(rep.steps) / static_cast<double>(rep.progress);
}

}  // namespace

TEST(FiberScale, WorkPerArrivalDoesNotGrowWithTheWorld) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer does not follow the fibers' stack switches (swapcontext); the fiber suites run "
                  "under asan and in the default build";
#endif
  // Counted, not timed: each arrival, suspension, wake-up and the world group's creation cost
  // O(1) amortized, so 16x the ranks is about the same work per arrival (creating the world
  // group read every member per rank: work per arrival grew with the world).
  const double small = work_per_arrival(256), big = work_per_arrival(4096);
  EXPECT_LT(big, small * 1.5) << "steps per arrival: " << small << " at 256 ranks, " << big << " at 4096";
  EXPECT_LT(big, 16.0);
}

TEST(ThreadedScale, WorkPerArrivalDoesNotGrowWithTheWorld) {
  // Rank threads keep the same registry: 8x the ranks is about the same bookkeeping per arrival
  // (each group checked once, the world's members never read per rank).
  const double small = work_per_arrival(128, "threaded"), big = work_per_arrival(1024, "threaded");
  EXPECT_LT(big, small * 1.5) << "steps per arrival: " << small << " at 128 ranks, " << big << " at 1024";
  EXPECT_LT(big, 16.0);
}

TEST(RankThreads, RanksThatKeepReturningAfterAnAbortAreNotCalledStuck) {
  // Rank 0 throws at once; ranks 1..6 are busy outside any collective and return one after
  // another, 400 ms apart, 2.4 s in all: longer than the 1 s grace, but each within the grace of
  // the one before. Rank 7 never returns in time (it sleeps 30 s): only it is stuck.
  SpmdOptions o;
  o.world_size = 8;
  o.timeout = std::chrono::milliseconds(5000);
  o.grace = std::chrono::milliseconds(1000);
  // Rank 0 throws once the others are running (a rank that starts after an abort is aborted
  // as it makes its world group, before its program runs).
  std::atomic<int> running{0};
  RunReport rep = run_spmd(o, [&running](RankContext& ctx) {
    if (ctx.rank() == 0) {
      while (running.load() < 7) std::this_thread::yield();
      throw InvalidArgument("planted");
    }
    running.fetch_add(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(ctx.rank() == 7 ? 30000 : 400 * ctx.rank()));
  });
  ASSERT_FALSE(rep.ok);
  for (const RankReport& r : rep.ranks) {
    EXPECT_EQ(r.status == RankStatus::kStuck, r.rank == 7) << r.rank << ": " << to_string(r.status) << " " << r.message;
  }
  EXPECT_LT(rep.seconds, 10.0);
}
