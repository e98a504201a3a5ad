#include "meshsim/algebra.hpp"
#include "meshsim/error.hpp"
#include "proptests/reference.hpp"
#include "test_util.hpp"

namespace meshsim {
namespace {
using namespace testing;

class LeftInverseTable : public ::testing::TestWithParam<Case> {};

TEST_P(LeftInverseTable, MatchesReferenceAndInverts) {
  const Case& c = GetParam();
  Layout l = L(c.in);
  Layout r = left_inverse(l, c.conv);
  EXPECT_EQ(r, L(c.want)) << to_string(r);
  for (int64_t i = 0; i < size(l); ++i) {
    EXPECT_EQ(reference::eval(r, reference::eval(l, i, c.conv), c.conv), i);
  }
}

INSTANTIATE_TEST_SUITE_P(Examples, LeftInverseTable,
                         ::testing::Values(Case{"4:2", kCute, "(2,4):(4,1)"},
                                           Case{"4:2", kTorch, "(4,2):(1,4)"},
                                           Case{"(2,3):(3,1)", kCute, "(3,2):(2,1)"},
                                           Case{"(2,3):(3,1)", kTorch, "6:1"},
                                           Case{"(4,2):(1,16)", kCute, "(4,4,2):(1,8,4)"},
                                           Case{"(4,2):(1,16)", kTorch, "(2,16):(1,2)"}));

TEST(LeftInverse, InjectiveButNotChainedIsAnError) {
  // pycute returns 3:1 / 3:2, which fail for i >= 3.
  for (Convention c : {kTorch, kCute}) {
    testing::expect_throws_with<InvalidArgument>([&] { left_inverse(L("(3,2):(1,4)"), c); },
                                                 "no left inverse");
  }
}

TEST(LeftInverse, NonInjectiveIsAnError) {
  for (Convention c : {kTorch, kCute}) {
    EXPECT_THROW(left_inverse(L("(4,2):(0,1)"), c), InvalidArgument);
    EXPECT_THROW(left_inverse(L("(2,2):(1,1)"), c), InvalidArgument);
  }
}

}  // namespace
}  // namespace meshsim
