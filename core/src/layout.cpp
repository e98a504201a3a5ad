#include "meshsim/layout.hpp"

#include <cstdint>
#include <optional>
#include <utility>

#include "checked_math.hpp"
#include "flat_modes.hpp"
#include "parse_text.hpp"
#include "meshsim/error.hpp"

namespace meshsim {

using Node = IntTuple::Node;


Layout::Layout(IntTuple shape, IntTuple stride) : shape_(std::move(shape)), stride_(std::move(stride)) {
  detail::check_layout(*this);
}

namespace detail {

namespace {
// Errors of check_layout, out of line. Congruence is reported first whatever else is wrong, so
// a leaf's error is raised only once the whole tree is known to be congruent (fail_leaf).
[[noreturn, gnu::cold, gnu::noinline]] void fail_congruence(const Layout& l) {
  // PyTorch's words first (_FlatLayout: "sizes ... and strides ... don't match").
  throw InvalidArgument("sizes " + to_string(l.shape()) + " and strides " + to_string(l.stride()) +
                        " don't match: layout " + to_string(l.shape()) + ":" + to_string(l.stride()) +
                        " has a shape and a stride that are not congruent (same tree structure required)");
}
enum class LeafFault { kSize, kStride, kSizeOverflow, kCosizeOverflow };
[[noreturn, gnu::cold, gnu::noinline]] void fail_leaf(const Layout& l, LeafFault f, int64_t v) {
  if (!congruent(l.shape(), l.stride())) fail_congruence(l);
  const std::string text = "layout " + to_string(l.shape()) + ":" + to_string(l.stride());
  switch (f) {
    case LeafFault::kSize:
      throw InvalidArgument(text + ": size " + std::to_string(v) + " is not >= 1");
    case LeafFault::kStride:
      throw InvalidArgument(text + ": stride " + std::to_string(v) + " is not >= 0");
    case LeafFault::kSizeOverflow:
      throw OverflowError(text + ": size overflows 64-bit signed integers");
    case LeafFault::kCosizeOverflow:
      break;
  }
  throw OverflowError(text + ": cosize overflows 64-bit signed integers");
}
}  // namespace

// check_layout makes one pass over both trees: structure and leaves together, each leaf's
// checks in order (size >= 1, stride >= 0, then the size and cosize products).
void check_layout(const Layout& l) {
  const int n = l.shape().node_count();
  if (n != l.stride().node_count()) fail_congruence(l);
  const Node* s = l.shape().nodes();
  const Node* d = l.stride().nodes();
  int64_t sz = 1;
  int64_t hi = 0;
  for (int i = 0; i < n; ++i) {
    if (s[i].arity != d[i].arity) fail_congruence(l);
    if (s[i].arity != IntTuple::kLeaf) continue;
    if (s[i].value < 1) fail_leaf(l, LeafFault::kSize, s[i].value);
    if (d[i].value < 0) fail_leaf(l, LeafFault::kStride, d[i].value);
    if (__builtin_mul_overflow(sz, s[i].value, &sz)) fail_leaf(l, LeafFault::kSizeOverflow, 0);
    int64_t term = 0;
    if (__builtin_mul_overflow(s[i].value - 1, d[i].value, &term) ||
        __builtin_add_overflow(hi, term, &hi) || hi == INT64_MAX) {
      fail_leaf(l, LeafFault::kCosizeOverflow, 0);
    }
  }
}

}  // namespace detail

Layout Layout::unchecked(IntTuple shape, IntTuple stride) {
  Layout l;
  l.shape_ = std::move(shape);
  l.stride_ = std::move(stride);
  return l;
}

Layout Layout::compact(const IntTuple& shape, Convention c) {
  return Layout(shape, compact_stride(shape, c));
}

Layout Layout::operator[](int i) const {
  if (i < 0 || i >= rank()) {
    throw OutOfRange("mode " + std::to_string(i) + " is out of range [0, " +
                     std::to_string(rank()) + ") for layout " + to_string(*this));
  }
  return detail::LayoutView(*this).mode(i).copy();
}

std::size_t Layout::hash() const {
  return shape_.hash() * 0x9e3779b97f4a7c15ULL ^ stride_.hash();
}

int64_t size(const Layout& l) { return size(l.shape()); }

int64_t cosize(const Layout& l) { return detail::cosize(l); }

namespace detail {

int64_t cosize(LayoutView v) {
  int64_t hi = 0;
  for (int i = 0; i < v.s->span; ++i) {
    if (v.s[i].arity == IntTuple::kLeaf) {
      hi = checked_add(hi, checked_mul(v.s[i].value - 1, v.d[i].value, "cosize"), "cosize");
    }
  }
  return checked_add(hi, 1, "cosize");
}

Layout LayoutView::copy() const {
  Layout out;
  auto& sn = NodeAccess::nodes(NodeAccess::shape(out));
  auto& dn = NodeAccess::nodes(NodeAccess::stride(out));
  sn.assign(s, s + s->span);
  dn.assign(d, d + d->span);
  return out;
}

namespace {
template <typename Modes>
Layout join_modes(const Modes& modes) {
  Layout out = NodeAccess::blank();
  LayoutBuilder b(out);
  b.open();
  for (const auto& m : modes) b.append(LayoutView(m));
  b.close();
  return out;
}
}  // namespace

Layout join_unchecked(std::span<const Layout> modes) { return join_modes(modes); }
Layout join_unchecked(std::span<const LayoutView> modes) { return join_modes(modes); }

}  // namespace detail

Layout make_layout(std::span<const Layout> modes) {
  Layout joined = detail::join_unchecked(modes);
  detail::check_layout(joined);
  return joined;
}

Layout make_layout(std::initializer_list<Layout> modes) {
  return make_layout(std::span<const Layout>(modes.begin(), modes.size()));
}

namespace {
void mirror_into(const Node* n, IntTupleBuilder& b) {
  if (n->arity == IntTuple::kLeaf) {
    b.leaf(n->value);
    return;
  }
  boost::container::small_vector<const Node*, 8> kids;
  const Node* c = n + 1;
  for (int k = 0; k < n->arity; ++k, c += c->span) kids.push_back(c);
  b.open();
  for (auto it = kids.rbegin(); it != kids.rend(); ++it) mirror_into(*it, b);
  b.close();
}
}  // namespace

IntTuple mirror(const IntTuple& t) {
  IntTupleBuilder b;
  mirror_into(t.nodes(), b);
  return b.take();
}

Layout mirror(const Layout& l) { return Layout::unchecked(mirror(l.shape()), mirror(l.stride())); }

std::string to_string(const Layout& l) { return to_string(l.shape()) + ":" + to_string(l.stride()); }

Layout parse_layout(std::string_view text) {
  // The common text is read straight into the result's trees; the full reader decides the rest.
  Layout out = detail::NodeAccess::blank();
  auto& shape_nodes = detail::NodeAccess::nodes(detail::NodeAccess::shape(out));
  auto& stride_nodes = detail::NodeAccess::nodes(detail::NodeAccess::stride(out));
  switch (detail::read_plain_layout_text(text, shape_nodes, stride_nodes)) {
    case detail::PlainText::kShapeStride:
      detail::check_layout(out);
      return out;
    case detail::PlainText::kShape:
      return Layout::compact(detail::NodeAccess::shape(out), Convention::kTorch);
    case detail::PlainText::kNotPlain:
      break;
  }
  auto [shape, stride] = detail::parse_layout_text(text);
  if (!stride) return Layout::compact(shape, Convention::kTorch);
  return Layout(std::move(shape), std::move(*stride));
}

}  // namespace meshsim
