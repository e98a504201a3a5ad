// meshsim/int_tuple.hpp — IntTuple: an integer or a tuple of IntTuples, nested to any depth.
//
// `4` and `(4)` are different values (rank 1 both, depth 0 vs 1) and compare unequal; results of
// the layout algebra are compared structurally, so the distinction is kept everywhere.
//
//   IntTuple s = IntTuple::tuple({IntTuple::tuple({2, 2}), 4});   // ((2,2),4)
//   s.rank() == 2; s.depth() == 2; size(s) == 16; to_string(s) == "((2,2),4)"
//   parse_int_tuple("((2,2),4)") == s
//
// Storage is a preorder array of nodes kept inline for up to 16 nodes (a layout with 8 leaves
// nested once), so typical mesh shapes never touch the heap. Values are immutable after
// construction; copies are cheap. Thread-safety: a const IntTuple may be shared freely.
#pragma once

#include <boost/container/small_vector.hpp>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

#include "meshsim/inline_vector.hpp"

namespace meshsim {

namespace detail {
struct NodeAccess;
}

// kMaxDepth bounds the nesting accepted from text and JSON (deeper input is rejected with
// InvalidArgument instead of exhausting the stack).
inline constexpr int kMaxDepth = 32;
// kMaxNodes bounds the number of nodes (ints plus tuples) of one IntTuple built from input, and so
// the modes of a layout read from input (as kMaxMeshDims bounds a mesh's dims). Every operation on
// a layout this size stays within milliseconds, and answers that nest once per mode (a remapped
// tensor) stay within a safe recursion depth.
inline constexpr int kMaxNodes = 4096;

class IntTuple {
 public:
  // Node is one preorder entry: a leaf (arity == kLeaf) holding `value`, or a tuple with
  // `arity` children whose subtree spans `span` nodes including itself.
  struct Node {
    int64_t value;
    int32_t arity;
    int32_t span;
  };
  static constexpr int32_t kLeaf = -1;
  using Storage = detail::InlineVector<Node, 16>;

  // IntTuple(v) is the integer v.
  IntTuple(int64_t v = 0) {  // NOLINT: implicit by design
    // Field by field: a whole-Node temporary read back as one 16-byte load stalls on store
    // forwarding, which dominated the cost of building small tuples.
    Node* n = nodes_.grow_by(1);
    n->value = v;
    n->arity = kLeaf;
    n->span = 1;
  }
  IntTuple(int v) : IntTuple(static_cast<int64_t>(v)) {}    // NOLINT

  // tuple builds the tuple of the given elements (an empty list gives the empty tuple).
  static IntTuple tuple(std::initializer_list<IntTuple> elements);
  static IntTuple tuple(std::span<const IntTuple> elements);

  bool is_int() const { return nodes_[0].arity == kLeaf; }
  bool is_tuple() const { return !is_int(); }
  // value is the integer of an int; InvalidArgument for a tuple.
  int64_t value() const;
  // rank is the number of top-level elements; 1 for an int.
  int rank() const { return is_int() ? 1 : nodes_[0].arity; }
  // depth is 0 for an int and 1 + the largest child depth for a tuple.
  int depth() const;
  // operator[] is the i-th top-level element; for an int only i == 0 is valid (itself).
  IntTuple operator[](int i) const;
  // leaf_count is the number of integers in the tree.
  int leaf_count() const;

  // nodes is the preorder node array (for algorithms that walk the tree without copying).
  const Node* nodes() const { return nodes_.data(); }
  int node_count() const { return static_cast<int>(nodes_.size()); }
  // from_nodes copies the subtree rooted at `root`.
  static IntTuple from_nodes(const Node* root);

  friend bool operator==(const IntTuple& a, const IntTuple& b);
  friend bool operator!=(const IntTuple& a, const IntTuple& b) { return !(a == b); }
  std::size_t hash() const;

 private:
  friend class IntTupleBuilder;
  friend struct detail::NodeAccess;
  struct Empty {};
  explicit IntTuple(Empty) {}
  Storage nodes_;
};

// transform_leaves is `t` with every leaf v replaced by f(k, v), k the leaf's preorder index
// (0, 1, ...); the tree structure is kept. It builds a new tuple (IntTuples are never edited).
template <typename F>
IntTuple transform_leaves(const IntTuple& t, F f);

// IntTupleBuilder assembles an IntTuple in preorder:
//   IntTupleBuilder b; b.open(); b.leaf(2); b.leaf(3); b.close(); IntTuple t = b.take();  // (2,3)
class IntTupleBuilder {
 public:
  void leaf(int64_t v);
  void append(const IntTuple& t) { append(t.nodes()); }
  void append(const IntTuple::Node* subtree_root);
  void open();
  void close();
  // take returns the finished tuple; exactly one top-level value must have been added.
  IntTuple take();

 private:
  void count_child();
  IntTuple::Storage nodes_;
  detail::InlineVector<int32_t, 8> open_;
};

template <typename F>
IntTuple transform_leaves(const IntTuple& t, F f) {
  IntTupleBuilder b;
  const IntTuple::Node* n = t.nodes();
  // Preorder with explicit closes: a stack of remaining children per open tuple.
  boost::container::small_vector<int32_t, 8> left;
  int leaf = 0;
  for (int i = 0; i < t.node_count(); ++i) {
    if (n[i].arity == IntTuple::kLeaf) {
      b.leaf(f(leaf++, n[i].value));
      if (!left.empty()) --left.back();
    } else {
      if (!left.empty()) --left.back();
      b.open();
      left.push_back(n[i].arity);
    }
    while (!left.empty() && left.back() == 0) {
      b.close();
      left.pop_back();
    }
  }
  return b.take();
}

// size is the product of all leaves (1 for the empty tuple); OverflowError when it overflows.
int64_t size(const IntTuple& t);
// flatten is the tuple of the leaves in order (always a tuple, `4` gives `(4)`).
IntTuple flatten(const IntTuple& t);
// Convention picks how an integer index maps to a coordinate.
//   kTorch (PyTorch `_pycute`, `_MeshLayout`): lexicographic, the right-most mode is fastest,
//          compact strides are suffix products: (2,3) -> (3,1).
//   kCute  (NVIDIA CuTe, CUTLASS pycute): colexicographic, the left-most mode is fastest,
//          compact strides are prefix products: (2,3) -> (1,2).
enum class Convention { kTorch, kCute };

// to_string is "torch" or "cute"; parse_convention is its inverse (InvalidArgument otherwise).
std::string_view to_string(Convention c);
Convention parse_convention(std::string_view name);

// compact_stride is the exclusive suffix (torch) or prefix (cute) product, congruent to shape.
//   compact_stride((2,(2,3))) == (6,(3,1)) torch, (1,(2,4)) cute.
// @post congruent(result, shape); the layout shape:result is a bijection onto [0, size(shape)).
IntTuple compact_stride(const IntTuple& shape, Convention c = Convention::kTorch);

// shape_div is CuTe's inclusive prefix division, congruent with `a`:
//   tuple / tuple (same rank): mode by mode;  tuple / int: each mode v is divided by what is left
//   of b, which is then divided by size(v);  int / tuple: a / size(b);  int / int: ceil(a / b).
//   shape_div((3,4), 6) == (1,2);  shape_div((6,((3,4),6)), 36) == (1,((1,2),6)).
// @pre every int / int step has a >= 0, b >= 1, and one of a, b divides the other
//      (InvalidArgument naming both otherwise); tuple / tuple ranks agree.
// @post congruent(shape_div(a, b), a).
IntTuple shape_div(const IntTuple& a, const IntTuple& b);
// congruent is true when a and b have the same tree structure.
bool congruent(const IntTuple& a, const IntTuple& b);

// to_string prints CuTe's text form: `4`, `(4)`, `((2,2),4)`.
std::string to_string(const IntTuple& t);
// parse_int_tuple reads CuTe's text form (spaces allowed, Python's `(4,)` accepted for a
// 1-tuple); ParseError on anything else, naming the position.
IntTuple parse_int_tuple(std::string_view text);

}  // namespace meshsim

template <>
struct std::hash<meshsim::IntTuple> {
  std::size_t operator()(const meshsim::IntTuple& t) const noexcept { return t.hash(); }
};
