#include "meshsim/algebra.hpp"
#include "meshsim/error.hpp"
#include "test_util.hpp"

namespace meshsim {
namespace {
using namespace testing;

TEST(Crd2Idx, IntCoordinateSplitsInTheConventionsOrder) {
  EXPECT_EQ(crd2idx(4, L("(2,3):(10,1)"), kTorch), 11);  // 4 -> (1,1)
  EXPECT_EQ(crd2idx(4, L("(2,3):(10,1)"), kCute), 2);    // 4 -> (0,2)
  EXPECT_EQ(crd2idx(5, L("((2,2),3):((1,6),2)"), kCute), 3);
  EXPECT_EQ(crd2idx(5, L("((2,2),3):((1,6),2)"), kTorch), 10);
}

TEST(Crd2Idx, HierarchicalCoordinateIsTheSameInBoth) {
  for (Convention c : {kTorch, kCute}) EXPECT_EQ(crd2idx(T("(3,1)"), L("((2,2),3):((1,6),2)"), c), 9);
}

TEST(Crd2Idx, OutermostModeTakesOverflow) {
  EXPECT_EQ(crd2idx(9, L("(2,3):(1,2)"), kCute), 9);
  EXPECT_EQ(crd2idx(9, L("(2,3):(1,2)"), kTorch), 3);
}

TEST(Crd2Idx, BadCoordinatesAreErrors) {
  testing::expect_throws_with<InvalidArgument>([] { crd2idx(T("(1,2)"), L("4:1")); },
                                               "against the integer shape");
  EXPECT_THROW(crd2idx(T("(1,2,3)"), L("(2,2):(1,2)")), InvalidArgument);
  EXPECT_THROW(crd2idx(-1, L("(2,2):(1,2)")), InvalidArgument);
}

TEST(Crd2Idx, OverflowOnTheExtensionIsReported) {
  EXPECT_THROW(crd2idx(int64_t{1} << 62, L("2:8")), OverflowError);
}

}  // namespace
}  // namespace meshsim
