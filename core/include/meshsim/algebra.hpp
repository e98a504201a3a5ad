// meshsim/algebra.hpp — the CuTe layout algebra over meshsim::Layout, in both conventions.
//
// Reference semantics: PyTorch's `_pycute` for Convention::kTorch (the default) and CUTLASS
// pycute for Convention::kCute; results match them structurally, including scalar results
// (`8:1`, not `(8):(1)`). Where a reference returns a value that breaks the operation's own
// postcondition (pycute does not check several preconditions), these functions throw
// InvalidArgument instead, naming the rule. Every product is overflow-checked.
//
//   Layout a = parse_layout("(2,2):(4,1)");
//   complement(a, 16) == parse_layout("(2,2):(8,2)")                         // torch
//   complement(parse_layout("(2,2):(1,4)"), 16, Convention::kCute) == parse_layout("(2,2):(2,8)")
//   composition(parse_layout("(6,2):(2,1)"), parse_layout("3:2")) == parse_layout("3:2")
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "meshsim/int_tuple.hpp"
#include "meshsim/layout.hpp"

namespace meshsim {

// compact_stride and shape_div, the IntTuple helpers, are declared in int_tuple.hpp.

// crd2idx maps a coordinate to an index: tuple coordinates take inner products mode by mode;
// an int coordinate against a tuple shape is split in the convention's order, the outermost mode
// (first in torch, last in cute) taking any overflow. A coordinate leaf must be >= 0.
//   crd2idx(4, (2,3):(10,1)) == 11 torch, 2 cute.
// @pre shape and stride congruent; coordinate leaves >= 0 (InvalidArgument otherwise).
// @post crd2idx(idx2crd(i, S), S, compact_stride(S)) == i for 0 <= i < size(S).
int64_t crd2idx(const IntTuple& coord, const IntTuple& shape, const IntTuple& stride,
                Convention c = Convention::kTorch);
int64_t crd2idx(const IntTuple& coord, const Layout& l, Convention c = Convention::kTorch);

// idx2crd maps an index (or a partial coordinate) to a coordinate congruent to shape: each leaf
// is (i / d) mod s, with d the given stride or the convention's compact stride. Every mode wraps.
// InvalidArgument for a zero stride or a tuple index against an int shape.
// @pre shape sizes >= 1, strides >= 1, index leaves >= 0. @post congruent(result, shape) for an
// int index; every leaf of the result is < its mode's size.
IntTuple idx2crd(const IntTuple& idx, const IntTuple& shape, Convention c = Convention::kTorch);
IntTuple idx2crd(const IntTuple& idx, const IntTuple& shape, const IntTuple& stride);

// coalesce flattens L, drops size-1 modes and merges neighbours whose strides chain, keeping
// L's function on [0, size). @post depth <= 1; size equal; R(i) == L(i) on the domain.
//   coalesce((2,4):(4,1)) == 8:1 torch; coalesce((2,4):(1,2), kCute) == 8:1.
Layout coalesce(const Layout& l, Convention c = Convention::kTorch);
// coalesce by profile: a tuple profile coalesces mode i against profile[i] (recursively) and
// keeps modes beyond it; a non-tuple profile coalesces the whole layout. Only the profile's
// tree structure matters. InvalidArgument when the profile has more modes than L.
Layout coalesce(const Layout& l, const IntTuple& profile, Convention c = Convention::kTorch);

// filter removes size-1 and stride-0 modes, then coalesces; `1:0` when nothing is left.
// @post depth <= 1; no stride-0 mode of size > 1; the image of R equals the image of L.
Layout filter(const Layout& l, Convention c = Convention::kTorch);
Layout filter(const Layout& l, const IntTuple& profile, Convention c = Convention::kTorch);

// complement(L, M) is the ordered layout R whose image avoids L's (but 0) such that L and R
// together cover [0, M) (the last mode is rounded up). @pre L's sorted strides leave no gap
// smaller than the running extent (else InvalidArgument "non-injective layout in complement");
// M >= 1. Torch returns modes in decreasing stride order, cute in increasing.
//   complement((2,2):(4,1), 16) == (2,2):(8,2) torch; complement(4:2, 16, kCute) == (2,2):(1,8)
// @post R's strides increase (cute) or decrease (torch) mode by mode; R(i) != L(j) for all i, j
// but R(0) == L(0) == 0 (disjoint images); size(R) * size(L) >= M (L and R cover [0, M)).
Layout complement(const Layout& l, int64_t bound = 1, Convention c = Convention::kTorch);

// composition(A, B) is R with R(i) == A(B(i)) for every i < size(B), compatible with B's shape;
// A is evaluated on its natural extension. @pre stride divisibility (each remaining stride and
// A's mode divide one another), shape divisibility (no truncation), and, when B reaches beyond
// A's domain, coalesce(A) must keep A's extension. InvalidArgument naming the rule otherwise.
//   composition((6,2):(2,1), 3:2) == 3:2 torch, 3:4 cute.
// @post R(i) == A(B(i)) for 0 <= i < size(B); size(R) == size(B).
Layout composition(const Layout& a, const Layout& b, Convention c = Convention::kTorch);

// Tiler is a by-mode argument: entry i applies to top-level mode i of A; nullopt keeps that
// mode; modes of A beyond the tiler are kept. (An int n is the layout n:1.) The result is
// always a tuple of rank(A) modes.
using Tiler = std::vector<std::optional<Layout>>;
Layout composition(const Layout& a, const Tiler& tiler, Convention c = Convention::kTorch);

// logical_divide(A, B) = A o (B, complement(B, size(A))): mode 0 the tile, mode 1 the rest,
// in both conventions.
//   logical_divide(16:1, 4:2) == (4,(2,2)):(2,(8,1)) torch.
// @pre the preconditions of complement(B, size(A)) and of the composition.
// @post rank(R) == 2; size(R) >= size(A); R(i) == A(B(i)) for i < size(B) (mode 0 is the tile).
Layout logical_divide(const Layout& a, const Layout& b, Convention c = Convention::kTorch);
Layout logical_divide(const Layout& a, const Tiler& tiler, Convention c = Convention::kTorch);

// logical_product(A, B) = (A, complement(A, size(A) * cosize(B)) o B), in both conventions.
//   logical_product(2:1, 3:1) == (2,3):(1,2).
// @pre the preconditions of the complement and of the composition.
// @post rank(R) == 2; mode 0 equals A; size(R) == size(A) * size(B).
Layout logical_product(const Layout& a, const Layout& b, Convention c = Convention::kTorch);
Layout logical_product(const Layout& a, const Tiler& tiler, Convention c = Convention::kTorch);

// right_inverse is the largest R, contiguous from 0, with L(R(i)) == i for i < size(R);
// `1:0` when L has no stride-1 mode. Never throws for a valid layout.
// @post L(R(i)) == i for 0 <= i < size(R).
Layout right_inverse(const Layout& l, Convention c = Convention::kTorch);
// left_inverse is R with R(L(i)) == i for every i < size(L): right_inverse of (L, complement(L))
// (cute) or (complement(L), L) (torch). @pre L injective with strides that chain so that the
// complement fills every gap; InvalidArgument otherwise.
// @post R(L(i)) == i for 0 <= i < size(L).
Layout left_inverse(const Layout& l, Convention c = Convention::kTorch);

}  // namespace meshsim
