// The threaded backend and the SPMD runner: every collective x dtype x op over worlds 1..16, on
// sub-mesh groups with identity and permuted rank maps; each failure path ends in a diagnosis
// naming the rank at fault.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <numeric>

#include "meshsim/error.hpp"
#include "meshsim/mesh_communicators.hpp"
#include "meshsim/nccl_backend.hpp"
#include "meshsim/spmd.hpp"
#include "meshsim/threaded_backend.hpp"

// The same file builds the gloo suite (meshsim_gloo_tests) with MESHSIM_TEST_BACKEND="gloo",
// and the NCCL backend's suite over a fake NCCL (meshsim_nccl_tests) with "nccl".
#ifndef MESHSIM_TEST_BACKEND
#define MESHSIM_TEST_BACKEND "threaded"
#endif
#ifdef MESHSIM_TEST_FAKE_NCCL
#include "fake_nccl.hpp"
#endif

namespace meshsim {
namespace {

using namespace std::chrono_literals;
const std::string kBackend = MESHSIM_TEST_BACKEND;
using Names = std::vector<std::string>;

SpmdOptions opts(int64_t world, std::chrono::milliseconds timeout = 5000ms) {
  SpmdOptions o;
  o.world_size = world;
  o.timeout = timeout;
  o.backend = kBackend;
#ifdef MESHSIM_TEST_FAKE_NCCL
  o.backend_options = NcclBackend::Options{.api = std::make_shared<testing::FakeNccl>(64)};
#endif
  return o;
}

template <class T>
T value_of(int64_t rank, int64_t i) {
  return static_cast<T>((rank * 7 + i * 3) % 11 + 1);
}

template <class T>
void check_reductions(int64_t world) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kAvg}) {
    const int64_t count = 5;
    RunReport rep = run_spmd(opts(world), [&](RankContext& ctx) {
      std::vector<T> buf(count);
      for (int64_t i = 0; i < count; ++i) buf[static_cast<std::size_t>(i)] = value_of<T>(ctx.rank(), i);
      ctx.world().all_reduce(std::span<T>(buf), op);
      for (int64_t i = 0; i < count; ++i) {
        T want = value_of<T>(0, i);
        for (int64_t r = 1; r < world; ++r) {
          const T v = value_of<T>(r, i);
          // Integers wrap (two's complement) like the backend's; computed without signed overflow.
          using W = std::conditional_t<std::is_integral_v<T>, std::make_unsigned_t<std::conditional_t<std::is_integral_v<T>, T, int>>, T>;
          if (op == ReduceOp::kSum || op == ReduceOp::kAvg) want = static_cast<T>(static_cast<W>(want) + static_cast<W>(v));
          if (op == ReduceOp::kProd) want = static_cast<T>(static_cast<W>(want) * static_cast<W>(v));
          if (op == ReduceOp::kMin) want = std::min(want, v);
          if (op == ReduceOp::kMax) want = std::max(want, v);
        }
        if (op == ReduceOp::kAvg) want = static_cast<T>(want / static_cast<T>(world));
        if (buf[static_cast<std::size_t>(i)] != want) {
          ctx.fail("element " + std::to_string(i) + " of " + to_string(op) + " is wrong");
        }
      }
    });
    EXPECT_TRUE(rep.ok) << "world " << world << " " << to_string(op) << ": " << rep.summary();
  }
}

class Worlds : public ::testing::TestWithParam<int64_t> {};

TEST_P(Worlds, AllReduceEveryOpAndDtype) {
  check_reductions<int32_t>(GetParam());
  check_reductions<int64_t>(GetParam());
  check_reductions<float>(GetParam());
  check_reductions<double>(GetParam());
}

TEST_P(Worlds, HalfPrecisionReducesInFloat32) {
  const int64_t world = GetParam();
  RunReport rep = run_spmd(opts(world), [&](RankContext& ctx) {
    std::vector<BFloat16> b{to_bfloat16(1.5f)};
    std::vector<Float16> h{to_float16(0.25f)};
    ctx.world().all_reduce(std::span<BFloat16>(b), ReduceOp::kSum);
    ctx.world().all_reduce(std::span<Float16>(h), ReduceOp::kSum);
    if (to_float(b[0]) != 1.5f * static_cast<float>(world)) ctx.fail("bfloat16 sum");
    if (to_float(h[0]) != 0.25f * static_cast<float>(world)) ctx.fail("float16 sum");
  });
  EXPECT_TRUE(rep.ok) << rep.summary();
}

TEST_P(Worlds, BroadcastGatherScatterAllToAllSendRecv) {
  const int64_t world = GetParam();
  RunReport rep = run_spmd(opts(world), [&](RankContext& ctx) {
    Communicator& w = ctx.world();
    const int64_t me = ctx.rank();
    const auto n = static_cast<std::size_t>(world);
    for (int root = 0; root < static_cast<int>(world); ++root) {
      std::vector<double> b{me == root ? 3.25 + root : -1.0, me == root ? 7.0 : -1.0};
      w.broadcast(std::span<double>(b), root);
      if (b[0] != 3.25 + root || b[1] != 7.0) ctx.fail("broadcast from " + std::to_string(root));
    }
    std::vector<int32_t> mine{static_cast<int32_t>(me), static_cast<int32_t>(-me)}, all(2 * n);
    w.all_gather(std::span<const int32_t>(mine), std::span<int32_t>(all));
    for (std::size_t r = 0; r < n; ++r) {
      if (all[2 * r] != static_cast<int32_t>(r) || all[2 * r + 1] != -static_cast<int32_t>(r)) ctx.fail("all_gather");
    }
    std::vector<int64_t> in(n * 2), out(2);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int64_t>(i) + me;
    w.reduce_scatter(std::span<const int64_t>(in), std::span<int64_t>(out), ReduceOp::kSum);
    const int64_t base = static_cast<int64_t>(world * (world - 1) / 2);
    if (out[0] != 2 * me * world + base || out[1] != (2 * me + 1) * world + base) ctx.fail("reduce_scatter");
    std::vector<int64_t> a2a_in(n), a2a_out(n);
    for (std::size_t i = 0; i < n; ++i) a2a_in[i] = me * 100 + static_cast<int64_t>(i);
    w.all_to_all(std::span<const int64_t>(a2a_in), std::span<int64_t>(a2a_out));
    for (std::size_t i = 0; i < n; ++i) {
      if (a2a_out[i] != static_cast<int64_t>(i) * 100 + me) ctx.fail("all_to_all");
    }
    w.barrier();
    if (world > 1) {
      const int next = static_cast<int>((me + 1) % world), prev = static_cast<int>((me + world - 1) % world);
      std::vector<float> s{static_cast<float>(me)}, r{-1};
      if (me % 2 == 0) {
        w.send(std::span<const float>(s), next);
        w.recv(std::span<float>(r), prev);
      } else {
        w.recv(std::span<float>(r), prev);
        w.send(std::span<const float>(s), next);
      }
      if (r[0] != static_cast<float>(prev)) ctx.fail("send/recv ring");
    }
  });
  EXPECT_TRUE(rep.ok) << rep.summary();
}

INSTANTIATE_TEST_SUITE_P(Backend, Worlds, ::testing::Values(1, 2, 3, 4, 5, 8, 16));

TEST(ThreadedBackend, FloatAllReduceIsBitIdenticalAcrossRuns) {
  std::vector<float> first;
  for (int run = 0; run < 5; ++run) {
    std::vector<float> result;
    std::mutex mu;
    RunReport rep = run_spmd(opts(7), [&](RankContext& ctx) {
      std::vector<float> v(1000);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = 1.0f / static_cast<float>(ctx.rank() * 131 + i + 1);
      ctx.world().all_reduce(std::span<float>(v), ReduceOp::kSum);
      if (ctx.rank() == 3) {
        std::lock_guard lk(mu);
        result = v;
      }
    });
    ASSERT_TRUE(rep.ok) << rep.summary();
    if (run == 0) first = result;
    EXPECT_EQ(0, std::memcmp(first.data(), result.data(), first.size() * sizeof(float)));
  }
}

// On every rank and every dim of 2-D and 3-D meshes (identity and permuted rank maps, slices,
// flatten, unflatten), the group the mesh computes equals all_gather of ranks over the dim's
// communicator.
TEST(MeshCommunicators, GroupsEqualAllGatherOnSubMeshes) {
  for (bool permuted : {false, true}) {
    RunReport rep = run_spmd(opts(24), [&](RankContext& ctx) {
      std::vector<int64_t> ranks(24);
      std::iota(ranks.begin(), ranks.end(), 0);
      if (permuted) std::reverse(ranks.begin(), ranks.end());
      DeviceMesh root = DeviceMesh::from_ranks(std::vector<int64_t>{2, 3, 4}, ranks, Names{"dp", "cp", "tp"});
      std::vector<DeviceMesh> meshes{root, root.slice({"dp", "tp"}), root.slice({"cp", "tp"}).flatten(),
                                     root.slice("tp").unflatten(0, std::vector<int64_t>{2, 2}, Names{"a", "b"}),
                                     DeviceMesh::from_ranks(std::vector<int64_t>{4, 6}, ranks, Names{"x", "y"})};
      for (const DeviceMesh& m : meshes) {
        ctx.check_mesh_agreement(m);
        for (int d = 0; d < m.ndim(); ++d) {
          Communicator& c = ctx.comm(m, d);
          std::vector<int64_t> got(static_cast<std::size_t>(c.size()));
          const int64_t me = ctx.rank();
          c.all_gather(std::span<const int64_t>(&me, 1), std::span<int64_t>(got));
          if (got != *m.group_of(me, d)) ctx.fail(m.to_string() + " dim " + m.dim_name(d));
        }
      }
    });
    EXPECT_TRUE(rep.ok) << rep.summary();
  }
}

TEST(MeshCommunicators, CacheReusesCommunicatorsAcrossSliceFlattenUnflatten) {
  RunReport rep = run_spmd(opts(8), [&](RankContext& ctx) {
    DeviceMesh world = DeviceMesh::init({8}, Names{"world"});
    DeviceMesh a = world.unflatten(0, std::vector<int64_t>{2, 2, 2}, Names{"dp", "cp", "tp"});
    DeviceMesh b = world.unflatten(0, std::vector<int64_t>{2, 2, 2}, Names{"dp", "ep", "ep_tp"});
    Communicator* tp = &ctx.comm(a, "tp");
    Communicator* dp = &ctx.comm(a, "dp");
    if (&ctx.comm(a.slice("tp"), 0) != tp) ctx.fail("slice created a new tp communicator");
    if (&ctx.comm(b, "ep_tp") != tp) ctx.fail("unflatten did not reuse the tp communicator");
    if (&ctx.comm(b, "dp") != dp) ctx.fail("unflatten did not reuse the dp communicator");
    Communicator* flat = &ctx.comm(a.slice({"cp", "tp"}).flatten(), 0);
    if (&ctx.comm(a.slice({"cp", "tp"}).flatten(), 0) != flat) ctx.fail("flatten twice created two");
    // Three keys: tp, dp and the flattened cp_tp; everything else is a cache hit.
    if (ctx.comms().created() != 3) ctx.fail("created " + std::to_string(ctx.comms().created()) + " communicators, expected 3");
    if (a.cache_stats().hits < 3) ctx.fail("cache_stats shows no reuse");
  });
  EXPECT_TRUE(rep.ok) << rep.summary();
}

TEST(MeshCommunicators, MeshFromCommunicatorsAndItsValidation) {
  RunReport rep = run_spmd(opts(6), [&](RankContext& ctx) {
    // Groups of a 2x3 mesh over ranks {5,4,3,2,1,0}, built by hand as torchcomms users do.
    const int64_t me = ctx.rank();
    const int64_t pos = 5 - me;
    std::vector<int64_t> row, col;
    for (int64_t j = 0; j < 3; ++j) row.push_back(5 - ((pos / 3) * 3 + j));
    for (int64_t i = 0; i < 2; ++i) col.push_back(5 - (i * 3 + pos % 3));
    auto c_dp = ctx.backend().new_group(me, col, {});
    auto c_tp = ctx.backend().new_group(me, row, {});
    std::vector<Communicator*> dims{c_dp.get(), c_tp.get()};
    DeviceMesh m = mesh_from_communicators(dims, Names{"dp", "tp"}, me);
    if (m.rank_map() != std::vector<int64_t>{5, 4, 3, 2, 1, 0}) ctx.fail("rank map");
    // The wrong communicator for a dim is refused, naming both rank lists.
    try {
      ctx.comms().adopt(m, 0, c_tp);
      if (c_tp->size() == 2) ctx.fail("adopt accepted a communicator of the wrong group");
    } catch (const InvalidArgument& e) {
      if (std::string(e.what()).find("but the mesh's group is") == std::string::npos) ctx.fail(e.what());
    }
    ctx.comms().adopt(m, 1, c_tp);
    if (&ctx.comm(m, 1) != c_tp.get()) ctx.fail("adopted communicator not used");
  });
  EXPECT_TRUE(rep.ok) << rep.summary();
}

// ---- faults: each ends in a diagnosis naming the rank, within the timeout ----

void expect_failure(const RunReport& rep, int64_t rank, const std::string& kind) {
  ASSERT_FALSE(rep.ok);
  ASSERT_FALSE(rep.failures.empty());
  bool found = false;
  for (const Diagnosis& d : rep.failures) found = found || (d.ranks == std::vector<int64_t>{rank} && to_string(d.kind) == kind);
  EXPECT_TRUE(found) << "expected " << kind << " at rank " << rank << ", got " << rep.summary();
  EXPECT_NE(rep.failures[0].message.find(std::to_string(rank)), std::string::npos);
}

TEST(SpmdFaults, ThrowingRankAbortsEveryBlockedRank) {
  for (int64_t bad : {0, 3, 7}) {
    RunReport rep = run_spmd(opts(8), [&](RankContext& ctx) {
      if (ctx.rank() == bad) throw InvalidArgument("boom");
      ctx.world().barrier();
    });
    expect_failure(rep, bad, "error");
    EXPECT_LT(rep.seconds, 3.0);
    for (const RankReport& r : rep.ranks) {
      if (r.rank != bad) {
        EXPECT_EQ(r.status, RankStatus::kAborted);
        EXPECT_NE(r.message.find("rank " + std::to_string(bad)), std::string::npos) << r.message;
      }
    }
  }
}

TEST(SpmdFaults, DepartedRankFailsWaitersAtOnce) {
  RunReport rep = run_spmd(opts(4), [&](RankContext& ctx) {
    if (ctx.rank() == 2) return;
    ctx.world().barrier();
  });
  expect_failure(rep, 2, "departed");
  EXPECT_LT(rep.seconds, 3.0);
}

TEST(SpmdWatchdog, AWorldThatIsSlowButMovingIsNotAStall) {
  // Rank r arrives 150 ms after rank r-1: the last comes about a second after the first, past
  // the 400 ms timeout, but some rank arrives every 150 ms. Slow, not stalled: the run passes.
  // (Fibers run one at a time: each sleeps 150 ms in turn, which spaces them the same way.)
  RunReport rep = run_spmd(opts(8, 400ms), [&](RankContext& ctx) {
    std::this_thread::sleep_for(kBackend == "fiber" ? 150ms : ctx.rank() * 150ms);
    ctx.world().barrier();
    int64_t v = 1;
    ctx.world().all_reduce(std::span<int64_t>(&v, 1), ReduceOp::kSum);
    if (v != 8) ctx.fail("sum " + std::to_string(v));
  });
  EXPECT_TRUE(rep.ok) << (rep.failures.empty() ? "" : rep.failures[0].message);
}

TEST(SpmdFaults, MismatchNamesTheOddRankAndBothDescriptions) {
  RunReport rep = run_spmd(opts(5), [&](RankContext& ctx) {
    std::vector<int64_t> v(ctx.rank() == 4 ? 3 : 2, 1);
    ctx.world().all_reduce(std::span<int64_t>(v), ReduceOp::kSum);
  });
  expect_failure(rep, 4, "mismatch");
  EXPECT_NE(rep.failures[0].message.find("count=3"), std::string::npos);
  EXPECT_NE(rep.failures[0].message.find("count=2"), std::string::npos);
}

TEST(SpmdFaults, ASendAndItsRecvThatDisagreeAreWordedTheSameOnEveryBackend) {
  RunReport rep = run_spmd(opts(4), [&](RankContext& ctx) {
    std::vector<int64_t> buf(3, 7);
    if (ctx.rank() == 1) ctx.world().send(buf.data(), 3, DType::kInt64, 2);
    if (ctx.rank() == 2) ctx.world().recv(buf.data(), 2, DType::kInt64, 1);
  });
  ASSERT_FALSE(rep.ok);
  ASSERT_FALSE(rep.failures.empty());
  EXPECT_EQ(rep.failures[0].kind, DiagnosisKind::kMismatch);
  EXPECT_EQ(rep.failures[0].message,
            "send/recv mismatch in group [0, 1, 2, 3]: rank 1 called send(int64, count=3, peer=2), rank 2 called "
            "recv(int64, count=2, peer=1)");
  std::vector<int64_t> at_fault;
  for (const Diagnosis& d : rep.failures) at_fault.insert(at_fault.end(), d.ranks.begin(), d.ranks.end());
  EXPECT_EQ(at_fault, (std::vector<int64_t>{1, 2}));
}

TEST(SpmdFaults, AMessageBetweenTwoRanksIsNotACollectiveOfTheirGroup) {
  // Ranks 1 and 2 exchange a message in the world group while 0 and 3 do not; then every rank
  // calls the world's collectives, numbered alike (#0, #1: messages are not counted), and a
  // rank that ends meanwhile is not blamed for a message it was never part of.
  RunReport rep = run_spmd(opts(4), [&](RankContext& ctx) {
    std::vector<int64_t> buf(3, ctx.rank());
    if (ctx.rank() == 1) ctx.world().send(buf.data(), 3, DType::kInt64, 2);
    if (ctx.rank() == 2) {
      ctx.world().recv(buf.data(), 3, DType::kInt64, 1);
      if (buf[0] != 1) ctx.fail("received " + std::to_string(buf[0]));
    }
    int64_t v = 1;
    ctx.world().all_reduce(std::span<int64_t>(&v, 1), ReduceOp::kSum);
    if (v != 4) ctx.fail("sum " + std::to_string(v));
    ctx.world().barrier();
    if (ctx.rank() == 3) ctx.world().send(buf.data(), 3, DType::kInt64, 0);
    if (ctx.rank() == 0) ctx.world().recv(buf.data(), 3, DType::kInt64, 3);
  });
  EXPECT_TRUE(rep.ok) << rep.summary();
}

TEST(SpmdFaults, ABadPeerOrRootIsRefusedInTheSameWordsOnEveryBackend) {
  auto first_failure = [&](const std::function<void(Communicator&)>& call) {
    RunReport rep = run_spmd(opts(4), [&](RankContext& ctx) {
      if (ctx.rank() == 1) call(ctx.world());
    });
    EXPECT_FALSE(rep.ok);
    return rep.failures.empty() ? std::string() : rep.failures[0].message;
  };
  int64_t v = 0;
  EXPECT_NE(first_failure([&](Communicator& c) { c.send(&v, 1, DType::kInt64, 4); })
                .find("OutOfRange: send peer 4 is out of range [0, 4) of group [0, 1, 2, 3]"),
            std::string::npos);
  EXPECT_NE(first_failure([&](Communicator& c) { c.recv(&v, 1, DType::kInt64, 1); })
                .find("OutOfRange: recv peer 1 is this rank itself: a message needs another member of group "
                      "[0, 1, 2, 3]"),
            std::string::npos);
  EXPECT_NE(first_failure([&](Communicator& c) { c.broadcast(&v, 1, DType::kInt64, -1); })
                .find("OutOfRange: broadcast root -1 is out of range [0, 4) of group [0, 1, 2, 3]"),
            std::string::npos);
}

TEST(SpmdFaults, WatchdogListsWaitersAndMissingRanks) {
  if (kBackend == "fiber") {
    // Every rank is a fiber of one thread, in turn: none can wait in time while the others wait
    // for it, so sleep_for is refused, naming the backend to use instead.
    RunReport rep = run_spmd(opts(4, 300ms), [&](RankContext& ctx) {
      if (ctx.rank() == 1) ctx.sleep_for(10s);
      ctx.world().barrier();
    });
    expect_failure(rep, 1, "error");
    EXPECT_NE(rep.failures[0].message.find("the fiber backend cannot express a rank that waits 10000 ms"),
              std::string::npos) << rep.failures[0].message;
    return;
  }
  RunReport rep = run_spmd(opts(4, 300ms), [&](RankContext& ctx) {
    if (ctx.rank() == 1) ctx.sleep_for(10s);
    ctx.world().barrier();
  });
  expect_failure(rep, 1, "stall");
  EXPECT_EQ(rep.failures[0].missing, std::vector<int64_t>{1});
  EXPECT_EQ(rep.failures[0].waiting, (std::vector<int64_t>{0, 2, 3}));
  EXPECT_NE(rep.failures[0].message.find("barrier"), std::string::npos);
  EXPECT_LT(rep.seconds, 5.0);
}

TEST(SpmdFaults, MeshDisagreementNamesRankAndPart) {
  RunReport rep = run_spmd(opts(4), [&](RankContext& ctx) {
    DeviceMesh m = ctx.rank() == 2 ? DeviceMesh::init({2, 2}, Names{"dp", "cp"})
                                   : DeviceMesh::init({2, 2}, Names{"dp", "tp"});
    ctx.check_mesh_agreement(m);
  });
  expect_failure(rep, 2, "mesh");
  EXPECT_NE(rep.failures[0].message.find("names"), std::string::npos);
}

TEST(SpmdFaults, MeshDisagreementFindsTheMajorityAndOnATieTheLowestRanksMesh) {
  const DeviceMesh a = DeviceMesh::init({2, 3}, Names{"dp", "tp"});
  const DeviceMesh b = DeviceMesh::init({2, 3}, Names{"dp", "cp"});
  const DeviceMesh c = DeviceMesh::init({3, 2}, Names{"dp", "tp"});
  // Three meshes: a (4 ranks) is the majority; ranks 2 and 3 differ, in names and in shape.
  RunReport rep = run_spmd(opts(6), [&](RankContext& ctx) {
    ctx.check_mesh_agreement(ctx.rank() == 2 ? b : ctx.rank() == 3 ? c : a);
  });
  ASSERT_FALSE(rep.ok);
  ASSERT_EQ(rep.failures.size(), 2u) << rep.summary();
  EXPECT_EQ(rep.failures[0].ranks, std::vector<int64_t>{2});
  EXPECT_EQ(rep.failures[1].ranks, std::vector<int64_t>{3});
  EXPECT_NE(rep.failures[0].message.find("ranks [2, 3] built a different mesh than the other ranks': its shape, names"),
            std::string::npos) << rep.failures[0].message;
  // A tie: ranks 0 and 1 built b, ranks 2 and 3 built a; rank 0's mesh is the reference.
  rep = run_spmd(opts(4), [&](RankContext& ctx) { ctx.check_mesh_agreement(ctx.rank() < 2 ? b : a); });
  ASSERT_FALSE(rep.ok);
  ASSERT_EQ(rep.failures.size(), 2u) << rep.summary();
  EXPECT_EQ(rep.failures[0].ranks, std::vector<int64_t>{2});
  EXPECT_EQ(rep.failures[1].ranks, std::vector<int64_t>{3});
  EXPECT_NE(rep.failures[0].message.find("its names differs"), std::string::npos) << rep.failures[0].message;
  // Every rank agrees with every other, none with the recipe: every rank is named.
  rep = run_spmd(opts(3), [&](RankContext& ctx) { ctx.check_mesh_agreement(a, mesh_parts(b)); });
  ASSERT_FALSE(rep.ok);
  ASSERT_EQ(rep.failures.size(), 3u) << rep.summary();
  EXPECT_NE(rep.failures[0].message.find("ranks [0, 1, 2] built a different mesh than the recipe's: its names differs"),
            std::string::npos) << rep.failures[0].message;
}

TEST(SpmdFaults, StuckUserCodeIsReportedNotAwaited) {
  auto flag = std::make_shared<std::atomic<bool>>(false);
  auto passed = std::make_shared<std::atomic<bool>>(false);
  SpmdOptions o = opts(2, 200ms);
  o.grace = 200ms;
  RunReport rep = run_spmd(o, [flag, passed](RankContext& ctx) {
    ctx.world().barrier();  // both ranks are past connecting before rank 0 fails
    if (ctx.rank() == 0) {
      // Fail only once rank 1 is out of the barrier (a backend that completes collectives
      // asynchronously could otherwise abort rank 1 inside it, before it gets stuck).
      for (int i = 0; i < 5000 && !passed->load(); ++i) std::this_thread::sleep_for(1ms);
      throw InvalidArgument("first");
    }
    passed->store(true);
    while (!flag->load()) std::this_thread::sleep_for(1ms);  // ignores the abort
  });
  EXPECT_FALSE(rep.ok);
  EXPECT_EQ(rep.ranks[1].status, RankStatus::kStuck);
  flag->store(true);
}

// The threaded backend's own argument checks (the other backends' are in their own files).
#ifndef MESHSIM_TEST_OTHER_BACKEND
TEST(ThreadedBackend, RejectsBadGroupsAndArguments) {
  ThreadedBackend b({.world_size = 4});
  EXPECT_THROW(b.new_group(0, std::vector<int64_t>{1, 2}, {}), InvalidArgument);
  EXPECT_THROW(b.new_group(1, std::vector<int64_t>{1, 1}, {}), InvalidArgument);
  EXPECT_THROW(b.new_group(1, std::vector<int64_t>{1, 9}, {}), OutOfRange);
  EXPECT_THROW(b.new_group(9, std::vector<int64_t>{9}, {}), OutOfRange);
  EXPECT_THROW(b.new_group(0, std::vector<int64_t>{0}, BackendConfig{.backend = "nccl"}), InvalidArgument);
  EXPECT_THROW(ThreadedBackend({.world_size = 0}), InvalidArgument);
  auto solo = b.new_group(0, std::vector<int64_t>{0}, {});
  int64_t x = 1;
  EXPECT_THROW(solo->all_reduce(&x, -1, DType::kInt64, ReduceOp::kSum), InvalidArgument);
  EXPECT_THROW(solo->broadcast(&x, 1, DType::kInt64, 1), OutOfRange);
}
#endif

}  // namespace
}  // namespace meshsim
