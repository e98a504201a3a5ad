// Local mode: values stored compactly, groups reconstructed from the layout, collectives group by
// group with the threaded backend's results and diagnoses.
#include "meshsim/local.hpp"

#include <gtest/gtest.h>

#include <numeric>

namespace meshsim {
namespace {

using Names = std::vector<std::string>;
using V = std::vector<int64_t>;

TEST(LocalGroups, AreTheMeshGroupsWithTheirInverse) {
  const DeviceMesh m = DeviceMesh::from_ranks(V{2, 3}, V{10, 4, 7, 0, 2, 9}, Names{"dp", "tp"}, {.world_size = 12});
  for (int d = 0; d < 2; ++d) {
    LocalGroups g(m, d);
    const auto rows = m.groups(d);
    ASSERT_EQ(g.count(), static_cast<int64_t>(rows.size()));
    EXPECT_EQ(g.size(), m.size(d));
    for (int64_t k = 0; k < g.count(); ++k) {
      std::span<const int64_t> members = g.group(k);
      EXPECT_EQ(V(members.begin(), members.end()), rows[static_cast<std::size_t>(k)]);
      for (std::size_t i = 0; i < members.size(); ++i) {
        auto where = g.of(members[i]);
        ASSERT_TRUE(where.has_value());
        EXPECT_EQ(where->first, k);
        EXPECT_EQ(where->second, static_cast<int64_t>(i));
      }
    }
    EXPECT_FALSE(g.of(1).has_value());   // in the world, not in the mesh
    EXPECT_FALSE(g.of(11).has_value());
    EXPECT_FALSE(g.of(-1).has_value());
  }
}

TEST(LocalWorld, CoordinatesAndLocalRanksOfEveryRankMatchTheMesh) {
  const DeviceMesh m = DeviceMesh::from_ranks(V{2, 3, 2}, V{10, 4, 7, 0, 2, 9, 1, 3, 5, 6, 8, 11}, Names{"dp", "cp", "tp"},
                                              {.world_size = 14});
  LocalWorld w(14);
  const auto coords = w.coordinates(m);
  ASSERT_EQ(coords.size(), 3u);
  for (int64_t r = 0; r < 14; ++r) {
    const auto c = m.coordinate(r);
    for (int d = 0; d < 3; ++d) {
      EXPECT_EQ(coords[static_cast<std::size_t>(d)].at(r), c ? (*c)[static_cast<std::size_t>(d)] : -1) << r << " dim " << d;
      if (c) EXPECT_EQ(coords[static_cast<std::size_t>(d)].at(r), *m.local_rank(r, d)) << r;
    }
  }
  EXPECT_THROW(LocalWorld(4).local_ranks(LocalGroups(m, 0)), OutOfRange);
}

TEST(LocalWorld, AllReduceIsStoredOncePerGroupAndMatchesByHand) {
  const DeviceMesh m = DeviceMesh::init({4, 8}, Names{"dp", "tp"});
  LocalWorld w(32);
  auto tp = std::make_shared<const LocalGroups>(m, 1);
  const auto x = LocalValue<int64_t>::affine(32, 1, 1);  // rank + 1
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kAvg}) {
    const LocalValue<int64_t> r = w.all_reduce(tp, x, op);
    EXPECT_EQ(r.stored(), 4);  // one value per tp group, not one per rank
    for (int64_t rank = 0; rank < 32; ++rank) {
      const int64_t lo = rank / 8 * 8 + 1, hi = lo + 7;
      int64_t sum = 0, prod = 1;
      for (int64_t v = lo; v <= hi; ++v) {
        sum += v;
        prod *= v;
      }
      const int64_t want = op == ReduceOp::kSum ? sum : op == ReduceOp::kProd ? prod
                         : op == ReduceOp::kMin ? lo : op == ReduceOp::kMax ? hi : sum / 8;
      EXPECT_EQ(r.at(rank), want) << to_string(op) << " rank " << rank;
    }
  }
  EXPECT_EQ(w.collectives(), 5 * 32);
  EXPECT_EQ(LocalValue<int64_t>::constant(1 << 20, 7).stored(), 1);
  EXPECT_EQ(LocalValue<int64_t>::affine(1 << 20, 0, 1).stored(), 2);
}

TEST(LocalWorld, AllGatherOverALargeDimHoldsOneValuePerRank) {
  // 2^16 ranks, tp = 1024: every member receives its group's 1024 values, held once per group.
  const DeviceMesh m = DeviceMesh::init({64, 1024}, Names{"dp", "tp"});
  LocalWorld w(m.rank_map_size());
  LocalGroups tp(m, 1);
  const auto rows = w.all_gather(tp, LocalValue<int64_t>::affine(m.rank_map_size(), 0, 1));
  int64_t held = 0;
  for (const auto& r : rows) held += static_cast<int64_t>(r.size());
  EXPECT_EQ(held, m.rank_map_size());
  EXPECT_EQ(rows[3][5], 3 * 1024 + 5);
}

TEST(LocalWorld, AbsentAndMismatchedRanksAreNamed) {
  const DeviceMesh m = DeviceMesh::init({2, 4}, Names{"dp", "tp"});
  LocalWorld w(8);
  auto tp = std::make_shared<const LocalGroups>(m, 1);
  const auto x = LocalValue<int64_t>::constant(8, 1);
  try {
    w.all_reduce(tp, x, ReduceOp::kSum, LocalCall{.absent = {6}});
    FAIL() << "an absent rank must fail the collective";
  } catch (const LocalFailure& f) {
    EXPECT_EQ(to_string(f.diagnosis.kind), "departed");
    EXPECT_EQ(f.diagnosis.ranks, V{6});
    EXPECT_NE(f.diagnosis.message.find("rank 6 ended its program"), std::string::npos) << f.what();
  }
  try {
    w.all_gather(*tp, x, LocalCall{.count_of = {{2, 3}}});
    FAIL() << "a different count must fail the collective";
  } catch (const LocalFailure& f) {
    EXPECT_EQ(to_string(f.diagnosis.kind), "mismatch");
    EXPECT_EQ(f.diagnosis.ranks, V{2});
    EXPECT_NE(f.diagnosis.message.find("count=3"), std::string::npos) << f.what();
    EXPECT_NE(f.diagnosis.message.find("count=1"), std::string::npos) << f.what();
  }
  // A rank outside every group of the dim does not take part and so is never absent.
  EXPECT_NO_THROW(w.all_reduce(tp, x, ReduceOp::kSum, LocalCall{.absent = {100}}));
  EXPECT_THROW(w.barrier(*tp, LocalCall{.absent = {1}}), LocalFailure);
  EXPECT_THROW(w.broadcast(tp, x, 4), OutOfRange);
  EXPECT_THROW(w.reduce_scatter(*tp, LocalBuffers<int64_t>(8, 6), ReduceOp::kSum), InvalidArgument);
  EXPECT_THROW(w.all_to_all(*tp, LocalBuffers<int64_t>(8, 3)), InvalidArgument);
  EXPECT_THROW(LocalWorld(0), InvalidArgument);
  EXPECT_THROW(LocalWorld(kMaxLocalWorld + 1), InvalidArgument);
}

}  // namespace
}  // namespace meshsim
