#include "meshsim/algebra.hpp"
#include "proptests/reference.hpp"
#include "test_util.hpp"

namespace meshsim {
namespace {
using namespace testing;

class RightInverseTable : public ::testing::TestWithParam<Case> {};

TEST_P(RightInverseTable, MatchesReferenceAndInverts) {
  const Case& c = GetParam();
  Layout l = L(c.in);
  Layout r = right_inverse(l, c.conv);
  EXPECT_EQ(r, L(c.want)) << to_string(r);
  for (int64_t i = 0; i < size(r); ++i) {
    EXPECT_EQ(reference::eval(l, reference::eval(r, i, c.conv), c.conv), i);
  }
}

INSTANTIATE_TEST_SUITE_P(Examples, RightInverseTable,
                         ::testing::Values(Case{"(4,2):(2,1)", kCute, "(2,4):(4,1)"},
                                           Case{"(4,2):(2,1)", kTorch, "8:1"},
                                           Case{"(2,3):(3,1)", kCute, "(3,2):(2,1)"},
                                           Case{"(2,3):(3,1)", kTorch, "6:1"},
                                           Case{"(2,4):(1,4)", kCute, "2:1"},
                                           Case{"(2,4):(1,4)", kTorch, "2:4"},
                                           Case{"(4,2):(0,1)", kCute, "1:0"},
                                           Case{"(4,2):(0,1)", kTorch, "1:0"}));

}  // namespace
}  // namespace meshsim
