// meshsim/layout.hpp — Layout: a shape and a congruent stride, CuTe's `shape:stride`.
//
//   Layout l = parse_layout("((2,2),4):((1,8),2)");
//   size(l) == 16; cosize(l) == 16; to_string(l) == "((2,2),4):((1,8),2)"
//   Layout c = Layout::compact(IntTuple::tuple({2, 3}));   // (2,3):(3,1), torch convention
//
// A Layout is an immutable value. Construction checks every invariant the algebra relies on:
// shape and stride congruent, every size >= 1, every stride >= 0, and size and cosize fit in
// int64_t. Thread-safety: const Layouts may be shared freely.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "meshsim/int_tuple.hpp"

namespace meshsim {


class Layout {
 public:
  // Layout(shape, stride) validates (see file comment); InvalidArgument or OverflowError.
  Layout(IntTuple shape, IntTuple stride);
  // Layout() is the trivial layout 1:0.
  Layout() : shape_(1), stride_(0) {}

  // compact is shape with the compact strides of the convention.
  static Layout compact(const IntTuple& shape, Convention c = Convention::kTorch);
  // unchecked skips validation; only for callers that construct valid layouts by design.
  static Layout unchecked(IntTuple shape, IntTuple stride);

  const IntTuple& shape() const { return shape_; }
  const IntTuple& stride() const { return stride_; }
  // rank is the number of top-level modes (1 for an int shape); depth is the shape's depth.
  int rank() const { return shape_.rank(); }
  int depth() const { return shape_.depth(); }
  // operator[] is top-level mode i; OutOfRange unless 0 <= i < rank().
  Layout operator[](int i) const;

  friend bool operator==(const Layout& a, const Layout& b) {
    return a.shape_ == b.shape_ && a.stride_ == b.stride_;
  }
  friend bool operator!=(const Layout& a, const Layout& b) { return !(a == b); }
  std::size_t hash() const;

 private:
  friend struct detail::NodeAccess;
  // Layout(shape, stride, {}) adopts both trees unchecked (for detail::NodeAccess).
  struct Adopt {};
  Layout(IntTuple shape, IntTuple stride, Adopt) : shape_(std::move(shape)), stride_(std::move(stride)) {}
  IntTuple shape_;
  IntTuple stride_;
};

// size is the number of coordinates: the product of the shape.
int64_t size(const Layout& l);
// cosize is L(size - 1) + 1 = 1 + sum((s - 1) * d) over the leaves.
int64_t cosize(const Layout& l);
// make_layout joins layouts as the top-level modes of one layout: (A, B) -> (SA,SB):(DA,DB).
Layout make_layout(std::span<const Layout> modes);
Layout make_layout(std::initializer_list<Layout> modes);
// mirror reverses shape and stride trees at every level: torch_op(X) == mirror(cute_op(mirror(X))).
IntTuple mirror(const IntTuple& t);
Layout mirror(const Layout& l);

// to_string prints `shape:stride` in CuTe's text form.
std::string to_string(const Layout& l);
// parse_layout reads `shape:stride` (a shape alone gets torch-compact strides); ParseError or
// the constructor's errors otherwise.
Layout parse_layout(std::string_view text);

}  // namespace meshsim

template <>
struct std::hash<meshsim::Layout> {
  std::size_t operator()(const meshsim::Layout& l) const noexcept { return l.hash(); }
};
