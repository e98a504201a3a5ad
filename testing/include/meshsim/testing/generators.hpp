// generators.hpp — rapidcheck generators for IntTuples and Layouts, reusable by anyone who fuzzes
// their own layouts:
//
//   #include <meshsim/testing/generators.hpp>   // target meshsim::testing
//   RC_GTEST_PROP(MyLayouts, CoalesceKeepsSize, ()) {
//     const meshsim::Layout l = *meshsim::gen::layout();
//     RC_ASSERT(size(meshsim::coalesce(l)) == size(l));
//   }
//
// Shapes nest up to depth 3, include size-1 modes, and keep size(L) <= 4096 so that properties
// can enumerate the whole domain. Strides come in three kinds: random (stride 0 and overlaps
// included), compact permutations (injective and chained), and compact with gaps (injective,
// not always chained).
#pragma once

#include <rapidcheck.h>

#include <algorithm>
#include <numeric>
#include <ostream>
#include <vector>

#include "meshsim/algebra.hpp"
#include "meshsim/layout.hpp"

namespace meshsim::gen {

// Shape tree: a list of leaf sizes plus the nesting, built from independent parts so rapidcheck
// shrinks well.
struct ShapeSpec {
  std::vector<int64_t> sizes;   // leaf sizes, 1..8
  std::vector<int> groups;      // how leaves group into nested modes
  int style;                    // 0: flat, 1: nested once, 2: nested twice, 3: scalar if 1 leaf
};

inline IntTuple build_shape(const std::vector<int64_t>& sizes, const std::vector<int>& groups,
                            int style) {
  if (sizes.size() == 1 && style == 3) return IntTuple(sizes[0]);
  std::vector<IntTuple> modes;
  std::size_t at = 0;
  std::size_t g = 0;
  while (at < sizes.size()) {
    int take = style == 0 ? 1 : 1 + (g < groups.size() ? groups[g] % 3 : 0);
    ++g;
    std::vector<IntTuple> inner;
    for (int k = 0; k < take && at < sizes.size(); ++k) inner.emplace_back(sizes[at++]);
    if (inner.size() == 1 && (style == 0 || g % 2 == 0)) {
      modes.push_back(inner[0]);
    } else if (style == 2 && inner.size() > 1) {
      std::vector<IntTuple> wrapped{IntTuple::tuple({inner[0]}),
                                    IntTuple::tuple(std::span<const IntTuple>(inner.data() + 1, inner.size() - 1))};
      modes.push_back(IntTuple::tuple(wrapped));
    } else {
      modes.push_back(IntTuple::tuple(inner));
    }
  }
  return IntTuple::tuple(modes);
}

// shape generates an IntTuple shape with 1..6 leaves and size <= 4096.
inline rc::Gen<IntTuple> shape() {
  return rc::gen::map(
      rc::gen::tuple(rc::gen::container<std::vector<int64_t>>(rc::gen::inRange<int64_t>(1, 9)),
                     rc::gen::container<std::vector<int>>(rc::gen::inRange(0, 3)),
                     rc::gen::inRange(0, 4)),
      [](const std::tuple<std::vector<int64_t>, std::vector<int>, int>& t) {
        std::vector<int64_t> sizes = std::get<0>(t);
        if (sizes.empty()) sizes.push_back(2);
        if (sizes.size() > 6) sizes.resize(6);
        int64_t total = 1;
        for (int64_t& s : sizes) {
          if (total * s > 4096) s = 1;
          total *= s;
        }
        return build_shape(sizes, std::get<1>(t), std::get<2>(t));
      });
}

// with_leaves replaces the leaves of `like` by `values`, in order.
inline IntTuple with_leaves(const IntTuple& like, const std::vector<int64_t>& values) {
  IntTupleBuilder b;
  std::size_t k = 0;
  auto rec = [&](auto&& self, const IntTuple::Node* n) -> void {
    if (n->arity == IntTuple::kLeaf) {
      b.leaf(values[k++]);
      return;
    }
    b.open();
    const IntTuple::Node* c = n + 1;
    for (int i = 0; i < n->arity; ++i, c += c->span) self(self, c);
    b.close();
  };
  rec(rec, like.nodes());
  return b.take();
}

inline std::vector<int64_t> leaf_values(const IntTuple& t) {
  std::vector<int64_t> out;
  for (int i = 0; i < t.node_count(); ++i) {
    if (t.nodes()[i].arity == IntTuple::kLeaf) out.push_back(t.nodes()[i].value);
  }
  return out;
}

// injective_layout: a compact layout whose modes are permuted, with optional gaps (factors)
// between consecutive strides; chained when every gap is 1.
inline rc::Gen<Layout> injective_layout(bool allow_gaps = true) {
  return rc::gen::map(
      rc::gen::tuple(shape(), rc::gen::container<std::vector<int>>(rc::gen::inRange(0, 1000)),
                     rc::gen::container<std::vector<int>>(rc::gen::inRange(1, 4))),
      [allow_gaps](const std::tuple<IntTuple, std::vector<int>, std::vector<int>>& t) {
        const IntTuple& s = std::get<0>(t);
        std::vector<int64_t> sizes = leaf_values(s);
        std::vector<std::size_t> order(sizes.size());
        std::iota(order.begin(), order.end(), 0);
        const auto& keys = std::get<1>(t);
        std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
          int ka = a < keys.size() ? keys[a] : 0;
          int kb = b < keys.size() ? keys[b] : 0;
          return ka < kb;
        });
        std::vector<int64_t> strides(sizes.size());
        int64_t cur = 1;
        for (std::size_t k = 0; k < order.size(); ++k) {
          int gap = allow_gaps && k < std::get<2>(t).size() ? std::get<2>(t)[k] : 1;
          strides[order[k]] = cur * gap;
          cur = cur * gap * sizes[order[k]];
        }
        return Layout(s, with_leaves(s, strides));
      });
}

// any_layout: random strides in [0, 16] (stride 0 and overlapping layouts included), or an
// injective layout.
inline rc::Gen<Layout> any_layout() {
  auto random = rc::gen::map(
      rc::gen::tuple(shape(), rc::gen::container<std::vector<int64_t>>(
                                  rc::gen::weightedOneOf<int64_t>(
                                      {{1, rc::gen::just<int64_t>(0)},
                                       {4, rc::gen::inRange<int64_t>(1, 17)}}))),
      [](const std::tuple<IntTuple, std::vector<int64_t>>& t) {
        const IntTuple& s = std::get<0>(t);
        std::vector<int64_t> d = std::get<1>(t);
        d.resize(static_cast<std::size_t>(s.leaf_count()), 1);
        return Layout(s, with_leaves(s, d));
      });
  return rc::gen::oneOf(random, injective_layout(true), injective_layout(false));
}

// convention: torch or cute.
inline rc::Gen<Convention> convention() {
  return rc::gen::element(Convention::kTorch, Convention::kCute);
}

}  // namespace meshsim::gen

namespace meshsim {
inline void showValue(const Layout& l, std::ostream& os) { os << to_string(l); }
inline void showValue(const IntTuple& t, std::ostream& os) { os << to_string(t); }
inline void showValue(Convention c, std::ostream& os) { os << to_string(c); }
}  // namespace meshsim

namespace rc {
template <>
struct Arbitrary<meshsim::Layout> {
  static Gen<meshsim::Layout> arbitrary() { return meshsim::gen::any_layout(); }
};
template <>
struct Arbitrary<meshsim::Convention> {
  static Gen<meshsim::Convention> arbitrary() { return meshsim::gen::convention(); }
};
}  // namespace rc
