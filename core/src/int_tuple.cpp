#include "meshsim/int_tuple.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>
#include <utility>

#include "checked_math.hpp"
#include "flat_modes.hpp"
#include "parse_text.hpp"
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

namespace {

class TextParser {
 public:
  explicit TextParser(std::string_view s) : s_(s) {}

  IntTuple parse_all() {
    IntTuple t = parse_value();
    skip_space();
    if (pos_ != s_.size()) fail("unexpected character after the value");
    return t;
  }

  IntTuple parse_value() {
    IntTupleBuilder b;
    value(b, 0);
    return b.take();
  }

  void skip_space() {
    // isspace's set in the C locale, without a library call per character.
    auto space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
    while (pos_ < s_.size() && space(s_[pos_])) ++pos_;
  }
  bool at(char c) {
    skip_space();
    return pos_ < s_.size() && s_[pos_] == c;
  }
  std::size_t pos() const { return pos_; }
  void advance() { ++pos_; }
  [[noreturn]] void fail(const std::string& why) const {
    throw ParseError("cannot parse " + quote_input(s_, pos_) + " at offset " + std::to_string(pos_) +
                     ": " + why);
  }

 private:
  void value(IntTupleBuilder& b, int depth) {
    skip_space();
    if (pos_ >= s_.size()) fail("expected an integer or '('");
    if (s_[pos_] == '(') {
      if (depth >= kMaxDepth) fail("nesting deeper than " + std::to_string(kMaxDepth));
      ++pos_;
      b.open();
      if (at(')')) fail("the empty tuple () is not a valid IntTuple");
      while (true) {
        value(b, depth + 1);
        if (++nodes_ > kMaxNodes) fail("more than " + std::to_string(kMaxNodes) + " nodes");
        if (at(',')) {
          ++pos_;
          if (at(')')) {  // Python's (4,) form
            ++pos_;
            break;
          }
          continue;
        }
        if (at(')')) {
          ++pos_;
          break;
        }
        fail("expected ',' or ')'");
      }
      b.close();
      return;
    }
    if (s_[pos_] == '-') fail("negative values are not allowed");
    if (s_[pos_] < '0' || s_[pos_] > '9') fail("expected an integer or '('");
    int64_t v = 0;
    auto [end, ec] = std::from_chars(s_.data() + pos_, s_.data() + s_.size(), v);
    if (ec == std::errc::result_out_of_range) fail("integer does not fit in 64-bit signed");
    if (ec != std::errc()) fail("expected an integer");
    pos_ = static_cast<std::size_t>(end - s_.data());
    b.leaf(v);
  }

  std::string_view s_;
  std::size_t pos_ = 0;
  int nodes_ = 0;
};

}  // namespace

std::string_view to_string(Convention c) { return c == Convention::kTorch ? "torch" : "cute"; }

Convention parse_convention(std::string_view name) {
  if (name == "torch") return Convention::kTorch;
  if (name == "cute") return Convention::kCute;
  throw InvalidArgument("unknown convention " + quote_input(name) +
                        ": expected \"torch\" or \"cute\"");
}

namespace detail {
namespace {
bool is_text_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
const char* skip_text_space(const char* p, const char* end) {
  while (p != end && is_text_space(*p)) ++p;
  return p;
}
constexpr std::size_t kMaxPlainNodes = 256;

// plain_value reads one value from `p` into `out`: one pass over the characters, each token
// checked against what the previous one allows, nodes written into a local array and copied out
// once, the tuples still open a stack of their node indices. A value's start counts it as a child
// of the innermost open tuple. false (with `out` in any state) wherever TextParser must decide;
// see read_plain_layout_text. On true, `p` is just past the value.
bool plain_value(const char*& p, const char* end, IntTuple::Storage& out) {
  // An integer of at most 18 digits cannot overflow int64; longer ones are left to TextParser.
  constexpr std::ptrdiff_t kSafeDigits = 18;
  Node nodes[kMaxPlainNodes];
  std::size_t count = 0;
  int32_t open[kMaxDepth];
  int depth = 0;
  bool after_value = false;  // a value just ended: ',' or ')' may follow
  bool after_comma = false;  // ',' just read: a value, or ')' (Python's (4,) form), may follow
  while (p != end) {
    const char c = *p;
    if (c >= '0' && c <= '9') {
      if (after_value || count == kMaxPlainNodes) return false;
      const char* digits = p;
      uint64_t v = 0;  // unsigned: the digits past kSafeDigits wrap harmlessly before the check
      do {
        v = v * 10 + static_cast<uint64_t>(*p - '0');
        ++p;
      } while (p != end && *p >= '0' && *p <= '9');
      if (p - digits > kSafeDigits) return false;
      if (depth) ++nodes[open[depth - 1]].arity;
      nodes[count++] = Node{static_cast<int64_t>(v), IntTuple::kLeaf, 1};
      if (depth == 0) break;
      after_value = true;
      after_comma = false;
      continue;
    }
    ++p;
    switch (c) {
      case '(':
        if (after_value || depth >= kMaxDepth || count == kMaxPlainNodes) return false;
        if (depth) ++nodes[open[depth - 1]].arity;
        open[depth++] = static_cast<int32_t>(count);
        nodes[count++] = Node{0, 0, 1};
        after_comma = false;
        continue;
      case ',':
        if (!after_value || depth == 0) return false;
        after_value = false;
        after_comma = true;
        continue;
      case ')': {
        if (depth == 0 || !(after_value || after_comma)) return false;  // "()" is TextParser's
        const int32_t top = open[--depth];
        nodes[top].span = static_cast<int32_t>(count) - top;
        after_value = true;
        after_comma = false;
        if (depth == 0) {
          out.assign(nodes, nodes + count);
          return true;
        }
        continue;
      }
      case ' ': case '\t': case '\n': case '\v': case '\f': case '\r':
        continue;
      default:
        return false;
    }
  }
  if (depth != 0 || count == 0) return false;  // the text ended inside the value
  out.assign(nodes, nodes + count);
  return true;
}
}  // namespace

PlainText read_plain_layout_text(std::string_view text, IntTuple::Storage& shape,
                                 IntTuple::Storage& stride) {
  const char* p = text.data();
  const char* end = p + text.size();
  if (!plain_value(p, end, shape)) return PlainText::kNotPlain;
  p = skip_text_space(p, end);
  if (p == end) {
    stride.clear();
    return PlainText::kShape;
  }
  if (*p != ':') return PlainText::kNotPlain;
  ++p;
  if (!plain_value(p, end, stride)) return PlainText::kNotPlain;
  return skip_text_space(p, end) == end ? PlainText::kShapeStride : PlainText::kNotPlain;
}

bool read_plain_int_tuple(std::string_view text, IntTuple::Storage& out) {
  const char* p = text.data();
  const char* end = p + text.size();
  return plain_value(p, end, out) && skip_text_space(p, end) == end;
}
}  // namespace detail

IntTuple parse_int_tuple(std::string_view text) {
  IntTuple t;
  if (detail::read_plain_int_tuple(text, detail::NodeAccess::nodes(t))) return t;
  return detail::parse_int_tuple_text(text);
}

namespace detail {
IntTuple parse_int_tuple_text(std::string_view text) { return TextParser(text).parse_all(); }

std::pair<IntTuple, std::optional<IntTuple>> parse_layout_text(std::string_view text) {
  TextParser p(text);
  IntTuple shape = p.parse_value();
  if (p.at(':')) {
    p.advance();
    IntTuple stride = p.parse_value();
    p.skip_space();
    if (p.pos() != text.size()) p.fail("unexpected character after the stride");
    return {std::move(shape), std::move(stride)};
  }
  p.skip_space();
  if (p.pos() != text.size()) p.fail("expected ':' after the shape");
  return {std::move(shape), std::nullopt};
}
}  // namespace detail

}  // namespace meshsim
