// fr_schema.hpp — a Flight Recorder dump as meshsim reads it: one rank's ring buffer of
// collective and point-to-point records and the process groups it lists (c10d's FlightRecorder
// at pytorch/pytorch cb41e3a4; flight_recorder.hpp has the fields' sources).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace meshsim::trace {

enum class EntryState : uint8_t { kScheduled, kStarted, kCompleted };
const char* state_name(EntryState s);

// One record of a rank's ring buffer.
struct Entry {
  int64_t record_id = 0;
  int64_t pg_id = -1;
  std::string group;           // process_group[0]: the group's name (pg_config's key)
  std::string desc;            // process_group[1]
  int64_t collective_seq_id = 0;
  int64_t p2p_seq_id = 0;
  int64_t op_id = -1;
  std::string profiling_name;  // "nccl:all_reduce", "nccl:send 0->1", ...
  std::string op;              // the name's operation: "all_reduce", "send", "coalesced", ...
  int64_t src = -1, dst = -1;  // send/recv: group ranks
  std::vector<std::vector<int64_t>> input_sizes, output_sizes;
  std::vector<std::string> input_dtypes, output_dtypes;
  EntryState state = EntryState::kScheduled;
  bool is_p2p = false;
};

// RankList: a group's global ranks, sorted; immutable and shared. Every dump of a job lists its
// default group's (and its widest groups') ranks in the same words: the reader keeps one list for
// all of them (65,536 dumps of a 65,536-rank job would otherwise hold 2^32 ranks, 32 GiB). Reads
// as a const std::vector<int64_t>.
class RankList {
 public:
  using value_type = int64_t;
  using const_iterator = std::vector<int64_t>::const_iterator;
  using iterator = const_iterator;

  RankList() = default;
  RankList(std::vector<int64_t> ranks)  // NOLINT(google-explicit-constructor): a list of ranks reads as one
      : p_(std::make_shared<const std::vector<int64_t>>(std::move(ranks))) {}
  RankList(std::initializer_list<int64_t> ranks) : p_(std::make_shared<const std::vector<int64_t>>(ranks)) {}

  const std::vector<int64_t>& get() const { return p_ ? *p_ : none(); }
  operator const std::vector<int64_t>&() const { return get(); }  // NOLINT(google-explicit-constructor)
  // shared: the one copy (null only for a default-constructed list), for what keeps the list
  // past the dumps: a group's problems name it by this pointer, so every list made from ranks,
  // even none, is its own.
  const std::shared_ptr<const std::vector<int64_t>>& shared() const { return p_; }
  // same: whether both are the one list (equal without reading them).
  bool same(const RankList& o) const { return p_ == o.p_; }

  std::size_t size() const { return get().size(); }
  bool empty() const { return get().empty(); }
  const_iterator begin() const { return get().begin(); }
  const_iterator end() const { return get().end(); }
  const int64_t* data() const { return get().data(); }
  int64_t operator[](std::size_t k) const { return get()[k]; }
  int64_t front() const { return get().front(); }
  int64_t back() const { return get().back(); }

  friend bool operator==(const RankList& a, const RankList& b) { return a.same(b) || a.get() == b.get(); }
  friend bool operator==(const RankList& a, const std::vector<int64_t>& b) { return a.get() == b; }

 private:
  static const std::vector<int64_t>& none() {
    static const std::vector<int64_t> empty;
    return empty;
  }
  std::shared_ptr<const std::vector<int64_t>> p_;
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
