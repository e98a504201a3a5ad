#include "meshsim/pickle.hpp"

#include <charconv>
#include <cmath>
#include <cstring>
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
  Machine(std::string_view in, const std::string& what, const PickleLimits& limits)
      : in_(in), what_(what), limits_(limits) {}

  PyData run() {
    while (true) {
      if (pos_ >= in_.size()) fail(pos_, "the pickle ends before its STOP opcode");
      const std::size_t at = pos_;
      const unsigned char op = static_cast<unsigned char>(in_[pos_++]);
      if (step(op, at)) break;
    }
    if (!marks_.empty()) fail(pos_ - 1, "STOP with an open MARK");
    if (stack_.size() != 1) fail(pos_ - 1, "STOP with " + std::to_string(stack_.size()) + " values on the stack, not 1");
    data_.root = static_cast<uint32_t>(stack_.back());
    data_.index_dicts();
    return std::move(data_);
  }

 private:
  [[noreturn]] void fail(std::size_t at, const std::string& why) const {
    throw ParseError(what_ + ": offset " + std::to_string(at) + ": " + why);
  }

  std::string_view take(std::size_t n, std::size_t at) {
    if (n > in_.size() - pos_) {
      fail(at, "the pickle ends inside an opcode's argument (" + std::to_string(n) + " bytes wanted, " +
                   std::to_string(in_.size() - pos_) + " left)");
    }
    std::string_view s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  uint64_t le(std::size_t n, std::size_t at) {
    const std::string_view s = take(n, at);
    uint64_t v = 0;
    for (std::size_t k = 0; k < n; ++k) v |= uint64_t(static_cast<unsigned char>(s[k])) << (8 * k);
    return v;
  }
  std::string_view line(std::size_t at) {
    const std::size_t end = in_.find('\n', pos_);
    if (end == std::string_view::npos) fail(at, "the pickle ends inside a text argument (no newline)");
    std::string_view s = in_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }

  uint32_t make(PyData::Node n, std::size_t at) {
    if (data_.nodes.size() >= limits_.max_nodes) {
      throw ResourceExhausted(what_ + ": offset " + std::to_string(at) + ": more than " +
                              std::to_string(limits_.max_nodes) + " objects");
    }
    data_.nodes.push_back(std::move(n));
    return static_cast<uint32_t>(data_.nodes.size() - 1);
  }
  void push(uint32_t v, std::size_t at) {
    if (stack_.size() >= limits_.max_stack) {
      throw ResourceExhausted(what_ + ": offset " + std::to_string(at) + ": the stack is over " +
                              std::to_string(limits_.max_stack) + " values");
    }
    stack_.push_back(v);
  }
  uint32_t pop(std::size_t at) {
    if (stack_.empty() || (!marks_.empty() && marks_.back() == stack_.size())) fail(at, "the stack is empty");
    const uint32_t v = stack_.back();
    stack_.pop_back();
    return v;
  }
  uint32_t top(std::size_t at) const {
    if (stack_.empty() || (!marks_.empty() && marks_.back() == stack_.size())) fail(at, "the stack is empty");
    return stack_.back();
  }
  // pop_mark: the values above the topmost MARK, oldest first; the MARK goes.
  std::vector<uint32_t> pop_mark(std::size_t at) {
    if (marks_.empty()) fail(at, "no MARK on the stack");
    const std::size_t m = marks_.back();
    marks_.pop_back();
    std::vector<uint32_t> v(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return v;
  }
  void push_new(PyData::Kind k, std::size_t at, int64_t i = 0) {
    PyData::Node n;
    n.kind = k;
    n.i = i;
    push(make(std::move(n), at), at);
  }
  void push_str(std::string s, std::size_t at) {
    PyData::Node n;
    n.kind = PyData::Kind::kStr;
    n.s = std::move(s);
    push(make(std::move(n), at), at);
  }
  void push_container(PyData::Kind k, std::vector<uint32_t> items, std::size_t at) {
    PyData::Node n;
    n.kind = k;
    n.items = std::move(items);
    push(make(std::move(n), at), at);
  }
  PyData::Node& container(uint32_t v, PyData::Kind k, const char* opname, std::size_t at) {
    PyData::Node& n = data_.nodes[v];
    if (n.kind != k) {
      fail(at, std::string(opname) + " onto a " + kind_name(n.kind) + ", not a " + kind_name(k));
    }
    return n;
  }
  void put(uint64_t slot, std::size_t at) {
    const uint32_t v = top(at);
    if (memo_.size() >= limits_.max_memo && !memo_.count(slot)) {
      throw ResourceExhausted(what_ + ": offset " + std::to_string(at) + ": more than " +
                              std::to_string(limits_.max_memo) + " memo slots");
    }
    memo_[slot] = v;
  }
  void get(uint64_t slot, std::size_t at) {
    auto it = memo_.find(slot);
    if (it == memo_.end()) fail(at, "memo slot " + std::to_string(slot) + " was never stored");
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
  bool step(unsigned char op, std::size_t at) {
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
      case 'N': push_new(K::kNone, at); return false;
      case 0x88: push_new(K::kBool, at, 1); return false;  // NEWTRUE
      case 0x89: push_new(K::kBool, at, 0); return false;  // NEWFALSE
      case 'I': {  // INT (protocol 0): "01"/"00" are True/False
        const std::string_view s = line(at);
        if (s == "01" || s == "00") {
          push_new(K::kBool, at, s == "01");
        } else {
          push_new(K::kInt, at, decimal(s, at, "INT"));
        }
        return false;
      }
      case 'L': push_new(K::kInt, at, decimal(line(at), at, "LONG")); return false;
      case 'J': {  // BININT: 4 bytes signed
        const auto v = static_cast<uint32_t>(le(4, at));
        int32_t s;
        std::memcpy(&s, &v, sizeof s);
        push_new(K::kInt, at, s);
        return false;
      }
      case 'K': push_new(K::kInt, at, static_cast<int64_t>(le(1, at))); return false;  // BININT1
      case 'M': push_new(K::kInt, at, static_cast<int64_t>(le(2, at))); return false;  // BININT2
      case 0x8a: {  // LONG1
        const std::size_t n = le(1, at);
        push_new(K::kInt, at, long_bytes(n, at));
        return false;
      }
      case 0x8b: {  // LONG4
        const uint64_t n = le(4, at);
        if (n > 64) {
          throw OverflowError(what_ + ": offset " + std::to_string(at) + ": a " + std::to_string(n) +
                              "-byte integer does not fit in int64");
        }
        push_new(K::kInt, at, long_bytes(n, at));
        return false;
      }
      case 'F': {  // FLOAT (text)
        const std::string s(line(at));
        char* end = nullptr;
        const double d = std::strtod(s.c_str(), &end);
        if (s.empty() || end != s.c_str() + s.size()) fail(at, "FLOAT argument '" + s.substr(0, 40) + "' is not a number");
        PyData::Node n;
        n.kind = K::kFloat;
        n.f = d;
        push(make(std::move(n), at), at);
        return false;
      }
      case 'G': {  // BINFLOAT: 8 bytes big-endian
        const std::string_view b = take(8, at);
        uint64_t v = 0;
        for (int k = 0; k < 8; ++k) v = (v << 8) | static_cast<unsigned char>(b[k]);
        PyData::Node n;
        n.kind = K::kFloat;
        std::memcpy(&n.f, &v, sizeof v);
        push(make(std::move(n), at), at);
        return false;
      }
      case 'X': { const std::size_t n = le(4, at); push_str(std::string(take(n, at)), at); return false; }
      case 0x8c: { const std::size_t n = le(1, at); push_str(std::string(take(n, at)), at); return false; }
      case 0x8d: {
        const uint64_t n = le(8, at);
        if (n > in_.size()) fail(at, "a str of " + std::to_string(n) + " bytes is longer than the input");
        push_str(std::string(take(static_cast<std::size_t>(n), at)), at);
        return false;
      }
      case 'V': push_str(raw_unicode_escape(line(at), at), at); return false;
      case ']': push_container(K::kList, {}, at); return false;   // EMPTY_LIST
      case 'l': push_container(K::kList, pop_mark(at), at); return false;  // LIST
      case ')': push_container(K::kTuple, {}, at); return false;  // EMPTY_TUPLE
      case 't': push_container(K::kTuple, pop_mark(at), at); return false;  // TUPLE
      case 0x85: case 0x86: case 0x87: {  // TUPLE1..3
        const std::size_t n = op - 0x84u;
        std::vector<uint32_t> v(n);
        for (std::size_t k = n; k-- > 0;) v[k] = pop(at);
        push_container(K::kTuple, std::move(v), at);
        return false;
      }
      case '}': push_container(K::kDict, {}, at); return false;  // EMPTY_DICT
      case 'd': {  // DICT
        std::vector<uint32_t> v = pop_mark(at);
        if (v.size() % 2) fail(at, "DICT with an odd number of items");
        push_container(K::kDict, std::move(v), at);
        return false;
      }
      case 'a': {  // APPEND
        const uint32_t v = pop(at);
        container(top(at), K::kList, "APPEND", at).items.push_back(v);
        return false;
      }
      case 'e': {  // APPENDS
        std::vector<uint32_t> v = pop_mark(at);
        auto& items = container(top(at), K::kList, "APPENDS", at).items;
        items.insert(items.end(), v.begin(), v.end());
        return false;
      }
      case 's': {  // SETITEM
        const uint32_t value = pop(at);
        const uint32_t key = pop(at);
        auto& items = container(top(at), K::kDict, "SETITEM", at).items;
        items.push_back(key);
        items.push_back(value);
        return false;
      }
      case 'u': {  // SETITEMS
        std::vector<uint32_t> v = pop_mark(at);
        if (v.size() % 2) fail(at, "SETITEMS with an odd number of items");
        auto& items = container(top(at), K::kDict, "SETITEMS", at).items;
        items.insert(items.end(), v.begin(), v.end());
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
      case 0x94: put(memo_.size(), at); return false;  // MEMOIZE
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
  std::size_t pos_ = 0;
  PyData data_;
  std::vector<uint32_t> stack_;
  std::vector<std::size_t> marks_;
  std::unordered_map<uint64_t, uint32_t> memo_;
};

}  // namespace

PyData read_pickle(std::string_view bytes, const std::string& what, const PickleLimits& limits) {
  return Machine(bytes, what, limits).run();
}

}  // namespace meshsim::trace
