// fr_schema.hpp — a Flight Recorder dump as meshsim reads it: one rank's ring buffer of
// collective and point-to-point records and the process groups it lists (c10d's FlightRecorder
// at pytorch/pytorch cb41e3a4; flight_recorder.hpp has the fields' sources).
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace meshsim::trace {

enum class EntryState : uint8_t { kScheduled, kStarted, kCompleted };
const char* state_name(EntryState s);

// SharedList: an immutable list shared by every holder, read as a const std::vector<V>. The
// reader keeps one copy of what many records or dumps hold alike: a job's default group's ranks
// in every dump (65,536 dumps of a 65,536-rank job would otherwise hold 2^32 ranks, 32 GiB), a
// record's sizes and dtypes (a step's records repeat a few shapes; one allocation each was a
// sixth of reading a dump).
template <class V>
class SharedList {
 public:
  using value_type = V;
  using const_iterator = typename std::vector<V>::const_iterator;
  using iterator = const_iterator;

  SharedList() = default;
  SharedList(std::vector<V> items)  // NOLINT(google-explicit-constructor): a list reads as one
      : p_(std::make_shared<const std::vector<V>>(std::move(items))) {}
  SharedList(std::initializer_list<V> items) : p_(std::make_shared<const std::vector<V>>(items)) {}
  explicit SharedList(std::shared_ptr<const std::vector<V>> p) : p_(std::move(p)) {}

  const std::vector<V>& get() const { return p_ ? *p_ : none(); }
  operator const std::vector<V>&() const { return get(); }  // NOLINT(google-explicit-constructor)
  // shared: the one copy (null only for a default-constructed list), for what keeps the list
  // past the dumps: a group's problems name it by this pointer, so every list made from items,
  // even none, is its own.
  const std::shared_ptr<const std::vector<V>>& shared() const { return p_; }
  // same: whether both are the one list (equal without reading them).
  bool same(const SharedList& o) const { return p_ == o.p_; }

  std::size_t size() const { return get().size(); }
  bool empty() const { return get().empty(); }
  const_iterator begin() const { return get().begin(); }
  const_iterator end() const { return get().end(); }
  const V* data() const { return get().data(); }
  const V& operator[](std::size_t k) const { return get()[k]; }
  const V& at(std::size_t k) const { return get().at(k); }
  const V& front() const { return get().front(); }
  const V& back() const { return get().back(); }

  friend bool operator==(const SharedList& a, const SharedList& b) { return a.same(b) || a.get() == b.get(); }
  friend bool operator==(const SharedList& a, const std::vector<V>& b) { return a.get() == b; }

 private:
  static const std::vector<V>& none() {
    static const std::vector<V> empty;
    return empty;
  }
  std::shared_ptr<const std::vector<V>> p_;
};

// Text: an immutable string shared by every holder, read as a const std::string. A dump's
// records repeat a few names (their group's, its description, the operation's): the reader keeps
// one copy of each for all the records that hold it, 16 bytes a field instead of 32.
class Text {
 public:
  static constexpr std::size_t npos = std::string::npos;

  Text() = default;
  Text(std::string s) : p_(std::make_shared<const std::string>(std::move(s))) {}  // NOLINT(google-explicit-constructor)
  Text(const char* s) : Text(std::string(s)) {}                                    // NOLINT(google-explicit-constructor)
  Text(std::string_view s) : Text(std::string(s)) {}                               // NOLINT(google-explicit-constructor)

  const std::string& str() const { return p_ ? *p_ : none(); }
  operator const std::string&() const { return str(); }                    // NOLINT(google-explicit-constructor)
  operator std::string_view() const { return str(); }                      // NOLINT(google-explicit-constructor)
  // same: whether both are the one copy (equal without reading them).
  bool same(const Text& o) const { return p_ == o.p_; }

  std::size_t size() const { return str().size(); }
  bool empty() const { return str().empty(); }
  const char* c_str() const { return str().c_str(); }
  const char* data() const { return str().data(); }
  std::string::const_iterator begin() const { return str().begin(); }
  std::string::const_iterator end() const { return str().end(); }
  char operator[](std::size_t k) const { return str()[k]; }
  std::string substr(std::size_t pos = 0, std::size_t n = npos) const { return str().substr(pos, n); }
  std::size_t find(std::string_view s, std::size_t pos = 0) const { return str().find(s, pos); }
  std::size_t find(char c, std::size_t pos = 0) const { return str().find(c, pos); }
  std::size_t rfind(std::string_view s, std::size_t pos = npos) const { return str().rfind(s, pos); }
  bool starts_with(std::string_view s) const { return str().starts_with(s); }

  friend bool operator==(const Text& a, const Text& b) { return a.same(b) || a.str() == b.str(); }
  friend bool operator==(const Text& a, const std::string& b) { return a.str() == b; }
  friend bool operator==(const Text& a, std::string_view b) { return a.str() == b; }
  friend bool operator==(const Text& a, const char* b) { return a.str() == b; }
  friend std::strong_ordering operator<=>(const Text& a, const Text& b) { return a.str() <=> b.str(); }
  friend std::string operator+(const std::string& a, const Text& b) { return a + b.str(); }
  friend std::string operator+(const char* a, const Text& b) { return a + b.str(); }
  friend std::string operator+(char a, const Text& b) { return a + b.str(); }
  friend std::string operator+(const Text& a, const std::string& b) { return a.str() + b; }
  friend std::string operator+(const Text& a, const char* b) { return a.str() + b; }
  friend std::string operator+(const Text& a, char b) { return a.str() + b; }
  friend std::string operator+(const Text& a, const Text& b) { return a.str() + b.str(); }
  friend std::ostream& operator<<(std::ostream& o, const Text& t) { return o << t.str(); }

 private:
  static const std::string& none() {
    static const std::string empty;
    return empty;
  }
  std::shared_ptr<const std::string> p_;
};

// RankList: a group's global ranks, sorted, one list for every dump that lists them alike.
using RankList = SharedList<int64_t>;
// A record's sizes (a list of dims per tensor) and dtypes ("Float", "BFloat16", ...), one list for
// every record of a dump's reader that holds them alike.
using SizesList = SharedList<std::vector<int64_t>>;
using DtypeList = SharedList<std::string>;

// One record of a rank's ring buffer.
struct Entry {
  int64_t record_id = 0;
  int64_t pg_id = -1;
  Text group;                  // process_group[0]: the group's name (pg_config's key)
  Text desc;                   // process_group[1]
  int64_t collective_seq_id = 0;
  int64_t p2p_seq_id = 0;
  int64_t op_id = -1;
  Text profiling_name;         // "nccl:all_reduce", "nccl:send 0->1", ...
  Text op;                     // the name's operation: "all_reduce", "send", "coalesced", ...
  int64_t src = -1, dst = -1;  // send/recv: group ranks
  SizesList input_sizes, output_sizes;
  DtypeList input_dtypes, output_dtypes;
  EntryState state = EntryState::kScheduled;
  bool is_p2p = false;
};

// A group as one rank's pg_config lists it.
struct GroupConfig {
  std::string name, desc;
  RankList ranks;  // global ranks, sorted
};

struct Dump {
  int64_t rank = 0;
  std::string path;
  std::string format;   // "pickle" or "json"
  std::string version;  // "2.10", say
  std::vector<GroupConfig> groups;
  std::vector<Entry> entries;  // in record order
};

}  // namespace meshsim::trace
