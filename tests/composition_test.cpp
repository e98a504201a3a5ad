#include "meshsim/algebra.hpp"
#include "meshsim/error.hpp"
#include "proptests/reference.hpp"
#include "test_util.hpp"

namespace meshsim {
namespace {
using namespace testing;

struct CompositionCase {
  std::string a, b;
  Convention conv;
  std::string want;
};

class CompositionTable : public ::testing::TestWithParam<CompositionCase> {};

// R == A o B structurally, and R(i) == A(B(i)) on all of B's domain.
TEST_P(CompositionTable, MatchesReferenceAndComposes) {
  const CompositionCase& c = GetParam();
  Layout a = L(c.a), b = L(c.b);
  Layout r = composition(a, b, c.conv);
  EXPECT_EQ(r, L(c.want)) << to_string(r);
  ASSERT_EQ(size(r), size(b));
  for (int64_t i = 0; i < size(b); ++i) {
    EXPECT_EQ(reference::eval(r, i, c.conv),
              reference::eval(a, reference::eval(b, i, c.conv), c.conv))
        << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Examples, CompositionTable,
    ::testing::Values(CompositionCase{"20:2", "(5,4):(4,1)", kCute, "(5,4):(8,2)"},
                      CompositionCase{"20:2", "(5,4):(4,1)", kTorch, "(5,4):(8,2)"},
                      CompositionCase{"(6,2):(2,1)", "3:2", kCute, "3:4"},
                      CompositionCase{"(6,2):(2,1)", "3:2", kTorch, "3:2"},
                      CompositionCase{"(3,4):(1,5)", "2:2", kTorch, "2:10"},
                      CompositionCase{"(3,4):(1,5)", "6:1", kCute, "(3,2):(1,5)"},
                      CompositionCase{"(4,6,8,10):(2,3,5,7)", "6:12", kCute, "(2,3):(9,5)"},
                      CompositionCase{"(4):(3)", "(6):(2)", kTorch, "(6):(6)"},
                      CompositionCase{"8:1", "(2,2,2):(4,2,1)", kTorch, "(2,2,2):(4,2,1)"},
                      CompositionCase{"(4,2):(1,4)", "3:0", kTorch, "3:0"}));

TEST(Composition, StrideDivisibilityViolationIsAnError) {
  testing::expect_throws_with<InvalidArgument>(
      [] { composition(L("(3,4):(1,5)"), L("2:2"), kCute); }, "stride divisibility");
  EXPECT_THROW(composition(L("(4,6,8,10):(2,3,5,7)"), L("6:12"), kTorch), InvalidArgument);
}

TEST(Composition, ShapeTruncationIsAnErrorNotASilentResult) {
  // pycute returns 3:1 (size 3, not 4).
  testing::expect_throws_with<InvalidArgument>(
      [] { composition(L("(3,4):(1,5)"), L("4:1"), kCute); }, "shape divisibility");
}

TEST(Composition, ExtensionLostByCoalesceIsAnError) {
  // pycute: 8:1, but A(5) == 1 on A's natural extension.
  EXPECT_THROW(composition(L("(4,1):(1,0)"), L("8:1"), kCute), InvalidArgument);
  EXPECT_THROW(composition(L("1:3"), L("(2):(4)"), kCute), InvalidArgument);
  // Inside A's domain the same A is fine.
  EXPECT_EQ(composition(L("(4,1):(1,0)"), L("4:1"), kCute), L("4:1"));
}

TEST(Composition, TilerComposesModeByModeAndKeepsTheRest) {
  Tiler t{L("2:1"), L("3:1")};
  EXPECT_EQ(composition(Layout::compact(T("(4,6,8)"), kCute), t, kCute), L("(2,3,8):(1,4,24)"));
  EXPECT_EQ(composition(Layout::compact(T("(4,6,8)"), kTorch), t, kTorch),
            L("(2,3,8):(48,8,1)"));
  Tiler keep{std::nullopt, L("2:3")};
  EXPECT_EQ(composition(L("(4,6):(1,4)"), keep, kCute), L("(4,2):(1,12)"));
  EXPECT_EQ(composition(L("8:1"), Tiler{L("2:1")}), L("(2):(1)"));
}

TEST(Composition, TilerLongerThanAIsAnError) {
  EXPECT_THROW(composition(L("2:8"), Tiler{L("2:1"), L("2:1")}), InvalidArgument);
}

TEST(Composition, StrideOverflowIsReported) {
  EXPECT_THROW(composition(L("(2,2):(1,4611686018427387904)"), L("2:4611686018427387904"), kCute),
               Error);
}

}  // namespace
}  // namespace meshsim
