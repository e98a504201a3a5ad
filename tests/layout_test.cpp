#include "meshsim/layout.hpp"

#include <unordered_set>

#include "meshsim/error.hpp"
#include "test_util.hpp"

namespace meshsim {
namespace {
using testing::L;
using testing::T;

TEST(Layout, ParsePrintRoundTrip) {
  for (const char* s : {"((2,2),4):((1,8),2)", "8:1", "(8):(1)", "(2,(3,4)):(0,(1,3))"}) {
    EXPECT_EQ(to_string(L(s)), s);
  }
}

TEST(Layout, ShapeAloneGetsTorchCompactStrides) { EXPECT_EQ(L("(2,3)"), L("(2,3):(3,1)")); }

TEST(Layout, CongruenceIsChecked) {
  testing::expect_throws_with<InvalidArgument>([] { L("(2,2):((1),2)"); }, "not congruent");
  // Newer PyTorch's words lead (_FlatLayout: f"sizes {shape} and strides {stride} don't match").
  testing::expect_throws_with<InvalidArgument>([] { L("(2,2):((1),2)"); }, "sizes (2,2) and strides ((1),2) don't match");
  EXPECT_THROW(L("(2,2):(1,2,3)"), InvalidArgument);
  EXPECT_THROW(L("4:(1)"), InvalidArgument);
}

TEST(Layout, SizesMustBePositive) {
  testing::expect_throws_with<InvalidArgument>([] { L("(2,0):(1,2)"); }, "size 0 is not >= 1");
}

TEST(Layout, StridesMustBeNonNegative) {
  testing::expect_throws_with<InvalidArgument>(
      [] { Layout(IntTuple::tuple({2, 2}), IntTuple::tuple({1, -2})); }, "stride -2");
}

TEST(Layout, SizeOverflowNear2To63IsRejected) {
  testing::expect_throws_with<OverflowError>([] { L("(4294967296,4294967296):(1,0)"); },
                                             "overflows");
}

TEST(Layout, CosizeOverflowIsRejected) {
  // size fits (2^62) but the largest index 3*(2^62 - 1) does not; 2*(2^62 - 1) + 1 does.
  EXPECT_THROW(L("(4611686018427387904):(3)"), OverflowError);
  EXPECT_EQ(cosize(L("(4611686018427387904):(2)")), INT64_MAX);
  EXPECT_NO_THROW(L("(4611686018427387904):(1)"));
}

TEST(Layout, SizeAndCosize) {
  EXPECT_EQ(size(L("((2,2),4):((1,8),2)")), 16);
  EXPECT_EQ(cosize(L("((2,2),4):((1,8),2)")), 1 + 1 + 8 + 6);
  EXPECT_EQ(cosize(L("(3,4):(0,0)")), 1);
  EXPECT_EQ(cosize(L("1:5")), 1);
}

TEST(Layout, ModesAndRank) {
  Layout l = L("((2,2),4):((1,8),2)");
  EXPECT_EQ(l.rank(), 2);
  EXPECT_EQ(l.depth(), 2);
  EXPECT_EQ(l[0], L("(2,2):(1,8)"));
  EXPECT_EQ(l[1], L("4:2"));
  EXPECT_THROW(l[2], OutOfRange);
  EXPECT_EQ(L("4:2")[0], L("4:2"));
}

TEST(Layout, MakeLayoutJoinsModes) {
  EXPECT_EQ(make_layout({L("2:1"), L("(2,2):(4,8)")}), L("(2,(2,2)):(1,(4,8))"));
  EXPECT_EQ(make_layout({L("4:1")}), L("(4):(1)"));
}

TEST(Layout, MirrorReversesEveryLevel) {
  EXPECT_EQ(mirror(L("((2,3),4):((1,2),6)")), L("(4,(3,2)):(6,(2,1))"));
  EXPECT_EQ(mirror(mirror(L("((2,3),4):((1,2),6)"))), L("((2,3),4):((1,2),6)"));
}

TEST(Layout, EqualityAndHashAreStructural) {
  std::unordered_set<Layout> set{L("8:1"), L("(8):(1)"), L("8:1")};
  EXPECT_EQ(set.size(), 2u);
  EXPECT_NE(L("(2,1):(1,0)"), L("(2,1):(1,2)"));
}

TEST(Convention, ParseAndPrint) {
  EXPECT_EQ(parse_convention("torch"), Convention::kTorch);
  EXPECT_EQ(parse_convention("cute"), Convention::kCute);
  EXPECT_EQ(to_string(Convention::kCute), "cute");
  EXPECT_THROW(parse_convention("Torch"), InvalidArgument);
}

}  // namespace
}  // namespace meshsim
