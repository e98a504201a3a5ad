#include "meshsim/algebra.hpp"
#include "meshsim/error.hpp"
#include "proptests/reference.hpp"
#include "test_util.hpp"

namespace meshsim {
namespace {
using namespace testing;

class CoalesceTable : public ::testing::TestWithParam<Case> {};

TEST_P(CoalesceTable, MatchesReferenceAndKeepsTheFunction) {
  const Case& c = GetParam();
  Layout in = L(c.in);
  Layout r = coalesce(in, c.conv);
  EXPECT_EQ(r, L(c.want)) << to_string(r);
  EXPECT_LE(r.depth(), 1);
  ASSERT_EQ(size(r), size(in));
  for (int64_t i = 0; i < size(in); ++i) {
    EXPECT_EQ(reference::eval(r, i, c.conv), reference::eval(in, i, c.conv)) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Examples, CoalesceTable,
    ::testing::Values(Case{"(2,4):(1,2)", kCute, "8:1"}, Case{"(2,4):(1,2)", kTorch, "(2,4):(1,2)"},
                      Case{"(2,4):(4,1)", kCute, "(2,4):(4,1)"}, Case{"(2,4):(4,1)", kTorch, "8:1"},
                      Case{"(2,1,3):(2,5,4)", kCute, "6:2"},
                      Case{"(2,1,3):(2,5,4)", kTorch, "(2,3):(2,4)"},
                      Case{"(1,1):(3,5)", kCute, "1:0"}, Case{"(1,1):(3,5)", kTorch, "1:0"},
                      Case{"(2,2):(0,0)", kTorch, "4:0"},
                      Case{"((2,2),(2,2)):((32,8),(4,1))", kTorch, "(2,4,2):(32,4,1)"},
                      Case{"(8):(1)", kTorch, "8:1"}));

TEST(Coalesce, ByProfileCoalescesModeByMode) {
  Layout l = L("((2,4),(3,5)):((1,2),(8,24))");
  EXPECT_EQ(coalesce(l, T("(1,1)"), kCute), L("(8,15):(1,8)"));
  EXPECT_EQ(coalesce(l, T("(1,1)"), kTorch), l);
  EXPECT_EQ(coalesce(l, T("(1)"), kCute), L("(8,(3,5)):(1,(8,24))"));
  EXPECT_EQ(coalesce(l, T("1"), kCute), coalesce(l, kCute));
}

TEST(Coalesce, ProfileLongerThanLayoutIsAnError) {
  testing::expect_throws_with<InvalidArgument>([] { coalesce(L("(2):(32)"), T("(1,1)")); },
                                               "profile (1,1) has 2 modes");
}

}  // namespace
}  // namespace meshsim
