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
  if (!congruent(shape_, stride_)) {
    throw InvalidArgument("layout " + to_string(shape_) + ":" + to_string(stride_) +
                          ": shape and stride are not congruent (same tree structure required)");
  }
  const Node* s = shape_.nodes();
  const Node* d = stride_.nodes();
  int64_t sz = 1;
  int64_t hi = 0;
  for (int i = 0; i < shape_.node_count(); ++i) {
    if (s[i].arity != IntTuple::kLeaf) continue;
    if (s[i].value < 1) {
      throw InvalidArgument("layout " + to_string(shape_) + ":" + to_string(stride_) + ": size " +
                            std::to_string(s[i].value) + " is not >= 1");
    }
    if (d[i].value < 0) {
      throw InvalidArgument("layout " + to_string(shape_) + ":" + to_string(stride_) + ": stride " +
                            std::to_string(d[i].value) + " is not >= 0");
    }
    const std::optional<int64_t> next_size = try_mul(sz, s[i].value);
    if (!next_size) {
      throw OverflowError("layout " + to_string(shape_) + ":" + to_string(stride_) +
                          ": size overflows 64-bit signed integers");
    }
    sz = *next_size;
    const std::optional<int64_t> term = try_mul(s[i].value - 1, d[i].value);
    const std::optional<int64_t> next_hi = term ? try_add(hi, *term) : std::nullopt;
    if (!next_hi || *next_hi == INT64_MAX) {
      throw OverflowError("layout " + to_string(shape_) + ":" + to_string(stride_) +
                          ": cosize overflows 64-bit signed integers");
    }
    hi = *next_hi;
  }
}

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
  if (shape_.is_int()) return *this;
  return unchecked(shape_[i], stride_[i]);
}

std::size_t Layout::hash() const {
  return shape_.hash() * 0x9e3779b97f4a7c15ULL ^ stride_.hash();
}

int64_t size(const Layout& l) { return size(l.shape()); }

int64_t cosize(const Layout& l) {
  const Node* s = l.shape().nodes();
  const Node* d = l.stride().nodes();
  int64_t hi = 0;
  for (int i = 0; i < l.shape().node_count(); ++i) {
    if (s[i].arity == IntTuple::kLeaf) {
      hi = checked_add(hi, checked_mul(s[i].value - 1, d[i].value, "cosize"), "cosize");
    }
  }
  return checked_add(hi, 1, "cosize");
}

namespace detail {

Leaves leaves(const Layout& l) {
  Leaves out;
  const Node* s = l.shape().nodes();
  const Node* d = l.stride().nodes();
  for (int i = 0; i < l.shape().node_count(); ++i) {
    if (s[i].arity == IntTuple::kLeaf) out.push_back(Leaf{s[i].value, d[i].value});
  }
  return out;
}

Layout join_unchecked(std::span<const Layout> modes) {
  IntTupleBuilder s;
  IntTupleBuilder d;
  s.open();
  d.open();
  for (const Layout& m : modes) {
    s.append(m.shape());
    d.append(m.stride());
  }
  s.close();
  d.close();
  return Layout::unchecked(s.take(), d.take());
}

}  // namespace detail

Layout make_layout(std::span<const Layout> modes) {
  Layout joined = detail::join_unchecked(modes);
  return Layout(joined.shape(), joined.stride());
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
  auto [shape, stride] = detail::parse_layout_text(text);
  if (!stride) return Layout::compact(shape, Convention::kTorch);
  return Layout(std::move(shape), std::move(*stride));
}

}  // namespace meshsim
