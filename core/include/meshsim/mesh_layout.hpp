// meshsim/mesh_layout.hpp — PyTorch `_MeshLayout` helpers: the DeviceMesh bookkeeping recipes
// over a Layout in the torch convention.
//
//   Layout l = parse_layout("(2,4):(4,1)");
//   mesh_global_ranks(l, 16) == {{0..7}, {8..15}}
//   mesh_flatten(parse_layout("(2,2,2):(4,2,1)")) == parse_layout("8:1")
//   mesh_unflatten(parse_layout("8:1"), 0, {2, 2, 2}) == parse_layout("(2,2,2):(4,2,1)")
//
// Enumerations (rank lists) are bounded by kMaxEnumeration elements; larger answers throw
// ResourceExhausted instead of allocating without bound.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "meshsim/layout.hpp"

namespace meshsim {

// kMaxEnumeration is the most elements a mesh_* enumeration produces (2^24).
inline constexpr int64_t kMaxEnumeration = int64_t{1} << 24;

// mesh_check_non_overlap is true when L maps its domain to distinct ranks (L is injective).
// Decided in O(rank log rank) when the sorted strides dominate; otherwise by enumeration
// (ResourceExhausted when size(L) > kMaxEnumeration and the fast tests cannot decide).
bool mesh_check_non_overlap(const Layout& l);
// mesh_check_orthogonal is PyTorch's _FlatLayout.check_orthogonal: L coalesced (torch
// convention) and flattened, its modes sorted by (stride, size) from the largest; true when
// fewer than two modes remain or each stride is a multiple of the next mode's stride x size
// (the modes nest, so no two coordinates meet). Stricter than mesh_check_non_overlap:
// (3,2):(2,3) is injective but not orthogonal; but a lone broadcast mode (2:0) passes, as in
// PyTorch (nothing to compare). PyTorch's DeviceMesh asserts it of a mesh's collapsed layout
// (every dim's modes together). Where the divisor is 0 (a broadcast mode sorted last) PyTorch
// raises ZeroDivisionError; this answers false.
// O(modes log modes); no enumeration, any size.
bool mesh_check_orthogonal(const Layout& l);
// mesh_all_ranks_from_zero lists L(c) for the flattened coordinates in row-major order.
std::vector<int64_t> mesh_all_ranks_from_zero(const Layout& l);
// mesh_top_level_sizes is the size of each top-level mode.
std::vector<int64_t> mesh_top_level_sizes(const Layout& l);
// mesh_nest wraps L as one top-level mode: S:D -> (S):(D).
Layout mesh_nest(const Layout& l);
// mesh_coalesce is the torch coalesce, then every stride 0 replaced by 1 (PyTorch's rule).
Layout mesh_coalesce(const Layout& l);
// mesh_flatten is mesh_coalesce, nested into one mode when more than one mode is left.
Layout mesh_flatten(const Layout& l);
// mesh_getitem is mode `index` (Python indexing, -rank <= index < rank); for a scalar shape
// only index 0 (PyTorch asserts otherwise). OutOfRange otherwise.
Layout mesh_getitem(const Layout& l, int64_t index);
// mesh_splice replaces top-level modes [start, end) (Python slice rules) by the modes of
// `insert`; a scalar shape counts as one mode; the result is always a tuple.
Layout mesh_splice(const Layout& l, int64_t start, int64_t end, const Layout& insert);
// mesh_unflatten splits mode `dim` into `sizes` (row-major): splice(dim, dim+1, L[dim] o
// (sizes):(suffix strides)). OutOfRange unless 0 <= dim < rank (PyTorch does not normalise a
// negative dim and corrupts the rank set; meshsim rejects it); InvalidArgument when the sizes'
// product differs from the mode's size.
Layout mesh_unflatten(const Layout& l, int64_t dim, std::span<const int64_t> sizes);
// mesh_global_ranks is one group of ranks per offset of complement(L, world_size), in
// complement order, each group in L's row-major order.
std::vector<std::vector<int64_t>> mesh_global_ranks(const Layout& l, int64_t world_size);

// GroupTable is every group of a dim in one buffer: `count` rows of `size` ranks, row g at
// ranks[g * size, (g + 1) * size).
struct GroupTable {
  int64_t count = 0;
  int64_t size = 0;
  std::vector<int64_t> ranks;
  std::span<const int64_t> row(int64_t g) const {
    return {ranks.data() + g * size, static_cast<std::size_t>(size)};
  }
  friend bool operator==(const GroupTable&, const GroupTable&) = default;
};
// mesh_group_table is mesh_global_ranks in one allocation, whatever the number of groups.
GroupTable mesh_group_table(const Layout& l, int64_t world_size);
// mesh_group_table_prefix is the first min(max_groups, all) rows of mesh_group_table, each cut
// to its first min(max_members, size(l)) ranks (`size` is that cut), at a cost in what it
// lists, not in the world (a summary of a 2^24-rank world lists a few groups).
GroupTable mesh_group_table_prefix(const Layout& l, int64_t world_size, int64_t max_groups,
                                   int64_t max_members = INT64_MAX);
// mesh_rank_at is L(c) for the flattened coordinate `index` in row-major order: element `index`
// of mesh_all_ranks_from_zero(l), without listing the others.
int64_t mesh_rank_at(const Layout& l, int64_t index);

// RemappedTensor is a row-major N-d array: `shape` and the `values` in row-major order.
struct RemappedTensor {
  std::vector<int64_t> shape;
  std::vector<int64_t> values;
};
// mesh_remap_to_tensor views rank_map through (complement(L, n), L), n = rank_map.size(), as
// the array [-1, *top_level_sizes(L)]. InvalidArgument when n < cosize(L) or when the view
// leaves the buffer (n not a multiple of L's span).
RemappedTensor mesh_remap_to_tensor(const Layout& l, std::span<const int64_t> rank_map);
// mesh_disjoint is true when the layouts, joined as top-level modes, do not overlap (what
// DeviceMesh slicing with flattened names and concatenate check).
bool mesh_disjoint(std::span<const Layout> layouts);

}  // namespace meshsim
