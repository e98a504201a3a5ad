#include "meshsim/algebra.hpp"
#include "meshsim/error.hpp"
#include "proptests/reference.hpp"
#include "test_util.hpp"

namespace meshsim {
namespace {
using namespace testing;

TEST(LogicalDivide, TileThenRestInBothConventions) {
  EXPECT_EQ(logical_divide(L("16:1"), L("4:2"), kCute), L("(4,(2,2)):(2,(1,8))"));
  EXPECT_EQ(logical_divide(L("16:1"), L("4:2"), kTorch), L("(4,(2,2)):(2,(8,1))"));
  EXPECT_EQ(logical_divide(L("24:1"), L("(2,3)"), kTorch), L("((2,3),4):((3,1),6)"));
  EXPECT_EQ(logical_divide(Layout::compact(T("(2,3)"), kCute), L("(2,3):(1,2)"), kCute),
            L("((2,3),1):((1,2),0)"));
  EXPECT_EQ(logical_divide(L("2:1"), L("32:1"), kCute), L("(32,1):(1,0)"));
}

TEST(LogicalDivide, SatisfiesItsDefinition) {
  Layout a = L("(4,6):(6,1)");
  Layout b = L("4:3");
  Layout r = logical_divide(a, b, kTorch);
  Layout bc = make_layout({b, complement(b, size(a), kTorch)});
  ASSERT_EQ(size(r), size(bc));
  for (int64_t i = 0; i < size(r); ++i) {
    EXPECT_EQ(reference::eval(r, i, kTorch),
              reference::eval(a, reference::eval(bc, i, kTorch), kTorch));
  }
}

TEST(LogicalDivide, TilerDividesModeByMode) {
  Tiler t{L("2:1"), L("3:1")};
  EXPECT_EQ(logical_divide(Layout::compact(T("(8,6)"), kTorch), t, kTorch),
            L("((2,4),(3,2)):((6,12),(1,3))"));
}

TEST(LogicalDivide, NonInjectiveTileIsAnError) {
  EXPECT_THROW(logical_divide(L("(5,2,4):(32,16,4)"), L("(5,4,(3,3)):(144,4,(16,48))"), kCute),
               InvalidArgument);
}

}  // namespace
}  // namespace meshsim
