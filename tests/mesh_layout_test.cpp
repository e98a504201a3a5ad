#include "meshsim/mesh_layout.hpp"

#include "meshsim/error.hpp"
#include "test_util.hpp"

namespace meshsim {
namespace {
using namespace testing;
using Ranks = std::vector<int64_t>;

TEST(MeshLayout, AllRanksFromZeroIsRowMajorOverFlattenedLeaves) {
  EXPECT_EQ(mesh_all_ranks_from_zero(L("(2,3):(1,2)")), (Ranks{0, 2, 4, 1, 3, 5}));
  EXPECT_EQ(mesh_all_ranks_from_zero(L("((2,2),):((4,1),)")), (Ranks{0, 1, 4, 5}));
}

TEST(MeshLayout, GlobalRanksOnePerComplementOffset) {
  std::vector<Ranks> want{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}};
  EXPECT_EQ(mesh_global_ranks(L("(2,4):(4,1)"), 16), want);
  EXPECT_EQ(mesh_global_ranks(L("4:2"), 8), (std::vector<Ranks>{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  // dp of a 2x2x2 mesh: groups {0,4},{1,5},{2,6},{3,7}
  EXPECT_EQ(mesh_global_ranks(L("2:4"), 8),
            (std::vector<Ranks>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

TEST(MeshLayout, GroupTableIsGlobalRanksInOneBuffer) {
  for (const char* text : {"(2,4):(4,1)", "4:2", "2:4", "(2,2):(1,4)", "((2,2),3):((1,12),4)"}) {
    const Layout l = L(text);
    const auto rows = mesh_global_ranks(l, 24);
    const GroupTable t = mesh_group_table(l, 24);
    ASSERT_EQ(t.count, static_cast<int64_t>(rows.size())) << text;
    ASSERT_EQ(t.ranks.size(), rows.size() * rows[0].size()) << text;
    for (std::size_t g = 0; g < rows.size(); ++g) {
      const auto row = t.row(static_cast<int64_t>(g));
      EXPECT_EQ(Ranks(row.begin(), row.end()), rows[g]) << text << " row " << g;
    }
  }
  EXPECT_THROW(mesh_group_table(L("(2,2):(1,1)"), 8), InvalidArgument);
}

TEST(MeshLayout, CheckNonOverlap) {
  EXPECT_TRUE(mesh_check_non_overlap(L("(2,3):(3,2)")));  // injective, not chained
  EXPECT_TRUE(mesh_check_non_overlap(L("(2,4):(4,1)")));
  EXPECT_FALSE(mesh_check_non_overlap(L("(2,2):(1,1)")));
  EXPECT_FALSE(mesh_check_non_overlap(L("(2,3):(0,1)")));
  EXPECT_TRUE(mesh_check_non_overlap(L("(1,3):(0,1)")));
  EXPECT_FALSE(mesh_check_non_overlap(L("(3,2):(1,2)")));
}

TEST(MeshLayout, CheckNonOverlapIsFastForHugeDominantLayouts) {
  EXPECT_TRUE(mesh_check_non_overlap(L("(1048576,1048576,1024):(1073741824,1024,1)")));
  EXPECT_FALSE(mesh_check_non_overlap(L("(1048576,1048576):(1,1)")));
}

TEST(MeshLayout, CheckNonOverlapTooLargeToDecideIsResourceExhausted) {
  // Not dominant, no repeated stride, and 2^40 elements: refuse rather than enumerate.
  EXPECT_THROW(mesh_check_non_overlap(L("(1048576,1048576):(3,2)")), ResourceExhausted);
}

// PyTorch's _FlatLayout.check_orthogonal (torch/distributed/_mesh_layout.py, read at the
// cyyever/pytorch mirror, commit 0011014f6f68f6fbcab776ee96d38e79d4086fae): the layout is
// coalesced and flattened, the (stride, size) pairs sorted from the largest, and each stride
// must be a multiple of the next stride x size. The expected values are that rule worked by
// hand; the first three are the docstring's own examples.
TEST(MeshLayout, CheckOrthogonalIsPyTorchsNestingRule) {
  EXPECT_TRUE(mesh_check_orthogonal(L("(2,3):(6,1)")));   // 6 % (1*3) == 0
  EXPECT_FALSE(mesh_check_orthogonal(L("(2,3):(2,1)")));  // 2 % 3 != 0: ranks 2 repeat
  EXPECT_FALSE(mesh_check_orthogonal(L("(4,2):(1,1)")));  // (1,4),(1,2): 1 % 2 != 0
  EXPECT_TRUE(mesh_check_orthogonal(L("4:1")));           // one mode
  EXPECT_TRUE(mesh_check_orthogonal(L("(2,4):(4,1)")));   // coalesces to 8:1
  EXPECT_TRUE(mesh_check_orthogonal(L("(1,1):(5,7)")));   // every mode of size 1: none left
  EXPECT_TRUE(mesh_check_orthogonal(L("(2,2):(1,4)")));   // sorted (4,2),(1,2): 4 % 2 == 0
  EXPECT_TRUE(mesh_check_orthogonal(L("((2,2),2):((8,1),2)")));  // (8,2),(2,2),(1,2)
  // Stricter than non-overlap: injective ranks {0,3,2,5,4,7}, but 3 % (2*3) != 0.
  EXPECT_TRUE(mesh_check_non_overlap(L("(3,2):(2,3)")));
  EXPECT_FALSE(mesh_check_orthogonal(L("(3,2):(2,3)")));
  // A broadcast mode: PyTorch divides by 0 (ZeroDivisionError); meshsim answers false. Alone,
  // it passes, as in PyTorch (fewer than two modes: nothing to compare).
  EXPECT_FALSE(mesh_check_orthogonal(L("(2,2):(0,1)")));
  EXPECT_TRUE(mesh_check_orthogonal(L("2:0")));
  EXPECT_TRUE(mesh_check_orthogonal(L("(2,2):(0,0)")));  // pycute's coalesce merges them: 4:0
  EXPECT_FALSE(mesh_check_non_overlap(L("2:0")));
  // No enumeration: 2^50 ranks answered from three modes.
  EXPECT_TRUE(mesh_check_orthogonal(L("(1048576,1048576,1024):(1073741824,1024,1)")));
  EXPECT_FALSE(mesh_check_orthogonal(L("(1048576,1048576):(3,2)")));
}

TEST(MeshLayout, CoalesceReplacesZeroStrides) {
  EXPECT_EQ(mesh_coalesce(L("(2,2):(0,0)")), L("4:1"));
  EXPECT_EQ(mesh_coalesce(L("1:0")), L("1:1"));
  EXPECT_EQ(mesh_coalesce(L("(3,1,2):(2,0,1)")), L("6:1"));
}

TEST(MeshLayout, FlattenNestsNonContiguousDims) {
  EXPECT_EQ(mesh_flatten(L("(2,2,2):(4,2,1)")), L("8:1"));
  EXPECT_EQ(mesh_flatten(L("(2,2):(4,1)")), L("((2,2)):((4,1))"));
}

TEST(MeshLayout, NestTopLevelSizes) {
  EXPECT_EQ(mesh_nest(L("(2,3):(3,1)")), L("((2,3)):((3,1))"));
  EXPECT_EQ(mesh_top_level_sizes(L("((2,2),3):((6,3),1)")), (Ranks{4, 3}));
  EXPECT_EQ(mesh_top_level_sizes(L("8:1")), (Ranks{8}));
}

TEST(MeshLayout, GetitemFollowsPythonIndexing) {
  EXPECT_EQ(mesh_getitem(L("(2,3):(3,1)"), -1), L("3:1"));
  EXPECT_EQ(mesh_getitem(L("(4):(1)"), -1), L("4:1"));
  EXPECT_EQ(mesh_getitem(L("4:1"), 0), L("4:1"));
  testing::expect_throws_with<OutOfRange>([] { mesh_getitem(L("(2):(1)"), -2); },
                                          "out of range [-1, 1)");
  EXPECT_THROW(mesh_getitem(L("4:1"), -1), OutOfRange);  // PyTorch asserts here
}

TEST(MeshLayout, SpliceUsesPythonSliceAssignment) {
  Layout l = L("(2,3,4):(12,4,1)");
  EXPECT_EQ(mesh_splice(l, 1, 2, L("(3,1):(1,4)")), L("(2,3,1,4):(12,1,4,1)"));
  EXPECT_EQ(mesh_splice(l, -1, 100, L("5:7")), L("(2,3,5):(12,4,7)"));
  EXPECT_EQ(mesh_splice(l, 2, 0, L("5:7")), L("(2,3,5,4):(12,4,7,1)"));
  EXPECT_EQ(mesh_splice(L("8:1"), 0, 1, L("8:1")), L("(8):(1)"));
}

TEST(MeshLayout, UnflattenSplitsADim) {
  EXPECT_EQ(mesh_unflatten(L("8:1"), 0, std::vector<int64_t>{2, 2, 2}), L("(2,2,2):(4,2,1)"));
  EXPECT_EQ(mesh_unflatten(L("(2,8):(8,1)"), 1, std::vector<int64_t>{4, 2}),
            L("(2,4,2):(8,2,1)"));
}

TEST(MeshLayout, UnflattenErrors) {
  testing::expect_throws_with<InvalidArgument>(
      [] { mesh_unflatten(L("(7,4):(4,1)"), 1, std::vector<int64_t>{4, 2}); }, "multiply to 8");
  EXPECT_THROW(mesh_unflatten(L("(7,4):(4,1)"), 2, std::vector<int64_t>{4}), OutOfRange);
  // PyTorch does not normalise -1 and corrupts the rank set; meshsim rejects it.
  EXPECT_THROW(mesh_unflatten(L("(7,4):(4,1)"), -1, std::vector<int64_t>{4}), OutOfRange);
  EXPECT_THROW(mesh_unflatten(L("8:1"), 0, std::vector<int64_t>{}), InvalidArgument);
}

TEST(MeshLayout, RemapToTensor) {
  RemappedTensor t = mesh_remap_to_tensor(L("2:2"), std::vector<int64_t>{10, 20, 30, 40});
  EXPECT_EQ(t.shape, (Ranks{2, 2}));
  EXPECT_EQ(t.values, (Ranks{10, 30, 20, 40}));
  t = mesh_remap_to_tensor(L("((2,2)):((4,1))"), std::vector<int64_t>{7, 6, 5, 4, 3, 2, 1, 0});
  EXPECT_EQ(t.shape, (Ranks{2, 4}));
  EXPECT_EQ(t.values, (Ranks{7, 6, 3, 2, 5, 4, 1, 0}));
}

TEST(MeshLayout, RemapToTensorErrors) {
  EXPECT_THROW(mesh_remap_to_tensor(L("3:18"), std::vector<int64_t>(36)), InvalidArgument);
  testing::expect_throws_with<InvalidArgument>(
      [] { mesh_remap_to_tensor(L("((3,3)):((3,1))"), std::vector<int64_t>(10)); },
      "not a multiple");
}

TEST(MeshLayout, Disjoint) {
  EXPECT_FALSE(mesh_disjoint(std::vector<Layout>{L("2:4"), L("(2,4):(4,1)")}));
  EXPECT_TRUE(mesh_disjoint(std::vector<Layout>{L("2:4"), L("4:1")}));
  EXPECT_THROW(mesh_disjoint(std::vector<Layout>{}), InvalidArgument);
}

TEST(MeshLayout, EnumerationsAreBounded) {
  EXPECT_THROW(mesh_all_ranks_from_zero(L("(1048576,1048576):(1048576,1)")), ResourceExhausted);
  EXPECT_THROW(mesh_global_ranks(L("4096:1"), int64_t{1} << 40), ResourceExhausted);
}

}  // namespace
}  // namespace meshsim
