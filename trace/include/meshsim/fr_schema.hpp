// fr_schema.hpp — a Flight Recorder dump as meshsim reads it: one rank's ring buffer of
// collective and point-to-point records and the process groups it lists (c10d's FlightRecorder
// at pytorch/pytorch cb41e3a4; flight_recorder.hpp has the fields' sources).
#pragma once

#include <cstdint>
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

// A group as one rank's pg_config lists it.
struct GroupConfig {
  std::string name, desc;
  std::vector<int64_t> ranks;  // global ranks, sorted
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
