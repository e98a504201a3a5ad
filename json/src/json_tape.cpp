#include "meshsim/json_tape.hpp"

#include <rapidjson/reader.h>

#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace meshsim::json {

namespace {

// plain_bytes: printable ASCII and JSON's whitespace, no backslash (see json_tape.hpp), byte by
// byte without branches.
bool plain_bytes(const char* p, std::size_t n) {
  unsigned bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<uint8_t>(p[i]);
    const bool printable = static_cast<uint8_t>(c - 0x20) < 0x5f;  // 0x20..0x7e
    const bool space = (c == '\t') | (c == '\n') | (c == '\r');
    bad |= static_cast<unsigned>(!(printable | space) | (c == '\\'));
  }
  return bad == 0;
}

// in_subset is plain_bytes over the text, 16 bytes at a time where SSE2 is there (every x86-64):
// a block of printable bytes without a backslash passes in a few instructions, and only a block
// with anything else (a tab, say) is checked byte by byte.
bool in_subset(std::string_view text) {
  const char* p = text.data();
  std::size_t n = text.size();
#if defined(__SSE2__)
  const __m128i space = _mm_set1_epi8(0x20);
  const __m128i del = _mm_set1_epi8(0x7f);
  const __m128i backslash = _mm_set1_epi8('\\');
  for (; n >= 16; p += 16, n -= 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    // Signed compares: bytes >= 0x80 are negative, so "below 0x20" catches them too.
    const __m128i odd = _mm_or_si128(_mm_cmplt_epi8(v, space),
                                     _mm_or_si128(_mm_cmpeq_epi8(v, del), _mm_cmpeq_epi8(v, backslash)));
    if (_mm_movemask_epi8(odd) != 0 && !plain_bytes(p, 16)) return false;
  }
#endif
  return plain_bytes(p, n);
}

// same_key compares a key with `len` bytes at `a` to `key`: lengths first, then bytes in a loop
// (keys are a few bytes; a memcmp call per comparison cost more than the comparison).
bool same_key(const char* a, uint32_t len, std::string_view key) {
  if (len != key.size()) return false;
  for (uint32_t i = 0; i < len; ++i) {
    if (a[i] != key[i]) return false;
  }
  return true;
}

// kMaxTapeMembers bounds an object's members on the tape (requests have a few).
constexpr rapidjson::SizeType kMaxTapeMembers = 32;

}  // namespace

// TapeBuilder is the SAX handler that writes the tape; returning false stops the reader.
struct TapeBuilder {
  using Node = JsonTape::Node;
  using Kind = TapeValue::Kind;
  explicit TapeBuilder(JsonTape& t) : tape(t) {}  // `open` is written before it is read
  JsonTape& tape;
  uint32_t open[kMaxTapeDepth];  // indices of the open containers
  int depth = 0;

  // add appends a node, field by field (no temporary to copy), unless the tape is full.
  bool add(Kind kind, uint32_t end, uint32_t count, int64_t value, const char* str) {
    if (tape.nodes_.size() >= kMaxTapeNodes) return false;
    Node* n = tape.nodes_.grow_by(1);
    n->kind = kind;
    n->end = end;
    n->count = count;
    n->value = value;
    n->str = str;
    return true;
  }
  // scalar adds a scalar, or a string or key read in place (`str`, `len` bytes).
  bool scalar(Kind kind, int64_t value, const char* str = nullptr, uint32_t len = 0) {
    return add(kind, static_cast<uint32_t>(tape.nodes_.size()) + 1, len, value, str);
  }
  bool Null() { return scalar(Kind::kNull, 0); }
  bool Bool(bool b) { return scalar(Kind::kBool, b ? 1 : 0); }
  bool Int(int v) { return scalar(Kind::kInt, v); }
  bool Uint(unsigned v) { return scalar(Kind::kInt, v); }
  bool Int64(int64_t v) { return scalar(Kind::kInt, v); }
  bool Uint64(uint64_t v) {
    if (v > static_cast<uint64_t>(INT64_MAX)) return false;
    return scalar(Kind::kInt, static_cast<int64_t>(v));
  }
  bool Double(double) { return false; }
  bool RawNumber(const char*, rapidjson::SizeType, bool) { return false; }
  bool String(const char* str, rapidjson::SizeType len, bool) {
    return scalar(Kind::kString, 0, str, static_cast<uint32_t>(len));
  }
  bool Key(const char* str, rapidjson::SizeType len, bool) {
    return scalar(Kind::kKey, 0, str, static_cast<uint32_t>(len));
  }
  bool start(Kind kind) {
    if (depth >= kMaxTapeDepth) return false;
    open[depth++] = static_cast<uint32_t>(tape.nodes_.size());
    return add(kind, 0, 0, 0, nullptr);
  }
  bool StartObject() { return start(Kind::kObject); }
  bool StartArray() { return start(Kind::kArray); }
  bool end(rapidjson::SizeType count) {
    const uint32_t at = open[--depth];
    Node& n = tape.nodes_[at];
    n.end = static_cast<uint32_t>(tape.nodes_.size());
    n.count = count;
    return true;
  }
  bool EndArray(rapidjson::SizeType count) { return end(count); }
  bool EndObject(rapidjson::SizeType count) {
    // Link each key past its value, and refuse a repeated key (checked pairwise, so a large
    // object is left to nlohmann).
    if (count > kMaxTapeMembers) return false;
    const uint32_t at = open[depth - 1];
    const uint32_t stop = static_cast<uint32_t>(tape.nodes_.size());
    auto next_value_end = [&](uint32_t v) {
      const Node& n = tape.nodes_[v];
      return n.kind == Kind::kArray || n.kind == Kind::kObject ? n.end : v + 1;
    };
    for (uint32_t k = at + 1; k < stop;) {
      Node& key = tape.nodes_[k];
      key.end = next_value_end(k + 1);
      const std::string_view name(key.str, key.count);
      for (uint32_t j = at + 1; j < k; j = tape.nodes_[j].end) {
        if (same_key(tape.nodes_[j].str, tape.nodes_[j].count, name)) return false;
      }
      k = key.end;
    }
    return end(count);
  }
};

bool JsonTape::read(std::string_view text) {
  nodes_.clear();
  if (!in_subset(text)) return false;
  // RapidJSON reads in place: strings end up in the tape's own copy, so no string is copied
  // again and the reader needs no stack of its own for them (no allocation below 256 bytes).
  // The copy is padded with zeros: RapidJSON's SSE2 scans load whole aligned 16-byte blocks, which
  // may reach up to 15 bytes past the NUL that ends the text for it.
  constexpr std::size_t kPad = 16;
  text_.resize_uninit(text.size() + kPad);
  std::memcpy(text_.data(), text.data(), text.size());
  std::memset(text_.data() + text.size(), 0, kPad);  // the first: the end for RapidJSON (in_subset
                                                     // refused any NUL in the text)
  rapidjson::InsituStringStream in(text_.data());
  TapeBuilder b(*this);
  rapidjson::Reader reader(nullptr, 0);
  return !reader.Parse<rapidjson::kParseInsituFlag>(in, b).IsError();
}

std::optional<TapeValue> TapeValue::member(std::string_view key) const {
  if (!is_object()) return std::nullopt;
  const auto& nodes = tape_->nodes_;
  for (uint32_t k = index_ + 1; k < nodes[index_].end; k = nodes[k].end) {
    if (same_key(nodes[k].str, nodes[k].count, key)) return TapeValue(*tape_, k + 1);
  }
  return std::nullopt;
}

bool TapeValue::int_nodes(IntTuple::Node* out, std::size_t capacity, bool nulls_as_zero) const {
  const auto& nodes = tape_->nodes_;
  const uint32_t stop = nodes[index_].end;  // past the value's subtree (a scalar: index_ + 1)
  if (stop - index_ > capacity) return false;
  uint32_t ends[kMaxDepth];  // where each open array ends
  int depth = 0;
  for (uint32_t i = index_; i < stop; ++i, ++out) {
    while (depth && i >= ends[depth - 1]) --depth;
    const JsonTape::Node& n = nodes[i];
    switch (n.kind) {
      case Kind::kInt:
        *out = IntTuple::Node{n.value, IntTuple::kLeaf, 1};
        break;
      case Kind::kNull:
        if (!nulls_as_zero) return false;
        *out = IntTuple::Node{0, IntTuple::kLeaf, 1};
        break;
      case Kind::kArray:
        if (depth >= kMaxDepth || n.count == 0) return false;
        *out = IntTuple::Node{0, static_cast<int32_t>(n.count), static_cast<int32_t>(n.end - i)};
        ends[depth++] = n.end;
        break;
      default:
        return false;
    }
  }
  return true;
}

std::string TapeValue::dump() const {
  std::string out;
  dump_to(out);
  return out;
}

void TapeValue::dump_to(std::string& out) const {
  const auto& nodes = tape_->nodes_;
  const auto& n = nodes[index_];
  switch (n.kind) {
    case Kind::kNull: out += "null"; return;
    case Kind::kBool: out += n.value ? "true" : "false"; return;
    case Kind::kInt: out += std::to_string(n.value); return;
    case Kind::kString:
    case Kind::kKey:  // no escapes on the tape: the text is the value
      out += '"';
      out.append(n.str, n.count);
      out += '"';
      return;
    case Kind::kArray:
    case Kind::kObject: {
      const bool object = n.kind == Kind::kObject;
      out += object ? '{' : '[';
      for (uint32_t k = index_ + 1; k < n.end; k = nodes[k].end) {
        if (k != index_ + 1) out += ',';
        if (object) {
          TapeValue(*tape_, k).dump_to(out);
          out += ':';
          TapeValue(*tape_, k + 1).dump_to(out);
        } else {
          TapeValue(*tape_, k).dump_to(out);
        }
      }
      out += object ? '}' : ']';
      return;
    }
  }
}

}  // namespace meshsim::json
