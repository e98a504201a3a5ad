#include "meshsim/algebra.hpp"
#include "meshsim/error.hpp"
#include "proptests/reference.hpp"
#include "test_util.hpp"

namespace meshsim {
namespace {
using namespace testing;

struct ComplementCase {
  std::string in;
  int64_t bound;
  Convention conv;
  std::string want;
};

class ComplementTable : public ::testing::TestWithParam<ComplementCase> {};

// The postconditions CuTe's complement test checks, by brute force.
TEST_P(ComplementTable, MatchesReferenceAndPostconditions) {
  const ComplementCase& c = GetParam();
  Layout l = L(c.in);
  Layout r = complement(l, c.bound, c.conv);
  EXPECT_EQ(r, L(c.want)) << to_string(r);
  std::set<int64_t> img = reference::image(l, c.conv);
  for (int64_t i = 1; i < size(r); ++i) {
    EXPECT_LT(reference::eval(r, i - 1, c.conv), reference::eval(r, i, c.conv));
    EXPECT_EQ(img.count(reference::eval(r, i, c.conv)), 0u) << i;
  }
  Layout joined = c.conv == kCute ? make_layout({l, r}) : make_layout({r, l});
  EXPECT_GE(cosize(joined), c.bound);
}

INSTANTIATE_TEST_SUITE_P(
    Examples, ComplementTable,
    ::testing::Values(ComplementCase{"(2,2):(4,1)", 16, kTorch, "(2,2):(8,2)"},
                      ComplementCase{"(2,2):(1,4)", 16, kCute, "(2,2):(2,8)"},
                      ComplementCase{"4:2", 1, kCute, "2:1"}, ComplementCase{"4:2", 1, kTorch, "2:1"},
                      ComplementCase{"4:2", 16, kCute, "(2,2):(1,8)"},
                      ComplementCase{"4:2", 16, kTorch, "(2,2):(8,1)"},
                      ComplementCase{"(2,2):(1,6)", 24, kCute, "(3,2):(2,12)"},
                      ComplementCase{"(2,2):(1,6)", 24, kTorch, "(2,3):(12,2)"},
                      ComplementCase{"4:0", 8, kTorch, "8:1"},
                      ComplementCase{"(4,2):(0,1)", 8, kCute, "4:2"},
                      ComplementCase{"(3,2):(1,4)", 12, kTorch, "2:8"},
                      ComplementCase{"4:1", 8, kTorch, "2:4"}));

TEST(Complement, BoundNotAMultipleRoundsUp) {
  EXPECT_EQ(complement(L("(2,2):(1,6)"), 20, kCute), L("(3,2):(2,12)"));
}

TEST(Complement, NonInjectiveLayoutIsAnError) {
  // pycute returns a size-0 mode for these ((2,2):(1,1) gives 0:2) or asserts.
  for (const char* s : {"(2,2):(1,1)", "(2,3):(3,2)", "(8,2):(1,3)", "(6,7):(4,2)"}) {
    for (Convention c : {kTorch, kCute}) {
      testing::expect_throws_with<InvalidArgument>([&] { complement(L(s), 1, c); },
                                                   "non-injective");
    }
  }
}

TEST(Complement, BoundMustBePositive) { EXPECT_THROW(complement(L("4:1"), 0), InvalidArgument); }

}  // namespace
}  // namespace meshsim
