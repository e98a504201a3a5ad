#include "meshsim/mesh_layout.hpp"

#include <algorithm>
#include <string>

#include "meshsim/algebra.hpp"
#include "checked_math.hpp"
#include "flat_modes.hpp"
#include "meshsim/error.hpp"

namespace meshsim {

using Node = IntTuple::Node;

namespace {

using detail::Leaf;
using detail::leaves;

void check_enumeration(int64_t n, const char* what, const Layout& l) {
  if (n > kMaxEnumeration) {
    throw ResourceExhausted(std::string(what) + ": " + std::to_string(n) +
                            " elements for layout " + to_string(l) + " exceed the limit of " +
                            std::to_string(kMaxEnumeration));
  }
}

// for_each_rank calls f(L(c)) for the flattened coordinates c in row-major order.
template <typename F>
void for_each_rank(const Layout& l, const F& f) {
  const detail::Leaves lv = leaves(l);
  const int64_t n = size(l);
  boost::container::small_vector<int64_t, 16> crd(lv.size(), 0);
  int64_t value = 0;
  for (int64_t i = 0; i < n; ++i) {
    f(value);
    for (std::size_t k = lv.size(); k-- > 0;) {  // odometer, last leaf fastest
      if (++crd[k] < lv[k].s) {
        value += lv[k].d;
        break;
      }
      value -= (lv[k].s - 1) * lv[k].d;
      crd[k] = 0;
    }
  }
}

}  // namespace

bool mesh_check_non_overlap(const Layout& l) {
  detail::Leaves live;
  for (const Leaf& x : leaves(l)) {
    if (x.s == 1) continue;
    if (x.d == 0) return false;  // a broadcast mode repeats ranks
    live.push_back(x);
  }
  std::sort(live.begin(), live.end(),
            [](const Leaf& a, const Leaf& b) { return a.d < b.d || (a.d == b.d && a.s < b.s); });
  // Dominance: every stride exceeds the largest value reachable with the smaller ones, so each
  // rank has a unique mixed-radix representation.
  bool dominant = true;
  int64_t reach = 0;  // bounded by cosize, which construction checked
  for (std::size_t k = 0; k < live.size(); ++k) {
    if (k > 0 && live[k].d == live[k - 1].d) return false;  // two modes step by the same stride
    if (live[k].d <= reach) dominant = false;
    reach += (live[k].s - 1) * live[k].d;
  }
  if (dominant) return true;
  const int64_t n = size(l);
  check_enumeration(n, "mesh_check_non_overlap: enumeration", l);
  const int64_t co = cosize(l);
  if (co <= (int64_t{1} << 27)) {
    std::vector<bool> seen(static_cast<std::size_t>(co), false);
    bool ok = true;
    for_each_rank(l, [&](int64_t r) {
      if (seen[static_cast<std::size_t>(r)]) ok = false;
      seen[static_cast<std::size_t>(r)] = true;
    });
    return ok;
  }
  std::vector<int64_t> ranks = mesh_all_ranks_from_zero(l);
  std::sort(ranks.begin(), ranks.end());
  return std::adjacent_find(ranks.begin(), ranks.end()) == ranks.end();
}

bool mesh_check_orthogonal(const Layout& l) {
  detail::Leaves m;
  detail::coalesce_into(l, Convention::kTorch, m);
  if (m.size() < 2) return true;
  std::vector<Leaf> v(m.begin(), m.end());
  std::sort(v.begin(), v.end(), [](const Leaf& a, const Leaf& b) { return a.d > b.d || (a.d == b.d && a.s > b.s); });
  __extension__ using Int128 = __int128;
  for (std::size_t i = 0; i + 1 < v.size(); ++i) {
    const Int128 span = Int128{v[i + 1].d} * v[i + 1].s;  // exact: two int64 factors
    if (span == 0 || Int128{v[i].d} % span != 0) return false;
  }
  return true;
}

std::vector<int64_t> mesh_all_ranks_from_zero(const Layout& l) {
  const int64_t n = size(l);
  check_enumeration(n, "mesh_all_ranks_from_zero", l);
  std::vector<int64_t> out;
  out.reserve(static_cast<std::size_t>(n));
  for_each_rank(l, [&](int64_t r) { out.push_back(r); });
  return out;
}

std::vector<int64_t> mesh_top_level_sizes(const Layout& l) {
  std::vector<int64_t> out;
  for (int i = 0; i < l.rank(); ++i) out.push_back(size(l[i]));
  return out;
}

Layout mesh_nest(const Layout& l) {
  Layout out = detail::NodeAccess::blank();
  detail::LayoutBuilder b(out);
  b.open();
  b.append(l);
  b.close();
  return out;
}

namespace {
// coalesced_modes is the torch coalesce of l (inner-first), every stride 0 replaced by 1 as
// PyTorch's _MeshLayout.coalesce does (a size-1 mode keeps its cosize; a broadcast mode grows
// it, so the result is checked).
detail::Leaves coalesced_modes(const Layout& l) {
  detail::Leaves m;
  detail::coalesce_into(l, Convention::kTorch, m);
  for (Leaf& x : m) {
    if (x.d == 0) x.d = 1;
  }
  return m;
}
}  // namespace

Layout mesh_coalesce(const Layout& l) {
  const detail::Leaves m = coalesced_modes(l);
  Layout out = detail::NodeAccess::blank();
  detail::LayoutBuilder b(out);
  detail::emit_flat(b, m, Convention::kTorch);
  detail::check_layout(out);
  return out;
}

Layout mesh_flatten(const Layout& l) {
  const detail::Leaves m = coalesced_modes(l);
  Layout out = detail::NodeAccess::blank();
  detail::LayoutBuilder b(out);
  if (m.size() > 1) b.open();
  detail::emit_flat(b, m, Convention::kTorch);
  if (m.size() > 1) b.close();
  detail::check_layout(out);
  return out;
}

Layout mesh_getitem(const Layout& l, int64_t index) {
  const int64_t rank = l.rank();
  if (index < -rank || index >= rank) {
    throw OutOfRange("mesh_getitem: index " + std::to_string(index) + " is out of range [" +
                     std::to_string(-rank) + ", " + std::to_string(rank) + ") for layout " +
                     to_string(l));
  }
  if (l.shape().is_int() && index != 0) {
    throw OutOfRange("mesh_getitem: a scalar layout " + to_string(l) +
                     " has only mode 0, not " + std::to_string(index));
  }
  return l[static_cast<int>(index < 0 ? index + rank : index)];
}

namespace {
int64_t python_index(int64_t i, int64_t n) {
  if (i < 0) i += n;
  return std::clamp<int64_t>(i, 0, n);
}
}  // namespace

namespace {
// splice_unchecked is mesh_splice without validating the result (for callers whose result is
// valid by construction).
Layout splice_unchecked(const Layout& l, int64_t start, int64_t end, const Layout& insert) {
  const int64_t n = l.rank();
  const int64_t lo = python_index(start, n);
  const int64_t hi = std::max(lo, python_index(end, n));
  const detail::LayoutView lv(l);
  const detail::LayoutView iv(insert);
  Layout out = detail::NodeAccess::blank();
  detail::LayoutBuilder b(out);
  b.open();
  for (int64_t i = 0; i < lo; ++i) b.append(lv.mode(static_cast<int>(i)));
  for (int i = 0; i < insert.rank(); ++i) b.append(iv.mode(i));
  for (int64_t i = hi; i < n; ++i) b.append(lv.mode(static_cast<int>(i)));
  b.close();
  return out;
}
}  // namespace

Layout mesh_splice(const Layout& l, int64_t start, int64_t end, const Layout& insert) {
  Layout out = splice_unchecked(l, start, end, insert);
  detail::check_layout(out);
  return out;
}

Layout mesh_unflatten(const Layout& l, int64_t dim, std::span<const int64_t> sizes) {
  if (dim < 0 || dim >= l.rank()) {
    throw OutOfRange("mesh_unflatten: dim " + std::to_string(dim) + " is out of range [0, " +
                     std::to_string(l.rank()) + ") for layout " + to_string(l));
  }
  if (sizes.empty()) throw InvalidArgument("mesh_unflatten: sizes must not be empty");
  // inner = (sizes):(suffix products), row-major; checked as any layout built from input.
  Layout inner = detail::NodeAccess::blank();
  {
    detail::Leaves m;
    int64_t stride = 1;
    for (std::size_t k = sizes.size(); k-- > 0;) {  // inner-first: the last size is fastest
      detail::add(m, sizes[k], stride);
      if (k > 0) stride = checked_mul(stride, sizes[k], "mesh_unflatten: stride");
    }
    detail::LayoutBuilder b(inner);
    b.open();
    for (std::size_t k = m.size(); k-- > 0;) b.leaf(m[k].s, m[k].d);
    b.close();
    detail::check_layout(inner);
  }
  const detail::LayoutView mode = detail::LayoutView(l).mode(static_cast<int>(dim));
  if (size(inner) != detail::size(mode)) {
    throw InvalidArgument("mesh_unflatten: sizes " + to_string(inner.shape()) + " multiply to " +
                          std::to_string(size(inner)) + " but dim " + std::to_string(dim) +
                          " of " + to_string(l) + " has size " + std::to_string(detail::size(mode)));
  }
  // Valid by construction: L[dim] o inner keeps the mode's size and stays within its cosize,
  // so the spliced layout keeps size(l) and at most cosize(l).
  return splice_unchecked(l, dim, dim + 1, detail::compose(mode, inner, Convention::kTorch));
}

namespace {
GroupTable group_table(const Layout& l, int64_t world_size, const char* what);
}  // namespace

std::vector<std::vector<int64_t>> mesh_global_ranks(const Layout& l, int64_t world_size) {
  const GroupTable t = group_table(l, world_size, "mesh_global_ranks");
  std::vector<std::vector<int64_t>> out;
  out.reserve(static_cast<std::size_t>(t.count));
  for (int64_t g = 0; g < t.count; ++g) out.emplace_back(t.row(g).begin(), t.row(g).end());
  return out;
}

GroupTable mesh_group_table(const Layout& l, int64_t world_size) {
  return group_table(l, world_size, "mesh_group_table");
}

int64_t mesh_rank_at(const Layout& l, int64_t index) {
  if (index < 0 || index >= size(l)) {
    throw OutOfRange("mesh_rank_at: index " + std::to_string(index) + " is out of range [0, " +
                     std::to_string(size(l)) + ") of layout " + to_string(l));
  }
  return crd2idx(IntTuple(index), l, Convention::kTorch);
}

GroupTable mesh_group_table_prefix(const Layout& l, int64_t world_size, int64_t max_groups,
                                   int64_t max_members) {
  if (max_groups < 0 || max_members < 0) {
    throw OutOfRange("mesh_group_table_prefix: max_groups " + std::to_string(max_groups) + " and max_members " +
                     std::to_string(max_members) + " must not be negative");
  }
  Layout comp = complement(l, world_size, Convention::kTorch);
  GroupTable t;
  t.count = std::min(size(comp), max_groups);
  t.size = std::min(size(l), max_members);
  const int64_t total = checked_mul(t.count, t.size, "mesh_group_table_prefix");
  check_enumeration(total, "mesh_group_table_prefix", l);
  t.ranks.reserve(static_cast<std::size_t>(total));
  if (t.count == 0) return t;
  std::vector<int64_t> row(static_cast<std::size_t>(t.size));
  for (int64_t i = 0; i < t.size; ++i) row[static_cast<std::size_t>(i)] = mesh_rank_at(l, i);
  for (int64_t g = 0; g < t.count; ++g) {
    const int64_t o = mesh_rank_at(comp, g);
    for (int64_t r : row) t.ranks.push_back(o + r);
  }
  return t;
}

namespace {
GroupTable group_table(const Layout& l, int64_t world_size, const char* what) {
  Layout comp = complement(l, world_size, Convention::kTorch);
  const int64_t total = checked_mul(size(comp), size(l), what);
  check_enumeration(total, what, l);
  std::vector<int64_t> from_zero = mesh_all_ranks_from_zero(l);
  GroupTable t;
  t.count = size(comp);
  t.size = static_cast<int64_t>(from_zero.size());
  t.ranks.reserve(static_cast<std::size_t>(total));
  for_each_rank(comp, [&](int64_t o) {
    for (int64_t r : from_zero) t.ranks.push_back(o + r);
  });
  return t;
}
}  // namespace

RemappedTensor mesh_remap_to_tensor(const Layout& l, std::span<const int64_t> rank_map) {
  const auto n = static_cast<int64_t>(rank_map.size());
  if (n < cosize(l)) {
    throw InvalidArgument("mesh_remap_to_tensor: rank map has " + std::to_string(n) +
                          " entries but layout " + to_string(l) + " needs at least its cosize " +
                          std::to_string(cosize(l)));
  }
  Layout comp = complement(l, n, Convention::kTorch);
  const int64_t span =
      checked_add(cosize(comp), cosize(l) - 1, "mesh_remap_to_tensor: view extent");
  if (span > n) {
    throw InvalidArgument("mesh_remap_to_tensor: the strided view of layout " + to_string(l) +
                          " with complement " + to_string(comp) + " reaches element " +
                          std::to_string(span - 1) + " of a rank map of size " +
                          std::to_string(n) + " (its size is not a multiple of the layout's span)");
  }
  RemappedTensor t;
  t.shape.push_back(size(comp));
  for (int64_t s : mesh_top_level_sizes(l)) t.shape.push_back(s);
  std::vector<int64_t> ranks = mesh_all_ranks_from_zero(l);
  for_each_rank(comp, [&](int64_t o) {
    for (int64_t r : ranks) t.values.push_back(rank_map[static_cast<std::size_t>(o + r)]);
  });
  return t;
}

bool mesh_disjoint(std::span<const Layout> layouts) {
  if (layouts.empty()) throw InvalidArgument("mesh_disjoint: needs at least one layout");
  return mesh_check_non_overlap(make_layout(layouts));
}

}  // namespace meshsim
