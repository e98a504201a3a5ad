#include "meshsim/algebra.hpp"
#include "meshsim/error.hpp"
#include "test_util.hpp"

namespace meshsim {
namespace {
using namespace testing;

TEST(LogicalProduct, ReproducesAOverB) {
  for (Convention c : {kTorch, kCute}) EXPECT_EQ(logical_product(L("2:1"), L("3:1"), c), L("(2,3):(1,2)"));
  EXPECT_EQ(logical_product(Layout::compact(T("(2,2)"), kCute), L("3:1"), kCute),
            L("((2,2),3):((1,2),4)"));
  EXPECT_EQ(logical_product(Layout::compact(T("(2,2)"), kTorch), L("3:1"), kTorch),
            L("((2,2),3):((2,1),4)"));
}

TEST(LogicalProduct, ModeZeroIsAAndModeOneHasBsShape) {
  Layout a = L("(2,4):(4,1)");
  Layout b = L("(3,2):(2,1)");
  Layout r = logical_product(a, b, kTorch);
  EXPECT_EQ(r.rank(), 2);
  EXPECT_EQ(r[0], a);
  EXPECT_TRUE(congruent(r[1].shape(), b.shape()));
}

TEST(LogicalProduct, IntTilerMeansNColonOne) {
  // pycute's int-tiler product calls logical_divide by mistake; meshsim means n:1.
  Tiler t{Layout(3, 1)};
  EXPECT_EQ(logical_product(L("2:1"), t, kCute), L("((2,3)):((1,2))"));
}

TEST(LogicalProduct, TruncationIsAnError) {
  // pycute silently returns ((2,2),2):((1,4),2): mode 1 has size 2, not 3.
  EXPECT_THROW(logical_product(L("(2,2):(1,4)"), L("3:1"), kCute), InvalidArgument);
}

TEST(LogicalProduct, AStrideZeroBOverAComplementWithEmptyModesIsRefused) {
  // complement(A, size(A) * cosize(B)) has a size-0 mode here; nothing composes into it, so the
  // product is refused even though B is one leaf of stride 0.
  try {
    logical_product(L("(3,((4))):(1,((2)))"), L("3:0"), kTorch);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("overlap inside mode 0:"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace meshsim
