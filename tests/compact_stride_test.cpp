#include "meshsim/algebra.hpp"
#include "meshsim/error.hpp"
#include "test_util.hpp"

namespace meshsim {
namespace {
using namespace testing;

TEST(CompactStride, TorchIsSuffixProductCuteIsPrefixProduct) {
  EXPECT_EQ(compact_stride(T("(2,3)"), kTorch), T("(3,1)"));
  EXPECT_EQ(compact_stride(T("(2,3)"), kCute), T("(1,2)"));
  EXPECT_EQ(compact_stride(T("(2,(2,3))"), kTorch), T("(6,(3,1))"));
  EXPECT_EQ(compact_stride(T("(2,(2,3))"), kCute), T("(1,(2,4))"));
}

TEST(CompactStride, KeepsStructureOfScalarsAndOneTuples) {
  EXPECT_EQ(compact_stride(T("7"), kTorch), T("1"));
  EXPECT_EQ(compact_stride(T("(7)"), kCute), T("(1)"));
}

TEST(CompactStride, OverflowOnlyWhenAStrideOverflows) {
  // The product of all sizes overflows, but no stride needs it.
  EXPECT_EQ(compact_stride(T("(4294967296,4294967296)"), kTorch), T("(4294967296,1)"));
  EXPECT_THROW(compact_stride(T("(2,4294967296,4294967296)"), kTorch), OverflowError);
  EXPECT_THROW(compact_stride(T("(4294967296,4294967296,2)"), kCute), OverflowError);
}

}  // namespace
}  // namespace meshsim
