#include "meshsim/device_mesh.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "meshsim/algebra.hpp"
#include "meshsim/error.hpp"
#include "checked_math.hpp"
#include "device_mesh_parts.hpp"
#include "flat_modes.hpp"
#include "rank_map.hpp"
#include "universe.hpp"

namespace meshsim {

using namespace mesh_detail;

namespace mesh_detail {

// leaves_by_stride lists the leaves of size > 1, ordered by stride (ties keep mode order).
Leaves leaves_by_stride(const Layout& l) {
  Leaves out;
  const detail::LayoutView v(l);
  for (int dim = 0; dim < l.rank(); ++dim) {
    const detail::LayoutView m = v.mode(dim);
    int64_t w = 1;  // row-major inside the mode: the last leaf is fastest
    for (int i = m.span(); i-- > 0;) {
      if (m.s[i].arity != IntTuple::kLeaf) continue;
      const int64_t s = m.s[i].value;
      if (s != 1) out.push_back(MeshLeaf{s, m.d[i].value, dim, w});
      w *= s;  // bounded by size(l), checked at construction
    }
  }
  // Insertion sort (stable, no buffer) for a mesh's few leaves; std::stable_sort beyond.
  if (out.size() > 16) {
    std::stable_sort(out.begin(), out.end(),
                     [](const MeshLeaf& a, const MeshLeaf& b) { return a.d < b.d; });
    return out;
  }
  for (std::size_t i = 1; i < out.size(); ++i) {
    const MeshLeaf x = out[i];
    std::size_t j = i;
    for (; j > 0 && x.d < out[j - 1].d; --j) out[j] = out[j - 1];
    out[j] = x;
  }
  return out;
}

// tiles_rank_map is whether copies of `l` tile positions [0, n) exactly: the sorted strides
// form a mixed radix (each stride a multiple of the span below it) that divides n. Every mesh
// derived from a root by slicing, flattening, unflattening or concatenating has this form;
// coordinates are then digits, found in O(ndim).
bool tiles_rank_map(const Layout& l, int64_t n) {
  int64_t span = 1;
  for (const MeshLeaf& x : leaves_by_stride(l)) {
    if (x.d < span || x.d % span != 0) return false;
    const std::optional<int64_t> next = try_mul(x.d, x.s);
    if (!next) return false;
    span = *next;
  }
  return n % span == 0;
}

// Layout::rank() == 1 with a scalar shape still counts as one mode; canonical gives every mode
// its coalesced form so identity never depends on int-vs-tuple spelling.
// Written in one pass from views; coalescing keeps each mode's size and cosize, so the result
// is valid by construction.
Layout canonical_of(const Layout& l) {
  const detail::LayoutView v(l);
  if (!v.is_leaf() && v.span() == v.rank() + 1) {
    // Every mode a leaf (a root's row-major layout, most slices): a leaf coalesces to itself,
    // or to 1:0 when its size is 1, so the canonical form is a copy with those strides zeroed.
    Layout out = l;
    auto& d = detail::NodeAccess::nodes(detail::NodeAccess::stride(out));
    for (int i = 1; i < v.span(); ++i) {
      if (v.s[i].value == 1) d[static_cast<std::size_t>(i)].value = 0;
    }
    return out;
  }
  Layout out = detail::NodeAccess::blank();
  detail::LayoutBuilder b(out);
  detail::Leaves m;
  b.open();
  for (int i = 0; i < l.rank(); ++i) {
    detail::coalesce_into(v.mode(i), Convention::kTorch, m);
    detail::emit_flat(b, m, Convention::kTorch);
  }
  b.close();
  return out;
}

// canonical_after_unflatten is canonical_of(layout) for a layout whose modes [dim, dim + count)
// replaced mode dim of a mesh whose canonical layout is `canonical`: the untouched modes keep
// their canonical form, only the new ones are coalesced.
Layout canonical_after_unflatten(const Layout& canonical, const Layout& layout, int dim, int count) {
  Layout out = detail::NodeAccess::blank();
  detail::LayoutBuilder b(out);
  detail::Leaves m;
  b.open();
  detail::LayoutView cm = detail::LayoutView(canonical).mode(0);
  detail::LayoutView lm = detail::LayoutView(layout).mode(0);
  const auto next = [](detail::LayoutView v) { return detail::LayoutView(v.s + v.span(), v.d + v.span()); };
  for (int i = 0; i < canonical.rank(); ++i, cm = next(cm)) {
    if (i != dim) {
      b.append(cm);
      if (i < dim) lm = next(lm);
      continue;
    }
    for (int k = 0; k < count; ++k, lm = next(lm)) {
      detail::coalesce_into(lm, Convention::kTorch, m);
      detail::emit_flat(b, m, Convention::kTorch);
    }
  }
  b.close();
  return out;
}

}  // namespace mesh_detail

}  // namespace meshsim
