// The CuTe text reader: IntTuple and layout text ("((2,3),4):((1,2),6)"), with a fast path for
// the plain text most calls pass (parse_text.hpp).
#include "parse_text.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <optional>
#include <utility>
#include <string>

#include "checked_math.hpp"
#include "flat_modes.hpp"
#include "meshsim/error.hpp"

namespace meshsim {

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
