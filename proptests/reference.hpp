// reference.hpp — brute-force evaluation of layouts, independent of meshsim's algebra code.
//
// Used by the property tests and unit tests as the oracle: a layout is evaluated leaf by leaf
// from its flattened shape and stride, with the outermost leaf taking any overflow (the natural
// extension), as docs/algebra.md defines it.
#pragma once

#include <cstdint>
#include <set>
#include <vector>

#include "meshsim/layout.hpp"

namespace meshsim::reference {

struct Leaf {
  int64_t s;
  int64_t d;
};

inline std::vector<Leaf> leaves(const Layout& l) {
  std::vector<Leaf> out;
  for (int i = 0; i < l.shape().node_count(); ++i) {
    if (l.shape().nodes()[i].arity == IntTuple::kLeaf) {
      out.push_back({l.shape().nodes()[i].value, l.stride().nodes()[i].value});
    }
  }
  return out;
}

// eval is L(i) on the natural extension: leaves fastest-first (last leaf first in torch).
inline int64_t eval(const Layout& l, int64_t i, Convention c) {
  std::vector<Leaf> ls = leaves(l);
  if (c == Convention::kTorch) std::vector<Leaf>(ls.rbegin(), ls.rend()).swap(ls);
  int64_t r = 0;
  for (std::size_t k = 0; k < ls.size(); ++k) {
    if (k + 1 == ls.size()) {
      r += i * ls[k].d;
    } else {
      r += (i % ls[k].s) * ls[k].d;
      i /= ls[k].s;
    }
  }
  return r;
}

inline int64_t size_of(const Layout& l) {
  int64_t n = 1;
  for (const Leaf& x : leaves(l)) n *= x.s;
  return n;
}

// image is the set of values of L on its domain.
inline std::set<int64_t> image(const Layout& l, Convention c) {
  std::set<int64_t> out;
  for (int64_t i = 0; i < size_of(l); ++i) out.insert(eval(l, i, c));
  return out;
}

inline bool injective(const Layout& l, Convention c) {
  return static_cast<int64_t>(image(l, c).size()) == size_of(l);
}

}  // namespace meshsim::reference
