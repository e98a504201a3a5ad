#include "meshsim/algebra.hpp"
#include "meshsim/error.hpp"
#include "test_util.hpp"

namespace meshsim {
namespace {
using namespace testing;

TEST(Idx2Crd, CompactStridesOfTheConvention) {
  EXPECT_EQ(idx2crd(4, T("(2,3)"), kTorch), T("(1,1)"));
  EXPECT_EQ(idx2crd(4, T("(2,3)"), kCute), T("(0,2)"));
}

TEST(Idx2Crd, EveryModeWraps) {
  EXPECT_EQ(idx2crd(9, T("(2,3)"), kCute), T("(1,1)"));
  EXPECT_EQ(idx2crd(9, T("(2,3)"), kTorch), T("(1,0)"));
}

TEST(Idx2Crd, ExplicitStrides) {
  EXPECT_EQ(idx2crd(5, T("(2,3)"), T("(3,2)")), T("(1,2)"));
  EXPECT_EQ(idx2crd(T("(1,7)"), T("(2,(2,4))"), T("(1,(1,2))")), T("(1,(1,3))"));
}

TEST(Idx2Crd, InverseOfCrd2IdxInsideTheDomain) {
  Layout l = Layout::compact(T("(3,(2,4))"), kCute);
  for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(crd2idx(idx2crd(i, l.shape(), kCute), l, kCute), i);
}

TEST(Idx2Crd, ErrorsNameTheRule) {
  testing::expect_throws_with<InvalidArgument>([] { idx2crd(3, T("3"), T("0")); },
                                               "division by zero");
  EXPECT_THROW(idx2crd(T("(1,2)"), T("3"), kTorch), InvalidArgument);
  EXPECT_THROW(idx2crd(1, T("(2,3)"), T("(1,(2))")), InvalidArgument);
  EXPECT_THROW(idx2crd(-1, T("(2,3)"), kTorch), InvalidArgument);
}

}  // namespace
}  // namespace meshsim
