// meshsim/group_names.hpp — the name PyTorch gives every process group, on every rank, and the
// programs whose ranks disagree on them.
//
//   GroupNames n = name_groups(plan, /*me=*/1);
//   n.calls[i].names      // rank 1's name for each group call of the program's i-th item
//   n.problems            // a group its members name differently, a name two groups share
//
// PyTorch names a group when a rank reaches new_group or split_group, from per-process state
// (torch/distributed/distributed_c10d.py, _process_group_name and _hash_ranks_to_str, read
// from the 2.13.0 and 2.14.1 wheels); init_process_group's default group is "0":
//   - new_group without use_local_synchronization: str(group_count), every rank of the world
//     (members or not), then group_count += 1;
//   - new_group(use_local_synchronization=True): a non-member returns before naming; a member
//     names it sha1("_".join(sorted ranks) + "_" + salt);
//   - split_group: every rank names its own split (a rank in none names the first) by that
//     hash, of the split's ranks as given;
//   - the salt: 2.13, the rank's count of groups it holds (len(_world.pg_names), the default
//     group included); 2.14, group_count, which 2.14 advances for hashed names too.
// The store prefix a group rendezvouses under is its name: members that name one group
// differently wait for each other forever, and two groups under one name mix their keys.
//
// Cost: O(ranks the program names + world-wide calls) time, O(ranks named) memory; a world of
// untouched ranks is one state.
//
// Thread safety: plain values; name_groups may be called from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "meshsim/creation_plan.hpp"

namespace meshsim {

// NamedItem is one item of the program (a user call, or one batch of the mesh's) as rank `me`
// makes it: per call (a new_group batch makes one call per group; split_group and a user's
// call one), the name of the group the rank gets, or nullopt where it gets none (its result is
// then `non_member`).
struct NamedItem {
  std::vector<std::optional<std::string>> names;
};

// NameProblem is one disagreement, worded for a user: the call, the ranks on each side.
struct NameProblem {
  enum class Kind { kMembersDisagree, kNameShared };
  Kind kind = Kind::kMembersDisagree;
  std::string call;     // the call, as describe_call words it
  std::string message;  // the whole diagnosis
};

struct GroupNames {
  std::vector<NamedItem> items;       // in program order (group_program_items)
  std::vector<NameProblem> problems;  // the first kMaxNameProblems
  int64_t problem_count = 0;          // all of them
};

inline constexpr std::size_t kMaxNameProblems = 16;

// ProgramItem is one item in the order the ranks make them: a user call (program[index]) or a
// batch of the mesh (plan.batches[index]).
struct ProgramItem {
  bool user = false;
  std::size_t index = 0;
};
std::vector<ProgramItem> group_program_items(const CreationPlan& plan);

// name_groups runs the program's naming on every rank of plan.world and keeps rank `me`'s.
GroupNames name_groups(const CreationPlan& plan, int64_t me);

// non_member_result is what a rank outside a group gets back from the call: "None" (2.13's
// split_group and local-synchronization new_group) or "NON_GROUP_MEMBER" (-100; 2.14, and
// every version's plain new_group).
std::string_view non_member_result(TorchVersion v, bool split_or_local);

// describe_call words a user call: "process_groups[1]: new_group(ranks=[0, 1], use_local_synchronization=True)".
std::string describe_call(const GroupCallSpec& c, std::size_t index);

// hashed_group_name is PyTorch's hashed name of `ranks` (as joined) salted with `salt`: 40 hex
// digits of sha1("r0_r1_..._salt").
std::string hashed_group_name(const std::vector<int64_t>& ranks, int64_t salt);

}  // namespace meshsim
