// Laws of the layout algebra, checked against the brute-force evaluator in reference.hpp.
// An operation either satisfies its postcondition or throws a meshsim::Error (never anything
// else); where a precondition is known to hold, it must not throw.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "meshsim/testing/generators.hpp"
#include "meshsim/algebra.hpp"
#include "meshsim/error.hpp"
#include "meshsim/mesh_layout.hpp"
#include "reference.hpp"
// The full text reader, to check the plain one that parse_layout and parse_int_tuple try first.
#include "parse_text.hpp"

namespace meshsim {
namespace {

using reference::eval;

// attempt runs f; returns false when it threw a meshsim::Error (anything else propagates and
// fails the property).
template <typename F>
bool attempt(F&& f) {
  try {
    f();
    return true;
  } catch (const Error&) {
    return false;
  }
}

RC_GTEST_PROP(Coalesce, KeepsTheFunctionOnTheDomain, (const Layout& l, Convention c)) {
  Layout r = coalesce(l, c);
  RC_ASSERT(r.depth() <= 1);
  RC_ASSERT(size(r) == size(l));
  for (int64_t i = 0; i < size(l); ++i) RC_ASSERT(eval(r, i, c) == eval(l, i, c));
}

RC_GTEST_PROP(Filter, KeepsTheImage, (const Layout& l, Convention c)) {
  Layout r = filter(l, c);
  RC_ASSERT(reference::image(r, c) == reference::image(l, c));
  RC_ASSERT(reference::injective(r, c) || !reference::injective(l, c) || size(r) == 1);
}

RC_GTEST_PROP(Coalesce, ByProfileKeepsTheFunction, (const Layout& l, Convention c)) {
  IntTuple profile = l.shape().is_int() ? IntTuple(1) : IntTuple::tuple({1});
  Layout r = coalesce(l, profile, c);
  RC_ASSERT(size(r) == size(l));
  for (int64_t i = 0; i < size(l); ++i) RC_ASSERT(eval(r, i, c) == eval(l, i, c));
}

RC_GTEST_PROP(Complement, OrderedDisjointAndCovering, (const Layout& l, Convention c)) {
  const int64_t bound = *rc::gen::inRange<int64_t>(1, 2 * cosize(l) + 2);
  Layout r;
  if (!attempt([&] { r = complement(l, bound, c); })) {
    // Only layouts with overlapping (non-injective) leaves, or strides that start inside an
    // extent already covered, are rejected; a chained injective layout never is.
    RC_ASSERT(!reference::injective(filter(l, c), c) || size(filter(l, c)) > 1);
    RC_SUCCEED("rejected");
  }
  std::set<int64_t> img = reference::image(l, c);
  RC_ASSERT(size(r) >= 1);
  for (int64_t i = 1; i < size(r); ++i) {
    RC_ASSERT(eval(r, i - 1, c) < eval(r, i, c));
    RC_ASSERT(img.count(eval(r, i, c)) == 0u);
  }
  Layout joined = c == Convention::kCute ? make_layout({l, r}) : make_layout({r, l});
  RC_ASSERT(cosize(joined) >= bound);
}

RC_GTEST_PROP(Complement, NeverRejectsChainedInjectiveLayouts, (Convention c)) {
  Layout l = *gen::injective_layout(false);
  Layout r = complement(l, size(l) * 2, c);
  RC_ASSERT(size(l) * size(r) == size(l) * 2);
}

RC_GTEST_PROP(Composition, ComposesOnBsDomain, (const Layout& a, Convention c)) {
  Layout b = *gen::any_layout();
  Layout r;
  if (!attempt([&] { r = composition(a, b, c); })) RC_SUCCEED("rejected");
  RC_ASSERT(size(r) == size(b));
  if (b.shape().is_tuple()) RC_ASSERT(r.shape().is_tuple() && r.rank() == b.rank());
  for (int64_t i = 0; i < size(b); ++i) RC_ASSERT(eval(r, i, c) == eval(a, eval(b, i, c), c));
}

RC_GTEST_PROP(Composition, CompactAWithAnInjectiveTileNeverFails, (Convention c)) {
  // A compact layout of B's cosize composes with any B whose strides divide nicely.
  Layout b = *gen::injective_layout(false);
  Layout a = Layout::compact(IntTuple(cosize(b)), c);
  Layout r = composition(a, b, c);
  for (int64_t i = 0; i < size(b); ++i) RC_ASSERT(eval(r, i, c) == eval(b, i, c));
}

RC_GTEST_PROP(LogicalDivide, SatisfiesItsDefinition, (const Layout& a, Convention c)) {
  Layout b = *gen::injective_layout(true);
  Layout r;
  if (!attempt([&] { r = logical_divide(a, b, c); })) RC_SUCCEED("rejected");
  RC_ASSERT(r.rank() == 2);
  Layout comp;
  if (!attempt([&] { comp = complement(b, size(a), c); })) RC_SUCCEED("empty rest");
  Layout bc = make_layout({b, comp});
  RC_ASSERT(size(r) == size(bc));
  for (int64_t i = 0; i < size(bc); ++i) RC_ASSERT(eval(r, i, c) == eval(a, eval(bc, i, c), c));
}

RC_GTEST_PROP(LogicalProduct, SatisfiesItsDefinition, (Convention c)) {
  Layout a = *gen::injective_layout(true);
  Layout b = *gen::any_layout();
  Layout r;
  if (!attempt([&] { r = logical_product(a, b, c); })) RC_SUCCEED("rejected");
  RC_ASSERT(r.rank() == 2);
  RC_ASSERT(r[0] == a);
  RC_ASSERT(size(r[1]) == size(b));
  Layout comp = complement(a, size(a) * cosize(b), c);
  for (int64_t i = 0; i < size(b); ++i) {
    RC_ASSERT(eval(r[1], i, c) == eval(comp, eval(b, i, c), c));
  }
}

RC_GTEST_PROP(RightInverse, IsARightInverse, (const Layout& l, Convention c)) {
  Layout r = right_inverse(l, c);
  for (int64_t i = 0; i < size(r); ++i) RC_ASSERT(eval(l, eval(r, i, c), c) == i);
}

RC_GTEST_PROP(LeftInverse, IsALeftInverseOrRejected, (const Layout& l, Convention c)) {
  Layout r;
  if (!attempt([&] { r = left_inverse(l, c); })) {
    RC_SUCCEED("rejected");
  }
  for (int64_t i = 0; i < size(l); ++i) RC_ASSERT(eval(r, eval(l, i, c), c) == i);
}

RC_GTEST_PROP(LeftInverse, ExistsForChainedInjectiveLayouts, (Convention c)) {
  Layout l = *gen::injective_layout(false);
  Layout r = left_inverse(l, c);
  for (int64_t i = 0; i < size(l); ++i) RC_ASSERT(eval(r, eval(l, i, c), c) == i);
}

// The mirror rule: torch_op(X) == mirror(cute_op(mirror(X))); both reject or neither.
template <typename Op>
void check_mirror(const Op& op) {
  Layout t, m;
  bool ok_t = attempt([&] { t = op(Convention::kTorch, false); });
  bool ok_c = attempt([&] { m = op(Convention::kCute, true); });
  RC_ASSERT(ok_t == ok_c);
  if (ok_t) RC_ASSERT(t == mirror(m));
}

RC_GTEST_PROP(Mirror, RuleHoldsForTheUnaryOps, (const Layout& l)) {
  auto arg = [&](bool mirrored) { return mirrored ? mirror(l) : l; };
  check_mirror([&](Convention c, bool mm) { return coalesce(arg(mm), c); });
  check_mirror([&](Convention c, bool mm) { return filter(arg(mm), c); });
  check_mirror([&](Convention c, bool mm) { return complement(arg(mm), 2 * cosize(l), c); });
  check_mirror([&](Convention c, bool mm) { return right_inverse(arg(mm), c); });
  check_mirror([&](Convention c, bool mm) { return left_inverse(arg(mm), c); });
  RC_ASSERT(compact_stride(l.shape(), Convention::kTorch) ==
            mirror(compact_stride(mirror(l.shape()), Convention::kCute)));
}

RC_GTEST_PROP(Mirror, RuleHoldsForComposition, (const Layout& a, const Layout& b)) {
  check_mirror([&](Convention c, bool mm) {
    return mm ? composition(mirror(a), mirror(b), c) : composition(a, b, c);
  });
}

RC_GTEST_PROP(Text, ParsePrintRoundTrip, (const Layout& l)) {
  RC_ASSERT(parse_layout(to_string(l)) == l);
  RC_ASSERT(parse_int_tuple(to_string(l.shape())) == l.shape());
}

// Outcome is what reading a text gives: its printed value, or the error's type and message.
template <typename F>
std::string outcome(F&& read) {
  try {
    return "ok " + to_string(read());
  } catch (const Error& e) {
    return std::string(e.type_name()) + " " + e.what();
  }
}

// layout_text is a layout's text as users write it, and near misses of it: spaces, Python's
// (4,) form, a shape alone, integers near and past int64, one character changed or dropped.
std::string layout_text() {
  const Layout l = *rc::gen::arbitrary<Layout>();
  std::string text = *rc::gen::arbitrary<bool>() ? to_string(l) : to_string(l.shape());
  std::string out;
  for (const char c : text) {
    if (c == ')' && *rc::gen::inRange(0, 6) == 0) out += ',';
    if (*rc::gen::inRange(0, 8) == 0) out += *rc::gen::element<std::string>(" ", "\t", "  ", "\n");
    out += c;
    if (c >= '0' && c <= '9' && *rc::gen::inRange(0, 12) == 0) {
      out += *rc::gen::element<std::string>("00000000000000000", "223372036854775807",
                                            "223372036854775808", "9999999999999999999",
                                            "0000000000000000000000001");
    }
  }
  if (!out.empty() && *rc::gen::inRange(0, 3) == 0) {
    const auto at = *rc::gen::inRange<std::size_t>(0, out.size());
    const std::string c = *rc::gen::element<std::string>("", "(", ")", ",", ":", "-", "x", "0", " ");
    out = out.substr(0, at) + c + out.substr(at + 1);
  }
  return out;
}

RC_GTEST_PROP(Text, PlainReaderAgreesWithTheFullReader, ()) {
  const std::string text = layout_text();
  RC_ASSERT(outcome([&] { return parse_layout(text); }) == outcome([&] {
              auto [shape, stride] = detail::parse_layout_text(text);
              return stride ? Layout(std::move(shape), std::move(*stride))
                            : Layout::compact(shape, Convention::kTorch);
            }));
  RC_ASSERT(outcome([&] { return parse_int_tuple(text); }) ==
            outcome([&] { return detail::parse_int_tuple_text(text); }));
}

RC_GTEST_PROP(Coordinates, Crd2IdxInvertsIdx2CrdOnTheDomain, (Convention c)) {
  IntTuple s = *gen::shape();
  Layout compact = Layout::compact(s, c);
  for (int64_t i = 0; i < size(s); ++i) {
    IntTuple crd = idx2crd(i, s, c);
    RC_ASSERT(congruent(crd, s));
    RC_ASSERT(crd2idx(crd, compact, c) == i);
  }
}

RC_GTEST_PROP(Coordinates, IntCoordinateMatchesTheReference, (const Layout& l, Convention c)) {
  const int64_t i = *rc::gen::inRange<int64_t>(0, 4 * size(l));
  RC_ASSERT(crd2idx(i, l, c) == eval(l, i, c));
}

RC_GTEST_PROP(MeshLayout, NonOverlapAgreesWithBruteForce, (const Layout& l)) {
  RC_ASSERT(mesh_check_non_overlap(l) == reference::injective(l, Convention::kTorch));
}

// pairwise_nesting is check_orthogonal's rule written another way: over the leaves of size > 1
// (not coalesced), of every two modes the one with the larger (stride, size) has a stride that
// is a multiple of the other's stride x size (a zero span nests nothing).
bool pairwise_nesting(const Layout& l) {
  __extension__ using Int128 = __int128;
  std::vector<reference::Leaf> modes;
  for (const reference::Leaf& x : reference::leaves(l)) {
    if (x.s != 1) modes.push_back(x);
  }
  const auto inside = [](const reference::Leaf& outer, const reference::Leaf& inner) {
    const Int128 span = Int128{inner.d} * inner.s;
    return span != 0 && Int128{outer.d} % span == 0;
  };
  for (std::size_t i = 0; i < modes.size(); ++i) {
    for (std::size_t j = i + 1; j < modes.size(); ++j) {
      const bool i_outer = modes[i].d > modes[j].d || (modes[i].d == modes[j].d && modes[i].s >= modes[j].s);
      if (!(i_outer ? inside(modes[i], modes[j]) : inside(modes[j], modes[i]))) return false;
    }
  }
  return true;
}

RC_GTEST_PROP(MeshLayout, OrthogonalIsPairwiseNestingAndImpliesNoOverlap, (const Layout& l)) {
  const bool orthogonal = mesh_check_orthogonal(l);
  // With a broadcast mode the two writings part: coalescing first merges 2:0 and 2:0 into one
  // mode 4:0, which PyTorch's rule passes (a lone mode has nothing to compare), so it is not
  // injective either.
  bool broadcast = false;
  for (const reference::Leaf& x : reference::leaves(l)) broadcast = broadcast || (x.s > 1 && x.d == 0);
  if (!broadcast) {
    RC_ASSERT(orthogonal == pairwise_nesting(l));
    if (orthogonal) RC_ASSERT(reference::injective(l, Convention::kTorch));
  }
}

RC_GTEST_PROP(MeshLayout, UnflattenThenFlattenKeepsTheRanks, ()) {
  Layout l = *gen::injective_layout(false);
  Layout flat = mesh_flatten(l);
  std::vector<int64_t> before = mesh_all_ranks_from_zero(flat);
  std::vector<int64_t> sizes = mesh_top_level_sizes(l);
  Layout un;
  if (!attempt([&] { un = mesh_unflatten(flat, 0, sizes); })) RC_SUCCEED("rejected");
  std::vector<int64_t> after = mesh_all_ranks_from_zero(un);
  std::sort(before.begin(), before.end());
  std::sort(after.begin(), after.end());
  RC_ASSERT(before == after);
}

// Hostile input: arbitrary (possibly invalid, possibly huge) shapes and strides. Construction
// and every operation either succeed or throw a meshsim::Error.
RC_GTEST_PROP(Errors, HostileLayoutsNeverCrash, ()) {
  auto value = rc::gen::oneOf(rc::gen::inRange<int64_t>(-3, 20),
                              rc::gen::element<int64_t>(INT64_MAX, INT64_MAX - 1,
                                                        int64_t{1} << 62, int64_t{1} << 32,
                                                        int64_t{3037000499}, 0));
  IntTuple s = *gen::shape();
  std::vector<int64_t> sv = *rc::gen::container<std::vector<int64_t>>(
      static_cast<std::size_t>(s.leaf_count()), value);
  std::vector<int64_t> dv = *rc::gen::container<std::vector<int64_t>>(
      static_cast<std::size_t>(s.leaf_count()), value);
  Layout l;
  if (!attempt([&] { l = Layout(gen::with_leaves(s, sv), gen::with_leaves(s, dv)); })) {
    RC_SUCCEED("rejected at construction");
  }
  const Convention c = *gen::convention();
  const int64_t bound = *value;
  attempt([&] { coalesce(l, c); });
  attempt([&] { filter(l, c); });
  attempt([&] { complement(l, bound, c); });
  attempt([&] { composition(l, l, c); });
  attempt([&] { logical_divide(l, l, c); });
  attempt([&] { logical_product(l, l, c); });
  attempt([&] { right_inverse(l, c); });
  attempt([&] { left_inverse(l, c); });
  attempt([&] { crd2idx(IntTuple(bound), l, c); });
  attempt([&] { idx2crd(IntTuple(bound), l.shape(), l.stride()); });
  attempt([&] { mesh_check_non_overlap(l); });
  attempt([&] { mesh_unflatten(l, 0, std::vector<int64_t>{bound}); });
  attempt([&] { mesh_global_ranks(l, bound); });
}

RC_GTEST_PROP(Errors, GarbageTextNeverCrashes, (const std::string& text)) {
  attempt([&] { parse_layout(text); });
  attempt([&] { parse_int_tuple(text); });
}

}  // namespace
}  // namespace meshsim
