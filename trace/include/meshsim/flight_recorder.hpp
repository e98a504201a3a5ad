// flight_recorder.hpp — PyTorch's Flight Recorder dumps read and checked across ranks: what
// `meshsim trace check DIR` runs after a job hung.
//
// A dump is one rank's ring buffer of collective and point-to-point records, written by c10d's
// FlightRecorder (torch/csrc/distributed/c10d/FlightRecorder.hpp, FlightRecorderDetail.hpp at
// pytorch/pytorch cb41e3a4d13921611dde43bb6aa6cf38d22f7f73: `version` "2.x", `pg_config` {name:
// {name, desc, ranks "[0, 1]"}}, `entries` [{record_id, pg_id, process_group (name, desc),
// collective_seq_id, p2p_seq_id, op_id, profiling_name "nccl:all_reduce" / "nccl:send 0->1" /
// "nccl:recv 1<-0", input_sizes, input_dtypes, output_sizes, output_dtypes, state scheduled |
// started | completed, is_p2p, ...}]) as a pickle (read by pickle.hpp's bounded reader) or as
// the same fields in JSON (`_dump_nccl_trace_json`). Files are `<prefix><rank>` as PyTorch's
// analyzer (torch/distributed/flight_recorder/fr_trace.py) finds them, in DIR or below it.
//
// The check covers every process group at once and reports every problem, not the first:
// membership disagreements, missing dumps, ranks that never issued a group's Nth collective
// while its other members wait in it, type / size / dtype / state mismatches of the Nth
// collective (the odd ranks named against the majority), each entry's own size rule (all_gather
// output = input x group size, reduce_scatter input = output x group size, all_reduce in = out),
// and sends paired with receives per (src, dst) in order. A hang is then followed through the
// ranks' waits to the ranks that hold everyone up (the culprits), or to a cycle of waits.
//
//   DumpSet set = read_dump_dir("comm_traces", "rank_");
//   CheckReport r = check_dumps(set.dumps);   // r.ok, r.problems, r.culprits
//
// Entries a ring buffer dropped are never taken for missing ones: a rank is said to have never
// issued collective #N of a group only when its newest record of that group is older than #N.
// Errors: ParseError / InvalidArgument naming the file and the field for a malformed dump;
// ResourceExhausted over the bounds (files, bytes, entries). Thread safety: plain values.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
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

struct DumpLimits {
  std::size_t max_file_bytes = std::size_t{1} << 30;
  std::size_t max_files = std::size_t{1} << 20;
  std::size_t max_entries = std::size_t{1} << 22;  // per dump
  std::size_t max_group_ranks = std::size_t{1} << 22;
  // What a dump decodes to (sizes, dtypes, names, rank lists: 8 bytes a number, a string's
  // length and 32 more, 24 a list) is at most this many bytes per input byte, plus the floor.
  // Memo references let a small pickle name one big list many times; Python shares it, the
  // decoded records would copy it, so past this bound the dump is refused (ResourceExhausted).
  std::size_t decoded_bytes_per_input_byte = 32;
  std::size_t decoded_bytes_floor = std::size_t{64} << 20;
};

// parse_dump reads one dump's bytes (a pickle when they start with the PROTO opcode 0x80, else
// JSON). `path` names it in errors.
Dump parse_dump(std::string_view bytes, int64_t rank, const std::string& path, const DumpLimits& limits = {});

struct DumpSet {
  std::string dir, prefix;
  std::vector<Dump> dumps;  // by rank
};

// read_dump_dir reads every `<prefix><rank>` file in `dir` and below (an optional ".json",
// ".pkl" or ".pickle" after the rank). Without a prefix, the one prefix that every file named
// `<letters><digits>` shares is used, as fr_trace infers it; more than one is an error asking
// for --prefix. Two files of one rank, an unreadable file or none at all are InvalidArgument.
DumpSet read_dump_dir(const std::string& dir, const std::optional<std::string>& prefix, const DumpLimits& limits = {});

struct Problem {
  // "membership", "missing-dump", "unknown-group", "never-issued", "absent", "type", "size",
  // "dtype", "state", "p2p", "unmatched-p2p", "wait-cycle", "stuck"
  std::string kind;
  std::string group;                // the group's name ("" for the world)
  std::string desc;
  std::shared_ptr<const std::vector<int64_t>> group_ranks;  // shared by the group's problems; null for none
  int64_t seq = -1;                 // the collective's sequence id (a send's index for p2p)
  int64_t last_seq = -1;            // the same problem again up to this sequence id (else -1)
  int64_t repeats = 0;              // how many more collectives showed it
  std::vector<int64_t> ranks;       // the ranks the problem is about
  std::string message;              // one line naming ranks, group, sequence id and entries
};

// A rank the problems blame, and why: the root of a hang (it never issued what others wait in,
// and waits in nothing itself), the odd one out of a mismatch, or a member of a wait cycle.
struct Culprit {
  int64_t rank = 0;
  std::string why;
};

struct CheckReport {
  bool ok = true;
  int64_t dumps = 0, groups = 0, entries = 0;
  int64_t collectives_checked = 0;  // (group, sequence id) pairs
  int64_t p2p_checked = 0;          // send/recv pairs
  std::vector<Problem> problems;
  std::vector<Culprit> culprits;    // by rank
  std::vector<std::string> notes;   // what could not be judged (records a ring buffer dropped)
};

CheckReport check_dumps(const std::vector<Dump>& dumps);

// report_text: "meshsim trace check: N dumps ..." then one FAILED line per problem, the
// culprits, notes, and OK or FAILED. report_json: the same as fields.
std::string report_text(const CheckReport& r, const DumpSet& set);
nlohmann::json report_json(const CheckReport& r, const DumpSet& set);

// format_ranks: "0-7,16,18-19" (ranges of consecutive ranks), at most `max_runs` runs then
// ",... (N ranks)"; four or more ranks a constant stride > 1 apart as "5,13,...,253 (32 ranks,
// stride 8)".
std::string format_ranks(const std::vector<int64_t>& sorted_ranks, std::size_t max_runs = 64);

}  // namespace meshsim::trace
