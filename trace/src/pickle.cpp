#include "meshsim/pickle.hpp"

#include <charconv>
#include <cmath>
#include <cstring>
#include <algorithm>
#include <unordered_map>

#include "meshsim/decimal.hpp"
#include "meshsim/error.hpp"

namespace meshsim::trace {

std::optional<uint32_t> PyData::get(uint32_t dict, std::string_view key) const {
  const Node& d = nodes[dict];
  if (d.kind != Kind::kDict) return std::nullopt;
  if (auto at = index_.find(dict); at != index_.end()) {
    auto v = at->second.find(std::string(key));
    if (v == at->second.end()) return std::nullopt;
    return v->second;
  }
  for (std::size_t k = d.items.size(); k >= 2; k -= 2) {
    const Node& key_node = nodes[d.items[k - 2]];
    if (key_node.kind == Kind::kStr && key_node.s == key) return d.items[k - 1];
  }
  return std::nullopt;
}

void PyData::index_dicts() {
  index_.clear();
  for (uint32_t i = 0; i < nodes.size(); ++i) {
    const Node& d = nodes[i];
    if (d.kind != Kind::kDict || d.items.size() <= kIndexedItems) continue;
    auto& keys = index_[i];
    for (std::size_t k = 0; k + 1 < d.items.size(); k += 2) {
      const Node& key = nodes[d.items[k]];
      if (key.kind == Kind::kStr) keys.insert_or_assign(key.s, d.items[k + 1]);
    }
  }
}

const char* kind_name(PyData::Kind k) {
  switch (k) {
    case PyData::Kind::kNone: return "None";
    case PyData::Kind::kBool: return "bool";
    case PyData::Kind::kInt: return "int";
    case PyData::Kind::kFloat: return "float";
    case PyData::Kind::kStr: return "str";
    case PyData::Kind::kList: return "list";
    case PyData::Kind::kTuple: return "tuple";
    case PyData::Kind::kDict: return "dict";
  }
  return "?";
}

namespace {

// The opcodes that build objects from code or hold bytes, named in refusals.
const char* refused_name(unsigned char op) {
  switch (op) {
    case 'c': return "GLOBAL";
    case 0x93: return "STACK_GLOBAL";
    case 'R': return "REDUCE";
    case 'b': return "BUILD";
    case 'i': return "INST";
    case 'o': return "OBJ";
    case 0x81: return "NEWOBJ";
    case 0x92: return "NEWOBJ_EX";
    case 'P': return "PERSID";
    case 'Q': return "BINPERSID";
    case 0x82: case 0x83: case 0x84: return "EXT";
    case 'S': case 'T': case 'U': return "STRING (Python 2 bytes)";
    case 'B': case 'C': case 0x8e: return "BINBYTES";
    case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    default: return nullptr;
  }
}

class Machine {
 public:
  Machine(std::string_view in, const std::string& what, const PickleLimits& limits, PickleTape& tape)
      : in_(in), what_(what), limits_(limits), t_(tape) {}

  void run() {
    t_.clear();
    t_.set_input(in_);
    while (true) {
      if (pos_ >= in_.size()) fail(pos_, "the pickle ends before its STOP opcode");
      const std::size_t at = pos_;
      const unsigned char op = static_cast<unsigned char>(in_[pos_++]);
      if (step(op, at)) break;
    }
    if (!marks_.empty()) fail(pos_ - 1, "STOP with an open MARK");
    if (stack_.size() != 1) fail(pos_ - 1, "STOP with " + std::to_string(stack_.size()) + " values on the stack, not 1");
    t_.set_root(stack_.back());
  }

 private:
  using Node = PickleTape::Node;

  [[noreturn, gnu::cold, gnu::noinline]] void fail(std::size_t at, const std::string& why) const {
    throw ParseError(what_ + ": offset " + std::to_string(at) + ": " + why);
  }

  [[gnu::always_inline]] std::string_view take(std::size_t n, std::size_t at) {
    if (n > in_.size() - pos_) {
      fail(at, "the pickle ends inside an opcode's argument (" + std::to_string(n) + " bytes wanted, " +
                   std::to_string(in_.size() - pos_) + " left)");
    }
    std::string_view s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  [[gnu::always_inline]] uint64_t le(std::size_t n, std::size_t at) {
    if (n > in_.size() - pos_) take(n, at);  // fails, naming the shortfall
    const auto* p = reinterpret_cast<const unsigned char*>(in_.data() + pos_);
    uint64_t v = 0;
    for (std::size_t k = 0; k < n; ++k) v |= uint64_t(p[k]) << (8 * k);
    pos_ += n;
    return v;
  }
  std::string_view line(std::size_t at) {
    const std::size_t end = in_.find('\n', pos_);
    if (end == std::string_view::npos) fail(at, "the pickle ends inside a text argument (no newline)");
    std::string_view s = in_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }

  // The refusals, out of the hot paths' way.
  [[noreturn, gnu::cold, gnu::noinline]] void too_many_nodes(std::size_t at) const {
    throw ResourceExhausted(what_ + ": offset " + std::to_string(at) + ": more than " +
                            std::to_string(limits_.max_nodes) + " objects");
  }
  [[noreturn, gnu::cold, gnu::noinline]] void too_deep(std::size_t at) const {
    throw ResourceExhausted(what_ + ": offset " + std::to_string(at) + ": the stack is over " +
                            std::to_string(limits_.max_stack) + " values");
  }
  [[gnu::always_inline]] void room(std::size_t at) {
    if (t_.nodes() >= limits_.max_nodes) [[unlikely]] too_many_nodes(at);
  }
  [[gnu::always_inline]] void push(uint32_t v, std::size_t at) {
    if (stack_.size() >= limits_.max_stack) [[unlikely]] too_deep(at);
    *stack_.grow_by(1) = v;
  }
  [[gnu::always_inline]] bool top_is_value() const { return !stack_.empty() && (marks_.empty() || marks_.back() != stack_.size()); }
  [[gnu::always_inline]] uint32_t pop(std::size_t at) {
    if (!top_is_value()) fail(at, "the stack is empty");
    const uint32_t v = stack_.back();
    stack_.pop_back();
    return v;
  }
  [[gnu::always_inline]] uint32_t top(std::size_t at) const {
    if (!top_is_value()) fail(at, "the stack is empty");
    return stack_.back();
  }
  // pop_mark: the values above the topmost MARK start at the index returned; the MARK goes (the
  // caller takes them from stack_ and then cuts the stack there).
  [[gnu::always_inline]] std::size_t pop_mark(std::size_t at) {
    if (marks_.empty()) fail(at, "no MARK on the stack");
    const std::size_t m = marks_.back();
    marks_.pop_back();
    return m;
  }
  [[gnu::always_inline]] void push_scalar(PyData::Kind k, std::size_t at, int64_t i = 0) {
    room(at);
    Node n;
    n.kind = k;
    n.i = i;
    push(t_.add(n), at);
  }
  void push_float(double f, std::size_t at) {
    room(at);
    Node n;
    n.kind = PyData::Kind::kFloat;
    n.f = f;
    push(t_.add(n), at);
  }
  // push_input_str: a str whose UTF-8 bytes are the `len` bytes of the input from `from`.
  [[gnu::always_inline]] void push_input_str(std::size_t from, std::size_t len, std::size_t at) {
    room(at);
    if (len > UINT32_MAX) fail(at, "a str of " + std::to_string(len) + " bytes is over 4 GiB");
    Node n;
    n.kind = PyData::Kind::kStr;
    n.n = static_cast<uint32_t>(len);
    n.at = from;
    push(t_.add(n), at);
  }
  [[gnu::always_inline]] void push_container(PyData::Kind k, std::size_t from, std::size_t at) {
    room(at);
    const std::size_t count = stack_.size() - from;
    const uint32_t v = t_.add_container(k, stack_.data() + from, count);
    stack_.resize_uninit(from);
    push(v, at);
  }
  [[gnu::always_inline]] uint32_t container(uint32_t v, PyData::Kind k, const char* opname, std::size_t at) const {
    const PyData::Kind has = t_.node(v).kind;
    if (has != k) fail(at, std::string(opname) + " onto a " + kind_name(has) + ", not a " + kind_name(k));
    return v;
  }
  [[gnu::always_inline]] void append_items(uint32_t c, const uint32_t* items, std::size_t count, std::size_t at) {
    if (count > UINT32_MAX - t_.size(c)) {
      throw ResourceExhausted(what_ + ": offset " + std::to_string(at) + ": a container of over 2^32 items");
    }
    t_.append(c, items, count);
  }
  // append: the values from `from` to the stack's top onto container c; they leave the stack.
  [[gnu::always_inline]] void append(uint32_t c, std::size_t from, std::size_t at) {
    append_items(c, stack_.data() + from, stack_.size() - from, at);
    stack_.resize_uninit(from);
  }
  // The memo: slots as Python numbers them (BINPUT/MEMOIZE count up from 0) in a vector; a slot
  // far past the others (LONG_BINPUT can name any of 2^32) in a map, so no slot costs memory
  // beyond the slots stored.
  static constexpr uint32_t kUnset = UINT32_MAX;
  [[gnu::always_inline]] void put(uint64_t slot, std::size_t at) {
    const uint32_t v = top(at);
    if (slot == memo_.size() && stored_ < limits_.max_memo) [[likely]] {  // the next slot, as picklers write them
      *memo_.grow_by(1) = v;
      ++stored_;
      return;
    }
    put_elsewhere(slot, v, at);
  }
  // put_elsewhere: a slot out of order, refilled, far away or past the bound.
  [[gnu::noinline, gnu::cold]] void put_elsewhere(uint64_t slot, uint32_t v, std::size_t at) {
    uint32_t* cell = nullptr;
    if (slot < memo_.size()) {
      cell = &memo_[slot];
    } else if (slot <= 2 * memo_.size() + 4096) {
      memo_.resize(slot + 1, kUnset);
      cell = &memo_[slot];
    } else if (auto it = far_.find(slot); it != far_.end()) {
      it->second = v;
      return;
    }
    if (cell && *cell != kUnset) {
      *cell = v;
      return;
    }
    if (stored_ >= limits_.max_memo) {
      throw ResourceExhausted(what_ + ": offset " + std::to_string(at) + ": more than " +
                              std::to_string(limits_.max_memo) + " memo slots");
    }
    ++stored_;
    if (cell) {
      *cell = v;
    } else {
      far_.emplace(slot, v);
    }
  }
  [[gnu::always_inline]] void get(uint64_t slot, std::size_t at) {
    if (slot < memo_.size() && memo_[slot] != kUnset) {
      push(memo_[slot], at);
      return;
    }
    auto it = far_.find(slot);
    if (it == far_.end()) fail(at, "memo slot " + std::to_string(slot) + " was never stored");
    push(it->second, at);
  }
  int64_t decimal(std::string_view s, std::size_t at, const char* opname) {
    if (!s.empty() && s.back() == 'L') s.remove_suffix(1);  // protocol 0's LONG ends "L"
    std::string_view digits = s;
    if (!digits.empty() && (digits[0] == '-' || digits[0] == '+')) digits.remove_prefix(1);
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string_view::npos) {
      fail(at, std::string(opname) + " argument '" + std::string(s.substr(0, 40)) + "' is not a decimal integer");
    }
    if (s[0] == '+') s.remove_prefix(1);
    bool overflow = false;
    const std::optional<int64_t> v = read_decimal(s, &overflow);
    if (overflow) {
      throw OverflowError(what_ + ": offset " + std::to_string(at) + ": integer " + std::string(s.substr(0, 40)) +
                          " does not fit in int64");
    }
    if (!v) fail(at, std::string(opname) + " argument is not an integer");
    return *v;
  }
  // long_bytes: a little-endian two's-complement integer of n bytes (LONG1, LONG4).
  int64_t long_bytes(std::size_t n, std::size_t at) {
    const std::string_view b = take(n, at);
    if (n == 0) return 0;
    const bool negative = (static_cast<unsigned char>(b[n - 1]) & 0x80) != 0;
    // Bytes past the eighth must be pure sign extension, and the eighth's top bit must agree.
    for (std::size_t k = 8; k < n; ++k) {
      if (static_cast<unsigned char>(b[k]) != (negative ? 0xff : 0x00)) {
        throw OverflowError(what_ + ": offset " + std::to_string(at) + ": a " + std::to_string(n) +
                            "-byte integer does not fit in int64");
      }
    }
    uint64_t v = negative ? ~uint64_t{0} : 0;
    for (std::size_t k = 0; k < std::min<std::size_t>(n, 8); ++k) {
      v &= ~(uint64_t{0xff} << (8 * k));
      v |= uint64_t(static_cast<unsigned char>(b[k])) << (8 * k);
    }
    if (n > 8 && ((v >> 63) != 0) != negative) {
      throw OverflowError(what_ + ": offset " + std::to_string(at) + ": a " + std::to_string(n) +
                          "-byte integer does not fit in int64");
    }
    int64_t out;
    std::memcpy(&out, &v, sizeof out);
    return out;
  }
  // raw_unicode_escape decodes protocol 0's UNICODE argument: Latin-1 bytes with \uXXXX and
  // \UXXXXXXXX escapes, as UTF-8.
  std::string raw_unicode_escape(std::string_view s, std::size_t at) {
    std::string out;
    auto utf8 = [&](uint32_t c) {
      if (c > 0x10FFFF) fail(at, "UNICODE escape past U+10FFFF");
      if (c < 0x80) {
        out += static_cast<char>(c);
      } else if (c < 0x800) {
        out += static_cast<char>(0xC0 | (c >> 6));
        out += static_cast<char>(0x80 | (c & 0x3F));
      } else if (c < 0x10000) {
        out += static_cast<char>(0xE0 | (c >> 12));
        out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (c & 0x3F));
      } else {
        out += static_cast<char>(0xF0 | (c >> 18));
        out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (c & 0x3F));
      }
    };
    for (std::size_t k = 0; k < s.size(); ++k) {
      if (s[k] == '\\' && k + 1 < s.size() && (s[k + 1] == 'u' || s[k + 1] == 'U')) {
        const std::size_t n = s[k + 1] == 'u' ? 4 : 8;
        if (k + 2 + n > s.size()) fail(at, "a truncated UNICODE escape");
        uint32_t c = 0;
        auto [p, ec] = std::from_chars(s.data() + k + 2, s.data() + k + 2 + n, c, 16);
        if (ec != std::errc() || p != s.data() + k + 2 + n) fail(at, "a malformed UNICODE escape");
        utf8(c);
        k += 1 + n;
      } else {
        utf8(static_cast<unsigned char>(s[k]));
      }
    }
    return out;
  }

  // step runs one opcode; true at STOP.
  [[gnu::always_inline]] bool step(unsigned char op, std::size_t at) {
    using K = PyData::Kind;
    switch (op) {
      case 0x80: {  // PROTO
        const uint64_t v = le(1, at);
        if (v > 5) fail(at, "protocol " + std::to_string(v) + " is newer than 5");
        return false;
      }
      case 0x95: le(8, at); return false;  // FRAME: a hint only
      case '.': return true;               // STOP
      case '(':  // MARK
        if (marks_.size() >= limits_.max_stack) {
          throw ResourceExhausted(what_ + ": offset " + std::to_string(at) + ": more than " +
                                  std::to_string(limits_.max_stack) + " open MARKs");
        }
        marks_.push_back(stack_.size());
        return false;
      case '0': pop(at); return false;                          // POP
      case '1': pop_mark(at); return false;                     // POP_MARK
      case '2': push(top(at), at); return false;                // DUP
      case 'N': push_scalar(K::kNone, at); return false;
      case 0x88: push_scalar(K::kBool, at, 1); return false;  // NEWTRUE
      case 0x89: push_scalar(K::kBool, at, 0); return false;  // NEWFALSE
      case 'I': {  // INT (protocol 0): "01"/"00" are True/False
        const std::string_view s = line(at);
        if (s == "01" || s == "00") {
          push_scalar(K::kBool, at, s == "01");
        } else {
          push_scalar(K::kInt, at, decimal(s, at, "INT"));
        }
        return false;
      }
      case 'L': push_scalar(K::kInt, at, decimal(line(at), at, "LONG")); return false;
      case 'J': {  // BININT: 4 bytes signed
        const auto v = static_cast<uint32_t>(le(4, at));
        int32_t s;
        std::memcpy(&s, &v, sizeof s);
        push_scalar(K::kInt, at, s);
        return false;
      }
      case 'K': push_scalar(K::kInt, at, static_cast<int64_t>(le(1, at))); return false;  // BININT1
      case 'M': push_scalar(K::kInt, at, static_cast<int64_t>(le(2, at))); return false;  // BININT2
      case 0x8a: {  // LONG1
        const std::size_t n = le(1, at);
        push_scalar(K::kInt, at, long_bytes(n, at));
        return false;
      }
      case 0x8b: {  // LONG4
        const uint64_t n = le(4, at);
        if (n > 64) {
          throw OverflowError(what_ + ": offset " + std::to_string(at) + ": a " + std::to_string(n) +
                              "-byte integer does not fit in int64");
        }
        push_scalar(K::kInt, at, long_bytes(n, at));
        return false;
      }
      case 'F': {  // FLOAT (text)
        const std::string s(line(at));
        char* end = nullptr;
        const double d = std::strtod(s.c_str(), &end);
        if (s.empty() || end != s.c_str() + s.size()) fail(at, "FLOAT argument '" + s.substr(0, 40) + "' is not a number");
        push_float(d, at);
        return false;
      }
      case 'G': {  // BINFLOAT: 8 bytes big-endian
        const std::string_view b = take(8, at);
        uint64_t v = 0;
        for (int k = 0; k < 8; ++k) v = (v << 8) | static_cast<unsigned char>(b[k]);
        double d;
        std::memcpy(&d, &v, sizeof v);
        push_float(d, at);
        return false;
      }
      case 'X': {  // BINUNICODE
        const std::size_t n = le(4, at);
        const std::size_t from = pos_;
        take(n, at);
        push_input_str(from, n, at);
        return false;
      }
      case 0x8c: {  // SHORT_BINUNICODE
        const std::size_t n = le(1, at);
        const std::size_t from = pos_;
        take(n, at);
        push_input_str(from, n, at);
        return false;
      }
      case 0x8d: {  // BINUNICODE8
        const uint64_t n = le(8, at);
        if (n > in_.size()) fail(at, "a str of " + std::to_string(n) + " bytes is longer than the input");
        const std::size_t from = pos_;
        take(static_cast<std::size_t>(n), at);
        push_input_str(from, static_cast<std::size_t>(n), at);
        return false;
      }
      case 'V': {  // UNICODE (protocol 0): decoded into the tape's own buffer
        const std::string s = raw_unicode_escape(line(at), at);
        room(at);
        push(t_.add_own_str(s), at);
        return false;
      }
      case ']': push_container(K::kList, stack_.size(), at); return false;   // EMPTY_LIST
      case 'l': push_container(K::kList, pop_mark(at), at); return false;    // LIST
      case ')': push_container(K::kTuple, stack_.size(), at); return false;  // EMPTY_TUPLE
      case 't': push_container(K::kTuple, pop_mark(at), at); return false;   // TUPLE
      case 0x85: case 0x86: case 0x87: {  // TUPLE1..3
        const std::size_t n = op - 0x84u;
        if (stack_.size() - (marks_.empty() ? 0 : marks_.back()) < n) fail(at, "the stack is empty");
        push_container(K::kTuple, stack_.size() - n, at);
        return false;
      }
      case '}': push_container(K::kDict, stack_.size(), at); return false;  // EMPTY_DICT
      case 'd': {  // DICT
        const std::size_t from = pop_mark(at);
        if ((stack_.size() - from) % 2) fail(at, "DICT with an odd number of items");
        push_container(K::kDict, from, at);
        return false;
      }
      case 'a': {  // APPEND
        const uint32_t v = pop(at);
        append_items(container(top(at), K::kList, "APPEND", at), &v, 1, at);
        return false;
      }
      case 'e': {  // APPENDS
        const std::size_t from = pop_mark(at);
        if (from == 0 || (!marks_.empty() && marks_.back() >= from)) fail(at, "the stack is empty");
        append(container(stack_[from - 1], K::kList, "APPENDS", at), from, at);
        return false;
      }
      case 's': {  // SETITEM
        uint32_t kv[2];
        kv[1] = pop(at);
        kv[0] = pop(at);
        append_items(container(top(at), K::kDict, "SETITEM", at), kv, 2, at);
        return false;
      }
      case 'u': {  // SETITEMS
        const std::size_t from = pop_mark(at);
        if ((stack_.size() - from) % 2) fail(at, "SETITEMS with an odd number of items");
        if (from == 0 || (!marks_.empty() && marks_.back() >= from)) fail(at, "the stack is empty");
        append(container(stack_[from - 1], K::kDict, "SETITEMS", at), from, at);
        return false;
      }
      case 'p': {  // PUT (text)
        const int64_t slot = decimal(line(at), at, "PUT");
        if (slot < 0) fail(at, "PUT to a negative memo slot");
        put(static_cast<uint64_t>(slot), at);
        return false;
      }
      case 'q': put(le(1, at), at); return false;  // BINPUT
      case 'r': put(le(4, at), at); return false;  // LONG_BINPUT
      case 0x94: put(stored_, at); return false;  // MEMOIZE: the slot is the memo's length
      case 'g': {  // GET (text)
        const int64_t slot = decimal(line(at), at, "GET");
        if (slot < 0) fail(at, "GET of a negative memo slot");
        get(static_cast<uint64_t>(slot), at);
        return false;
      }
      case 'h': get(le(1, at), at); return false;  // BINGET
      case 'j': get(le(4, at), at); return false;  // LONG_BINGET
      default: break;
    }
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", op);
    if (const char* name = refused_name(op)) {
      fail(at, std::string("opcode ") + hex + " (" + name +
                   ") is refused: only dicts, lists, tuples, str, int, float, bool and None are read, nothing is "
                   "imported or called");
    }
    fail(at, std::string("opcode ") + hex + " is not a pickle opcode");
  }

  std::string_view in_;
  const std::string& what_;
  PickleLimits limits_;
  PickleTape& t_;
  std::size_t pos_ = 0;
  ::meshsim::detail::PodVector<uint32_t> stack_;
  std::vector<std::size_t> marks_;
  ::meshsim::detail::PodVector<uint32_t> memo_;           // slot -> node, kUnset where none
  std::unordered_map<uint64_t, uint32_t> far_;  // the slots past memo_
  std::size_t stored_ = 0;                      // slots stored (len(memo))
};

}  // namespace

void read_pickle_tape(std::string_view bytes, const std::string& what, PickleTape& tape, const PickleLimits& limits) {
  Machine(bytes, what, limits, tape).run();
}

PyData read_pickle(std::string_view bytes, const std::string& what, const PickleLimits& limits) {
  PickleTape t;
  read_pickle_tape(bytes, what, t, limits);
  // The owning form, node for node (shared objects stay one node).
  PyData d;
  d.nodes.resize(t.nodes());
  for (uint32_t v = 0; v < t.nodes(); ++v) {
    const PickleTape::Node& n = t.node(v);
    PyData::Node& o = d.nodes[v];
    o.kind = n.kind;
    switch (n.kind) {
      case PyData::Kind::kBool:
      case PyData::Kind::kInt: o.i = n.i; break;
      case PyData::Kind::kFloat: o.f = n.f; break;
      case PyData::Kind::kStr: o.s = std::string(t.str(v)); break;
      case PyData::Kind::kList:
      case PyData::Kind::kTuple:
      case PyData::Kind::kDict: o.items.assign(t.items(v), t.items(v) + n.n); break;
      case PyData::Kind::kNone: break;
    }
  }
  d.root = t.root();
  d.index_dicts();
  return d;
}

void PickleTape::clear() {
  nodes_.clear();
  pool_.clear();
  text_.clear();
  input_ = {};
  root_ = 0;
}

void PickleTape::make_room(Node& c, std::size_t count) {
  // The items move to the pool's end with room to grow: twice what they need, so appending one
  // at a time costs amortized O(1) and the pool holds at most about three times the items. A
  // container at the pool's end grows in place; a first fill takes just what it needs.
  const std::size_t want = c.n == 0 ? count : 2 * (c.n + count);
  if (c.at + c.cap == pool_.size()) {
    pool_.resize_uninit(c.at + want);
  } else {
    const std::size_t to = pool_.size();
    pool_.resize_uninit(to + want);
    if (c.n) std::memcpy(pool_.data() + to, pool_.data() + c.at, sizeof(uint32_t) * c.n);
    c.at = to;
  }
  c.cap = static_cast<uint32_t>(std::min<std::size_t>(want, UINT32_MAX));
}

uint32_t PickleTape::add_own_str(std::string_view s) {
  Node n;
  n.kind = Kind::kStr;
  n.own = true;
  n.n = static_cast<uint32_t>(s.size());
  n.at = text_.size();
  text_.append(s);
  return add(n);
}

}  // namespace meshsim::trace
