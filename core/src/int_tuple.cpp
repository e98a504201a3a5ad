#include "meshsim/int_tuple.hpp"

#include <algorithm>
#include <cctype>
#include <optional>
#include <utility>

#include "checked_math.hpp"
#include "flat_modes.hpp"
#include "meshsim/error.hpp"

namespace meshsim {

using Node = IntTuple::Node;

// ---- builder ----------------------------------------------------------------------------

void IntTupleBuilder::count_child() {
  if (!open_.empty()) ++nodes_[open_.back()].arity;
}

void IntTupleBuilder::leaf(int64_t v) {
  count_child();
  nodes_.push_back(Node{v, IntTuple::kLeaf, 1});
}

void IntTupleBuilder::append(const Node* root) {
  count_child();
  nodes_.append(root, root + root->span);
}

void IntTupleBuilder::open() {
  count_child();
  open_.push_back(static_cast<int32_t>(nodes_.size()));
  nodes_.push_back(Node{0, 0, 1});
}

void IntTupleBuilder::close() {
  if (open_.empty()) throw Internal("IntTupleBuilder: close() without open()");
  int32_t at = open_.back();
  open_.pop_back();
  nodes_[at].span = static_cast<int32_t>(nodes_.size()) - at;
}

IntTuple IntTupleBuilder::take() {
  if (!open_.empty() || nodes_.empty() || nodes_[0].span != static_cast<int32_t>(nodes_.size())) {
    throw Internal("IntTupleBuilder: take() needs exactly one complete value");
  }
  IntTuple t{IntTuple::Empty{}};
  t.nodes_ = std::move(nodes_);
  nodes_.clear();
  return t;
}

// ---- IntTuple ---------------------------------------------------------------------------

IntTuple IntTuple::tuple(std::initializer_list<IntTuple> elements) {
  return tuple(std::span<const IntTuple>(elements.begin(), elements.size()));
}

IntTuple IntTuple::tuple(std::span<const IntTuple> elements) {
  IntTupleBuilder b;
  b.open();
  for (const IntTuple& e : elements) b.append(e);
  b.close();
  return b.take();
}

IntTuple IntTuple::from_nodes(const Node* root) {
  IntTuple t{IntTuple::Empty{}};
  t.nodes_.assign(root, root + root->span);
  return t;
}

int64_t IntTuple::value() const {
  if (!is_int()) throw InvalidArgument("expected an integer, got the tuple " + to_string(*this));
  return nodes_[0].value;
}

int IntTuple::depth() const {
  // Preorder walk with an explicit stack of remaining-children counts: no recursion.
  int best = 0;
  boost::container::small_vector<int32_t, 16> remaining;
  for (const Node& n : nodes_) {
    if (!remaining.empty()) --remaining.back();
    if (n.arity != kLeaf) {
      remaining.push_back(n.arity);
      best = std::max(best, static_cast<int>(remaining.size()));
    }
    while (!remaining.empty() && remaining.back() == 0) remaining.pop_back();
  }
  return best;
}

IntTuple IntTuple::operator[](int i) const {
  if (is_int()) {
    if (i != 0) {
      throw OutOfRange("index " + std::to_string(i) + " is out of range [0, 1) for the integer " +
                       to_string(*this));
    }
    return *this;
  }
  if (i < 0 || i >= rank()) {
    throw OutOfRange("index " + std::to_string(i) + " is out of range [0, " +
                     std::to_string(rank()) + ") for " + to_string(*this));
  }
  const Node* c = nodes_.data() + 1;
  for (int k = 0; k < i; ++k) c += c->span;
  return from_nodes(c);
}

int IntTuple::leaf_count() const {
  return static_cast<int>(
      std::count_if(nodes_.begin(), nodes_.end(), [](const Node& n) { return n.arity == kLeaf; }));
}

bool operator==(const IntTuple& a, const IntTuple& b) {
  if (a.nodes_.size() != b.nodes_.size()) return false;
  for (std::size_t i = 0; i < a.nodes_.size(); ++i) {
    const Node& x = a.nodes_[i];
    const Node& y = b.nodes_[i];
    if (x.arity != y.arity) return false;
    if (x.arity == IntTuple::kLeaf && x.value != y.value) return false;
  }
  return true;
}

std::size_t IntTuple::hash() const {
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&h](uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  };
  for (const Node& n : nodes_) {
    mix(static_cast<uint64_t>(static_cast<int64_t>(n.arity)));
    if (n.arity == kLeaf) mix(static_cast<uint64_t>(n.value));
  }
  return static_cast<std::size_t>(h);
}

// ---- free functions ---------------------------------------------------------------------

int64_t size(const IntTuple& t) {
  int64_t p = 1;
  const Node* n = t.nodes();
  for (int i = 0; i < t.node_count(); ++i) {
    if (n[i].arity == IntTuple::kLeaf) p = checked_mul(p, n[i].value, "size");
  }
  return p;
}

namespace {

int64_t subtree_size(const Node* n) {
  int64_t p = 1;
  for (int i = 0; i < n->span; ++i) {
    if (n[i].arity == IntTuple::kLeaf) p = checked_mul(p, n[i].value, "shape_div: size");
  }
  return p;
}

int64_t div_ints(int64_t a, int64_t b) {
  if (a < 0 || b < 1) {
    throw InvalidArgument("shape_div: " + std::to_string(a) + " / " + std::to_string(b) +
                          " needs a >= 0 and b >= 1");
  }
  if (a % b != 0 && b % a != 0) {
    throw InvalidArgument("shape_div: neither of " + std::to_string(a) + " and " +
                          std::to_string(b) + " divides the other");
  }
  return a / b + (a % b != 0 ? 1 : 0);
}

// div_by divides the subtree at `a` by the int b, left to right (tuple / int).
void div_by(const Node* a, int64_t b, IntTupleBuilder& out) {
  if (a->arity == IntTuple::kLeaf) {
    out.leaf(div_ints(a->value, b));
    return;
  }
  out.open();
  const Node* c = a + 1;
  for (int k = 0; k < a->arity; ++k, c += c->span) {
    div_by(c, b, out);
    b = div_ints(b, subtree_size(c));
  }
  out.close();
}

void div_tree(const Node* a, const Node* b, IntTupleBuilder& out) {
  if (b->arity == IntTuple::kLeaf) {
    div_by(a, b->value, out);
    return;
  }
  if (a->arity == IntTuple::kLeaf) {
    out.leaf(div_ints(a->value, subtree_size(b)));
    return;
  }
  if (a->arity != b->arity) {
    throw InvalidArgument("shape_div: " + to_string(IntTuple::from_nodes(a)) + " and " +
                          to_string(IntTuple::from_nodes(b)) + " have different ranks (" +
                          std::to_string(a->arity) + " and " + std::to_string(b->arity) + ")");
  }
  out.open();
  const Node* ca = a + 1;
  const Node* cb = b + 1;
  for (int k = 0; k < a->arity; ++k, ca += ca->span, cb += cb->span) div_tree(ca, cb, out);
  out.close();
}

}  // namespace

IntTuple compact_stride(const IntTuple& shape, Convention c) {
  // The leaves' sizes in the convention's order (torch: right to left), then their running
  // exclusive products, written back in preorder by transform_leaves.
  boost::container::small_vector<int64_t, 16> sizes;
  for (int i = 0; i < shape.node_count(); ++i) {
    if (shape.nodes()[i].arity == IntTuple::kLeaf) sizes.push_back(shape.nodes()[i].value);
  }
  const std::size_t n = sizes.size();
  boost::container::small_vector<int64_t, 16> stride(n);
  int64_t cur = 1;
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t at = c == Convention::kTorch ? n - 1 - k : k;
    stride[at] = cur;
    if (k + 1 < n) cur = checked_mul(cur, sizes[at], "compact_stride");
  }
  return transform_leaves(shape, [&](int k, int64_t) { return stride[static_cast<std::size_t>(k)]; });
}

IntTuple shape_div(const IntTuple& a, const IntTuple& b) {
  IntTupleBuilder out;
  div_tree(a.nodes(), b.nodes(), out);
  return out.take();
}

IntTuple flatten(const IntTuple& t) {
  IntTupleBuilder b;
  b.open();
  const Node* n = t.nodes();
  for (int i = 0; i < t.node_count(); ++i) {
    if (n[i].arity == IntTuple::kLeaf) b.leaf(n[i].value);
  }
  b.close();
  return b.take();
}

bool congruent(const IntTuple& a, const IntTuple& b) {
  if (a.node_count() != b.node_count()) return false;
  for (int i = 0; i < a.node_count(); ++i) {
    if (a.nodes()[i].arity != b.nodes()[i].arity) return false;
  }
  return true;
}

namespace {

void print(const Node* n, std::string& out) {
  if (n->arity == IntTuple::kLeaf) {
    out += std::to_string(n->value);
    return;
  }
  out += '(';
  const Node* c = n + 1;
  for (int k = 0; k < n->arity; ++k) {
    if (k) out += ',';
    print(c, out);
    c += c->span;
  }
  out += ')';
}

}  // namespace

std::string to_string(const IntTuple& t) {
  std::string out;
  print(t.nodes(), out);
  return out;
}


std::string_view to_string(Convention c) { return c == Convention::kTorch ? "torch" : "cute"; }

Convention parse_convention(std::string_view name) {
  if (name == "torch") return Convention::kTorch;
  if (name == "cute") return Convention::kCute;
  throw InvalidArgument("unknown convention " + quote_input(name) +
                        ": expected \"torch\" or \"cute\"");
}

}  // namespace meshsim
