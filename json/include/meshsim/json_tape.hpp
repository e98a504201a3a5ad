// json_tape.hpp — a fast reader for the plain JSON that requests are made of (target meshsim::json).
//
// JsonTape reads one JSON text with RapidJSON's SAX reader, in place on its own copy of the text,
// into a flat, preorder array of nodes (a "tape"), with no allocation for typical requests (64
// nodes and 256 bytes inline); strings point into the copy. TapeValue is a view of one node with the
// subset of nlohmann::json's interface that meshsim's JSON readers use (their overloads are declared at
// the end), so one reader serves both. Internal to the query tool: not installed.
//
//   JsonTape tape;
//   if (tape.read(R"({"op":"size","layout":"(2,4):(4,1)"})")) {
//     std::optional<TapeValue> op = json::find(tape.root(), "op");  // "size"
//   }
//
// read() accepts a strict subset of what nlohmann::json accepts, chosen so that whatever it
// accepts means exactly the same to both readers; for anything else it returns false and the
// caller reads the text with nlohmann (which also words every error). The subset: bytes are
// printable ASCII, space, tab, CR or LF, with no backslash (so no escapes and no encoding
// questions); numbers are integers that fit int64 (nlohmann keeps larger ones as uint64 or double);
// no object repeats a key (nlohmann keeps the last, RapidJSON both) or has more than 32 members
// (the check is pairwise); nesting is at most kMaxTapeDepth (deeper text is refused before
// RapidJSON recurses further); at most kMaxTapeNodes values and keys.
//
// Thread-safety: a JsonTape is a plain value; one per thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "meshsim/inline_vector.hpp"
#include "meshsim/int_tuple.hpp"
#include "meshsim/json_codec.hpp"

namespace meshsim::json {

class JsonTape;

// kMaxTapeDepth bounds bracket nesting on the tape (the query engine refuses deeper requests).
inline constexpr int kMaxTapeDepth = 64;
// kMaxTapeNodes bounds the values and keys on one tape (32 bytes each): a larger text is left to
// nlohmann, whose tree is smaller per value, so a 64 MiB line cannot cost a gigabyte of tape.
inline constexpr std::size_t kMaxTapeNodes = std::size_t{1} << 16;

// TapeValue is one value of a JsonTape: a view, valid while the tape and its text live.
class TapeValue {
 public:
  enum class Kind : uint8_t { kNull, kBool, kInt, kString, kArray, kObject, kKey };

  TapeValue(const JsonTape& tape, uint32_t index) : tape_(&tape), index_(index) {}

  Kind kind() const;
  bool is_null() const { return kind() == Kind::kNull; }
  bool is_boolean() const { return kind() == Kind::kBool; }
  bool is_number() const { return kind() == Kind::kInt; }
  bool is_number_integer() const { return kind() == Kind::kInt; }
  // Like nlohmann's, a non-negative integer reads as unsigned too.
  bool is_number_unsigned() const { return kind() == Kind::kInt && int_value() >= 0; }
  bool is_number_float() const { return false; }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_array() const { return kind() == Kind::kArray; }
  bool is_object() const { return kind() == Kind::kObject; }

  // int_value is the integer (0 unless is_number); bool_value the boolean; string_value the
  // string or key (empty unless a string).
  int64_t int_value() const;
  bool bool_value() const;
  std::string_view string_value() const;
  // nlohmann's getters, for the shared readers: int64_t, uint64_t, double, std::string.
  template <typename T>
  T get() const;

  // size is the number of elements (array) or members (object), 0 for a scalar.
  std::size_t size() const;
  bool empty() const { return size() == 0; }
  // dump is the value as compact JSON (members in their order).
  std::string dump() const;

  // Iteration over an array's elements (an object's are its keys' values, in order; key() is
  // the current member's key, empty for an array element).
  class Iterator {
   public:
    Iterator(const JsonTape& tape, uint32_t index) : tape_(&tape), index_(index) {}
    TapeValue operator*() const;
    std::string_view key() const;
    Iterator& operator++();
    bool operator==(const Iterator& o) const { return index_ == o.index_; }
    bool operator!=(const Iterator& o) const { return index_ != o.index_; }

   private:
    const JsonTape* tape_;
    uint32_t index_;
  };
  Iterator begin() const;
  Iterator end() const;

  // member is the value of `key` in an object; nullopt when absent or not an object.
  std::optional<TapeValue> member(std::string_view key) const;

  // int_nodes writes the value as an IntTuple's preorder nodes into out[0, capacity) when it is
  // an integer, or non-empty arrays nested fewer than kMaxDepth deep of integers (and of nulls,
  // read as 0, when nulls_as_zero), with at most `capacity` values in all. Anything else is
  // false (out is then in any state): the caller's full reader decides it, and words its error.
  // Array and IntTuple subtrees are both spans of preorder nodes, so this is one pass.
  bool int_nodes(IntTuple::Node* out, std::size_t capacity, bool nulls_as_zero) const;

 private:
  void dump_to(std::string& out) const;
  const JsonTape* tape_;
  uint32_t index_;
};

// JsonTape holds one JSON text read by read().
class JsonTape {
 public:
  // read parses `text`; false when the text is not JSON or not in
  // the subset above. It may be called again to reuse the tape's storage.
  bool read(std::string_view text);
  // root is the text's top-level value; only after read() returned true.
  TapeValue root() const { return TapeValue(*this, 0); }

 private:
  friend class TapeValue;
  friend struct TapeBuilder;
  struct Node {
    TapeValue::Kind kind;
    uint32_t end;    // one past this value's last node (a key: past its value)
    uint32_t count;  // elements or members; string length
    int64_t value;   // integer or boolean
    const char* str;
  };
  detail::InlineVector<Node, 64> nodes_;
  detail::InlineVector<char, 256> text_;  // the text, NUL-terminated, its strings read in place
};

// The accessors are inline: the query engine calls them per field.
inline TapeValue::Kind TapeValue::kind() const { return tape_->nodes_[index_].kind; }

inline int64_t TapeValue::int_value() const {
  const auto& n = tape_->nodes_[index_];
  return n.kind == Kind::kInt ? n.value : 0;
}

inline bool TapeValue::bool_value() const {
  const auto& n = tape_->nodes_[index_];
  return n.kind == Kind::kBool && n.value != 0;
}

inline std::string_view TapeValue::string_value() const {
  const auto& n = tape_->nodes_[index_];
  if (n.kind != Kind::kString && n.kind != Kind::kKey) return {};
  return {n.str, n.count};
}

inline std::size_t TapeValue::size() const {
  const auto& n = tape_->nodes_[index_];
  return n.kind == Kind::kArray || n.kind == Kind::kObject ? n.count : 0;
}

inline TapeValue TapeValue::Iterator::operator*() const {
  const bool key = tape_->nodes_[index_].kind == Kind::kKey;
  return TapeValue(*tape_, key ? index_ + 1 : index_);
}

inline TapeValue::Iterator& TapeValue::Iterator::operator++() {
  index_ = tape_->nodes_[index_].end;
  return *this;
}

inline TapeValue::Iterator TapeValue::begin() const {
  const auto& n = tape_->nodes_[index_];
  const bool container = n.kind == Kind::kArray || n.kind == Kind::kObject;
  return Iterator(*tape_, container ? index_ + 1 : n.end);
}

inline TapeValue::Iterator TapeValue::end() const {
  return Iterator(*tape_, tape_->nodes_[index_].end);
}

inline std::string_view TapeValue::Iterator::key() const {
  const auto& n = tape_->nodes_[index_];
  if (n.kind != Kind::kKey) return {};
  return {n.str, n.count};
}

template <typename T>
T TapeValue::get() const {
  if constexpr (std::is_same_v<T, std::string>) {
    return std::string(string_value());
  } else if constexpr (std::is_same_v<T, double>) {
    return static_cast<double>(int_value());
  } else {
    static_assert(std::is_integral_v<T>);
    return static_cast<T>(int_value());
  }
}

// The readers of json_codec.hpp over the tape's values: the same rules and errors.
int64_t to_int(const TapeValue& j, std::string_view field);
IntTuple to_int_tuple(const TapeValue& j, std::string_view field, NullAs nulls = NullAs::kError);
Layout to_layout(const TapeValue& j, std::string_view field);
Tiler to_tiler(const TapeValue& j, std::string_view field);
std::vector<int64_t> to_int_list(const TapeValue& j, std::string_view field);
ShortIntList to_short_int_list(const TapeValue& j, std::string_view field);

}  // namespace meshsim::json
