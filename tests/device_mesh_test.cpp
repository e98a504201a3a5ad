// DeviceMesh: PyTorch's documented behaviours, then meshsim's deliberate differences.
#include "meshsim/device_mesh.hpp"

#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>
#include <thread>
#include <unordered_set>

#include "meshsim/error.hpp"
#include "meshsim/mesh_json.hpp"
#include "test_util.hpp"

namespace meshsim {
namespace {

using meshsim::testing::expect_throws_with;
using meshsim::testing::L;
using Rows = std::vector<std::vector<int64_t>>;
using V = std::vector<int64_t>;
using Names = std::vector<std::string>;

DeviceMesh mesh_3d() { return DeviceMesh::init({2, 2, 2}, Names{"dp", "cp", "tp"}); }

Rows groups_by_name(const DeviceMesh& m, const std::string& name) {
  return m.groups(m.dim_index(name));
}

// --- construction -----------------------------------------------------------------------------

TEST(DeviceMeshInit, TwoByFourGroupsPerDim) {
  DeviceMesh m = DeviceMesh::init({2, 4}, Names{"dp", "tp"});
  EXPECT_EQ(m.layout(), L("(2,4):(4,1)"));
  EXPECT_EQ(m.shape(), (V{2, 4}));
  EXPECT_EQ(m.ndim(), 2);
  EXPECT_EQ(m.size(), 8);
  EXPECT_EQ(groups_by_name(m, "dp"), (Rows{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(groups_by_name(m, "tp"), (Rows{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(m.to_string(), "DeviceMesh((dp=2, tp=4), 'cpu', stride=(4, 1))");
  // PyTorch 2.13's repr: each dim's coalesced strides, () for a size-1 dim, a tuple for a dim
  // of several modes, a Python one-tuple for one dim.
  const DeviceMesh w = DeviceMesh::init({2, 1, 2, 2}, Names{"a", "b", "c", "d"});
  EXPECT_EQ(w.to_string(), "DeviceMesh((a=2, b=1, c=2, d=2), 'cpu', stride=(4, (), 2, 1))");
  EXPECT_EQ(w.slice("a").to_string(), "DeviceMesh((a=2), 'cpu', stride=(4,))");
  EXPECT_EQ(w.slice(std::vector<std::string>{"a", "d"}).flatten("ad").to_string(), "DeviceMesh((ad=4), 'cpu', stride=((4, 1),))");
  EXPECT_EQ(w.slice(std::vector<std::string>{"c", "d"}).flatten("cd").to_string(), "DeviceMesh((cd=4), 'cpu', stride=(1,))");
}

TEST(DeviceMeshInit, TwoByTwoByTwoGroupsEqualSwapdimsReshape) {
  DeviceMesh m = mesh_3d();
  // Brute force: rows of arange(8).view(2,2,2).swapdims(-1, d).reshape(-1, 2).
  for (int d = 0; d < 3; ++d) {
    Rows want;
    const int64_t stride = int64_t{1} << (2 - d);
    std::vector<bool> used(8, false);
    for (int64_t r = 0; r < 8; ++r) {
      if (used[r]) continue;
      want.push_back({r, r + stride});
      used[r] = used[r + stride] = true;
    }
    EXPECT_EQ(m.groups(d), want) << "dim " << d;
  }
}

TEST(DeviceMeshInit, CoordinatesAndLocalRankFollowRowMajorOrder) {
  DeviceMesh m = mesh_3d();
  for (int64_t r = 0; r < 8; ++r) {
    EXPECT_EQ(m.coordinate(r), (V{r / 4, (r / 2) % 2, r % 2}));
    EXPECT_EQ(m.local_rank(r, 2), r % 2);
    EXPECT_EQ(m.local_rank(r, 1), r % 4 <= 1 ? 0 : 1);
    EXPECT_EQ(m.local_rank(r, 0), r / 4);
  }
  EXPECT_EQ(m.coordinate(8), std::nullopt);
}

TEST(DeviceMeshInit, ExplicitRankMapEightToFifteen) {
  V ranks(8);
  std::iota(ranks.begin(), ranks.end(), 8);
  V shape{2, 4};
  DeviceMesh m = DeviceMesh::from_ranks(shape, ranks, Names{"dp", "tp"}, {.world_size = 16});
  EXPECT_EQ(m.rank_map(), ranks);
  EXPECT_EQ(groups_by_name(m, "dp"), (Rows{{8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(m.coordinate(13), (V{1, 1}));
  EXPECT_EQ(m.coordinate(3), std::nullopt);
  // One copy: every rank sees the whole mesh, as in PyTorch.
  EXPECT_EQ(m.mesh_for(3)->values, ranks);
  DeviceMesh tp = m.slice("tp");
  EXPECT_EQ(tp.mesh_for(13)->values, (V{12, 13, 14, 15}));
  EXPECT_EQ(tp.mesh_for(3), std::nullopt);  // two copies, neither holds rank 3
}

TEST(DeviceMeshInit, SparseAndLargeRanks) {
  V shape{2, 2};
  V ranks{2048, 4095, 7, 1'000'000'000'000};
  DeviceMesh m = DeviceMesh::from_ranks(shape, ranks, Names{"a", "b"});
  EXPECT_EQ(m.coordinate(1'000'000'000'000), (V{1, 1}));
  EXPECT_EQ(m.group_of(4095, 0), (V{4095, 1'000'000'000'000}));
  EXPECT_EQ(m.coordinate(2049), std::nullopt);
}

TEST(DeviceMeshInit, TransposedExplicitMeshGetsRowMajorLayoutOverPermutedRankMap) {
  V shape{2, 2};
  V ranks{0, 2, 1, 3};  // arange(4).view(2,2).T
  DeviceMesh m = DeviceMesh::from_ranks(shape, ranks, Names{"a", "b"});
  EXPECT_EQ(m.layout(), L("(2,2):(2,1)"));
  EXPECT_EQ(m.groups(1), (Rows{{0, 2}, {1, 3}}));
  EXPECT_EQ(m.groups(0), (Rows{{0, 1}, {2, 3}}));
}

TEST(DeviceMeshInit, RejectsBadInputWithPyTorchMessages) {
  expect_throws_with<InvalidArgument>([] { DeviceMesh::init({2, 4}, Names{"dp", "dp"}); },
                                      "Each mesh_dim_name must be unique.");
  expect_throws_with<InvalidArgument>([] { DeviceMesh::init({2, 4}, Names{"dp"}); },
                                      "mesh_shape and mesh_dim_names should have same length!");
  expect_throws_with<InvalidArgument>(
      [] { DeviceMesh::init({2, 4}, Names{"dp", "tp"}, {.device_type = "cuda:0"}); },
      "Device type with index is not supported");
  expect_throws_with<InvalidArgument>(
      [] { DeviceMesh::init({4, 4}, std::nullopt, {.world_size = 8}); },
      "Mesh should not be bigger than default world size 8, but found 16 ranks!");
  expect_throws_with<InvalidArgument>([] { DeviceMesh::init({2, 0}); }, "mesh size 0");
  expect_throws_with<OverflowError>(
      [] { DeviceMesh::init({int64_t{1} << 32, int64_t{1} << 32}); }, "overflow");
  // Sizes are read left to right, each checked, the product as it grows: the overflow is found
  // before the 0 that follows it.
  expect_throws_with<OverflowError>(
      [] { DeviceMesh::init({int64_t{1} << 32, int64_t{1} << 32, 0}); }, "mesh size");
  expect_throws_with<InvalidArgument>(
      [] { DeviceMesh::init({0, int64_t{1} << 32, int64_t{1} << 32}); }, "mesh size 0");
  V shape{4};
  expect_throws_with<InvalidArgument>(
      [&] { DeviceMesh::from_ranks(shape, V{0, 1, 1, 2}); },
      "rank 1 appears twice in the mesh (PyTorch finds it later: rank_coords.size(0) must be 0 or 1");
  expect_throws_with<InvalidArgument>([&] { DeviceMesh::from_ranks(shape, V{0, -1, 2, 3}); },
                                      "rank -1 at mesh position 1 is negative");
  expect_throws_with<OutOfRange>(
      [&] { DeviceMesh::from_ranks(shape, V{0, 1, 2, 9}, std::nullopt, {.world_size = 8}); },
      "rank 9 at mesh position 3 is out of range [0, 8)");
  expect_throws_with<InvalidArgument>([&] { DeviceMesh::from_ranks(shape, V{0, 1, 2}); },
                                      "holds 4 ranks but 3 were given");
}

TEST(DeviceMeshInit, RepeatedNamesNameTheSmallestRepeatedOne) {
  // A few names are compared pairwise, many are sorted: both name the same repeated name.
  expect_throws_with<InvalidArgument>(
      [] { DeviceMesh::init({1, 1, 1, 1}, Names{"tp", "cp", "tp", "cp"}); }, "'cp' appears twice");
  V shape(20, 1);
  Names many;
  for (int i = 0; i < 20; ++i) many.push_back("n" + std::to_string(i));
  many[19] = "n7";
  many[18] = "n3";
  expect_throws_with<InvalidArgument>([&] { DeviceMesh::init(shape, many); }, "'n3' appears twice");
  many.resize(16);
  many[15] = "n9";
  many[14] = "n2";
  shape.resize(16);
  expect_throws_with<InvalidArgument>([&] { DeviceMesh::init(shape, many); }, "'n2' appears twice");
}

TEST(DeviceMeshInit, AbsurdlyManyDimsAreRejectedNotQuadratic) {
  std::vector<int64_t> ones(100000, 1);
  expect_throws_with<InvalidArgument>([&] { DeviceMesh::init(ones); }, "exceed the limit of 256");
  DeviceMesh w = DeviceMesh::init({1}, Names{"w"});
  Names many(100000);
  for (std::size_t i = 0; i < many.size(); ++i) many[i] = "n" + std::to_string(i);
  expect_throws_with<InvalidArgument>([&] { w.unflatten(0, ones, many); }, "exceed the limit");
  std::vector<int64_t> max_ones(static_cast<std::size_t>(kMaxMeshDims), 1);
  EXPECT_EQ(DeviceMesh::init(max_ones).ndim(), kMaxMeshDims);
}

TEST(DeviceMeshInit, RanksNearInt64MaxNeitherWrapNorCollide) {
  V shape{3};
  V ranks{INT64_MAX, 0, INT64_MAX - 1};
  DeviceMesh m = DeviceMesh::from_ranks(shape, ranks);
  EXPECT_EQ(m.coordinate(INT64_MAX), (V{0}));
  EXPECT_EQ(m.coordinate(INT64_MAX - 1), (V{2}));
  EXPECT_EQ(m.coordinate(INT64_MIN), std::nullopt);
  EXPECT_EQ(m.rank_map_start(), std::nullopt);
  V run{INT64_MAX - 2, INT64_MAX - 1, INT64_MAX};
  EXPECT_EQ(DeviceMesh::from_ranks(shape, run).rank_map_start(), INT64_MAX - 2);
}

TEST(DeviceMeshInit, DuplicateInSparseRankMapIsFound) {
  V shape{3};
  expect_throws_with<InvalidArgument>(
      [&] { DeviceMesh::from_ranks(shape, V{5, int64_t{1} << 50, 5}); }, "rank 5 appears twice");
}

// --- slicing -----------------------------------------------------------------------------------

TEST(DeviceMeshSlice, SliceOfTwoByFourIsRowOrColumnOfTheRank) {
  DeviceMesh m = DeviceMesh::init({2, 4}, Names{"dp", "tp"});
  DeviceMesh tp = m.slice("tp");
  EXPECT_EQ(tp.layout(), L("(4):(1)"));
  EXPECT_EQ(tp.mesh_for(5)->values, (V{4, 5, 6, 7}));
  DeviceMesh dp = m.slice("dp");
  EXPECT_EQ(dp.layout(), L("(2):(4)"));
  EXPECT_EQ(dp.mesh_for(5)->values, (V{1, 5}));
  EXPECT_EQ(dp.coordinate(5), (V{1}));
  EXPECT_EQ(dp.copies(), 4);
}

TEST(DeviceMeshSlice, NonContiguousDpTp) {
  DeviceMesh dp_tp = mesh_3d().slice({"dp", "tp"});
  EXPECT_EQ(dp_tp.layout(), L("(2,2):(4,1)"));
  EXPECT_EQ(dp_tp.mesh_for(2)->values, (V{2, 3, 6, 7}));
  EXPECT_EQ(dp_tp.coordinate(6), (V{1, 0}));
  EXPECT_EQ(groups_by_name(dp_tp, "dp"), (Rows{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

TEST(DeviceMeshSlice, OwnNamesReturnSelfAndSliceOfSliceEqualsSliceOfRoot) {
  DeviceMesh m = mesh_3d();
  EXPECT_EQ(m.slice({"dp", "cp", "tp"}), m);
  EXPECT_EQ(m.slice({"dp", "tp"}).slice("tp"), m.slice("tp"));
}

TEST(DeviceMeshSlice, ErrorsNameTheRule) {
  DeviceMesh m = mesh_3d();
  // PyTorch 2.13's classes: KeyError for the order, RuntimeError for an overlap.
  expect_throws_with<NotFound>([&] { m.slice({"cp", "dp"}); },
                               "Mesh dim indices should be in ascending order");
  expect_throws_with<FailedPrecondition>([&] { m.slice({"dp", "dp"}); },
                                      "Slicing overlapping dim_names ('dp', 'dp')");
  expect_throws_with<NotFound>([&] { m.slice("pp"); },
                               "Invalid mesh_dim_names ('pp',) specified. Valid mesh_dim_names "
                               "are ['dp', 'cp', 'tp'].");
  expect_throws_with<FailedPrecondition>([] { DeviceMesh::init({2, 2}).slice("a"); },
                                         "Cannot slice a DeviceMesh without mesh_dim_names!");
  // Flattened names are visible from the root only.
  m.slice({"dp", "cp"}).flatten();
  expect_throws_with<NotFound>([&] { m.slice("tp").slice("dp_cp"); }, "Invalid mesh_dim_names");
}

// --- flatten -----------------------------------------------------------------------------------

TEST(DeviceMeshFlatten, ContiguousAndNonContiguous) {
  DeviceMesh m = mesh_3d();
  DeviceMesh dp_cp = m.slice({"dp", "cp"}).flatten();
  EXPECT_EQ(*dp_cp.names(), (Names{"dp_cp"}));
  EXPECT_EQ(dp_cp.layout(), L("4:2"));
  EXPECT_EQ(dp_cp.groups(0), (Rows{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  DeviceMesh dp_tp = m.slice({"dp", "tp"}).flatten();
  EXPECT_EQ(dp_tp.layout(), L("((2,2)):((4,1))"));
  EXPECT_EQ(dp_tp.groups(0), (Rows{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(m.flattened_names(), (Names{"dp_cp", "dp_tp"}));
  // The root slices a flattened name, a non-contiguous one too where the collapsed layout's
  // strides still descend (PyTorch 2.13: (2,2,2):(4,1,2) does not: KeyError).
  DeviceMesh s = m.slice({"dp_cp", "tp"});
  EXPECT_EQ(s.layout(), L("(4,2):(2,1)"));
  EXPECT_EQ(m.slice("dp_tp").groups(0), (Rows{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  expect_throws_with<NotFound>([&] { m.slice({"dp_tp", "cp"}); }, "Mesh dim indices should be in ascending order");
}

TEST(DeviceMeshFlatten, ReconstructWithFlattenedDim) {
  DeviceMesh m = DeviceMesh::init({2, 2, 2}, Names{"replicate", "shard", "cp"});
  m.slice({"shard", "cp"}).flatten();
  DeviceMesh h = m.slice({"replicate", "shard_cp"});
  EXPECT_EQ(h.groups(1), (Rows{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(h.groups(0), (Rows{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

TEST(DeviceMeshFlatten, SameNameSameLayoutReturnsEqualMeshOtherLayoutThrows) {
  DeviceMesh m = mesh_3d();
  DeviceMesh a = m.slice({"dp", "cp"}).flatten("x");
  DeviceMesh b = m.slice({"dp", "cp"}).flatten("x");
  EXPECT_EQ(a, b);
  expect_throws_with<AlreadyExists>([&] { m.slice({"cp", "tp"}).flatten("x"); },
                                    "Flatten mesh with mesh_dim_name x has been created before");
  expect_throws_with<AlreadyExists>([&] { m.flatten("dp"); },
                                    "dp already exists for submesh of the DeviceMesh(");
  expect_throws_with<FailedPrecondition>([] { DeviceMesh::init({4}).flatten(); },
                                         "Cannot flatten a DeviceMesh without mesh_dim_names!");
  EXPECT_EQ(m.slice("tp").flatten(), m.slice("tp"));  // 1-D into its own name: itself
}

TEST(DeviceMeshFlatten, SlicingAFlattenedDimFromTheRootIsNamedForItsWarning) {
  DeviceMesh m = mesh_3d();  // dp=2, cp=2, tp=2
  m.slice({"dp", "cp"}).flatten();
  EXPECT_EQ(m.flattened_from_root(Names{"dp_cp", "tp"}), (Names{"dp_cp"}));
  EXPECT_EQ(m.flattened_from_root(Names{"dp", "tp"}), Names{});
  // Only a root resolves flattened names; a view refuses them (so there is nothing to warn of).
  EXPECT_EQ(m.slice({"dp", "cp"}).flattened_from_root(Names{"dp_cp"}), Names{});
  EXPECT_NE(flattened_slice_warning("dp_cp").find("'dp_cp'"), std::string::npos);
  EXPECT_NE(flattened_slice_warning("dp_cp").find("pytorch/pytorch#164993"), std::string::npos);
  // A name of any length is quoted clipped, as errors quote input.
  EXPECT_LT(flattened_slice_warning(std::string(1 << 20, 'x')).size(), 1000u);
}

TEST(DeviceMeshFlatten, FindFlattenedTellsEqualSizesApartByLayout) {
  // dp_cp and cp_tp both hold 4 ranks; a lookup by size cannot tell them apart. Over the 2x2x2
  // mesh (strides 4, 2, 1), dp_cp is 4:2 (ranks {0,2,4,6}, {1,3,5,7}) and cp_tp 4:1 ({0..3}, {4..7}).
  DeviceMesh m = mesh_3d();
  m.slice({"dp", "cp"}).flatten();
  m.slice({"cp", "tp"}).flatten();
  const std::optional<DeviceMesh> dp_cp = m.find_flattened(Names{"dp", "cp"});
  ASSERT_TRUE(dp_cp.has_value());
  EXPECT_EQ(dp_cp->names(), (Names{"dp_cp"}));
  EXPECT_EQ(dp_cp->groups(0), (Rows{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  const std::optional<DeviceMesh> cp_tp = m.find_flattened(Names{"cp", "tp"});
  ASSERT_TRUE(cp_tp.has_value());
  EXPECT_EQ(cp_tp->names(), (Names{"cp_tp"}));
  EXPECT_EQ(cp_tp->groups(0), (Rows{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_FALSE(m.find_flattened(Names{"dp", "tp"}).has_value());  // never flattened
  // From a view, by the view's own dims; the result is the mesh the flatten made.
  EXPECT_EQ(*m.slice({"dp", "cp"}).find_flattened(Names{"dp", "cp"}), m.slice({"dp", "cp"}).flatten());
  // Under another name, the same layout is found by it (the first name registered).
  DeviceMesh other = mesh_3d();
  other.slice({"dp", "cp"}).flatten("batch");
  EXPECT_EQ(other.find_flattened(Names{"dp", "cp"})->names(), (Names{"batch"}));
  // The dims follow slice's rules and errors.
  expect_throws_with<NotFound>([&] { m.find_flattened(Names{"dp", "zz"}); }, "Invalid mesh_dim_names");
  expect_throws_with<NotFound>([&] { m.find_flattened(Names{"tp", "dp"}); }, "ascending order");
}

TEST(DeviceMeshFlatten, AnAllSizeOneFlattenedDimSlicesWithTheOthers) {
  // torchtitan with dp_shard=1, cp=1 (what pytorch/pytorch#169454 fixed: PyTorch 2.10 refused
  // these slices, "Mesh dim indices should be in ascending order"). Over (2,1,1,4) with strides
  // (4,4,4,1): dp_replicate groups {r, r+4}, tp groups of 4 consecutive ranks, the size-1 dim
  // one rank each.
  DeviceMesh m = DeviceMesh::init({2, 1, 1, 4}, Names{"dp_replicate", "dp_shard", "cp", "tp"});
  m.slice({"dp_shard", "cp"}).flatten();
  const DeviceMesh v = m.slice({"dp_replicate", "dp_shard_cp", "tp"});
  EXPECT_EQ(v.shape(), (V{2, 1, 4}));
  EXPECT_EQ(v.groups(0), (Rows{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(v.groups(1), (Rows{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(v.groups(2), (Rows{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(m.slice({"dp_shard_cp", "tp"}).groups(1), (Rows{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  m.slice({"dp_replicate", "dp_shard", "cp"}).flatten("dp");
  EXPECT_EQ(m.slice({"dp", "tp"}).groups(0), (Rows{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

TEST(DeviceMeshFlatten, AllSizeOneMesh) {
  DeviceMesh m = DeviceMesh::init({1, 1, 1}, Names{"a", "b", "c"});
  DeviceMesh f = m.flatten();
  EXPECT_EQ(f.layout(), L("1:1"));
  EXPECT_EQ(m.slice({"a", "c"}).shape(), (V{1, 1}));
  EXPECT_EQ(f.groups(0), (Rows{{0}}));
}

// --- unflatten ---------------------------------------------------------------------------------

TEST(DeviceMeshUnflatten, EightRankWorld) {
  DeviceMesh w = DeviceMesh::init({8}, Names{"world"});
  DeviceMesh m = w.unflatten(0, V{2, 2, 2}, Names{"dp", "cp", "tp"});
  EXPECT_EQ(m.layout(), L("(2,2,2):(4,2,1)"));
  EXPECT_EQ(groups_by_name(m, "cp"), (Rows{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  DeviceMesh n = w.unflatten("world", V{2, 2, 2}, Names{"dp", "ep", "ep_tp"});
  EXPECT_EQ(groups_by_name(n, "ep"), groups_by_name(m, "cp"));
  // The root cannot slice unflattened names.
  expect_throws_with<NotFound>([&] { w.slice("dp"); }, "Invalid mesh_dim_names");
}

TEST(DeviceMeshUnflatten, CanonicalLayoutZeroesSizeOneStridesAndKeepsOtherDims) {
  // A root's canonical form is its row-major layout with size-1 strides zeroed (1:x coalesces to
  // 1:0); unflatten recomputes only the new dims' forms and keeps the others'.
  DeviceMesh root = DeviceMesh::init({8, 1, 2}, Names{"a", "b", "c"});
  EXPECT_EQ(root.layout(), L("(8,1,2):(2,2,1)"));
  EXPECT_EQ(root.canonical_layout(), L("(8,1,2):(2,0,1)"));
  DeviceMesh m = root.unflatten(0, V{2, 1, 4}, Names{"x", "y", "z"});
  EXPECT_EQ(m.canonical_layout(), L("(2,1,4,1,2):(8,0,2,0,1)"));
  // Equal to the same dims reached another way: a root of that shape over the same ranks is
  // another universe, so compare with a slice of an unflatten of the flattened root.
  DeviceMesh again = root.flatten("abc").unflatten(0, V{2, 1, 4, 1, 2}, Names{"x", "y", "z", "b2", "c2"});
  EXPECT_EQ(again.canonical_layout(), m.canonical_layout());
}

TEST(DeviceMeshUnflatten, NonContiguousFlattenedDimRecoversTheDims) {
  DeviceMesh m = mesh_3d();
  DeviceMesh back = m.slice({"dp", "tp"}).flatten().unflatten(0, V{2, 2}, Names{"a", "b"});
  EXPECT_EQ(back.layout(), L("(2,2):(4,1)"));
  EXPECT_EQ(back.groups(0), groups_by_name(m, "dp"));
  EXPECT_EQ(back.groups(1), groups_by_name(m, "tp"));
}

TEST(DeviceMeshUnflatten, KeepsOtherDimsAndSizeOneDims) {
  DeviceMesh m = DeviceMesh::init({2, 4}, Names{"dp", "tp"});
  DeviceMesh u = m.unflatten(0, V{2, 1}, Names{"a", "b"});
  EXPECT_EQ(u.layout(), L("(2,1,4):(4,4,1)"));
  EXPECT_EQ(u.groups(2), groups_by_name(m, "tp"));
  EXPECT_EQ(u.groups(1), (Rows{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
}

TEST(DeviceMeshUnflatten, ErrorsNameTheRule) {
  DeviceMesh w = DeviceMesh::init({8}, Names{"world"});
  // PyTorch 2.13 raises ValueError for each (InvalidArgument is one in Python).
  expect_throws_with<InvalidArgument>([&] { w.unflatten(1, V{2, 4}, Names{"a", "b"}); },
                                      "dim 1 specified in `_unflatten` is out of range 1");
  expect_throws_with<InvalidArgument>([&] { w.unflatten(-1, V{2, 4}, Names{"a", "b"}); },
                                      "negative dims are not accepted");
  expect_throws_with<InvalidArgument>([&] { w.unflatten("x", V{2, 4}, Names{"a", "b"}); },
                                      "dim x specified in `_unflatten` is not in ('world',)");
  // An unnamed mesh: the same class and message by name as by index.
  DeviceMesh unnamed = DeviceMesh::init({8});
  expect_throws_with<FailedPrecondition>([&] { unnamed.unflatten("x", V{2, 4}, Names{"a", "b"}); },
                                         "Cannot unflatten a DeviceMesh without mesh_dim_names!");
  expect_throws_with<FailedPrecondition>([&] { unnamed.unflatten(0, V{2, 4}, Names{"a", "b"}); },
                                         "Cannot unflatten a DeviceMesh without mesh_dim_names!");
  expect_throws_with<InvalidArgument>([&] { w.unflatten(0, V{2, 4}, Names{"a"}); },
                                      "mesh_dim_names must have same length as mesh_sizes");
  expect_throws_with<InvalidArgument>(
      [&] { w.unflatten(0, V{2, 3}, Names{"a", "b"}); },
      "The product of mesh_sizes=(2, 3) is 6, but the original dimension at dim=0 has size 8.");
  expect_throws_with<InvalidArgument>([&] { w.unflatten(0, V{4}, Names{"a"}); },
                                      "The product of mesh_sizes=(4,) is 4");
  expect_throws_with<InvalidArgument>([&] { w.unflatten(0, V{8, 0}, Names{"a", "b"}); },
                                      "mesh size 0");
  expect_throws_with<OverflowError>(
      [&] { w.unflatten(0, V{int64_t{1} << 40, int64_t{1} << 40}, Names{"a", "b"}); },
      "overflow");
  // meshsim difference: names stay unique after unflatten.
  DeviceMesh m = DeviceMesh::init({2, 4}, Names{"dp", "tp"});
  expect_throws_with<InvalidArgument>([&] { m.unflatten(1, V{2, 2}, Names{"dp", "x"}); },
                                      "Each mesh_dim_name must be unique");
}

// --- concatenate -------------------------------------------------------------------------------

TEST(DeviceMeshConcatenate, SlicesRebuildTheRoot) {
  DeviceMesh m = DeviceMesh::init({2, 2, 2}, Names{"pp", "dp", "tp"});
  std::vector<DeviceMesh> parts{m.slice({"pp", "dp"}), m.slice("tp")};
  DeviceMesh c = DeviceMesh::concatenate(parts);
  EXPECT_EQ(c, m);
  EXPECT_TRUE(equivalent(c, m));
  for (int d = 0; d < 3; ++d) EXPECT_EQ(c.groups(d), m.groups(d));
}

TEST(DeviceMeshConcatenate, AcceptsStrideOrderSlicingRejects) {
  DeviceMesh m = DeviceMesh::init({2, 4}, Names{"dp", "tp"});
  std::vector<DeviceMesh> parts{m.slice("tp"), m.slice("dp")};
  DeviceMesh c = DeviceMesh::concatenate(parts);
  EXPECT_EQ(c.layout(), L("(4,2):(1,4)"));
  EXPECT_EQ(c.mesh_for(0)->values, (V{0, 4, 1, 5, 2, 6, 3, 7}));
  EXPECT_EQ(c.coordinate(5), (V{1, 1}));
}

TEST(DeviceMeshConcatenate, Errors) {
  DeviceMesh m = mesh_3d();
  std::vector<DeviceMesh> overlap{m.slice({"dp", "cp"}), m.slice("cp")};
  expect_throws_with<FailedPrecondition>([&] { DeviceMesh::concatenate(overlap); },
                                      "Cannot concatenate overlapping meshes");
  std::vector<DeviceMesh> other{m.slice("dp"), mesh_3d().slice("tp")};
  expect_throws_with<FailedPrecondition>([&] { DeviceMesh::concatenate(other); },
                                         "Cannot concatenate DeviceMeshes derived from different");
  std::vector<DeviceMesh> none;
  expect_throws_with<InvalidArgument>([&] { DeviceMesh::concatenate(none); }, "at least one");
  std::vector<DeviceMesh> dup{m.slice("dp"), m.slice("cp").unflatten(0, V{2, 1}, Names{"q", "dp"})};
  expect_throws_with<InvalidArgument>([&] { DeviceMesh::concatenate(dup); },
                                      "Each mesh_dim_name must be unique");
}

// --- identity, hashing and the group cache (meshsim) --------------------------------------------

TEST(DeviceMeshLocalRank, IsTheCoordinateNotTheSortedGroupRank) {
  // PyTorch reports the rank inside a c10d group, which sorts its members: on mesh [7..0],
  // rank 7 has local rank 7 there. meshsim keeps mesh order: rank 7 sits at coordinate 0.
  V shape{8};
  V ranks{7, 6, 5, 4, 3, 2, 1, 0};
  DeviceMesh m = DeviceMesh::from_ranks(shape, ranks, Names{"w"});
  EXPECT_EQ(m.groups(0), (Rows{{7, 6, 5, 4, 3, 2, 1, 0}}));
  for (int64_t r = 0; r < 8; ++r) EXPECT_EQ(m.local_rank(r, 0), 7 - r);
}

TEST(DeviceMeshIdentity, IndependentRootsAreDifferentUniversesButEquivalent) {
  DeviceMesh a = mesh_3d();
  DeviceMesh b = mesh_3d();
  EXPECT_NE(a, b);
  EXPECT_TRUE(equivalent(a, b));
  EXPECT_TRUE(equivalent(a.slice("tp"), b.slice("tp")));
  EXPECT_NE(a.slice("tp"), b.slice("tp"));
}

TEST(DeviceMeshIdentity, EqualityUsesTheCanonicalLayout) {
  DeviceMesh m = mesh_3d();
  DeviceMesh f = m.slice({"cp", "tp"}).flatten("f");  // layout 4:1 (int form)
  DeviceMesh s = m.slice("f");                          // layout (4):(1)
  EXPECT_NE(f.layout(), s.layout());
  EXPECT_EQ(f, s);
  EXPECT_EQ(f.hash(), s.hash());
  std::unordered_set<DeviceMesh> set{f, s, m, m.slice("tp")};
  EXPECT_EQ(set.size(), 3u);
}

TEST(DeviceMeshIdentity, NamesArePartOfIdentity) {
  DeviceMesh m = DeviceMesh::init({2, 4}, Names{"dp", "tp"});
  DeviceMesh tp = m.slice("tp");
  DeviceMesh other = m.slice({"dp", "tp"}).unflatten(1, V{4}, Names{"x"}).slice("x");
  EXPECT_EQ(tp.layout(), other.layout());
  EXPECT_NE(tp, other);
  EXPECT_FALSE(equivalent(tp, other));
}

TEST(DeviceMeshCache, UnflattensOfTheWorldShareRecords) {
  DeviceMesh w = DeviceMesh::init({8}, Names{"world"});
  DeviceMesh a = w.unflatten(0, V{2, 2, 2}, Names{"dp", "cp", "tp"});
  DeviceMesh b = w.unflatten(0, V{2, 2, 2}, Names{"dp", "ep", "ep_tp"});
  auto dp_a = a.group_record(0);
  auto tp_a = a.group_record(2);
  EXPECT_EQ(w.cache_stats().misses, 2);
  EXPECT_EQ(b.group_record(0), dp_a);
  EXPECT_EQ(b.group_record(2), tp_a);
  EXPECT_EQ(w.cache_stats().hits, 2);
  EXPECT_NE(b.group_record(1), dp_a);
  EXPECT_EQ(dp_a->rows(), (Rows{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(dp_a->name, "group[2:4]@default");
  // Another backend config is another key.
  BackendConfig gloo{.backend = "gloo", .timeout = std::chrono::milliseconds(5000)};
  auto dp_gloo = a.group_record(0, gloo);
  EXPECT_NE(dp_gloo, dp_a);
  EXPECT_EQ(dp_gloo->rows(), dp_a->rows());
  EXPECT_NE(dp_gloo->name, dp_a->name);
  EXPECT_EQ(a.group_record(0, gloo), dp_gloo);
  // A flattened dim with the same canonical layout as a root dim reuses its record.
  DeviceMesh m = DeviceMesh::init({2, 4}, Names{"dp", "tp"});
  auto tp = m.group_record(1);
  EXPECT_EQ(m.slice({"tp"}).flatten("tp2").group_record(0), tp);
}

TEST(DeviceMeshCache, RecordNamesAreStableAcrossUniverses) {
  DeviceMesh a = mesh_3d();
  DeviceMesh b = mesh_3d();
  EXPECT_EQ(a.group_record(1)->name, b.group_record(1)->name);
  EXPECT_NE(a.group_record(1), b.group_record(1));
}

TEST(DeviceMeshCache, PerDimBackendOverrideFollowsTheDimThroughSlicesAndUnflatten) {
  BackendConfig gloo{.backend = "gloo"};
  DeviceMesh m = DeviceMesh::init({2, 4}, Names{"dp", "tp"},
                                  {.backend_override = {gloo, BackendConfig{}}});
  EXPECT_EQ(m.slice("dp").backend_config(0), gloo);
  EXPECT_EQ(m.slice("tp").backend_config(0), BackendConfig{});
  DeviceMesh u = m.unflatten(1, V{2, 2}, Names{"a", "b"});
  EXPECT_EQ(u.backend_config(0), gloo);
  EXPECT_EQ(u.backend_config(1), BackendConfig{});
  EXPECT_EQ(m.group_record(0)->name, "group[2:4]@gloo");
  EXPECT_EQ(m.group_record(0), m.slice("dp").group_record(0));
  EXPECT_NE(m.group_record(0), m.group_record(0, BackendConfig{}));
  expect_throws_with<InvalidArgument>(
      [&] { DeviceMesh::init({2, 4}, Names{"dp", "tp"}, {.backend_override = {gloo}}); },
      "backend_override should have the same length as the number of mesh dimensions");
}

TEST(DeviceMeshCache, ConcurrentLookupsAndFlattensAgree) {
  // The universe is shared by every rank thread of a simulation: lookups and flattens race.
  DeviceMesh m = DeviceMesh::init({4, 4, 4}, Names{"dp", "cp", "tp"});
  std::vector<std::shared_ptr<const GroupRecord>> seen(8);
  std::vector<DeviceMesh> flats(8, m);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        seen[t] = m.slice({"dp", "tp"}).group_record(1);
        flats[t] = m.slice({"cp", "tp"}).flatten();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 1; t < 8; ++t) {
    EXPECT_EQ(seen[t], seen[0]);
    EXPECT_EQ(flats[t], flats[0]);
  }
  EXPECT_EQ(m.cache_stats().size, 1);
  EXPECT_EQ(m.cache_stats().hits + m.cache_stats().misses, 8 * 200);
  EXPECT_EQ(m.flattened_names(), (Names{"cp_tp"}));
}

TEST(BackendConfigValue, EqualityAndHash) {
  BackendConfig a{.backend = "nccl",
                  .timeout = std::chrono::milliseconds(100),
                  .options = NcclOptions{.high_priority_stream = true, .split_color = 3}};
  BackendConfig b = a;
  EXPECT_EQ(a, b);
  EXPECT_EQ(std::hash<BackendConfig>{}(a), std::hash<BackendConfig>{}(b));
  std::get<NcclOptions>(b.options).config_blob = "x";
  EXPECT_NE(a, b);
  EXPECT_NE(a.fingerprint(), b.fingerprint());
  BackendConfig g{.backend = "gloo", .options = GlooOptions{.devices = {"lo"}, .threads = 2}};
  BackendConfig g2 = g;
  std::get<GlooOptions>(g2.options).threads = 3;
  EXPECT_NE(g, g2);
  EXPECT_EQ(BackendConfig{}.to_string(), "default");
  BackendConfig short_timeout{.backend = "gloo", .timeout = std::chrono::milliseconds(5)};
  EXPECT_EQ(short_timeout.to_string(), "gloo(timeout=5ms)");
}

TEST(BackendConfigValue, SplitFromIsAValueThatMeansTheSameInEveryUniverse) {
  // Two universes built apart (as two processes would) name the parent group the same, so the
  // split configs derived from them are equal, with equal fingerprints and group names.
  auto split_config = [](const DeviceMesh& world) {
    return BackendConfig{.backend = "nccl",
                         .options = NcclOptions{.split_color = 1,
                                                .split_from = world.group_record(0)->name}};
  };
  DeviceMesh w1 = DeviceMesh::init({8}, Names{"world"});
  DeviceMesh w2 = DeviceMesh::init({8}, Names{"world"});
  const BackendConfig c1 = split_config(w1), c2 = split_config(w2);
  EXPECT_EQ(c1, c2);
  EXPECT_EQ(c1.fingerprint(), c2.fingerprint());
  DeviceMesh m1 = DeviceMesh::init({2, 4}, Names{"dp", "tp"});
  DeviceMesh m2 = DeviceMesh::init({2, 4}, Names{"dp", "tp"});
  EXPECT_EQ(m1.group_record(1, c1)->name, m2.group_record(1, c2)->name);
  // Another parent is another config.
  BackendConfig other = c1;
  std::get<NcclOptions>(other.options).split_from = m1.group_record(1)->name;
  EXPECT_NE(other, c1);
  EXPECT_NE(other.fingerprint(), c1.fingerprint());
  BackendConfig none = c1;
  std::get<NcclOptions>(none.options).split_from.reset();
  EXPECT_NE(none.fingerprint(), c1.fingerprint());
}

// --- from groups (meshsim validates what PyTorch skips) ------------------------------------------

TEST(DeviceMeshFromGroups, OneGroupAndGroupsPerDim) {
  DeviceMesh g = DeviceMesh::from_group(V{0, 1, 2, 3}, Names{"w"});
  EXPECT_EQ(g.rank_map(), (V{0, 1, 2, 3}));
  V shape{2, 2};
  V ranks{0, 1, 2, 3};
  std::vector<V> groups{{1, 3}, {2, 3}};
  DeviceMesh m = DeviceMesh::from_groups(groups, shape, ranks, Names{"dp", "tp"}, 3);
  EXPECT_TRUE(equivalent(m, DeviceMesh::init({2, 2}, Names{"dp", "tp"})));
  std::vector<V> wrong{{1, 3}, {0, 3}};
  expect_throws_with<InvalidArgument>(
      [&] { DeviceMesh::from_groups(wrong, shape, ranks, Names{"dp", "tp"}, 3); },
      "the group given for dim tp is (0, 3) but rank 3's group along that dim in the mesh is "
      "(2, 3)");
  std::vector<V> one{{1, 3}};
  expect_throws_with<InvalidArgument>(
      [&] { DeviceMesh::from_groups(one, shape, ranks, Names{"dp", "tp"}, 3); },
      "Expects mesh with ndim equal to number of ProcessGroups");
}

// --- scale: no O(world) work on the derived path -------------------------------------------------

TEST(DeviceMeshScale, HugeWorldDerivedMeshesStayCheap) {
  const int64_t n = int64_t{1} << 40;  // never materialised
  DeviceMesh m = DeviceMesh::init({int64_t{1} << 20, 1 << 10, 1 << 10}, Names{"dp", "cp", "tp"});
  DeviceMesh f = m.slice({"dp", "tp"}).flatten();
  DeviceMesh u = f.unflatten(0, V{1 << 10, 1 << 10, 1 << 10}, Names{"a", "b", "c"});
  EXPECT_EQ(u.size(), int64_t{1} << 30);
  const int64_t r = n - 1;
  EXPECT_EQ(m.coordinate(r), (V{(1 << 20) - 1, 1023, 1023}));
  EXPECT_EQ(u.coordinate(r), (V{1023, 1023, 1023}));
  EXPECT_EQ(m.group_of(r, 2)->size(), 1024u);
  expect_throws_with<ResourceExhausted>([&] { (void)m.rank_map(); }, "exceed the limit");
  expect_throws_with<ResourceExhausted>([&] { (void)m.groups(0); }, "exceed the limit");
}

// --- serialization -------------------------------------------------------------------------------

TEST(DeviceMeshJson, RoundTripIsANewEquivalentUniverseWithTheRegistry) {
  V ranks{2048, 2049, 2050, 2051, 2056, 2057, 2058, 2059};
  V shape{2, 2, 2};
  DeviceMesh root = DeviceMesh::from_ranks(shape, ranks, Names{"dp", "cp", "tp"},
                                           {.world_size = 4096});
  DeviceMesh flat = root.slice({"dp", "tp"}).flatten();
  DeviceMesh mesh = root.slice({"dp", "cp"}).flatten().unflatten(0, V{4}, Names{"x"});
  for (const DeviceMesh& m : {root, flat, mesh, root.slice({"dp", "tp"})}) {
    DeviceMesh back = load_mesh(save_mesh(m));
    EXPECT_NE(back, m);
    EXPECT_TRUE(equivalent(back, m)) << save_mesh(m);
    EXPECT_EQ(back.layout(), m.layout());
    EXPECT_EQ(back.is_root(), m.is_root());
    EXPECT_EQ(back.world_size(), m.world_size());
    EXPECT_EQ(back.flattened(), m.flattened());
    EXPECT_EQ(save_mesh(back), save_mesh(m));
    for (int d = 0; d < m.ndim(); ++d) EXPECT_EQ(back.groups(d), m.groups(d));
  }
  // The registry came along: the loaded root slices the flattened name.
  DeviceMesh back_root = load_mesh(save_mesh(flat)).root();
  EXPECT_TRUE(equivalent(back_root.slice("dp_cp"), root.slice("dp_cp")));
}

TEST(DeviceMeshJson, ContiguousRankMapsStayCompact) {
  DeviceMesh m = DeviceMesh::init({int64_t{1} << 20, 1 << 10}, Names{"dp", "tp"});
  const std::string text = save_mesh(m.slice("tp"));
  EXPECT_LT(text.size(), 400u) << text;
  EXPECT_TRUE(equivalent(load_mesh(text), m.slice("tp")));
  V shifted{8, 9, 10, 11};
  V shape{4};
  DeviceMesh s = DeviceMesh::from_ranks(shape, shifted);
  EXPECT_EQ(s.rank_map_start(), 8);
  EXPECT_TRUE(equivalent(load_mesh(save_mesh(s)), s));
}

TEST(DeviceMeshJson, MalformedTruncatedOrHostileInputIsATypedError) {
  const std::string good = save_mesh(mesh_3d().slice({"dp", "tp"}));
  for (std::size_t cut = 0; cut < good.size(); cut += 7) {
    EXPECT_THROW(load_mesh(good.substr(0, cut)), Error) << cut;
  }
  auto edited = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const auto at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  EXPECT_THROW(load_mesh(edited("\"version\":1", "\"version\":2")), ParseError);
  EXPECT_THROW(load_mesh(edited("(2,2):(4,1)", "(2,2):(4,4)")), InvalidArgument);   // overlap
  EXPECT_THROW(load_mesh(edited("(2,2):(4,1)", "(2,2):(3,1)")), InvalidArgument);   // no tiling
  EXPECT_THROW(load_mesh(edited("\"shape\":[2,2,2]", "\"shape\":[2,2,-2]")), InvalidArgument);
  EXPECT_THROW(load_mesh(edited("[\"dp\",\"tp\"]", "[\"dp\",\"dp\"]")), InvalidArgument);
  EXPECT_THROW(load_mesh(edited("[\"dp\",\"tp\"]", "[\"dp\"]")), InvalidArgument);
  EXPECT_THROW(load_mesh(edited("\"start\":0", "\"start\":9223372036854775807")), Error);
  EXPECT_THROW(load_mesh(edited("\"start\":0", "\"start\":\"0\"")), ParseError);
  // One reader, one class per condition: an integer past int64 is an OverflowError here as in
  // the query engine, whether JSON keeps it as uint64 or as a double.
  EXPECT_THROW(load_mesh(edited("\"start\":0", "\"start\":9223372036854775808")), OverflowError);
  EXPECT_THROW(load_mesh(edited("\"start\":0", "\"start\":18446744073709551616")), OverflowError);
  EXPECT_THROW(load_mesh(std::string(100000, '[')), ParseError);
  EXPECT_THROW(load_mesh("null"), ParseError);
  EXPECT_THROW(load_mesh(""), ParseError);
}


// ---- group names follow the groups (members and config), not the universe that found them ----

// Two meshes over one world, one with the ranks transposed: the position layout 2:1 is rank 0's
// tp group [0, 1] in one and [0, 2] in the other, so the names must differ, and the group
// [0, 1] has one name wherever it is found.
TEST(GroupNames, FollowTheMembersInEveryUniverse) {
  DeviceMesh a = DeviceMesh::from_ranks(V{2, 2}, V{0, 1, 2, 3}, Names{"dp", "tp"});
  DeviceMesh b = DeviceMesh::from_ranks(V{2, 2}, V{0, 2, 1, 3}, Names{"tp", "dp"});
  ASSERT_EQ(a.group_record(1)->rows(), (Rows{{0, 1}, {2, 3}}));
  ASSERT_EQ(b.group_record(1)->rows(), (Rows{{0, 2}, {1, 3}}));
  EXPECT_EQ(a.group_record(1)->name, "group[2:1]@default");  // rows step 1, start at 0
  EXPECT_EQ(b.group_record(1)->name, "group[2:2]@default");  // rows step 2
  EXPECT_EQ(b.group_record(0)->name, "group[2:1]@default");  // [0, 1], [2, 3] again
  EXPECT_EQ(a.group_record(0)->name, "group[2:2]@default");
  // The same groups in a larger world keep the name: rank 4's tp group is [4, 5] in both.
  EXPECT_EQ(DeviceMesh::init({4, 2}, Names{"dp", "tp"}).group_record(1)->name, "group[2:1]@default");
  EXPECT_EQ(DeviceMesh::from_ranks(V{2}, V{4, 5}, Names{"tp"}).group_record(0)->name, "group[2:1]@default");
  // [5, 6] is in no group of 2:1 ([4, 5], [6, 7]): the family shifted by 1, which [1, 2] is in too.
  EXPECT_EQ(DeviceMesh::from_ranks(V{2}, V{5, 6}, Names{"tp"}).group_record(0)->name, "group[2:1+1]@default");
  EXPECT_EQ(DeviceMesh::from_ranks(V{2}, V{1, 2}, Names{"tp"}).group_record(0)->name, "group[2:1+1]@default");
  // A rank map that is not one run: [8, 12], [9, 13] are rows of 2:4 (rank 8's dp group in a
  // (2, 4) mesh over ranks 8..15).
  EXPECT_EQ(DeviceMesh::from_ranks(V{2, 2}, V{8, 9, 12, 13}, Names{"dp", "x"}).group_record(0)->name, "group[2:4]@default");
  EXPECT_EQ(DeviceMesh::from_ranks(V{2, 4}, V{8, 9, 10, 11, 12, 13, 14, 15}, Names{"dp", "tp"}).group_record(0)->name,
            "group[2:4]@default");
}

// Rows that no layout lays out ([0, 3] and [1, 2]) are named by their members: the same rows in
// another order, from another rank map, have the same name; other rows another.
TEST(GroupNames, RowsNoLayoutDescribesAreNamedByTheirMembers) {
  DeviceMesh a = DeviceMesh::from_ranks(V{2, 2}, V{0, 3, 1, 2}, Names{"x", "y"});
  DeviceMesh b = DeviceMesh::from_ranks(V{2, 2}, V{1, 2, 0, 3}, Names{"x", "y"});
  DeviceMesh c = DeviceMesh::from_ranks(V{2, 2}, V{0, 3, 2, 1}, Names{"x", "y"});
  ASSERT_EQ(a.group_record(1)->rows(), (Rows{{0, 3}, {1, 2}}));
  ASSERT_EQ(c.group_record(1)->rows(), (Rows{{0, 3}, {2, 1}}));
  EXPECT_EQ(a.group_record(1)->name.rfind("group[{", 0), 0u) << a.group_record(1)->name;
  EXPECT_EQ(a.group_record(1)->name, b.group_record(1)->name);
  EXPECT_NE(a.group_record(1)->name, c.group_record(1)->name);  // [2, 1] is another order: other local ranks
}

// Brute force: over many universes (roots of every small shape, over runs and over shuffled
// rank maps, and their flattened and unflattened views), two records of one name give every
// rank they both hold the same group, in the same order.
TEST(GroupNames, OneNameIsOneGroupForEveryRankThatHoldsIt) {
  std::vector<DeviceMesh> meshes;
  std::mt19937_64 rng(20261127);
  const std::vector<V> shapes{{4}, {2, 2}, {2, 4}, {4, 2}, {2, 2, 2}, {2, 3}, {3, 2}, {2, 2, 3}};
  for (const V& shape : shapes) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    std::vector<std::string> names;
    for (std::size_t i = 0; i < shape.size(); ++i) names.push_back("d" + std::to_string(i));
    for (int trial = 0; trial < 6; ++trial) {
      V ranks(static_cast<std::size_t>(n));
      const int64_t start = trial < 3 ? trial * 2 : 0;
      std::iota(ranks.begin(), ranks.end(), start);
      if (trial >= 3) std::shuffle(ranks.begin(), ranks.end(), rng);
      DeviceMesh root = DeviceMesh::from_ranks(shape, ranks, names);
      meshes.push_back(root);
      meshes.push_back(root.flatten("all"));
      if (shape.size() >= 2) meshes.push_back(root.slice(Names{names[0], names[1]}).flatten("f01"));
      if (shape.back() % 2 == 0 && shape.back() > 2) {
        meshes.push_back(root.unflatten(static_cast<int>(shape.size()) - 1, V{2, shape.back() / 2}, Names{"u0", "u1"}));
      }
    }
  }
  std::map<std::string, std::map<int64_t, std::vector<int64_t>>> group_by_name;  // name -> rank -> group
  int64_t compared = 0;
  for (const DeviceMesh& m : meshes) {
    for (int d = 0; d < m.ndim(); ++d) {
      auto rec = m.group_record(d);
      for (const auto& row : rec->rows()) {
        for (int64_t r : row) {
          auto [it, fresh] = group_by_name[rec->name].emplace(r, row);
          if (!fresh) {
            ++compared;
            EXPECT_EQ(it->second, row) << rec->name << " gives rank " << r << " two groups";
          }
        }
      }
    }
  }
  EXPECT_GT(compared, 500);
}

// from_group keeps the groups it is handed: their names (and configs) are what get_group hands
// back, in the root and in every view that reuses them; other groups keep the members' names.
TEST(GroupNames, HandedGroupsKeepTheirNames) {
  BackendConfig gloo{.backend = "gloo"};
  RootOptions o;
  o.group_names = {std::string("dp_pg"), std::string("tp_pg")};
  o.backend_override = {BackendConfig{}, gloo};
  const std::vector<V> groups{{0, 2}, {0, 1}};
  DeviceMesh m = DeviceMesh::from_group(groups, true, MeshArray{{2, 2}, {0, 1, 2, 3}}, Names{"dp", "tp"}, 0, o);
  EXPECT_EQ(m.get_group(0, "dp").record->name, "dp_pg");
  EXPECT_EQ(m.get_group(3, "tp").record->name, "tp_pg");
  EXPECT_EQ(m.get_group(3, "tp").backend, "gloo");
  EXPECT_EQ(m.slice("tp").get_group(1).record->name, "tp_pg");
  EXPECT_EQ(m.flatten("dp_tp").get_group(0).record->name, "group[4:1]@default");
  // One name for two different groups is refused.
  RootOptions twice;
  twice.group_names = {std::string("pg"), std::string("pg")};
  expect_throws_with<InvalidArgument>(
      [&] { DeviceMesh::from_group(groups, true, MeshArray{{2, 2}, {0, 1, 2, 3}}, Names{"dp", "tp"}, 0, twice); },
      "is handed for two different groups");
  RootOptions empty;
  empty.group_names = {std::string(""), std::nullopt};
  expect_throws_with<InvalidArgument>(
      [&] { DeviceMesh::from_group(groups, true, MeshArray{{2, 2}, {0, 1, 2, 3}}, Names{"dp", "tp"}, 0, empty); },
      "must hold 1 to 256 bytes");
}

// A handed group keeps its ProcessGroup's description ("undefined", new_group's default, when
// none is given), even world-sized (it is not the default group), in the views that slice it
// out; a dim that flatten makes over the same members is a group of its own (PyTorch 2.13 makes
// it: "default_pg" for the world), named by its members.
TEST(GroupNames, HandedGroupsKeepTheirDescriptionsAndFlattenMakesItsOwn) {
  RootOptions o;
  o.group_names = {std::string("7")};
  o.world_size = 4;
  DeviceMesh world = DeviceMesh::from_group(std::vector<int64_t>{0, 1, 2, 3}, Names{"dp"}, o);
  EXPECT_EQ(world.get_group(2, "dp").group_desc, "undefined");
  EXPECT_EQ(world.get_group(2, "dp").name, "7");
  const DeviceMesh flat = world.flatten("all");
  EXPECT_EQ(flat.get_group(2, 0).group_desc, "default_pg");
  EXPECT_EQ(flat.get_group(2, 0).name, "group[4:1]@default");
  EXPECT_EQ(world.get_group(1, "dp").name, "7");  // the cache record stays the handed one's

  RootOptions d;
  d.group_descs = {std::string("dp_pg_desc"), std::nullopt};
  const std::vector<V> groups{{0, 2}, {0, 1}};
  DeviceMesh m = DeviceMesh::from_group(groups, true, MeshArray{{2, 2}, {0, 1, 2, 3}}, Names{"dp", "tp"}, 0, d);
  EXPECT_EQ(m.get_group(0, "dp").group_desc, "dp_pg_desc");
  EXPECT_EQ(m.get_group(3, "tp").group_desc, "undefined");
  EXPECT_EQ(m.slice("dp").get_group(2).group_desc, "dp_pg_desc");
  const std::vector<int64_t> sizes{2, 1};
  const std::vector<std::string> names{"a", "b"};
  EXPECT_EQ(m.unflatten("tp", sizes, names).get_group(0, "a").group_desc, "mesh_a");
  // Only a from_group root is handed groups with descriptions.
  RootOptions not_handed;
  not_handed.group_descs = {std::string("x")};
  expect_throws_with<InvalidArgument>([&] { DeviceMesh::init({4}, Names{"dp"}, not_handed); },
                                      "from_group root");
}

}  // namespace
}  // namespace meshsim
