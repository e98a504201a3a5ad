// pickle.hpp — a bounded reader of Python pickles that hold plain data only: dicts, lists,
// tuples, str, int, float, bool and None, which is what PyTorch's Flight Recorder writes (its
// C++ pickler with tagging off) and what Python's `pickle` writes for the same values at any
// protocol 0 to 5. It interprets the pickle machine's data opcodes and nothing else: an opcode
// that would import, call or build an object (GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, EXT,
// PERSID), bytes, sets and out-of-band buffers are refused with the offset and the opcode named.
// Nothing in the input is ever executed.
//
//   PyData d = read_pickle(bytes, "dump 'comm_traces/rank_3'");
//   const PyData::Node& root = d.node(d.root);        // a dict, say
//   if (auto v = d.get(d.root, "version")) ...        // the value under a str key
//
// Objects live in one arena and refer to each other by index, so shared and even cyclic
// structures (which the memo opcodes can build) are harmless to hold and to free; readers walk
// them along a known schema, never recursively over everything.
//
// Bounds: Limits (nodes, stack, memo) keep memory proportional to the input; integers must fit
// in int64 (an OverflowError names the offset). Errors: ParseError "<what>: offset N: ..." for a
// truncated or malformed pickle and for refused opcodes; ResourceExhausted for a limit.
// Thread safety: plain values.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>


namespace meshsim::detail {

// PodVector: a growable array of trivially copyable T on the heap alone, for the pickle
// machine's stacks and the tape (which spill past any inline buffer at once): its data pointer
// needs no test per access (InlineVector's inline-or-heap choice cost 10% of a dump's decode),
// its appends are a few inline instructions, growth (doubling) is out of line.
template <typename T>
class PodVector {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>);

 public:
  PodVector() = default;
  PodVector(const PodVector&) = delete;
  PodVector& operator=(const PodVector&) = delete;
  ~PodVector() { ::operator delete(p_); }

  T* data() { return p_; }
  const T* data() const { return p_; }
  std::size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  T& operator[](std::size_t i) { return p_[i]; }
  const T& operator[](std::size_t i) const { return p_[i]; }
  T& back() { return p_[n_ - 1]; }
  const T& back() const { return p_[n_ - 1]; }
  void clear() { n_ = 0; }
  void pop_back() { --n_; }
  // grow_by appends n uninitialised elements and returns the first.
  [[gnu::always_inline]] T* grow_by(std::size_t n) {
    if (cap_ - n_ < n) [[unlikely]] reserve_more(n);
    T* p = p_ + n_;
    n_ += n;
    return p;
  }
  void resize_uninit(std::size_t n) {
    if (n > n_) grow_by(n - n_);
    n_ = n;
  }
  void resize(std::size_t n, T v) {
    const std::size_t old = n_;
    resize_uninit(n);
    for (std::size_t i = old; i < n; ++i) p_[i] = v;
  }

 private:
  [[gnu::noinline]] void reserve_more(std::size_t n) {
    std::size_t cap = std::max<std::size_t>(cap_ * 2, 64);
    if (cap < n_ + n) cap = n_ + n;
    T* p = static_cast<T*>(::operator new(cap * sizeof(T)));
    if (n_) std::memcpy(static_cast<void*>(p), p_, n_ * sizeof(T));
    ::operator delete(p_);
    p_ = p;
    cap_ = cap;
  }
  T* p_ = nullptr;
  std::size_t n_ = 0, cap_ = 0;
};

}  // namespace meshsim::detail

namespace meshsim::trace {

struct PyData {
  enum class Kind : uint8_t { kNone, kBool, kInt, kFloat, kStr, kList, kTuple, kDict };
  struct Node {
    Kind kind = Kind::kNone;
    int64_t i = 0;             // kBool (0/1) and kInt
    double f = 0;              // kFloat
    std::string s;             // kStr (UTF-8 as pickled)
    std::vector<uint32_t> items;  // kList/kTuple: elements; kDict: key, value, key, value, ...
  };
  std::vector<Node> nodes;
  uint32_t root = 0;

  const Node& node(uint32_t i) const { return nodes[i]; }
  // get: the value under the str key `key` of dict `dict` (the last one, as Python keeps), or
  // nothing when `dict` is not a dict or has no such key. O(items) for a small dict, O(1) for
  // one index_dicts indexed: a dict of 10^6 items that 10^4 records share costs 10^6 once.
  std::optional<uint32_t> get(uint32_t dict, std::string_view key) const;
  // index_dicts: a hash index of the str keys of every dict of more than kIndexedItems items
  // (the last value of a repeated key), in time and memory proportional to those dicts' items.
  void index_dicts();
  static constexpr std::size_t kIndexedItems = 64;  // keys and values

 private:
  std::unordered_map<uint32_t, std::unordered_map<std::string, uint32_t>> index_;
};

const char* kind_name(PyData::Kind k);

struct PickleLimits {
  std::size_t max_nodes = std::size_t{1} << 25;   // objects built
  std::size_t max_stack = std::size_t{1} << 20;   // values and marks on the machine's stack
  std::size_t max_memo = std::size_t{1} << 25;    // memo slots
};

// PickleTape holds the same values compactly, for readers that walk them once (the dumps'
// reader): a node is 24 bytes with no allocation of its own; a str is a view of the input's own
// bytes (the input must outlive the tape) or, for protocol 0's escaped text and JSON strings, of
// the tape's buffer; the items of every list, tuple and dict lie in one pool. A tape is reused
// from input to input (clear keeps its memory), so a reader of many files allocates little.
class PickleTape {
 public:
  using Kind = PyData::Kind;
  struct Node {
    Kind kind = Kind::kNone;
    bool own = false;  // kStr: the bytes are in the tape's buffer, not the input
    uint32_t n = 0;    // kStr: bytes; containers: items (a dict's keys and values)
    uint32_t cap = 0;  // containers: pool slots reserved from `at`
    union {
      int64_t i;    // kBool (0/1), kInt
      double f;     // kFloat
      uint64_t at;  // kStr: offset of its bytes; containers: offset of its items in the pool
    };
    Node() : i(0) {}
  };

  Kind kind(uint32_t v) const { return nodes_[v].kind; }
  const Node& node(uint32_t v) const { return nodes_[v]; }
  std::string_view str(uint32_t v) const {
    const Node& n = nodes_[v];
    return std::string_view((n.own ? text_.data() : input_.data()) + n.at, n.n);
  }
  const uint32_t* items(uint32_t v) const { return pool_.data() + nodes_[v].at; }
  uint32_t size(uint32_t v) const { return nodes_[v].n; }
  uint32_t root() const { return root_; }
  std::size_t nodes() const { return nodes_.size(); }
  void clear();

  // Building (the pickle machine and the JSON reader).
  uint32_t add(const Node& n) {
    *nodes_.grow_by(1) = n;
    return static_cast<uint32_t>(nodes_.size() - 1);
  }
  Node& at(uint32_t v) { return nodes_[v]; }
  // add_container: a new container holding `count` items (inline: one per list, tuple and dict).
  [[gnu::always_inline]] uint32_t add_container(Kind k, const uint32_t* items, std::size_t count) {
    Node n;
    n.kind = k;
    n.n = static_cast<uint32_t>(count);
    n.cap = n.n;
    n.at = pool_.size();
    copy_items(pool_.grow_by(count), items, count);
    return add(n);
  }
  // append: `count` more items onto a container (APPENDS, SETITEMS: inline, the room made out of line).
  [[gnu::always_inline]] void append(uint32_t container, const uint32_t* items, std::size_t count) {
    Node& c = nodes_[container];
    if (c.n + count > c.cap) make_room(c, count);
    copy_items(pool_.data() + c.at + c.n, items, count);
    c.n += static_cast<uint32_t>(count);
  }
  uint32_t add_own_str(std::string_view s);
  void set_input(std::string_view in) { input_ = in; }
  void set_root(uint32_t r) { root_ = r; }
  std::string& text() { return text_; }

 private:
  // make_room: room for `count` more items of c, at the pool's end.
  void make_room(Node& c, std::size_t count);
  // copy_items: a few items, most often (a record's fields, a list of sizes): no library call.
  [[gnu::always_inline]] static void copy_items(uint32_t* to, const uint32_t* from, std::size_t count) {
    for (std::size_t k = 0; k < count; ++k) to[k] = from[k];
  }
  // PodVector: its appends are a few inline instructions (std::vector's push_back was an
  // out-of-line call per value here).
  ::meshsim::detail::PodVector<Node> nodes_;
  ::meshsim::detail::PodVector<uint32_t> pool_;
  std::string text_;
  std::string_view input_;
  uint32_t root_ = 0;
};

// read_pickle runs the pickle in `bytes` (one pickle; bytes after its STOP are ignored, as
// pickle.load does) and returns its value. `what` names the input in errors.
PyData read_pickle(std::string_view bytes, const std::string& what, const PickleLimits& limits = {});
// read_pickle_tape is the same run into `tape` (cleared first): its strs are views of `bytes`.
void read_pickle_tape(std::string_view bytes, const std::string& what, PickleTape& tape, const PickleLimits& limits = {});

}  // namespace meshsim::trace
