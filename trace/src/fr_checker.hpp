// trace/src/fr_checker.hpp — the cross-rank check's parts (check_dumps): the groups and their
// members (fr_check.cpp), each group's records compared (fr_compare.cpp), a hang followed to its
// culprits (fr_hang.cpp); the text helpers they share.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "meshsim/fr_check.hpp"
#include "meshsim/fr_report.hpp"

namespace meshsim::trace::detail {

inline std::string sizes_text(const std::vector<std::vector<int64_t>>& s) {
  std::string out = "[";
  for (std::size_t k = 0; k < s.size(); ++k) {
    if (k == 8) {
      out += ", ... (" + std::to_string(s.size()) + " tensors)";
      break;
    }
    out += k ? ", [" : "[";
    for (std::size_t m = 0; m < s[k].size(); ++m) out += (m ? ", " : "") + std::to_string(s[k][m]);
    out += "]";
  }
  return out + "]";
}

inline std::string dtypes_text(const std::vector<std::string>& d) {
  std::vector<std::string> u(d.begin(), d.end());
  std::sort(u.begin(), u.end());
  u.erase(std::unique(u.begin(), u.end()), u.end());
  std::string out;
  for (const auto& t : u) out += (out.empty() ? "" : "/") + t.substr(0, 40);
  return out.empty() ? "-" : out;
}

// entry_text: "nccl:all_gather in [[4096]] BFloat16 out [[32768]] BFloat16 (record 41, started)".
inline std::string entry_text(const Entry& e) {
  return e.profiling_name.substr(0, 80) + " in " + sizes_text(e.input_sizes) + " " + dtypes_text(e.input_dtypes) + " out " +
         sizes_text(e.output_sizes) + " " + dtypes_text(e.output_dtypes) + " (record " + std::to_string(e.record_id) + ", " +
         state_name(e.state) + ")";
}

// who: "rank 5" or "ranks 5,7".
inline std::string who(const std::vector<int64_t>& ranks, std::size_t max_runs = 64) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + format_rank_runs(ranks, max_runs);
}

// counted: "1 rank (5)" or "7 ranks (0-4,6-7)".
inline std::string counted(const std::vector<int64_t>& ranks, std::size_t max_runs) {
  return std::to_string(ranks.size()) + (ranks.size() == 1 ? " rank (" : " ranks (") + format_rank_runs(ranks, max_runs) + ")";
}

// verb: "waits" for one rank, "wait" for more.
inline std::string verb(const std::vector<int64_t>& ranks, const std::string& plural) {
  return ranks.size() == 1 ? plural + "s" : plural;
}

inline bool has(const std::string& op, const char* part) { return op.find(part) != std::string::npos; }

inline int64_t numel(const std::vector<std::vector<int64_t>>& s) {
  int64_t total = 0;
  for (const auto& t : s) {
    int64_t p = 1;
    for (int64_t d : t) {
      if (d != 0 && p > INT64_MAX / d) return -1;  // past int64: compared as unknown
      p *= d;
    }
    if (total > INT64_MAX - p) return -1;
    total += p;
  }
  return total;
}

// signature: what every member of a collective must agree on (fr_trace's Op.match): the
// operation, the sizes (all-to-all's splits and scatter's input / gather's output may differ
// per rank) and the dtypes.
inline std::string signature(const std::vector<const Entry*>& bundle) {
  std::string s;
  for (const Entry* e : bundle) {
    s += e->op;
    s += '|';
    const bool a2a = e->op.rfind("all_to_all", 0) == 0 || e->op.rfind("alltoall", 0) == 0;
    if (!a2a && e->op != "scatter") s += sizes_text(e->input_sizes);
    s += '|';
    if (!a2a && e->op != "gather") s += sizes_text(e->output_sizes);
    // A scatter's non-root ranks record no input and a gather's no output (PyTorch's analyzer
    // compares neither dtype, nor a broadcast's input dtype): those are not compared either.
    s += '|' + (e->op == "scatter" || e->op == "broadcast" ? std::string() : dtypes_text(e->input_dtypes));
    s += '|' + (e->op == "gather" ? std::string() : dtypes_text(e->output_dtypes)) + ';';
  }
  return s;
}

// same_signature: whether two bundles' signatures are equal, decided on the fields (no text made):
// true only where signature() would give the same text, so a caller that falls back to the text
// when this says no gets the same answer, the common case (every member agrees) at a fraction of
// the cost.
// same_dtypes: whether dtypes_text(x) == dtypes_text(y), with no text made when the lists are equal.
inline bool same_dtypes(const std::vector<std::string>& x, const std::vector<std::string>& y) {
  return x == y || dtypes_text(x) == dtypes_text(y);
}

inline bool same_signature(const std::vector<const Entry*>& a, const std::vector<const Entry*>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t k = 0; k < a.size(); ++k) {
    const Entry& x = *a[k];
    const Entry& y = *b[k];
    if (x.op != y.op) return false;
    const bool a2a = x.op.rfind("all_to_all", 0) == 0 || x.op.rfind("alltoall", 0) == 0;
    if (!a2a && x.op != "scatter" && x.input_sizes != y.input_sizes) return false;
    if (!a2a && x.op != "gather" && x.output_sizes != y.output_sizes) return false;
    if (x.op != "scatter" && x.op != "broadcast" && !same_dtypes(x.input_dtypes, y.input_dtypes)) return false;
    if (x.op != "gather" && !same_dtypes(x.output_dtypes, y.output_dtypes)) return false;
  }
  return true;
}

// own_rule: the entry's own size or dtype rule it breaks for a group of n ranks, and how (nullopt: none).
inline std::optional<std::pair<ProblemKind, std::string>> own_rule(const Entry& e, int64_t n) {
  const int64_t in = numel(e.input_sizes), out = numel(e.output_sizes);
  const bool gather = has(e.op, "all_gather") || has(e.op, "allgather");
  const bool scatter = has(e.op, "reduce_scatter");
  if (in >= 0 && out >= 0 && n > 0 && !e.input_sizes.empty() && !e.output_sizes.empty()) {
    // Gloo records a functional all_gather_into_tensor's output as [1, input...] (PyTorch 2.13's
    // ProcessGroupGloo on DTensor's gathers): not a size the ranks disagree on.
    const bool gloo_slice = e.profiling_name.rfind("gloo:", 0) == 0 && e.input_sizes.size() == 1 &&
                            e.output_sizes.size() == 1 && e.output_sizes[0].size() == e.input_sizes[0].size() + 1 &&
                            e.output_sizes[0][0] == 1 &&
                            std::equal(e.input_sizes[0].begin(), e.input_sizes[0].end(), e.output_sizes[0].begin() + 1);
    if (gather && !gloo_slice && in <= INT64_MAX / n && out != in * n) {
      return std::pair{ProblemKind::kSize, "its output holds " + std::to_string(out) + " elements, not input " + std::to_string(in) + " x group size " +
                          std::to_string(n)};
    }
    if (scatter && out <= INT64_MAX / n && in != out * n) {
      return std::pair{ProblemKind::kSize, "its input holds " + std::to_string(in) + " elements, not output " + std::to_string(out) + " x group size " +
                          std::to_string(n)};
    }
    if ((e.op == "all_reduce" || e.op == "allreduce_coalesced") && e.input_sizes != e.output_sizes) {
      return std::pair{ProblemKind::kSize, "its output sizes " + sizes_text(e.output_sizes) + " are not its input sizes " + sizes_text(e.input_sizes)};
    }
  }
  if (e.op != "scatter" && e.op != "gather" && e.op != "broadcast" && !e.input_dtypes.empty() && !e.output_dtypes.empty() &&
      !same_dtypes(e.input_dtypes, e.output_dtypes) && in != 0 && out != 0) {
    return std::pair{ProblemKind::kDtype, "its input is " + dtypes_text(e.input_dtypes) + " and its output " + dtypes_text(e.output_dtypes)};
  }
  return std::nullopt;
}

struct Group {
  std::string name, desc;
  RankList ranks;  // the dumps' own list, shared with its problems
  std::vector<int64_t> claimers;
  std::map<std::string, std::vector<int64_t>> descs;  // desc -> ranks that list it so
};

struct RankState {
  const Dump* dump = nullptr;
  bool wrapped = false;                         // its ring buffer dropped older records
  std::unordered_map<std::string, int> gid_of;  // pg name -> group
  const Entry* blocking = nullptr;              // its oldest record not completed
  int blocking_gid = -1;
};

// Per group and member: its collectives as (seq, entries of that seq) in record order.
struct Member {
  int64_t rank = 0;
  bool dumped = false;
  std::vector<std::pair<int64_t, std::vector<const Entry*>>> bundles;
  std::vector<const Entry*> p2p;
};

class Checker {
 public:
  explicit Checker(const std::vector<Dump>& dumps, const CheckOptions& options = {});
  CheckReport run();

 private:
  std::string group_text(int g) const;
  void add(Problem p, int g);
  void blame(int64_t rank, const std::string& why);
  bool dumped(int64_t r) const { return ranks_.count(r) != 0; }

  // The groups and their members (fr_check.cpp).
  void build_groups();
  // infer_unlisted_groups: a group that records name and no pg_config of the dumps lists (Gloo's
  // dumps) is checked over the ranks whose records name it (a member that issued none of them
  // cannot be seen), the default group ('0', default_pg) over every rank the dumps know of (0 to
  // the largest); each said in a note. Without an unnamed pg_config entry they stay
  // "unknown-group" problems (a dump that lost its pg_config).
  void infer_unlisted_groups(bool unnamed);
  // check_group_names: every dumped member of a group lists it under the group's name; a member
  // that lists no group of that name knows it by another (or not at all).
  void check_group_names();
  void check_membership();
  void check_missing_dumps();
  void assign_entries();
  Member* member(int g, int64_t r);
  // never_issued: whether member m certainly never issued collective `seq` of its group: its
  // newest record of the group is older, or it holds none and its buffer never wrapped.
  bool never_issued(const Member& m, int64_t seq) const;
  // Each group's collectives and sends compared across its members (fr_compare.cpp).
  void check_collectives(int g);
  static EntryState ranks_pending_state(const std::vector<std::pair<int64_t, const std::vector<const Entry*>*>>& present);
  void mismatch(int g, int64_t s, const std::vector<std::pair<int64_t, const std::vector<const Entry*>*>>& present,
                const std::map<std::string, std::vector<std::size_t>>& variants);
  void check_p2p(int g);
  CheckOptions options_;
  int64_t unchecked_totals_ = 0;  // all-to-alls whose totals the options leave out
  // A hang followed through the ranks' waits (fr_hang.cpp).
  // follow_waits: every rank's oldest pending record is what it waits in; the members that never
  // issued it (or the peer that never met it) hold it up. Following these waits ends at ranks
  // that wait in nothing (the roots: culprits), at ranks without a dump, or in a cycle.
  // follow_waits: who each waiting rank waits on, the ranks at the end of those waits (the
  // roots that hold everyone up) and cycles of waits. Linear in the waits and the roots reached:
  // the blockers of a (group, sequence id) are found once, a group's members without dumps are
  // one node when there are many, cycles are found by an iterative Tarjan (no recursion), and
  // each strongly connected part's roots are computed once, sinks first. Past kMaxWaitWork the
  // rest is not followed and a note says so.
  void follow_waits();
  // One line for a problem that repeats; the culprits (fr_check.cpp).
  void finish();

  std::map<int64_t, RankState> ranks_;
  std::vector<Group> groups_;
  std::vector<std::vector<Member>> members_;
  std::set<int64_t> missing_;
  std::map<std::pair<int, int64_t>, std::vector<int64_t>> never_;  // (group, seq) -> ranks that never issued it
  std::set<std::pair<int, int64_t>> mismatched_;
  std::set<int> conflicted_;  // groups whose members disagree on who they are
  std::map<const Entry*, int64_t> unmatched_;  // a pending p2p record -> the peer that never met it
  std::map<int64_t, std::string> culprits_;
  std::unordered_map<const Entry*, int64_t> peer_of_;  // a send's or receive's peer (global rank)
  std::map<int, std::vector<int64_t>> missing_of_;  // a group -> its members without dumps
  CheckReport report_;
};

}  // namespace meshsim::trace::detail
