// fr_check.hpp — Flight Recorder dumps checked across ranks (check_dumps): every process group at
// once, every problem reported, a hang followed to its culprits. flight_recorder.hpp says what
// each rule compares.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "meshsim/fr_schema.hpp"

namespace meshsim::trace {

// ProblemKind: what a problem is, each with one wording (problem_kind_name, the reports' word):
//   group-name     the members of one group know it under different names (or one rank
//                  lists it and another member lists no group of that name): they rendezvous
//                  under different store prefixes, and every one of them waits forever
//   membership     members list a group differently (ranks or description)
//   missing-dump   a group's member left no dump
//   unknown-group  a record names a group its dump's pg_config does not list
//   never-issued   a member never issued a collective its group's other members wait in
//   absent         a member's ring buffer holds no record of a collective the others issued
//   type, size, dtype, state  the Nth collective's operation, sizes, dtypes or state differ
//                  (or a record breaks its own size / dtype rule)
//   p2p            a send met by a receive of another size or dtype
//   unmatched-p2p  a send or receive its peer never met
//   wait-cycle     ranks wait for each other in a cycle
enum class ProblemKind {
  kMembership, kMissingDump, kUnknownGroup, kNeverIssued, kAbsent, kType, kSize, kDtype, kState, kP2p, kUnmatchedP2p, kWaitCycle,
  kGroupName
};
inline constexpr int kProblemKinds = 13;
std::string_view problem_kind_name(ProblemKind k);
// parse_problem_kind: the kind a name words, nullopt for none.
std::optional<ProblemKind> parse_problem_kind(std::string_view name);

struct Problem {
  ProblemKind kind = ProblemKind::kMembership;
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

// CheckOptions: all_to_all_totals off for dumps whose all-to-alls carried no data between ranks
// (meshsim record's, over PyTorch's fake backend, which hands each rank its own input back):
// an exchange whose splits came from an earlier exchange (an MoE's token counts) then holds
// sizes no peer sent, and the group's totals are not compared (a note counts them).
struct CheckOptions {
  bool all_to_all_totals = true;
};

CheckReport check_dumps(const std::vector<Dump>& dumps);
CheckReport check_dumps(const std::vector<Dump>& dumps, const CheckOptions& options);

}  // namespace meshsim::trace
