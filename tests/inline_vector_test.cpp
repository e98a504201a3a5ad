#include "meshsim/inline_vector.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

namespace meshsim::detail {
namespace {

using V = InlineVector<int64_t, 4>;

std::vector<int64_t> items(const V& v) { return {v.begin(), v.end()}; }

V filled(int n) {
  V v;
  for (int i = 0; i < n; ++i) v.push_back(i * 10);
  return v;
}

TEST(InlineVector, GrowsPastTheInlineCapacityKeepingElements) {
  V v = filled(4);
  EXPECT_EQ(v.capacity(), 4u);
  v.push_back(40);  // spills to the heap
  EXPECT_GT(v.capacity(), 4u);
  EXPECT_EQ(items(v), (std::vector<int64_t>{0, 10, 20, 30, 40}));
}

TEST(InlineVector, CopyAndMoveKeepContentInlineAndOnTheHeap) {
  for (int n : {0, 3, 4, 9}) {
    const V src = filled(n);
    const std::vector<int64_t> want = items(src);
    V copy(src);
    EXPECT_EQ(items(copy), want);
    V moved(std::move(copy));
    EXPECT_EQ(items(moved), want);
    EXPECT_TRUE(copy.empty());  // NOLINT(bugprone-use-after-move): moved-from is empty
    V assigned = filled(7);
    assigned = src;
    EXPECT_EQ(items(assigned), want);
    V move_assigned = filled(2);
    move_assigned = std::move(assigned);
    EXPECT_EQ(items(move_assigned), want);
    move_assigned = move_assigned;  // self-assignment keeps the content
    EXPECT_EQ(items(move_assigned), want);
  }
}

TEST(InlineVector, PushBackOfItsOwnElementSurvivesTheGrowth) {
  V v = filled(4);
  v.push_back(v[1]);  // the reference's storage is freed by the growth
  EXPECT_EQ(v.back(), 10);
}

TEST(InlineVector, AppendAssignResizeAndPop) {
  V v;
  std::vector<int64_t> src(10);
  std::iota(src.begin(), src.end(), 1);
  v.append(src.data(), src.data() + src.size());
  EXPECT_EQ(items(v), src);
  v.resize(12, 7);
  EXPECT_EQ(v.size(), 12u);
  EXPECT_EQ(v[11], 7);
  v.resize(2, 0);
  EXPECT_EQ(items(v), (std::vector<int64_t>{1, 2}));
  v.assign(3, 5);
  EXPECT_EQ(items(v), (std::vector<int64_t>{5, 5, 5}));
  v.pop_back();
  EXPECT_EQ(v.size(), 2u);
  v.clear();
  EXPECT_TRUE(v.empty());
}

}  // namespace
}  // namespace meshsim::detail
