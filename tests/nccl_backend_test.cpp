// The NCCL backend's own logic over a fake NCCL: dims over the world come from ncclCommSplit
// (once per dim, through the group cache), other groups from a unique id passed through the
// store; an async error, a hung collective and too few GPUs each end in a diagnosis, never a hang.
#include <gtest/gtest.h>

#include <thread>

#include "fake_nccl.hpp"
#include "meshsim/error.hpp"
#include "meshsim/nccl_backend.hpp"
#include "meshsim/spmd.hpp"
#include "meshsim/store.hpp"

namespace meshsim {
namespace {

using namespace std::chrono_literals;
using Names = std::vector<std::string>;

SpmdOptions nccl(int64_t world, std::shared_ptr<NcclApi> api, std::chrono::milliseconds timeout = 10s) {
  SpmdOptions o;
  o.backend = "nccl";
  o.world_size = world;
  o.timeout = timeout;
  o.backend_options = NcclBackend::Options{.api = std::move(api)};
  return o;
}

TEST(NcclBackend, DimsOverTheWorldAreSplitOnceEachOtherGroupsUseAnIdFromTheStore) {
  auto fake = std::make_shared<testing::FakeNccl>(8);
  RunReport rep = run_spmd(nccl(8, fake), [](RankContext& ctx) {
    DeviceMesh mesh = DeviceMesh::init({2, 4}, Names{"dp", "tp"});
    for (int d = 0; d < 2; ++d) {
      Communicator& c = ctx.comm(mesh, d);
      Communicator& again = ctx.comm(mesh.slice(mesh.dim_name(d)), 0);  // the group cache
      if (&c != &again) ctx.fail("the sliced dim got a new communicator");
      std::vector<int64_t> got(static_cast<std::size_t>(c.size()));
      const int64_t me = ctx.rank();
      c.all_gather(std::span<const int64_t>(&me, 1), std::span<int64_t>(got));
      if (got != *mesh.group_of(me, d)) ctx.fail("dim " + mesh.dim_name(d) + " gathered the wrong ranks");
    }
    // A mesh over ranks 2..5 only (not the world): its groups get unique ids, not splits.
    const std::vector<int64_t> shape{2, 2}, ranks{2, 3, 4, 5};
    DeviceMesh part = DeviceMesh::from_ranks(shape, ranks, Names{"a", "b"});
    if (part.contains(ctx.rank())) {
      Communicator& c = ctx.comm(part, 1);
      int64_t v = ctx.rank();
      c.all_reduce(std::span<int64_t>(&v, 1), ReduceOp::kSum);
      const auto g = *part.group_of(ctx.rank(), 1);
      if (v != g[0] + g[1]) ctx.fail("sub-mesh all_reduce");
    }
    auto& backend = dynamic_cast<NcclBackend&>(ctx.backend());
    (void)backend;
  });
  ASSERT_TRUE(rep.ok) << rep.summary();
  EXPECT_EQ(fake->splits_made(), 2);             // dp and tp: one ncclCommSplit each
  EXPECT_EQ(fake->inits_made(), 8 + 4);          // the world on 8 ranks, then 2 groups of 2
}

TEST(NcclBackend, UniqueIdsTravelAsHex) {
  testing::FakeNccl fake(1);
  const NcclId id = fake.unique_id();
  EXPECT_EQ(id.to_hex().size(), 256u);
  EXPECT_EQ(NcclId::from_hex(id.to_hex()).bytes, id.bytes);
  EXPECT_THROW(NcclId::from_hex("abc"), InvalidArgument);
  EXPECT_THROW(NcclId::from_hex(std::string(256, 'g')), InvalidArgument);
}

TEST(NcclBackend, AnAsyncErrorOnOneRankNamesIt) {
  auto fake = std::make_shared<testing::FakeNccl>(4);
  fake->async_error = [](int rank, int size) -> std::optional<std::string> {
    if (size == 4 && rank == 2) return "planted: remote process exited or there was a network error";
    return std::nullopt;
  };
  RunReport rep = run_spmd(nccl(4, fake), [](RankContext& ctx) {
    std::vector<float> v(16, 1.0f);
    ctx.world().all_reduce(std::span<float>(v), ReduceOp::kSum);
  });
  ASSERT_FALSE(rep.ok);
  ASSERT_EQ(rep.failures.size(), 1u) << rep.summary();
  EXPECT_EQ(rep.failures[0].ranks, std::vector<int64_t>{2});
  EXPECT_NE(rep.failures[0].message.find("planted"), std::string::npos) << rep.summary();
  EXPECT_GT(fake->aborts(), 0);  // ncclCommAbort, so the peers' collectives end
  EXPECT_LT(rep.seconds, 5.0);
}

TEST(NcclBackend, AHungCollectiveIsAbortedAndDiagnosedWithinTheTimeout) {
  auto fake = std::make_shared<testing::FakeNccl>(4);
  fake->swallow = [](int rank, int size) { return size == 4 && rank == 1; };
  RunReport rep = run_spmd(nccl(4, fake, 400ms), [](RankContext& ctx) { ctx.world().barrier(); });
  EXPECT_FALSE(rep.ok);
  EXPECT_GT(fake->aborts(), 0);
  EXPECT_LT(rep.seconds, 5.0);
  for (const RankReport& r : rep.ranks) EXPECT_NE(r.status, RankStatus::kStuck) << r.message;
}

TEST(NcclBackend, MismatchAndDepartureAreNamed) {
  auto fake = std::make_shared<testing::FakeNccl>(3);
  RunReport rep = run_spmd(nccl(3, fake), [](RankContext& ctx) {
    std::vector<int32_t> v(ctx.rank() == 1 ? 5 : 4, 1);
    ctx.world().all_reduce(std::span<int32_t>(v), ReduceOp::kMax);
  });
  ASSERT_EQ(rep.failures.size(), 1u) << rep.summary();
  EXPECT_EQ(to_string(rep.failures[0].kind), "mismatch");
  EXPECT_EQ(rep.failures[0].ranks, std::vector<int64_t>{1});
  rep = run_spmd(nccl(3, fake), [](RankContext& ctx) {
    if (ctx.rank() == 0) return;
    ctx.world().barrier();
  });
  ASSERT_EQ(rep.failures.size(), 1u) << rep.summary();
  EXPECT_EQ(to_string(rep.failures[0].kind), "departed");
  EXPECT_EQ(rep.failures[0].ranks, std::vector<int64_t>{0});
}

// one_rank_process is one "process" of a 2-rank run: a backend running only `rank`, over `store`.
std::unique_ptr<NcclBackend> one_rank_process(const std::shared_ptr<testing::FakeNccl>& fake,
                                              const std::shared_ptr<Store>& store, int64_t rank, const std::string& prefix) {
  return std::make_unique<NcclBackend>(NcclBackend::Options{
      .world_size = 2,
      .placement = {.first_rank = rank, .local_ranks = 1, .local_rank = rank, .store = store, .prefix = prefix},
      .timeout = 300ms,
      .api = fake});
}

// Two "processes" (one backend each, one rank each) over one store: NCCL's init waits for every
// member, as the real one does. When one never comes, the other names it within its timeout.
TEST(NcclBackend, AMemberThatNeverJoinsTheCommunicatorIsNamedAcrossProcesses) {
  auto fake = std::make_shared<testing::FakeNccl>(2);
  fake->blocking_init = true;
  auto store = std::make_shared<InProcessStore>();
  auto process = [&](int64_t rank, const std::string& prefix) { return one_rank_process(fake, store, rank, prefix); };
  const std::vector<int64_t> both{0, 1};
  {  // both come: the communicator is made
    auto a = process(0, "ok"), b = process(1, "ok");
    std::thread t([&] { b->new_group(1, both, {}); });
    EXPECT_NO_THROW(a->new_group(0, both, {}));
    t.join();
  }
  {  // both made the world communicator; only rank 0 splits it (rank 1 stalls elsewhere)
    auto a = process(0, "split"), b = process(1, "split");
    std::thread t([&] { b->new_group(1, both, {}); });
    a->new_group(0, both, {});
    t.join();
    EXPECT_THROW(a->split_group(0, std::vector<int64_t>{0}, {}), Aborted);
    const auto dg = a->diagnosis();
    ASSERT_TRUE(dg.has_value());
    EXPECT_EQ(dg->ranks, std::vector<int64_t>{1}) << dg->message;
    EXPECT_NE(dg->message.find("splitting the world's NCCL communicator (split 0, for group [0]); rank 1 never joined"),
              std::string::npos) << dg->message;
  }
  for (int64_t alone : {0, 1}) {  // rank `alone` comes, the other never does
    const std::string prefix = "lonely" + std::to_string(alone);
    auto p = process(alone, prefix);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_THROW(p->new_group(alone, both, {}), Aborted);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
    const auto dg = p->diagnosis();
    ASSERT_TRUE(dg.has_value());
    EXPECT_EQ(to_string(dg->kind), "stall");
    EXPECT_EQ(dg->ranks, std::vector<int64_t>{1 - alone}) << dg->message;
    EXPECT_NE(dg->message.find("rank " + std::to_string(1 - alone) + " never joined"), std::string::npos) << dg->message;
    EXPECT_NE(dg->message.find("creating the NCCL communicator of group [0, 1]"), std::string::npos) << dg->message;
  }
}

// Two "processes" over one store, one rank each: a collective that one member never enters ends,
// at the other's deadline, in the census Gloo's ranks take (the store says who waited), naming
// the member that never arrived, or the one whose program returned without entering it.
TEST(NcclBackend, ACollectiveAMemberNeverEntersIsNamedAcrossProcesses) {
  auto fake = std::make_shared<testing::FakeNccl>(2);
  auto store = std::make_shared<InProcessStore>();
  auto process = [&](int64_t rank, const std::string& prefix) { return one_rank_process(fake, store, rank, prefix); };
  const std::vector<int64_t> both{0, 1};
  for (const bool departs : {false, true}) {
    const std::string prefix = departs ? "departs" : "stalls";
    auto a = process(0, prefix), b = process(1, prefix);
    std::shared_ptr<Communicator> ca, cb;
    std::thread t([&] { cb = b->new_group(1, both, {}); });
    ca = a->new_group(0, both, {});
    t.join();
    if (departs) b->depart(1);  // rank 1's program returned without entering the all_reduce
    int32_t v = 1;
    const auto start = std::chrono::steady_clock::now();
    EXPECT_THROW(ca->all_reduce(std::span<int32_t>(&v, 1), ReduceOp::kSum), Aborted);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
    const auto dg = a->diagnosis();
    ASSERT_TRUE(dg.has_value());
    EXPECT_EQ(dg->ranks, std::vector<int64_t>{1}) << dg->message;
    EXPECT_EQ(to_string(dg->kind), departs ? "departed" : "stall") << dg->message;
    EXPECT_NE(dg->message.find("all_reduce"), std::string::npos) << dg->message;
    if (!departs) {
      EXPECT_NE(dg->message.find("stall: rank 0 waited 300 ms in all_reduce(sum, int32, count=1) #0 of group [0, 1]; rank 1 never arrived"),
                std::string::npos) << dg->message;
    }
    // The diagnosis reached the store, where rank 1's process reads it.
    EXPECT_NO_THROW(store->get(prefix + "/failure", 100ms));
  }
}

TEST(NcclBackend, RefusesTooFewGpusAndABuildWithoutNccl) {
  auto fake = std::make_shared<testing::FakeNccl>(2);
  try {
    run_spmd(nccl(4, fake), [](RankContext&) {});
    ADD_FAILURE() << "4 ranks over 2 GPUs ran";
  } catch (const FailedPrecondition& e) {
    EXPECT_NE(std::string(e.what()).find("4 ranks need GPUs 0..3, one each;"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sees 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(NcclBackend({.world_size = 2}), FailedPrecondition);  // no api
  NcclBackend b({.world_size = 2, .api = fake});
  EXPECT_THROW(b.new_group(0, std::vector<int64_t>{1}, {}), InvalidArgument);
  EXPECT_THROW(b.new_group(0, std::vector<int64_t>{0, 0}, {}), InvalidArgument);
  EXPECT_THROW(b.new_group(0, std::vector<int64_t>{0, 2}, {}), OutOfRange);
  EXPECT_THROW(b.new_group(0, std::vector<int64_t>{0}, BackendConfig{.backend = "gloo"}), InvalidArgument);
#ifndef MESHSIM_WITH_NCCL
  EXPECT_EQ(make_cuda_nccl_api(), nullptr);
  EXPECT_THROW(run_spmd(nccl(1, nullptr), [](RankContext&) {}), FailedPrecondition);
#endif
}

}  // namespace
}  // namespace meshsim
