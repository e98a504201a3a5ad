// The algebra works on flattened modes in "inner-first" order: the order in which an index
// walks the modes, fastest first. That is left to right in cute and right to left in torch, so
// each kernel is written once; the torch convention reverses the flat list on the way in and the
// result on the way out (the mirror rule of DESIGN §3, applied at the flat level).
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

// flat_inner_first lists L's leaves fastest first.
Flat flat_inner_first(const Layout& l, Convention c) {
  Flat out = detail::leaves(l);
  if (c == Convention::kTorch) std::reverse(out.begin(), out.end());
  return out;
}

// build turns inner-first modes into a depth <= 1 layout: a scalar when one mode is left.
Layout build(const Flat& modes, Convention c) {
  if (modes.size() == 1) return Layout::unchecked(modes[0].s, modes[0].d);
  IntTupleBuilder s;
  IntTupleBuilder d;
  s.open();
  d.open();
  auto emit = [&](const Mode& m) {
    s.leaf(m.s);
    d.leaf(m.d);
  };
  if (c == Convention::kTorch) {
    std::for_each(modes.rbegin(), modes.rend(), emit);
  } else {
    std::for_each(modes.begin(), modes.end(), emit);
  }
  s.close();
  d.close();
  return Layout::unchecked(s.take(), d.take());
}

bool product_equals(int64_t a, int64_t b, int64_t target) {
  const std::optional<int64_t> p = try_mul(a, b);
  return p && *p == target;
}

// coalesce_flat merges inner-first modes: drop size 1, merge when the outer stride equals the
// inner extent. Empty input gives {1:0}.
Flat coalesce_flat(const Flat& in) {
  Flat out{Mode{1, 0}};
  for (const Mode& m : in) {
    Mode& back = out.back();
    if (m.s == 1) continue;
    if (back.s == 1) {
      back = m;
    } else if (product_equals(back.s, back.d, m.d)) {
      back.s = checked_mul(back.s, m.s, "coalesce");
    } else {
      out.push_back(m);
    }
  }
  return out;
}

std::string str(const Layout& l) { return to_string(l); }

}  // namespace

// ---- crd2idx, idx2crd --------------------------------------------------


namespace {

int64_t crd_int(int64_t v, const Node* s, const Node* d, Convention c) {
  if (s->arity == IntTuple::kLeaf) return checked_mul(v, d->value, "crd2idx");
  boost::container::small_vector<std::pair<const Node*, const Node*>, 8> kids;
  const Node* cs = s + 1;
  const Node* cd = d + 1;
  for (int k = 0; k < s->arity; ++k, cs += cs->span, cd += cd->span) kids.emplace_back(cs, cd);
  if (c == Convention::kTorch) std::reverse(kids.begin(), kids.end());
  int64_t result = 0;
  for (std::size_t k = 0; k < kids.size(); ++k) {
    if (k + 1 == kids.size()) {  // the outermost mode takes the overflow
      result = checked_add(result, crd_int(v, kids[k].first, kids[k].second, c), "crd2idx");
      break;
    }
    int64_t sz = size(IntTuple::from_nodes(kids[k].first));
    result = checked_add(result, crd_int(v % sz, kids[k].first, kids[k].second, c), "crd2idx");
    v /= sz;
  }
  return result;
}

int64_t crd(const Node* x, const Node* s, const Node* d, Convention c) {
  if (x->arity == IntTuple::kLeaf) {
    if (x->value < 0) {
      throw InvalidArgument("crd2idx: coordinate " + std::to_string(x->value) + " is negative");
    }
    return crd_int(x->value, s, d, c);
  }
  if (s->arity == IntTuple::kLeaf) {
    throw InvalidArgument("crd2idx: tuple coordinate " + to_string(IntTuple::from_nodes(x)) +
                          " against the integer shape " + std::to_string(s->value));
  }
  if (x->arity != s->arity) {
    throw InvalidArgument("crd2idx: coordinate " + to_string(IntTuple::from_nodes(x)) + " has " +
                          std::to_string(x->arity) + " modes but shape " +
                          to_string(IntTuple::from_nodes(s)) + " has " + std::to_string(s->arity));
  }
  int64_t result = 0;
  const Node* cx = x + 1;
  const Node* cs = s + 1;
  const Node* cd = d + 1;
  for (int k = 0; k < x->arity; ++k, cx += cx->span, cs += cs->span, cd += cd->span) {
    result = checked_add(result, crd(cx, cs, cd, c), "crd2idx");
  }
  return result;
}

}  // namespace

int64_t crd2idx(const IntTuple& coord, const IntTuple& shape, const IntTuple& stride, Convention c) {
  if (!congruent(shape, stride)) {
    throw InvalidArgument("crd2idx: shape " + to_string(shape) + " and stride " +
                          to_string(stride) + " are not congruent");
  }
  return crd(coord.nodes(), shape.nodes(), stride.nodes(), c);
}

int64_t crd2idx(const IntTuple& coord, const Layout& l, Convention c) {
  return crd(coord.nodes(), l.shape().nodes(), l.stride().nodes(), c);
}

namespace {

void crd_of_int(int64_t v, const Node* s, const Node* d, IntTupleBuilder& b) {
  if (s->arity == IntTuple::kLeaf) {
    if (d->value == 0) {
      throw InvalidArgument("idx2crd: stride 0 of mode " + std::to_string(s->value) +
                            " cannot be divided by (division by zero)");
    }
    b.leaf((v / d->value) % s->value);
    return;
  }
  b.open();
  const Node* cs = s + 1;
  const Node* cd = d + 1;
  for (int k = 0; k < s->arity; ++k, cs += cs->span, cd += cd->span) crd_of_int(v, cs, cd, b);
  b.close();
}

void crd_of(const Node* x, const Node* s, const Node* d, IntTupleBuilder& b) {
  if (x->arity == IntTuple::kLeaf) {
    if (x->value < 0) {
      throw InvalidArgument("idx2crd: index " + std::to_string(x->value) + " is negative");
    }
    crd_of_int(x->value, s, d, b);
    return;
  }
  if (s->arity == IntTuple::kLeaf || s->arity != x->arity) {
    throw InvalidArgument("idx2crd: index " + to_string(IntTuple::from_nodes(x)) +
                          " does not match the structure of shape " +
                          to_string(IntTuple::from_nodes(s)));
  }
  b.open();
  const Node* cx = x + 1;
  const Node* cs = s + 1;
  const Node* cd = d + 1;
  for (int k = 0; k < x->arity; ++k, cx += cx->span, cs += cs->span, cd += cd->span) {
    crd_of(cx, cs, cd, b);
  }
  b.close();
}

void check_shape(const IntTuple& shape, const char* op) {
  for (int i = 0; i < shape.node_count(); ++i) {
    const Node& n = shape.nodes()[i];
    if (n.arity == IntTuple::kLeaf && n.value < 1) {
      throw InvalidArgument(std::string(op) + ": size " + std::to_string(n.value) + " in shape " +
                            to_string(shape) + " is not >= 1");
    }
  }
}

}  // namespace

IntTuple idx2crd(const IntTuple& idx, const IntTuple& shape, Convention c) {
  check_shape(shape, "idx2crd");
  return idx2crd(idx, shape, compact_stride(shape, c));
}

IntTuple idx2crd(const IntTuple& idx, const IntTuple& shape, const IntTuple& stride) {
  check_shape(shape, "idx2crd");
  if (!congruent(shape, stride)) {
    throw InvalidArgument("idx2crd: shape " + to_string(shape) + " and stride " +
                          to_string(stride) + " are not congruent");
  }
  for (int i = 0; i < stride.node_count(); ++i) {
    const Node& n = stride.nodes()[i];
    if (n.arity == IntTuple::kLeaf && n.value < 0) {
      throw InvalidArgument("idx2crd: stride " + std::to_string(n.value) + " is negative");
    }
  }
  IntTupleBuilder b;
  crd_of(idx.nodes(), shape.nodes(), stride.nodes(), b);
  return b.take();
}

// ---- coalesce, filter ------------------------------------------------------------------

Layout coalesce(const Layout& l, Convention c) {
  return build(coalesce_flat(flat_inner_first(l, c)), c);
}

namespace {

template <typename Op>
Layout by_profile(const Layout& l, const IntTuple& profile, Convention c, const char* name,
                  const Op& op) {
  if (profile.is_int()) return op(l);
  if (profile.rank() > l.rank()) {
    throw InvalidArgument(std::string(name) + ": profile " + to_string(profile) + " has " +
                          std::to_string(profile.rank()) + " modes but layout " + str(l) +
                          " has only " + std::to_string(l.rank()));
  }
  boost::container::small_vector<Layout, 8> modes;
  for (int i = 0; i < l.rank(); ++i) {
    if (i < profile.rank()) {
      modes.push_back(by_profile(l[i], profile[i], c, name, op));
    } else {
      modes.push_back(l[i]);
    }
  }
  return make_layout(std::span<const Layout>(modes.data(), modes.size()));
}

}  // namespace

Layout coalesce(const Layout& l, const IntTuple& profile, Convention c) {
  return by_profile(l, profile, c, "coalesce",
                    [c](const Layout& x) { return coalesce(x, c); });
}

Layout filter(const Layout& l, Convention c) {
  Flat kept;
  for (const Mode& m : flat_inner_first(l, c)) {
    if (m.s != 1 && m.d != 0) kept.push_back(m);
  }
  return build(coalesce_flat(kept), c);
}

Layout filter(const Layout& l, const IntTuple& profile, Convention c) {
  return by_profile(l, profile, c, "filter", [c](const Layout& x) { return filter(x, c); });
}

// ---- complement ------------------------------------------------------------------------

namespace {

// complement_impl is complement; with `allow_empty_modes` it keeps pycute's behaviour of emitting
// a size-0 mode where a stride starts inside the covered extent, which logical_divide and
// logical_product need: there the size-0 mode empties the composed domain, so the reference's
// result is vacuously correct and must be reproduced, not rejected.
Layout complement_impl(const Layout& l, int64_t bound, Convention c, bool allow_empty_modes) {
  if (bound < 1) {
    throw InvalidArgument("complement: bound " + std::to_string(bound) + " is not >= 1");
  }
  Flat modes = flat_inner_first(l, Convention::kCute);
  std::sort(modes.begin(), modes.end(),
            [](const Mode& a, const Mode& b) { return std::tie(a.d, a.s) < std::tie(b.d, b.s); });
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
    out.push_back(Mode{m.d / cur, cur});
    cur = extent;
  }
  out.push_back(Mode{ceil_div(bound, cur), cur});
  Layout r = build(coalesce_flat(out), c);
  if (!allow_empty_modes) {
    // A stride that is not a multiple of the running extent is floored; the result can then
    // fall short of the bound (e.g. (4,2):(2,12) with bound 21). That breaks the postcondition.
    const int64_t covered = checked_add(cosize(l), cosize(r) - 1, "complement");
    if (covered < bound) {
      throw InvalidArgument("complement: layout " + str(l) + " with complement " + str(r) +
                            " covers only [0, " + std::to_string(covered) + "), not the bound " +
                            std::to_string(bound) + " (its strides do not chain)");
    }
  }
  return r;
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

// Operands of one composition: A flattened, A coalesced, size(A), and whether the strict
// postcondition checks apply (they do unless B's domain is empty, where any result is correct).
// `load[k]` sums, over B's leaves, the largest digit each contributes to A's coalesced mode k
// (fastest first): B's modes compose independently only if these never carry.
struct ComposeCtx {
  const Layout& a;
  Flat flat_a;
  Flat co_a;
  bool strict;
  bool beyond;  // B reaches past size(A), onto A's natural extension
  Convention c;
  boost::container::small_vector<int64_t, 16> load;
};

Layout compose_leaf(ComposeCtx& x, int64_t s, int64_t d) {
  const Layout& a = x.a;
  const Flat& co_a = x.co_a;
  if (d == 0) return Layout::unchecked(s, 0);
  // B reaches beyond A's domain: coalesce(A) must extend A the same way.
  if (x.strict && x.beyond && outer_extent(x.flat_a.back()) != outer_extent(co_a.back())) {
    throw InvalidArgument("composition: B reaches beyond the domain of A = " + str(a) +
                          ", whose natural extension coalesce(A) does not preserve");
  }
  Flat out;
  int64_t rest = s;
  int64_t r = d;
  for (std::size_t k = 0; k + 1 < co_a.size(); ++k) {
    const int64_t S = co_a[k].s;
    if (S == 0) {
      throw InvalidArgument("composition: A = " + str(a) + " has a size-0 mode (division by zero)");
    }
    if (S % r != 0 && r % S != 0) {
      throw InvalidArgument("composition: stride divisibility condition violated: stride " +
                            std::to_string(r) + " and mode size " + std::to_string(S) +
                            " of A = " + str(a) + " do not divide one another (B = " +
                            std::to_string(s) + ":" + std::to_string(d) + ")");
    }
    int64_t ns = std::min(std::max<int64_t>(1, S / r), rest);
    if (ns != 1) {
      out.push_back(Mode{ns, checked_mul(r, co_a[k].d, "composition")});
      if (x.strict) x.load[k] = checked_add(x.load[k], (ns - 1) * r, "composition");
    }
    if (ns == 0) {
      throw InvalidArgument("composition: B = " + std::to_string(s) + ":" + std::to_string(d) +
                            " has size 0 against the multi-mode A = " + str(a) +
                            " (division by zero)");
    }
    if (x.strict && rest % ns != 0) {
      throw InvalidArgument("composition: shape divisibility condition violated: size " +
                            std::to_string(rest) + " of B = " + std::to_string(s) + ":" +
                            std::to_string(d) + " is not a multiple of " + std::to_string(ns) +
                            " taken from mode " + std::to_string(S) + " of A = " + str(a));
    }
    rest /= ns;
    r = ceil_div(r, S);
  }
  if (rest != 1 || out.empty()) {
    out.push_back(Mode{rest, checked_mul(r, co_a.back().d, "composition")});
  }
  return build(out, x.c);
}

// join makes layouts the top-level modes of one layout without re-validating them.
Layout join(std::span<const Layout> modes) { return detail::join_unchecked(modes); }

Layout compose_rec(ComposeCtx& x, const Node* bs, const Node* bd) {
  if (bs->arity == IntTuple::kLeaf) return compose_leaf(x, bs->value, bd->value);
  boost::container::small_vector<Layout, 8> modes;
  const Node* cs = bs + 1;
  const Node* cd = bd + 1;
  for (int k = 0; k < bs->arity; ++k, cs += cs->span, cd += cd->span) {
    modes.push_back(compose_rec(x, cs, cd));
  }
  return join({modes.data(), modes.size()});
}

Layout composition_impl(const Layout& a, const Layout& b, Convention c) {
  const int64_t size_a = size(a);
  const int64_t size_b = size(b);
  ComposeCtx x{a, flat_inner_first(a, c), {}, size_b > 0, false, c, {}};
  x.co_a = coalesce_flat(x.flat_a);
  x.load.assign(x.co_a.size(), 0);
  if (x.strict && size_a > 0) x.beyond = cosize(b) > size_a;
  Layout r = compose_rec(x, b.shape().nodes(), b.stride().nodes());
  if (x.strict) {
    for (std::size_t k = 0; k + 1 < x.co_a.size(); ++k) {
      if (x.load[k] >= x.co_a[k].s) {
        throw InvalidArgument("composition: the modes of B = " + str(b) +
                              " overlap inside mode " + std::to_string(x.co_a[k].s) + ":" +
                              std::to_string(x.co_a[k].d) + " of A = " + str(a) +
                              " (their sum carries), so A o B is not a layout");
      }
    }
  }
  return r;
}

}  // namespace

Layout composition(const Layout& a, const Layout& b, Convention c) {
  return composition_impl(a, b, c);
}

namespace {

template <typename Op>
Layout by_tiler(const Layout& a, const Tiler& tiler, const char* name, const Op& op) {
  if (static_cast<int>(tiler.size()) > a.rank()) {
    throw InvalidArgument(std::string(name) + ": tiler has " + std::to_string(tiler.size()) +
                          " modes but A = " + str(a) + " has only " + std::to_string(a.rank()));
  }
  boost::container::small_vector<Layout, 8> modes;
  for (int i = 0; i < a.rank(); ++i) {
    if (i < static_cast<int>(tiler.size()) && tiler[i]) {
      modes.push_back(op(a[i], *tiler[i]));
    } else {
      modes.push_back(a[i]);
    }
  }
  return join({modes.data(), modes.size()});
}

}  // namespace

Layout composition(const Layout& a, const Tiler& tiler, Convention c) {
  return by_tiler(a, tiler, "composition",
                  [c](const Layout& x, const Layout& y) { return composition(x, y, c); });
}

// ---- divide, product -------------------------------------------------------------------

Layout logical_divide(const Layout& a, const Layout& b, Convention c) {
  const Layout parts[] = {b, complement_impl(b, size(a), c, /*allow_empty_modes=*/true)};
  return composition_impl(a, join(parts), c);
}

Layout logical_divide(const Layout& a, const Tiler& tiler, Convention c) {
  return by_tiler(a, tiler, "logical_divide",
                  [c](const Layout& x, const Layout& y) { return logical_divide(x, y, c); });
}

Layout logical_product(const Layout& a, const Layout& b, Convention c) {
  int64_t bound = checked_mul(size(a), cosize(b), "logical_product: size(A) * cosize(B)");
  const Layout parts[] = {
      a, composition_impl(complement_impl(a, bound, c, /*allow_empty_modes=*/true), b, c)};
  return join(parts);
}

Layout logical_product(const Layout& a, const Tiler& tiler, Convention c) {
  return by_tiler(a, tiler, "logical_product",
                  [c](const Layout& x, const Layout& y) { return logical_product(x, y, c); });
}

// ---- inverses --------------------------------------------------------------------------

namespace {

// right_inverse_impl also reports whether every non-unit mode joined the chain from stride 1,
// i.e. whether L is a bijection onto [0, size) (what left_inverse needs).
Layout right_inverse_impl(const Layout& l, Convention c, bool* complete) {
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
    out.push_back(Mode{x.s, x.rs});
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
