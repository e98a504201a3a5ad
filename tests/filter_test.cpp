#include "meshsim/algebra.hpp"
#include "meshsim/error.hpp"
#include "test_util.hpp"

namespace meshsim {
namespace {
using namespace testing;

TEST(Filter, DropsUnitAndBroadcastModes) {
  EXPECT_EQ(filter(L("(4,1,3,2):(0,5,1,3)"), kCute), L("6:1"));
  EXPECT_EQ(filter(L("(4,1,3,2):(0,5,1,3)"), kTorch), L("(3,2):(1,3)"));
}

TEST(Filter, NothingLeftIsOneZero) {
  for (Convention c : {kTorch, kCute}) EXPECT_EQ(filter(L("(4,1):(0,7)"), c), L("1:0"));
}

TEST(Filter, ByProfile) {
  EXPECT_EQ(filter(L("((4,2),(3,1)):((0,1),(2,9))"), T("(1,1)"), kTorch), L("(2,3):(1,2)"));
  EXPECT_THROW(filter(L("(12,4):(1,12)"), T("(1,1,1)")), InvalidArgument);
}

}  // namespace
}  // namespace meshsim
