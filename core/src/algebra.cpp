// The algebra works on flattened modes in "inner-first" order: the order in which an index
// walks the modes, fastest first. That is left to right in cute and right to left in torch, so
// each kernel is written once; the torch convention reverses the flat list on the way in and the
// result on the way out (the mirror rule of docs/algebra.md, applied at the flat level).
#include "meshsim/algebra.hpp"

#include <algorithm>
#include <string>
#include <tuple>

#include "checked_math.hpp"
#include "flat_modes.hpp"
#include "meshsim/error.hpp"

namespace meshsim {

using Node = IntTuple::Node;

namespace {

using Mode = detail::Leaf;
using Flat = detail::Leaves;
using detail::LayoutBuilder;
using detail::LayoutView;

// flat_inner_first lists L's leaves fastest first.
Flat flat_inner_first(LayoutView l, Convention c) {
  Flat out;
  l.for_each_leaf([&out](Mode m) { detail::add(out, m.s, m.d); });
  if (c == Convention::kTorch) std::reverse(out.begin(), out.end());
  return out;
}

// emit writes inner-first modes as a depth <= 1 layout: a scalar when one mode is left.
void emit(LayoutBuilder& b, const Flat& modes, Convention c) {
  b.flat(modes.data(), modes.size(), c == Convention::kTorch);
}

// build is emit into a new layout.
Layout build(const Flat& modes, Convention c) {
  return detail::make_flat(modes.data(), modes.size(), c == Convention::kTorch);
}

// sort_by_stride orders modes by (stride, size): insertion sort for the few modes of a mesh
// layout, std::sort beyond.
void sort_by_stride(Flat& m) {
  if (m.size() > 16) {
    std::sort(m.begin(), m.end(),
              [](const Mode& a, const Mode& b) { return std::tie(a.d, a.s) < std::tie(b.d, b.s); });
    return;
  }
  for (std::size_t i = 1; i < m.size(); ++i) {
    const Mode x = m[i];
    std::size_t j = i;
    for (; j > 0 && std::tie(x.d, x.s) < std::tie(m[j - 1].d, m[j - 1].s); --j) m[j] = m[j - 1];
    m[j] = x;
  }
}

bool product_equals(int64_t a, int64_t b, int64_t target) {
  const std::optional<int64_t> p = try_mul(a, b);
  return p && *p == target;
}

// coalesce_flat merges inner-first modes: drop size 1, merge when the outer stride equals the
// inner extent. Empty input gives {1:0}.
void coalesce_flat(const Flat& in, Flat& out) {
  out.clear();
  detail::add(out, 1, 0);
  for (const Mode& m : in) {
    Mode& back = out.back();
    if (m.s == 1) continue;
    if (back.s == 1) {
      back = m;
    } else if (product_equals(back.s, back.d, m.d)) {
      back.s = checked_mul(back.s, m.s, "coalesce");
    } else {
      detail::add(out, m.s, m.d);
    }
  }
}
Flat coalesce_flat(const Flat& in) {
  Flat out;
  coalesce_flat(in, out);
  return out;
}

// coalesce_in_place is coalesce_flat(m) written over m (a merge never writes past the mode it
// reads).
void coalesce_in_place(Flat& m) {
  std::size_t n = 0;  // modes kept; m[n - 1] is the one being grown
  for (std::size_t i = 0; i < m.size(); ++i) {
    const int64_t s = m[i].s;
    const int64_t d = m[i].d;
    if (s == 1) continue;
    if (n == 0) {
      m[n].s = s;
      m[n].d = d;
      ++n;
    } else if (product_equals(m[n - 1].s, m[n - 1].d, d)) {
      m[n - 1].s = checked_mul(m[n - 1].s, s, "coalesce");
    } else {
      m[n].s = s;
      m[n].d = d;
      ++n;
    }
  }
  if (n == 0) {
    m.resize_uninit(1);
    m[0].s = 1;
    m[0].d = 0;
    return;
  }
  m.resize_uninit(n);
}

// flat_cosize is 1 + sum((s - 1) * d) over modes, checked as cosize is.
int64_t flat_cosize(const Flat& m) {
  int64_t hi = 0;
  for (const Mode& x : m) hi = checked_add(hi, checked_mul(x.s - 1, x.d, "cosize"), "cosize");
  return checked_add(hi, 1, "cosize");
}

// coalesce_step folds the leaf (ls, ld) into `out` as coalesce_flat does.
[[gnu::always_inline]] inline void coalesce_step(Flat& out, int64_t ls, int64_t ld) {
  if (ls == 1) return;
  // Fields, not a Mode temporary: a 16-byte value reloaded from memory stalls on store
  // forwarding (it was a sixth of this loop).
  Mode& back = out.back();
  if (back.s == 1) {
    back.s = ls;
    back.d = ld;
  } else if (product_equals(back.s, back.d, ld)) {
    back.s = checked_mul(back.s, ls, "coalesce");
  } else {
    detail::add(out, ls, ld);
  }
}

// coalesce_view is coalesce_flat(flat_inner_first(l, c)) in one pass over the nodes, writing
// `out`; `outermost`, when given, receives the last leaf inner-first (1:0 for no leaves). The
// walk runs forwards (cute) or backwards (torch) with no per-node choice of direction.
void coalesce_view(LayoutView l, Convention c, Flat& out, Mode* outermost) {
  const Node* s = l.s;
  const Node* d = l.d;
  const int n = s->span;
  out.clear();
  detail::add(out, 1, 0);
  int64_t last_s = 1;
  int64_t last_d = 0;
  if (c == Convention::kCute) {
    for (int i = 0; i < n; ++i) {
      if (s[i].arity != IntTuple::kLeaf) continue;
      last_s = s[i].value;
      last_d = d[i].value;
      coalesce_step(out, last_s, last_d);
    }
  } else {
    for (int i = n; i-- > 0;) {
      if (s[i].arity != IntTuple::kLeaf) continue;
      last_s = s[i].value;
      last_d = d[i].value;
      coalesce_step(out, last_s, last_d);
    }
  }
  if (outermost) {
    outermost->s = last_s;
    outermost->d = last_d;
  }
}

std::string str(LayoutView l) { return to_string(l.copy()); }

}  // namespace

// ---- coalesce, filter ------------------------------------------------------------------

Layout coalesce(const Layout& l, Convention c) {
  Flat out;
  coalesce_view(l, c, out, nullptr);
  return build(out, c);
}

namespace {

Layout filter_view(LayoutView l, Convention c) {
  Flat kept;
  l.for_each_leaf([&kept](Mode m) {
    if (m.s != 1 && m.d != 0) detail::add(kept, m.s, m.d);
  });
  if (c == Convention::kTorch) std::reverse(kept.begin(), kept.end());
  return build(coalesce_flat(kept), c);
}

// by_profile applies op to the sub-layouts the profile names, copying the other modes; the
// result is written once. Coalesce and filter keep (or shrink) size and cosize, so the result
// is valid by construction.
template <typename Op>
void by_profile(LayoutView l, const Node* profile, Convention c, const char* name, const Op& op,
                LayoutBuilder& out) {
  if (profile->arity == IntTuple::kLeaf) {
    out.append(op(l));
    return;
  }
  if (profile->arity > l.rank()) {
    throw InvalidArgument(std::string(name) + ": profile " +
                          to_string(IntTuple::from_nodes(profile)) + " has " +
                          std::to_string(profile->arity) + " modes but layout " + str(l) +
                          " has only " + std::to_string(l.rank()));
  }
  out.open();
  const Node* p = profile + 1;
  for (int i = 0; i < l.rank(); ++i) {
    if (i < profile->arity) {
      by_profile(l.mode(i), p, c, name, op, out);
      p += p->span;
    } else {
      out.append(l.mode(i));
    }
  }
  out.close();
}

template <typename Op>
Layout by_profile(const Layout& l, const IntTuple& profile, Convention c, const char* name,
                  const Op& op) {
  Layout r = detail::NodeAccess::blank();
  LayoutBuilder b(r);
  by_profile(LayoutView(l), profile.nodes(), c, name, op, b);
  return r;
}

}  // namespace

Layout coalesce(const Layout& l, const IntTuple& profile, Convention c) {
  return by_profile(l, profile, c, "coalesce",
                    [c](LayoutView x) {
                      Flat m;
                      coalesce_view(x, c, m, nullptr);
                      return build(m, c);
                    });
}

Layout filter(const Layout& l, Convention c) { return filter_view(l, c); }

Layout filter(const Layout& l, const IntTuple& profile, Convention c) {
  return by_profile(l, profile, c, "filter", [c](LayoutView x) { return filter_view(x, c); });
}

// ---- complement ------------------------------------------------------------------------

namespace {

// complement_impl is complement; with `allow_empty_modes` it keeps pycute's behaviour of emitting
// a size-0 mode where a stride starts inside the covered extent, which logical_divide and
// logical_product need: there the size-0 mode empties the composed domain, so the reference's
// result is vacuously correct and must be reproduced, not rejected.
Layout complement_impl(LayoutView l, int64_t bound, Convention c, bool allow_empty_modes) {
  if (bound < 1) {
    throw InvalidArgument("complement: bound " + std::to_string(bound) + " is not >= 1");
  }
  Flat modes = detail::leaves(l);
  const int64_t cosize_l = flat_cosize(modes);
  sort_by_stride(modes);
  Flat out;
  int64_t cur = 1;
  for (const Mode& m : modes) {
    if (m.d == 0 || m.s == 1) continue;
    const int64_t extent = checked_mul(m.s, m.d, "complement");
    if (m.d < cur && (!allow_empty_modes || extent < cur)) {
      throw InvalidArgument("complement: non-injective layout " + str(l) + ": mode " +
                            std::to_string(m.s) + ":" + std::to_string(m.d) +
                            " starts inside the extent " + std::to_string(cur) +
                            " already covered by smaller strides");
    }
    detail::add(out, m.d / cur, cur);
    cur = extent;
  }
  detail::add(out, ceil_div(bound, cur), cur);
  coalesce_in_place(out);
  if (!allow_empty_modes) {
    // A stride that is not a multiple of the running extent is floored; the result can then
    // fall short of the bound (e.g. (4,2):(2,12) with bound 21). That breaks the postcondition.
    const int64_t covered = checked_add(cosize_l, flat_cosize(out) - 1, "complement");
    if (covered < bound) {
      throw InvalidArgument("complement: layout " + str(l) + " with complement " + str(build(out, c)) +
                            " covers only [0, " + std::to_string(covered) + "), not the bound " +
                            std::to_string(bound) + " (its strides do not chain)");
    }
  }
  return build(out, c);
}

}  // namespace

Layout complement(const Layout& l, int64_t bound, Convention c) {
  return complement_impl(l, bound, c, /*allow_empty_modes=*/false);
}

// ---- composition -----------------------------------------------------------------------

namespace {

// outer_extent is s*d of the outermost leaf: how far A's natural extension moves per size(A).
__extension__ using Int128 = __int128;
Int128 outer_extent(const Mode& m) { return static_cast<Int128>(m.s) * m.d; }

// Operands of one composition: A flattened, A coalesced, B as its top-level parts (one part
// for a plain B; B's modes when B is a join built on the fly, as logical_divide's), and whether
// the strict postcondition checks apply (they do unless B's domain is empty, where any result is
// correct). `load[k]` sums, over B's leaves, the largest digit each contributes to A's coalesced
// mode k (fastest first): B's modes compose independently only if these never carry.
struct ComposeCtx {
  ComposeCtx(LayoutView a_, std::span<const LayoutView> b_, bool joined, bool strict_, Convention c_)
      : a(a_), b(b_), b_joined(joined), strict(strict_), c(c_) {
    coalesce_view(a, c, co_a, &outermost);
    // One leaf cannot carry: it takes ns <= S / r from a mode of size S at stride r, so its
    // digit (ns - 1) * r stays below S. Only several leaves need the loads (the check below
    // still runs, with loads of 0, for modes of size 0).
    track_load = strict && (b_joined || !b[0].is_leaf());
    if (track_load) load.assign(co_a.size(), 0);
  }
  LayoutView a;
  std::span<const LayoutView> b;
  bool b_joined;
  Mode outermost;  // A's outermost leaf (its last inner-first)
  Flat co_a;
  bool strict;
  bool beyond = false;  // B reaches past size(A), onto A's natural extension
  Convention c;
  bool track_load;
  detail::InlineVector<int64_t, 16> load;

  std::string str_a() const { return str(a); }
  std::string str_b() const {
    return b_joined ? to_string(detail::join_unchecked(b)) : str(b[0]);
  }
};

std::string str_leaf(int64_t s, int64_t d) { return std::to_string(s) + ":" + std::to_string(d); }

void compose_leaf(ComposeCtx& x, int64_t s, int64_t d, LayoutBuilder& b) {
  const Flat& co_a = x.co_a;
  if (d == 0) {
    b.leaf(s, 0);
    return;
  }
  // B reaches beyond A's domain: coalesce(A) must extend A the same way.
  if (x.strict && x.beyond && outer_extent(x.outermost) != outer_extent(co_a.back())) {
    throw InvalidArgument("composition: B reaches beyond the domain of A = " + x.str_a() +
                          ", whose natural extension coalesce(A) does not preserve");
  }
  if (co_a.size() == 1) {  // A is one mode s':d' after coalescing: s:d -> s:(d * d')
    b.leaf(s, checked_mul(d, co_a[0].d, "composition"));
    return;
  }
  Flat out;
  int64_t rest = s;
  int64_t r = d;
  for (std::size_t k = 0; k + 1 < co_a.size(); ++k) {
    const int64_t S = co_a[k].s;
    if (S == 0) {
      throw InvalidArgument("composition: A = " + x.str_a() +
                            " has a size-0 mode (division by zero)");
    }
    int64_t s_by_r = 0;
    int64_t s_mod_r = 0;
    divmod(S, r, s_by_r, s_mod_r);  // one division for both
    if (s_mod_r != 0 && fast_mod(r, S) != 0) {
      throw InvalidArgument("composition: stride divisibility condition violated: stride " +
                            std::to_string(r) + " and mode size " + std::to_string(S) +
                            " of A = " + x.str_a() + " do not divide one another (B = " +
                            str_leaf(s, d) + ")");
    }
    int64_t ns = std::min(std::max<int64_t>(1, s_by_r), rest);
    if (ns != 1) {
      detail::add(out, ns, checked_mul(r, co_a[k].d, "composition"));
      if (x.track_load) x.load[k] = checked_add(x.load[k], (ns - 1) * r, "composition");
    }
    if (ns == 0) {
      throw InvalidArgument("composition: B = " + str_leaf(s, d) +
                            " has size 0 against the multi-mode A = " + x.str_a() +
                            " (division by zero)");
    }
    if (ns != 1) {  // (ns == 1 leaves rest as it is)
      const int64_t before = rest;
      int64_t rest_mod_ns = 0;
      divmod(before, ns, rest, rest_mod_ns);
      if (x.strict && rest_mod_ns != 0) {
        throw InvalidArgument("composition: shape divisibility condition violated: size " +
                              std::to_string(before) + " of B = " +
                              str_leaf(s, d) + " is not a multiple of " + std::to_string(ns) +
                              " taken from mode " + std::to_string(S) + " of A = " + x.str_a());
      }
    }
    r = r == 0 ? 0 : fast_div(r - 1, S) + 1;  // ceil(r / S)
  }
  if (rest != 1 || out.empty()) {
    detail::add(out, rest, checked_mul(r, co_a.back().d, "composition"));
  }
  emit(b, out, x.c);
}

// compose_rec writes A o B for the subtree (bs, bd) of B: B's tree, each leaf replaced by its
// composition with A.
void compose_rec(ComposeCtx& x, const Node* bs, const Node* bd, LayoutBuilder& b) {
  if (bs->arity == IntTuple::kLeaf) {
    compose_leaf(x, bs->value, bd->value, b);
    return;
  }
  b.open();
  const Node* cs = bs + 1;
  const Node* cd = bd + 1;
  for (int k = 0; k < bs->arity; ++k, cs += cs->span, cd += cd->span) compose_rec(x, cs, cd, b);
  b.close();
}

// size_of_coalesced is size(A) from coalesce(A)'s modes (coalescing keeps the size), or
// size(a) itself when the product overflows (which throws as size does).
int64_t size_of_coalesced(const Flat& co_a, LayoutView a) {
  int64_t p = 1;
  for (const Mode& m : co_a) {
    if (__builtin_mul_overflow(p, m.s, &p)) return detail::size(a);
  }
  return p;
}

// compose_scaled is A o B for an A that coalesces to one mode s':d': B with every stride d
// scaled to d * d', written straight from B's nodes (the builder is for trees that change).
Layout compose_scaled(ComposeCtx& x, LayoutView b) {
  Layout r = detail::NodeAccess::blank();
  auto& rs = detail::NodeAccess::nodes(detail::NodeAccess::shape(r));
  auto& rd = detail::NodeAccess::nodes(detail::NodeAccess::stride(r));
  const int n = b.s->span;
  rs.append(b.s, b.s + n);
  rd.append(b.d, b.d + n);
  const int64_t scale = x.co_a[0].d;
  for (int i = 0; i < n; ++i) {
    Node& leaf = rd[static_cast<std::size_t>(i)];
    if (leaf.arity != IntTuple::kLeaf || leaf.value == 0) continue;
    if (x.strict && x.beyond && outer_extent(x.outermost) != outer_extent(x.co_a.back())) {
      throw InvalidArgument("composition: B reaches beyond the domain of A = " + x.str_a() +
                            ", whose natural extension coalesce(A) does not preserve");
    }
    leaf.value = checked_mul(leaf.value, scale, "composition");
  }
  return r;
}

// compose_tree writes B's tree with each leaf composed with A, and checks that B's modes do not
// carry into one another inside A's modes.
Layout compose_tree(ComposeCtx& x) {
  Layout r = detail::NodeAccess::blank();
  LayoutBuilder out(r);
  if (x.b_joined) out.open();
  for (const LayoutView& m : x.b) {
    if (m.is_leaf()) {
      compose_leaf(x, m.s->value, m.d->value, out);
    } else {
      compose_rec(x, m.s, m.d, out);
    }
  }
  if (x.b_joined) out.close();
  if (x.strict) {
    for (std::size_t k = 0; k + 1 < x.co_a.size(); ++k) {
      // Untracked loads are 0; a mode of size 0 still refuses (nothing fits in it).
      const int64_t load = x.track_load ? x.load[k] : 0;
      if (load >= x.co_a[k].s) {
        throw InvalidArgument("composition: the modes of B = " + x.str_b() +
                              " overlap inside mode " + std::to_string(x.co_a[k].s) + ":" +
                              std::to_string(x.co_a[k].d) + " of A = " + x.str_a() +
                              " (their sum carries), so A o B is not a layout");
      }
    }
  }
  return r;
}

// composition_impl is A o B, with B given as one layout (b_joined false, b.size() == 1) or as
// the top-level modes of a B never materialised (b_joined true).
Layout composition_impl(LayoutView a, std::span<const LayoutView> b, bool b_joined,
                        Convention c) {
  int64_t size_b = 1;
  for (const LayoutView& m : b) size_b = checked_mul(size_b, detail::size(m), "size");
  ComposeCtx x(a, b, b_joined, size_b > 0, c);
  const int64_t size_a = size_of_coalesced(x.co_a, a);
  if (x.strict && size_a > 0) {
    int64_t cosize_b = 1;
    for (const LayoutView& m : b) {
      // A leaf's cosize inline, with cosize's checks (B is most often one mode).
      const int64_t cm = m.is_leaf() ? checked_add(checked_mul(m.s->value - 1, m.d->value, "cosize"),
                                                   1, "cosize")
                                     : detail::cosize(m);
      cosize_b = checked_add(cosize_b, cm - 1, "cosize");
    }
    x.beyond = cosize_b > size_a;
  }
  // Each path returns a prvalue, so each result is written in place (a named result returned
  // on one path only would be moved, two inline node arrays, on the other).
  if (x.co_a.size() == 1 && !b_joined) return compose_scaled(x, b[0]);
  return compose_tree(x);
}

Layout compose_one(LayoutView a, LayoutView b, Convention c) {
  return composition_impl(a, std::span<const LayoutView>(&b, 1), false, c);
}

}  // namespace

Layout composition(const Layout& a, const Layout& b, Convention c) { return compose_one(a, b, c); }

namespace detail {
Layout compose(LayoutView a, LayoutView b, Convention c) { return compose_one(a, b, c); }
void coalesce_into(LayoutView l, Convention c, Leaves& out) { coalesce_view(l, c, out, nullptr); }
}  // namespace detail

namespace {

// by_tiler applies op to A's modes that the tiler names and copies the others, writing the
// result once.
template <typename Op>
Layout by_tiler(const Layout& a, const Tiler& tiler, const char* name, const Op& op) {
  if (static_cast<int>(tiler.size()) > a.rank()) {
    throw InvalidArgument(std::string(name) + ": tiler has " + std::to_string(tiler.size()) +
                          " modes but A = " + to_string(a) + " has only " +
                          std::to_string(a.rank()));
  }
  Layout r = detail::NodeAccess::blank();
  LayoutBuilder out(r);
  out.open();
  const LayoutView av(a);
  for (int i = 0; i < a.rank(); ++i) {
    if (i < static_cast<int>(tiler.size()) && tiler[i]) {
      out.append(op(av.mode(i), *tiler[i]));
    } else {
      out.append(av.mode(i));
    }
  }
  out.close();
  return r;
}

Layout divide_view(LayoutView a, LayoutView b, Convention c) {
  const Layout rest = complement_impl(b, detail::size(a), c, /*allow_empty_modes=*/true);
  const LayoutView parts[] = {b, rest};
  return composition_impl(a, parts, /*b_joined=*/true, c);
}

Layout product_view(LayoutView a, LayoutView b, Convention c) {
  const int64_t bound =
      checked_mul(detail::size(a), detail::cosize(b), "logical_product: size(A) * cosize(B)");
  const Layout rest =
      compose_one(complement_impl(a, bound, c, /*allow_empty_modes=*/true), b, c);
  const LayoutView parts[] = {a, rest};
  return detail::join_unchecked(parts);
}

}  // namespace

Layout composition(const Layout& a, const Tiler& tiler, Convention c) {
  return by_tiler(a, tiler, "composition",
                  [c](LayoutView x, const Layout& y) { return compose_one(x, y, c); });
}

// ---- divide, product -------------------------------------------------------------------

Layout logical_divide(const Layout& a, const Layout& b, Convention c) {
  return divide_view(a, b, c);
}

Layout logical_divide(const Layout& a, const Tiler& tiler, Convention c) {
  return by_tiler(a, tiler, "logical_divide",
                  [c](LayoutView x, const Layout& y) { return divide_view(x, y, c); });
}

Layout logical_product(const Layout& a, const Layout& b, Convention c) {
  return product_view(a, b, c);
}

Layout logical_product(const Layout& a, const Tiler& tiler, Convention c) {
  return by_tiler(a, tiler, "logical_product",
                  [c](LayoutView x, const Layout& y) { return product_view(x, y, c); });
}

// ---- inverses --------------------------------------------------------------------------

namespace {

// right_inverse_impl also reports whether every non-unit mode joined the chain from stride 1,
// i.e. whether L is a bijection onto [0, size) (what left_inverse needs).
Layout right_inverse_impl(LayoutView l, Convention c, bool* complete) {
  struct Leaf {
    int64_t d, s, rs;
  };
  boost::container::small_vector<Leaf, 16> leaves;
  int64_t cur = 1;
  for (const Mode& m : flat_inner_first(l, c)) {
    leaves.push_back(Leaf{m.d, m.s, cur});
    cur = checked_mul(cur, m.s, "right_inverse");
  }
  std::sort(leaves.begin(), leaves.end(), [](const Leaf& a, const Leaf& b) {
    return std::tie(a.d, a.s, a.rs) < std::tie(b.d, b.s, b.rs);
  });
  Flat out;
  cur = 1;
  *complete = true;
  for (const Leaf& x : leaves) {
    if (x.s == 1) continue;
    if (x.d != cur) {
      *complete = false;
      break;
    }
    detail::add(out, x.s, x.rs);
    cur = checked_mul(x.s, x.d, "right_inverse");
  }
  return build(coalesce_flat(out), c);
}

}  // namespace

Layout right_inverse(const Layout& l, Convention c) {
  bool complete = false;
  return right_inverse_impl(l, c, &complete);
}

Layout left_inverse(const Layout& l, Convention c) {
  Layout comp = complement(l, 1, c);
  Layout joined = c == Convention::kCute ? make_layout({l, comp}) : make_layout({comp, l});
  bool complete = false;
  Layout r = right_inverse_impl(joined, c, &complete);
  if (!complete) {
    throw InvalidArgument("left_inverse: layout " + str(l) +
                          " has no left inverse: it is not injective or its strides do not chain "
                          "(its complement leaves a gap)");
  }
  return r;
}

}  // namespace meshsim
