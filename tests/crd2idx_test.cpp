#include <vector>

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

TEST(Crd2Idx, RawTuplesWithASizeBelowOneAreRefused) {
  // A size-0 mode would divide by zero when an int coordinate is split over it.
  testing::expect_throws_with<InvalidArgument>(
      [] { crd2idx(IntTuple(5), T("(2,0,3)"), T("(1,2,2)")); }, "size 0");
  EXPECT_THROW(crd2idx(IntTuple(5), T("(2,-3)"), T("(1,2)")), InvalidArgument);
}

// The split uses shifts for powers of two and 32-bit division when it can: check every path
// against the plain mixed-radix definition, including sizes and coordinates past 2^32.
TEST(Crd2Idx, IntSplitAgreesWithMixedRadixOnEveryDivisionPath) {
  const int64_t big = (int64_t{1} << 33) + 7;  // neither a power of two nor 32-bit
  const std::vector<std::vector<int64_t>> shapes = {
      {3, 5, 7}, {4, 8, 2}, {6, 1, 9}, {big, 3}, {3, big}, {1 << 20, 12, 5}};
  for (const auto& shape : shapes) {
    std::vector<IntTuple> s, d;
    for (std::size_t k = 0; k < shape.size(); ++k) {
      s.emplace_back(shape[k]);
      d.emplace_back(static_cast<int64_t>(2 * k + 1));
    }
    const Layout l(IntTuple::tuple(s), IntTuple::tuple(d));
    for (Convention c : {kTorch, kCute}) {
      for (int64_t v : {int64_t{0}, int64_t{1}, int64_t{37}, int64_t{104}, big + 11,
                        (int64_t{1} << 40) + 3}) {
        // Reference: digits from the fastest mode (last in torch, first in cute); the outermost
        // mode takes what is left.
        int64_t want = 0;
        int64_t rest = v;
        const std::size_t n = shape.size();
        for (std::size_t k = 0; k < n; ++k) {
          const std::size_t i = c == kTorch ? n - 1 - k : k;
          const int64_t digit = k + 1 == n ? rest : rest % shape[i];
          want += digit * static_cast<int64_t>(2 * i + 1);
          if (k + 1 < n) rest /= shape[i];
        }
        EXPECT_EQ(crd2idx(IntTuple(v), l, c), want) << to_string(l) << " at " << v;
      }
    }
  }
}

}  // namespace
}  // namespace meshsim
