// flat_modes.hpp (core-private) — how the algebra, the _MeshLayout helpers and DeviceMesh work
// on layouts without copying them:
//   LayoutView     a layout or any sub-layout (a mode, a mode of a mode) as two pointers into its
//                  owner's preorder nodes; modes and sub-tuples are views, never copies;
//   Leaf, Leaves   a layout's (size, stride) leaves as one flat inline array: the kernels compute
//                  on these;
//   LayoutBuilder  writes a result's shape and stride trees in one preorder pass, in place in the
//                  returned Layout (no intermediate tuples, no moves of inline storage).
// A typical mesh layout (<= 16 nodes) never touches the heap on any of these paths.
#pragma once

#include <cstdint>
#include <span>

#include <boost/container/small_vector.hpp>

#include "meshsim/error.hpp"
#include "meshsim/layout.hpp"

namespace meshsim::detail {

using Node = IntTuple::Node;

// Leaf is one (size, stride) pair of a layout.
struct Leaf {
  int64_t s;
  int64_t d;
};
using Leaves = InlineVector<Leaf, 16>;

// NodeAccess is core's write access to the preorder storage of IntTuple and Layout.
struct NodeAccess {
  static IntTuple::Storage& nodes(IntTuple& t) { return t.nodes_; }
  static IntTuple& shape(Layout& l) { return l.shape_; }
  static IntTuple& stride(Layout& l) { return l.stride_; }
  // blank is a Layout with empty trees, to be written by a LayoutBuilder (not a valid value
  // until then).
  static Layout blank() { return Layout(IntTuple(IntTuple::Empty{}), IntTuple(IntTuple::Empty{}), Layout::Adopt{}); }
};

// LayoutView is a (sub-)layout by reference: valid while its owner lives and is not modified.
struct LayoutView {
  const Node* s;
  const Node* d;

  LayoutView(const Layout& l) : s(l.shape().nodes()), d(l.stride().nodes()) {}  // NOLINT
  LayoutView(const Node* shape, const Node* stride) : s(shape), d(stride) {}

  bool is_leaf() const { return s->arity == IntTuple::kLeaf; }
  // rank is the number of top-level modes (1 for a leaf); span the nodes of the subtree.
  int rank() const { return is_leaf() ? 1 : s->arity; }
  int span() const { return s->span; }
  // mode is top-level mode i (0 <= i < rank; a leaf is its own mode 0). O(i) pointer hops.
  LayoutView mode(int i) const {
    if (is_leaf()) return *this;
    const Node* cs = s + 1;
    const Node* cd = d + 1;
    for (int k = 0; k < i; ++k) {
      cd += cs->span;
      cs += cs->span;
    }
    return {cs, cd};
  }
  // copy is an owning Layout of the view (for results and error messages).
  Layout copy() const;
  // Leaves in preorder: [begin, begin + span) with arity == kLeaf.
  template <typename F>
  void for_each_leaf(F f) const {
    for (int i = 0; i < s->span; ++i) {
      if (s[i].arity == IntTuple::kLeaf) f(Leaf{s[i].value, d[i].value});
    }
  }
};

// size is the product of the view's sizes (OverflowError never fires for a view of a valid
// Layout, whose size was checked on construction); cosize is 1 + sum((s - 1) * d).
inline int64_t size(LayoutView v) {
  int64_t p = 1;
  for (int i = 0; i < v.s->span; ++i) {
    if (v.s[i].arity == IntTuple::kLeaf && __builtin_mul_overflow(p, v.s[i].value, &p)) {
      throw OverflowError("size of a sub-layout overflows 64-bit signed integers");
    }
  }
  return p;
}
int64_t cosize(LayoutView v);

// add appends the leaf (s, d) field by field (see LayoutBuilder::put).
inline void add(Leaves& v, int64_t s, int64_t d) {
  Leaf* x = v.grow_by(1);
  x->s = s;
  x->d = d;
}

// leaves lists the view's leaves left to right (preorder).
inline Leaves leaves(LayoutView v) {
  Leaves out;
  for (int i = 0; i < v.s->span; ++i) {
    if (v.s[i].arity == IntTuple::kLeaf) add(out, v.s[i].value, v.d[i].value);
  }
  return out;
}

// write_flat appends n >= 1 leaves (in order or reversed) to shape and stride node arrays as a
// depth <= 1 value: a tuple node and its leaves, or the leaf itself when n == 1. Fields are
// written one by one (a whole-Node temporary reloaded as one 16-byte value stalls on store
// forwarding).
inline void write_flat(IntTuple::Storage& rs, IntTuple::Storage& rd, const Leaf* m, std::size_t n,
                       bool reversed) {
  const std::size_t head = n == 1 ? 0 : 1;
  Node* s = rs.grow_by(n + head);
  Node* d = rd.grow_by(n + head);
  if (head) {
    s[0].value = d[0].value = 0;
    s[0].arity = d[0].arity = static_cast<int32_t>(n);
    s[0].span = d[0].span = static_cast<int32_t>(n + 1);
  }
  for (std::size_t i = 0; i < n; ++i) {
    const Leaf& x = m[reversed ? n - 1 - i : i];
    s[i + head].value = x.s;
    d[i + head].value = x.d;
    s[i + head].arity = d[i + head].arity = IntTuple::kLeaf;
    s[i + head].span = d[i + head].span = 1;
  }
}

// LayoutBuilder writes `out` in preorder (shape and stride together). `out` is cleared on
// construction and holds the result once exactly one complete value has been written:
//   Layout r; { LayoutBuilder b(r); b.open(); b.leaf(2, 1); b.leaf(3, 2); b.close(); } // (2,3):(1,2)
// No validation: for results valid by construction (the public constructor validates).
class LayoutBuilder {
 public:
  explicit LayoutBuilder(Layout& out)
      : s_(NodeAccess::nodes(NodeAccess::shape(out))), d_(NodeAccess::nodes(NodeAccess::stride(out))) {
    s_.clear();
    d_.clear();
  }
  [[gnu::always_inline]] void leaf(int64_t s, int64_t d) {
    count_child();
    put(s_, s, IntTuple::kLeaf);
    put(d_, d, IntTuple::kLeaf);
  }
  // flat writes n >= 1 leaves as a depth <= 1 layout (the leaf itself when n == 1), in
  // order or reversed: the common result of the algebra, written in one pass.
  void flat(const Leaf* m, std::size_t n, bool reversed) {
    if (n == 1) {
      leaf(m[0].s, m[0].d);
      return;
    }
    count_child();
    write_flat(s_, d_, m, n, reversed);
  }
  void append(LayoutView v) {
    count_child();
    s_.append(v.s, v.s + v.s->span);
    d_.append(v.d, v.d + v.d->span);
  }
  [[gnu::always_inline]] void open() {
    count_child();
    open_.push_back(static_cast<int32_t>(s_.size()));
    put(s_, 0, 0);
    put(d_, 0, 0);
  }
  [[gnu::always_inline]] void close() {
    if (open_.empty()) throw Internal("LayoutBuilder: close() without open()");
    const int32_t at = open_.back();
    open_.pop_back();
    const auto span = static_cast<int32_t>(s_.size()) - at;
    s_[static_cast<std::size_t>(at)].span = span;
    d_[static_cast<std::size_t>(at)].span = span;
  }
  // complete is true once exactly one whole value has been written.
  bool complete() const {
    return open_.empty() && !s_.empty() && s_[0].span == static_cast<int32_t>(s_.size());
  }

 private:
  // put appends a node field by field (a whole-Node temporary read back as one 16-byte load
  // stalls on store forwarding, which dominated small results).
  [[gnu::always_inline]] static void put(IntTuple::Storage& v, int64_t value, int32_t arity) {
    Node* n = v.grow_by(1);
    n->value = value;
    n->arity = arity;
    n->span = 1;
  }
  [[gnu::always_inline]] void count_child() {
    if (!open_.empty()) {
      ++s_[static_cast<std::size_t>(open_.back())].arity;
      ++d_[static_cast<std::size_t>(open_.back())].arity;
    }
  }
  IntTuple::Storage& s_;
  IntTuple::Storage& d_;
  InlineVector<int32_t, 8> open_;
};

// make_flat is LayoutBuilder::flat into a new layout, written without a builder (the common
// result of the algebra: n >= 1 leaves as a depth <= 1 layout, a leaf when n == 1).
inline Layout make_flat(const Leaf* m, std::size_t n, bool reversed) {
  Layout r = NodeAccess::blank();
  write_flat(NodeAccess::nodes(NodeAccess::shape(r)), NodeAccess::nodes(NodeAccess::stride(r)), m,
             n, reversed);
  return r;
}

// check_layout runs the checks of Layout's constructor on l (InvalidArgument, OverflowError):
// for layouts assembled by a LayoutBuilder from parts that are not valid by construction.
void check_layout(const Layout& l);

// coalesce_into writes coalesce(l, c)'s modes inner-first (fastest first) into `out`.
void coalesce_into(LayoutView l, Convention c, Leaves& out);
// emit_flat writes inner-first modes as coalesce does: a depth <= 1 layout, a scalar for one.
inline void emit_flat(LayoutBuilder& b, const Leaves& modes, Convention c) {
  b.flat(modes.data(), modes.size(), c == Convention::kTorch);
}
// compose is composition(a, b, c) on views.
Layout compose(LayoutView a, LayoutView b, Convention c);

// join_unchecked makes `modes` the top-level modes of one layout without validating it (for
// callers whose modes are valid by construction; make_layout validates).
Layout join_unchecked(std::span<const Layout> modes);
Layout join_unchecked(std::span<const LayoutView> modes);

}  // namespace meshsim::detail
