// The cross-rank check of Flight Recorder dumps (flight_recorder.hpp).
#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "meshsim/error.hpp"
#include "meshsim/flight_recorder.hpp"

namespace meshsim::trace {

std::string format_ranks(const std::vector<int64_t>& r, std::size_t max_runs) {
  // A strided group (a DP group of a TP x DP mesh, say): its ends and its stride.
  if (r.size() >= 6 && r[1] - r[0] > 1) {
    const int64_t step = r[1] - r[0];
    bool even = true;
    for (std::size_t k = 2; k < r.size() && even; ++k) even = r[k] - r[k - 1] == step;
    if (even) {
      return std::to_string(r[0]) + "," + std::to_string(r[1]) + ",...," + std::to_string(r.back()) + " (" +
             std::to_string(r.size()) + " ranks, stride " + std::to_string(step) + ")";
    }
  }
  std::string out;
  std::size_t runs = 0;
  for (std::size_t i = 0; i < r.size();) {
    std::size_t j = i;
    while (j + 1 < r.size() && r[j + 1] == r[j] + 1) ++j;
    if (runs == max_runs) {
      out += ",... (" + std::to_string(r.size()) + " ranks)";
      return out;
    }
    if (!out.empty()) out += ',';
    out += std::to_string(r[i]);
    if (j > i) out += "-" + std::to_string(r[j]);
    ++runs;
    i = j + 1;
  }
  return out;
}

namespace {

std::string sizes_text(const std::vector<std::vector<int64_t>>& s) {
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

std::string dtypes_text(const std::vector<std::string>& d) {
  std::vector<std::string> u(d.begin(), d.end());
  std::sort(u.begin(), u.end());
  u.erase(std::unique(u.begin(), u.end()), u.end());
  std::string out;
  for (const auto& t : u) out += (out.empty() ? "" : "/") + t.substr(0, 40);
  return out.empty() ? "-" : out;
}

// entry_text: "nccl:all_gather in [[4096]] BFloat16 out [[32768]] BFloat16 (record 41, started)".
std::string entry_text(const Entry& e) {
  return e.profiling_name.substr(0, 80) + " in " + sizes_text(e.input_sizes) + " " + dtypes_text(e.input_dtypes) + " out " +
         sizes_text(e.output_sizes) + " " + dtypes_text(e.output_dtypes) + " (record " + std::to_string(e.record_id) + ", " +
         state_name(e.state) + ")";
}

// who: "rank 5" or "ranks 5,7".
std::string who(const std::vector<int64_t>& ranks, std::size_t max_runs = 64) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + format_ranks(ranks, max_runs);
}

// counted: "1 rank (5)" or "7 ranks (0-4,6-7)".
std::string counted(const std::vector<int64_t>& ranks, std::size_t max_runs) {
  return std::to_string(ranks.size()) + (ranks.size() == 1 ? " rank (" : " ranks (") + format_ranks(ranks, max_runs) + ")";
}

// verb: "waits" for one rank, "wait" for more.
std::string verb(const std::vector<int64_t>& ranks, const std::string& plural) {
  return ranks.size() == 1 ? plural + "s" : plural;
}

bool has(const std::string& op, const char* part) { return op.find(part) != std::string::npos; }

int64_t numel(const std::vector<std::vector<int64_t>>& s) {
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
std::string signature(const std::vector<const Entry*>& bundle) {
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

// own_rule: an entry's own size and dtype rules for a group of n ranks, or "".
std::pair<std::string, std::string> own_rule(const Entry& e, int64_t n) {
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
      return {"size", "its output holds " + std::to_string(out) + " elements, not input " + std::to_string(in) + " x group size " +
                          std::to_string(n)};
    }
    if (scatter && out <= INT64_MAX / n && in != out * n) {
      return {"size", "its input holds " + std::to_string(in) + " elements, not output " + std::to_string(out) + " x group size " +
                          std::to_string(n)};
    }
    if ((e.op == "all_reduce" || e.op == "allreduce_coalesced") && e.input_sizes != e.output_sizes) {
      return {"size", "its output sizes " + sizes_text(e.output_sizes) + " are not its input sizes " + sizes_text(e.input_sizes)};
    }
  }
  if (e.op != "scatter" && e.op != "gather" && e.op != "broadcast" && !e.input_dtypes.empty() && !e.output_dtypes.empty() &&
      dtypes_text(e.input_dtypes) != dtypes_text(e.output_dtypes) && in != 0 && out != 0) {
    return {"dtype", "its input is " + dtypes_text(e.input_dtypes) + " and its output " + dtypes_text(e.output_dtypes)};
  }
  return {"", ""};
}

struct Group {
  std::string name, desc;
  std::vector<int64_t> ranks;
  std::vector<int64_t> claimers;
  std::map<std::string, std::vector<int64_t>> descs;  // desc -> ranks that list it so
  std::shared_ptr<const std::vector<int64_t>> shared;  // ranks, once, for its problems
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
  explicit Checker(const std::vector<Dump>& dumps) {
    for (const auto& d : dumps) {
      RankState& rs = ranks_[d.rank];
      rs.dump = &d;
      rs.wrapped = !d.entries.empty() && d.entries.front().record_id > 0;
      report_.entries += static_cast<int64_t>(d.entries.size());
    }
    report_.dumps = static_cast<int64_t>(dumps.size());
  }

  CheckReport run() {
    build_groups();
    check_membership();
    check_missing_dumps();
    assign_entries();
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      check_collectives(static_cast<int>(g));
      check_p2p(static_cast<int>(g));
    }
    follow_waits();
    finish();
    return std::move(report_);
  }

 private:
  std::string group_text(int g) const {
    const Group& G = groups_[g];
    return "group '" + G.name.substr(0, 60) + "'" + (G.desc.empty() || G.desc == "undefined" ? "" : " (" + G.desc.substr(0, 60) + ")") +
           " ranks [" + format_ranks(G.ranks, 8) + "]";
  }
  void add(Problem p, int g) {
    if (g >= 0) {
      p.group = groups_[g].name;
      p.desc = groups_[g].desc;
      if (!groups_[g].shared) groups_[g].shared = std::make_shared<const std::vector<int64_t>>(groups_[g].ranks);
      p.group_ranks = groups_[g].shared;
    }
    std::sort(p.ranks.begin(), p.ranks.end());
    report_.problems.push_back(std::move(p));
  }
  void blame(int64_t rank, const std::string& why) {
    auto& c = culprits_[rank];
    if (c.empty()) c = why;
  }
  bool dumped(int64_t r) const { return ranks_.count(r) != 0; }

  void build_groups() {
    std::map<std::pair<std::string, std::vector<int64_t>>, int> index;
    bool unnamed = false;
    for (auto& [r, rs] : ranks_) {
      for (const auto& c : rs.dump->groups) {
        // PyTorch's Gloo backend registers its groups before they are named: its pg_config holds
        // one entry named '' (the last group registered), which no record names.
        if (c.name.empty() && c.desc.empty()) {
          unnamed = true;
          continue;
        }
        auto key = std::make_pair(c.name, c.ranks);
        auto [it, fresh] = index.emplace(key, static_cast<int>(groups_.size()));
        if (fresh) groups_.push_back(Group{c.name, c.desc, c.ranks, {}, {}});
        Group& G = groups_[it->second];
        G.claimers.push_back(r);
        G.descs[c.desc].push_back(r);
        rs.gid_of[c.name] = it->second;
      }
    }
    infer_unlisted_groups(unnamed);
    report_.groups = static_cast<int64_t>(groups_.size());
  }

  // infer_unlisted_groups: a group that records name and no pg_config of the dumps lists (Gloo's
  // dumps) is checked over the ranks whose records name it (a member that issued none of them
  // cannot be seen), the default group ('0', default_pg) over every rank the dumps know of (0 to
  // the largest); each said in a note. Without an unnamed pg_config entry they stay
  // "unknown-group" problems (a dump that lost its pg_config).
  void infer_unlisted_groups(bool unnamed) {
    if (!unnamed) return;
    std::map<std::string, std::pair<std::string, std::set<int64_t>>> unlisted;  // name -> desc, ranks
    for (auto& [r, rs] : ranks_) {
      for (const Entry& e : rs.dump->entries) {
        if (rs.gid_of.count(e.group)) continue;
        auto& u = unlisted[e.group];
        if (u.second.empty()) u.first = e.desc;
        u.second.insert(r);
      }
    }
    int64_t world = 0;
    for (const auto& [r, rs] : ranks_) world = std::max(world, r + 1);
    for (const auto& G : groups_) {
      if (!G.ranks.empty()) world = std::max(world, G.ranks.back() + 1);
    }
    for (auto& [name, u] : unlisted) {
      const bool whole = name == "0" && u.first == "default_pg";
      Group G{name, u.first, {}, {}, {}};
      if (whole) {
        for (int64_t r = 0; r < world; ++r) G.ranks.push_back(r);
      } else {
        G.ranks.assign(u.second.begin(), u.second.end());
      }
      const int g = static_cast<int>(groups_.size());
      for (int64_t r : G.ranks) {
        auto it = ranks_.find(r);
        if (it == ranks_.end()) continue;
        it->second.gid_of[name] = g;
        G.claimers.push_back(r);
        G.descs[u.first].push_back(r);
      }
      groups_.push_back(std::move(G));
      report_.notes.push_back(group_text(g) + ": no pg_config lists it (PyTorch's Gloo backend records its groups before it names them): " +
                              (whole ? std::string("the default group, taken as every rank the dumps know of")
                                     : std::string("its members are taken from the records that name it (a member that issued none of them is not seen)")));
    }
  }

  void check_membership() {
    // Groups of one name must not share a rank (split groups share a name, never a member);
    // one group's ranks must agree on its description; a rank must be in the groups it lists.
    std::map<std::string, std::unordered_map<int64_t, int>> owner;
    std::set<std::pair<int, int>> reported;
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      const Group& G = groups_[g];
      auto& own = owner[G.name];
      for (int64_t m : G.ranks) {
        auto [it, fresh] = own.emplace(m, static_cast<int>(g));
        if (fresh || !reported.emplace(it->second, static_cast<int>(g)).second) continue;
        const Group& H = groups_[it->second];
        Problem p;
        p.kind = "membership";
        p.ranks = H.claimers;
        p.ranks.insert(p.ranks.end(), G.claimers.begin(), G.claimers.end());
        p.message = "group '" + G.name.substr(0, 60) + "': " + who(H.claimers) + " " + verb(H.claimers, "list") + " its ranks as [" +
                    format_ranks(H.ranks, 16) + "] but " + who(G.claimers) + " as [" + format_ranks(G.ranks, 16) +
                    "]; both include rank " + std::to_string(m) + " (neither group's records are matched)";
        conflicted_.insert(static_cast<int>(g));
        conflicted_.insert(it->second);
        const auto& fewer = H.claimers.size() < G.claimers.size() ? H.claimers : G.claimers;
        if (H.claimers.size() != G.claimers.size()) {
          for (int64_t r : fewer) blame(r, "its pg_config disagrees with the other members of group '" + G.name.substr(0, 60) + "'");
        }
        add(std::move(p), static_cast<int>(g));
      }
      if (G.descs.size() > 1) {
        Problem p;
        p.kind = "membership";
        std::string parts;
        for (const auto& [desc, rs] : G.descs) {
          parts += (parts.empty() ? "" : "; ") + (who(rs) + " call it '" + desc.substr(0, 60) + "'");
          p.ranks.insert(p.ranks.end(), rs.begin(), rs.end());
        }
        p.message = group_text(static_cast<int>(g)) + ": its members disagree on its description: " + parts;
        add(std::move(p), static_cast<int>(g));
      }
      std::vector<int64_t> outside;
      for (int64_t r : G.claimers) {
        if (!std::binary_search(G.ranks.begin(), G.ranks.end(), r)) outside.push_back(r);
      }
      if (!outside.empty()) {
        Problem p;
        p.kind = "membership";
        p.ranks = outside;
        p.message = group_text(static_cast<int>(g)) + ": " + who(outside) + " " + verb(outside, "list") + " it but " + (outside.size() == 1 ? "is" : "are") + " not among its ranks";
        for (int64_t r : outside) blame(r, "lists " + group_text(static_cast<int>(g)) + " without being a member");
        add(std::move(p), static_cast<int>(g));
      }
    }
  }

  void check_missing_dumps() {
    std::set<int64_t> expected;
    for (const auto& G : groups_) expected.insert(G.ranks.begin(), G.ranks.end());
    for (const auto& [r, rs] : ranks_) expected.erase(r);
    if (expected.empty()) return;
    Problem p;
    p.kind = "missing-dump";
    p.ranks.assign(expected.begin(), expected.end());
    p.message = "no dump from " + who(p.ranks) + " (members of the groups the dumps list): what they issued is unknown";
    missing_.insert(expected.begin(), expected.end());
    add(std::move(p), -1);
  }

  void assign_entries() {
    members_.resize(groups_.size());
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      for (int64_t r : groups_[g].ranks) members_[g].push_back(Member{r, dumped(r), {}, {}});
    }
    for (auto& [r, rs] : ranks_) {
      std::map<std::string, int64_t> unknown;
      for (const Entry& e : rs.dump->entries) {
        auto it = rs.gid_of.find(e.group);
        if (it == rs.gid_of.end()) {
          ++unknown[e.group];
          continue;
        }
        const int g = it->second;
        if (!rs.blocking && e.state != EntryState::kCompleted) {
          rs.blocking = &e;
          rs.blocking_gid = g;
        }
        Member* m = member(g, r);
        if (!m) continue;  // reported as membership
        if (e.is_p2p) {
          if (e.op == "send" || e.op == "recv") m->p2p.push_back(&e);
          continue;
        }
        if (m->bundles.empty() || m->bundles.back().first != e.collective_seq_id) m->bundles.push_back({e.collective_seq_id, {}});
        m->bundles.back().second.push_back(&e);
      }
      for (const auto& [name, n] : unknown) {
        Problem p;
        p.kind = "unknown-group";
        p.ranks = {r};
        p.message = "rank " + std::to_string(r) + " has " + std::to_string(n) + " records on group '" + name.substr(0, 60) +
                    "', which its pg_config does not list: they are not checked";
        add(std::move(p), -1);
      }
    }
  }

  Member* member(int g, int64_t r) {
    auto& ms = members_[g];
    auto it = std::lower_bound(ms.begin(), ms.end(), r, [](const Member& m, int64_t x) { return m.rank < x; });
    return it != ms.end() && it->rank == r ? &*it : nullptr;
  }

  // never_issued: whether member m certainly never issued collective `seq` of its group: its
  // newest record of the group is older, or it holds none and its buffer never wrapped.
  bool never_issued(const Member& m, int64_t seq) const {
    if (!m.dumped) return false;
    if (m.bundles.empty()) return !ranks_.at(m.rank).wrapped;
    return seq > m.bundles.back().first;
  }

  void check_collectives(int g) {
    if (conflicted_.count(g)) return;
    auto& ms = members_[g];
    const int64_t n = static_cast<int64_t>(ms.size());
    // Every cost here is in the records (and the problems found), never in members x sequence
    // ids: a group of 10^6 ranks of which one dumped is walked over that one dump's records.
    std::vector<int64_t> seqs;
    std::vector<std::size_t> dumped;  // members with a dump
    for (std::size_t i = 0; i < ms.size(); ++i) {
      if (!ms[i].dumped) continue;
      dumped.push_back(i);
      for (const auto& b : ms[i].bundles) seqs.push_back(b.first);
    }
    std::sort(seqs.begin(), seqs.end());
    seqs.erase(std::unique(seqs.begin(), seqs.end()), seqs.end());
    const auto pos = [&](int64_t s) { return static_cast<std::size_t>(std::lower_bound(seqs.begin(), seqs.end(), s) - seqs.begin()); };
    // Per sequence id: the members holding it (in member order), those that never issued it
    // (each member once, at the first id past its newest record that it does not hold), and
    // those with a gap there inside what their buffers hold. A member's bundles are taken in
    // record order while their ids increase (a record whose id goes back is not matched).
    std::vector<std::vector<std::pair<int64_t, const std::vector<const Entry*>*>>> present_at(seqs.size());
    std::vector<std::vector<int64_t>> never_at(seqs.size()), absent_at(seqs.size());
    std::vector<int64_t> unknown;
    for (std::size_t i : dumped) {
      const Member& m = ms[i];
      if (m.bundles.empty()) {
        if (!seqs.empty()) {
          if (ranks_.at(m.rank).wrapped) unknown.push_back(m.rank);
          else never_at[0].push_back(m.rank);
        }
        continue;
      }
      std::vector<std::size_t> held;  // positions in seqs, increasing
      for (const auto& b : m.bundles) {
        const std::size_t at = pos(b.first);
        if (!held.empty() && at <= held.back()) continue;
        held.push_back(at);
        present_at[at].push_back({m.rank, &b.second});
      }
      const int64_t first = m.bundles.front().first, last = m.bundles.back().first;
      // never: the first id past `last` it does not hold.
      for (std::size_t at = static_cast<std::size_t>(std::upper_bound(seqs.begin(), seqs.end(), last) - seqs.begin());
           at < seqs.size(); ++at) {
        if (!std::binary_search(held.begin(), held.end(), at)) {
          never_at[at].push_back(m.rank);
          break;
        }
      }
      // absent: ids in (first, last] it does not hold, walked between the ids it holds.
      const std::size_t lo = static_cast<std::size_t>(std::upper_bound(seqs.begin(), seqs.end(), first) - seqs.begin());
      const std::size_t hi = static_cast<std::size_t>(std::upper_bound(seqs.begin(), seqs.end(), last) - seqs.begin());
      std::size_t at = lo;
      for (std::size_t h : held) {
        if (h < lo) continue;
        if (h >= hi) break;
        for (; at < h; ++at) absent_at[at].push_back(m.rank);
        at = h + 1;
      }
      for (; at < hi; ++at) absent_at[at].push_back(m.rank);
    }
    if (!unknown.empty()) {
      report_.notes.push_back(group_text(g) + ": " + who(unknown) +
                              " hold no record of it in their wrapped ring buffers: whether they issued its collectives is unknown");
    }
    for (std::size_t at = 0; at < seqs.size(); ++at) {
      const int64_t s = seqs[at];
      ++report_.collectives_checked;
      const auto& present = present_at[at];
      const std::vector<int64_t>& never = never_at[at];
      const std::vector<int64_t>& absent = absent_at[at];
      if (present.empty()) continue;
      const Entry& ref = *present.front().second->front();
      // Agreement: the ranks against the majority.
      std::map<std::string, std::vector<std::size_t>> variants;
      for (std::size_t k = 0; k < present.size(); ++k) variants[signature(*present[k].second)].push_back(k);
      if (variants.size() > 1) mismatch(g, s, present, variants);
      // Each variant's own rules (once per variant, naming its ranks).
      for (const auto& [sig, idx] : variants) {
        const auto& bundle = *present[idx.front()].second;
        for (const Entry* e : bundle) {
          auto [kind, why] = own_rule(*e, n);
          if (kind.empty()) continue;
          Problem p;
          p.kind = kind;
          p.seq = s;
          for (std::size_t k : idx) p.ranks.push_back(present[k].first);
          p.message = group_text(g) + " #" + std::to_string(s) + ": " + who(p.ranks) + " issued " + entry_text(*e) +
                      ": " + why;
          for (int64_t r : p.ranks) blame(r, kind + " rule broken at " + group_text(g) + " #" + std::to_string(s));
          add(std::move(p), g);
          break;
        }
      }
      // An all_to_all moves every element it sends: over the whole group the inputs total what
      // the outputs do (the records hold each rank's totals, not its splits). Named: the ranks
      // whose own input and output differ, when they are fewer than the rest (an even exchange
      // where one rank's splits went wrong); otherwise the group, with no one blamed.
      if (variants.size() == 1 && static_cast<int64_t>(present.size()) == n && present.front().second->size() == 1 &&
          (ref.op.rfind("all_to_all", 0) == 0 || ref.op.rfind("alltoall", 0) == 0)) {
        int64_t in = 0, out = 0;
        bool known = true;
        std::vector<int64_t> odd;
        for (const auto& [r, b] : present) {
          const int64_t i = numel(b->front()->input_sizes), o = numel(b->front()->output_sizes);
          if (i < 0 || o < 0 || in > INT64_MAX - i || out > INT64_MAX - o) {
            known = false;
            break;
          }
          in += i;
          out += o;
          if (i != o) odd.push_back(r);
        }
        if (known && in != out) {
          Problem p;
          p.kind = "size";
          p.seq = s;
          const bool blame_odd = !odd.empty() && 2 * odd.size() < present.size();
          if (blame_odd) {
            p.ranks = odd;
          } else {
            for (const auto& pr : present) p.ranks.push_back(pr.first);
          }
          p.message = group_text(g) + " #" + std::to_string(s) + " " + ref.profiling_name.substr(0, 60) + ": its inputs total " +
                      std::to_string(in) + " elements over the group but its outputs " + std::to_string(out) +
                      (blame_odd ? "; " + who(odd) + " " + (odd.size() == 1 ? "sends" : "send") +
                                       " a different count than " + (odd.size() == 1 ? "it receives" : "they receive") +
                                       " while every other rank sends what it receives"
                                 : "");
          if (blame_odd) {
            for (int64_t r : odd) blame(r, "all_to_all sizes at " + group_text(g) + " #" + std::to_string(s));
          }
          add(std::move(p), g);
        }
      }
      // State: completed on some members, not on others.
      std::vector<int64_t> done, pending;
      for (const auto& [r, b] : present) {
        const bool all_done = std::all_of(b->begin(), b->end(), [](const Entry* e) { return e->state == EntryState::kCompleted; });
        (all_done ? done : pending).push_back(r);
      }
      if (!done.empty() && !pending.empty() && never.empty()) {
        Problem p;
        p.kind = "state";
        p.seq = s;
        p.ranks = pending;
        p.message = group_text(g) + " #" + std::to_string(s) + " " + ref.profiling_name.substr(0, 60) + ": " +
                    who(done) + " completed it while " + who(pending) + (pending.size() == 1 ? " has it " : " have it ") +
                    state_name(ranks_pending_state(present)) + "";
        add(std::move(p), g);
      }
      if (!never.empty()) {
        Problem p;
        p.kind = "never-issued";
        p.seq = s;
        p.ranks = never;
        std::string newest;
        if (never.size() == 1) {
          const Member* m = member(g, never.front());
          newest = m->bundles.empty() ? " (it holds no record of this group)"
                                      : " (its newest record of this group: #" + std::to_string(m->bundles.back().first) + " " +
                                            entry_text(*m->bundles.back().second.back()) + ")";
        }
        p.message = group_text(g) + " #" + std::to_string(s) + " " + entry_text(ref) + " (rank " +
                    std::to_string(present.front().first) + "): " + who(never) + " never issued it" + newest + "; " +
                    (pending.empty() ? who(done) + " completed it"
                                     : counted(pending, 16) + " " + verb(pending, "wait") + " in it");
        add(std::move(p), g);
        for (int64_t r : never) never_[{g, s}].push_back(r);
      }
      if (!absent.empty()) {
        Problem p;
        p.kind = "absent";
        p.seq = s;
        p.ranks = absent;
        p.message = group_text(g) + " #" + std::to_string(s) + " " + entry_text(ref) + ": " + who(absent) +
                    " hold records of this group before and after it but none of it";
        for (int64_t r : absent) blame(r, "skipped " + group_text(g) + " #" + std::to_string(s));
        add(std::move(p), g);
      }
    }
  }

  static EntryState ranks_pending_state(const std::vector<std::pair<int64_t, const std::vector<const Entry*>*>>& present) {
    EntryState st = EntryState::kCompleted;
    for (const auto& [r, b] : present) {
      for (const Entry* e : *b) {
        if (e->state != EntryState::kCompleted) st = std::min(st, e->state);
      }
    }
    return st;
  }

  void mismatch(int g, int64_t s, const std::vector<std::pair<int64_t, const std::vector<const Entry*>*>>& present,
                const std::map<std::string, std::vector<std::size_t>>& variants) {
    // The majority variant; on a tie no side is the odd one out and every side is named.
    std::size_t best = 0, best_count = 0;
    bool tie = false;
    std::vector<const std::vector<std::size_t>*> vs;
    for (const auto& [sig, idx] : variants) vs.push_back(&idx);
    for (std::size_t k = 0; k < vs.size(); ++k) {
      if (vs[k]->size() > best_count) {
        best = k;
        best_count = vs[k]->size();
        tie = false;
      } else if (vs[k]->size() == best_count) {
        tie = true;
      }
    }
    const auto& major = *vs[best];
    const auto& mb = *present[major.front()].second;
    std::vector<int64_t> major_ranks;
    for (std::size_t k : major) major_ranks.push_back(present[k].first);
    std::sort(major_ranks.begin(), major_ranks.end());
    for (std::size_t k = 0; k < vs.size(); ++k) {
      if (k == best) continue;
      const auto& ob = *present[vs[k]->front()].second;
      // The first entry that differs, and how.
      std::string kind = "type";
      std::size_t at = 0;
      if (ob.size() == mb.size()) {
        for (at = 0; at < ob.size(); ++at) {
          if (signature({ob[at]}) != signature({mb[at]})) break;
        }
        if (at == ob.size()) at = 0;
        const Entry& x = *ob[at];
        const Entry& y = *mb[at];
        if (x.op != y.op) kind = "type";
        else if (dtypes_text(x.input_dtypes) != dtypes_text(y.input_dtypes) || dtypes_text(x.output_dtypes) != dtypes_text(y.output_dtypes)) kind = "dtype";
        else kind = "size";
      }
      Problem p;
      p.kind = kind;
      p.seq = s;
      for (std::size_t i : *vs[k]) p.ranks.push_back(present[i].first);
      std::sort(p.ranks.begin(), p.ranks.end());
      auto block = [](const std::vector<const Entry*>& b) {
        std::string names;
        for (std::size_t k = 0; k < b.size() && k < 8; ++k) names += (k ? ", " : "") + b[k]->profiling_name.substr(0, 60);
        return "a coalesced block of " + std::to_string(b.size()) + " (" + names + (b.size() > 8 ? ", ..." : "") + ", record " +
               std::to_string(b.front()->record_id) + ")";
      };
      std::string mine, theirs;
      if (ob.size() != mb.size()) {
        mine = ob.size() == 1 ? entry_text(*ob.front()) : block(ob);
        theirs = mb.size() == 1 ? entry_text(*mb.front()) : block(mb);
      } else {
        const std::string op = mb.size() > 1 ? " (op " + std::to_string(at + 1) + " of a coalesced block of " + std::to_string(mb.size()) + ")" : "";
        mine = entry_text(*ob[at]) + op;
        theirs = entry_text(*mb[at]) + op;
      }
      p.message = group_text(g) + " #" + std::to_string(s) + ": " + (tie ? "no majority: " : "") + who(p.ranks) + " issued " + mine +
                  " where " + counted(major_ranks, 16) + " issued " + theirs + " (rank " + std::to_string(major_ranks.front()) + ")";
      for (int64_t r : p.ranks) blame(r, std::string(tie ? "one side of " : "the odd one out of ") + group_text(g) + " #" + std::to_string(s) + " (" + kind + ")");
      if (tie) {
        for (int64_t r : major_ranks) blame(r, "one side of " + group_text(g) + " #" + std::to_string(s) + " (" + kind + ")");
      }
      mismatched_.insert({g, s});
      add(std::move(p), g);
    }
  }

  void check_p2p(int g) {
    if (conflicted_.count(g)) return;
    auto& ms = members_[g];
    const int64_t n = static_cast<int64_t>(ms.size());
    // (src, dst) global ranks -> that pair's sends (at src) and receives (at dst), in order.
    std::map<std::pair<int64_t, int64_t>, std::pair<std::vector<const Entry*>, std::vector<const Entry*>>> pairs;
    for (std::size_t i = 0; i < ms.size(); ++i) {
      for (const Entry* e : ms[i].p2p) {
        const int64_t self = e->op == "send" ? e->src : e->dst;
        const int64_t peer = e->op == "send" ? e->dst : e->src;
        if (self != static_cast<int64_t>(i) || peer >= n) {
          Problem p;
          p.kind = "p2p";
          p.ranks = {ms[i].rank};
          p.message = group_text(g) + ": rank " + std::to_string(ms[i].rank) + " (group rank " + std::to_string(i) + ") recorded " +
                      entry_text(*e) + ", which names " +
                      (self != static_cast<int64_t>(i) ? "group rank " + std::to_string(self) + " as itself"
                                                       : "group rank " + std::to_string(peer) + ", outside a group of " + std::to_string(n));
          blame(ms[i].rank, "recorded a send/recv naming the wrong group ranks in " + group_text(g));
          add(std::move(p), g);
          continue;
        }
        const int64_t pg = ms[peer].rank;
        peer_of_[e] = pg;
        if (e->op == "send") pairs[{ms[i].rank, pg}].first.push_back(e);
        else pairs[{pg, ms[i].rank}].second.push_back(e);
      }
    }
    for (auto& [key, sr] : pairs) {
      const auto [src, dst] = key;
      if (!dumped(src) || !dumped(dst)) continue;
      const auto& sends = sr.first;
      const auto& recvs = sr.second;
      const bool exact = !ranks_.at(src).wrapped && !ranks_.at(dst).wrapped;
      const std::string pair_text = "rank " + std::to_string(src) + " -> rank " + std::to_string(dst);
      auto compare = [&](const Entry& s, const Entry& r, std::size_t k, const std::string& index) {
        ++report_.p2p_checked;
        if (s.input_sizes == r.output_sizes && dtypes_text(s.input_dtypes) == dtypes_text(r.output_dtypes)) return;
        Problem p;
        p.kind = "p2p";
        p.seq = static_cast<int64_t>(k);
        p.ranks = {src, dst};
        p.message = group_text(g) + ": " + pair_text + " send " + index + " " + entry_text(s) + " meets receive " + entry_text(r) +
                    ": " + (s.input_sizes != r.output_sizes ? "sizes" : "dtypes") + " differ";
        blame(src, "its send " + index + " to rank " + std::to_string(dst) + " does not fit the receive");
        blame(dst, "its receive " + index + " from rank " + std::to_string(src) + " does not fit the send");
        add(std::move(p), g);
      };
      if (exact) {
        const std::size_t both = std::min(sends.size(), recvs.size());
        for (std::size_t k = 0; k < both; ++k) compare(*sends[k], *recvs[k], k, "#" + std::to_string(k));
        if (sends.size() != recvs.size()) {
          const bool more_sends = sends.size() > recvs.size();
          const Entry& e = more_sends ? *sends[recvs.size()] : *recvs[sends.size()];
          Problem p;
          p.kind = "unmatched-p2p";
          p.seq = static_cast<int64_t>(std::min(sends.size(), recvs.size()));
          p.ranks = {more_sends ? dst : src};
          p.message = group_text(g) + ": " + pair_text + ": " +
                      (more_sends ? "send #" + std::to_string(recvs.size()) + " " + entry_text(e) + " has no receive at rank " +
                                        std::to_string(dst) + " (it posted " + std::to_string(recvs.size()) + ")"
                                  : "receive #" + std::to_string(sends.size()) + " " + entry_text(e) + " has no send at rank " +
                                        std::to_string(src) + " (it posted " + std::to_string(sends.size()) + ")");
          add(std::move(p), g);
          unmatched_[&e] = more_sends ? dst : src;
        }
      } else {
        // A wrapped buffer drops the oldest records, so the pair's counts say nothing. Pending
        // ones: a pending send with no pending receive at its peer (whose newest records are
        // kept) was never met, and the other way round. Completed ones are paired from the
        // newest back (a completed send met its receive, in order).
        auto pending = [](const std::vector<const Entry*>& v) {
          return std::count_if(v.begin(), v.end(), [](const Entry* e) { return e->state != EntryState::kCompleted; });
        };
        const auto ps = pending(sends), pr = pending(recvs);
        std::vector<const Entry*> cs, cr;
        for (const Entry* e : sends) if (e->state == EntryState::kCompleted) cs.push_back(e);
        for (const Entry* e : recvs) if (e->state == EntryState::kCompleted) cr.push_back(e);
        for (std::size_t k = 1; k <= std::min(cs.size(), cr.size()); ++k) {
          compare(*cs[cs.size() - k], *cr[cr.size() - k], k, "(completed, " + std::to_string(k) + " back from the newest; buffers wrapped)");
        }
        if ((ps > 0) != (pr > 0)) {
          const bool send_waits = ps > 0;
          const auto& v = send_waits ? sends : recvs;
          const Entry* e = *std::find_if(v.begin(), v.end(), [](const Entry* x) { return x->state != EntryState::kCompleted; });
          Problem p;
          p.kind = "unmatched-p2p";
          p.ranks = {send_waits ? dst : src};
          p.message = group_text(g) + ": " + pair_text + ": " + (send_waits ? "the send " : "the receive ") + entry_text(*e) +
                      " waits, and rank " + std::to_string(send_waits ? dst : src) + " has no pending " +
                      (send_waits ? "receive from rank " + std::to_string(src) : "send to rank " + std::to_string(dst));
          add(std::move(p), g);
          unmatched_[e] = send_waits ? dst : src;
        }
      }
    }
  }

  // follow_waits: every rank's oldest pending record is what it waits in; the members that never
  // issued it (or the peer that never met it) hold it up. Following these waits ends at ranks
  // that wait in nothing (the roots: culprits), at ranks without a dump, or in a cycle.
  // follow_waits: who each waiting rank waits on, the ranks at the end of those waits (the
  // roots that hold everyone up) and cycles of waits. Linear in the waits and the roots reached:
  // the blockers of a (group, sequence id) are found once, a group's members without dumps are
  // one node when there are many, cycles are found by an iterative Tarjan (no recursion), and
  // each strongly connected part's roots are computed once, sinks first. Past kMaxWaitWork the
  // rest is not followed and a note says so.
  void follow_waits() {
    constexpr std::size_t kMaxWaitWork = std::size_t{1} << 25;
    constexpr std::size_t kMaxMissingListed = 64;  // missing members named one by one
    std::size_t work = 0;
    bool cut = false;
    // A waiting rank -> the nodes it waits on: a (group, seq)'s list is found once and shared by
    // every rank waiting there (20,000 ranks waiting on 20,000 others share one list, not copies).
    std::map<int64_t, const std::vector<int64_t>*> blockers;
    std::map<int64_t, std::vector<int64_t>> own;  // a p2p wait's one peer, or none
    std::map<int64_t, std::string> waits_in;
    std::map<int64_t, int> missing_group;  // a pseudo node (< 0) -> the group whose missing members it stands for
    std::map<std::pair<int, int64_t>, std::vector<int64_t>> cached;
    std::vector<std::vector<std::pair<int64_t, int64_t>>> by_last(groups_.size());  // (newest seq, rank), sorted
    std::vector<char> by_last_built(groups_.size(), 0);
    auto blockers_of = [&](int g, int64_t s) -> const std::vector<int64_t>& {
      auto [it, fresh] = cached.try_emplace({g, s});
      if (!fresh) return it->second;
      auto& b = it->second;
      if (auto nv = never_.find({g, s}); nv != never_.end()) b = nv->second;
      if (!by_last_built[g]) {
        by_last_built[g] = 1;
        std::vector<int64_t> missing;
        for (const Member& m : members_[g]) {
          if (!m.dumped) missing.push_back(m.rank);
          else if (!m.bundles.empty()) by_last[g].push_back({m.bundles.back().first, m.rank});
          else if (!ranks_.at(m.rank).wrapped) by_last[g].push_back({INT64_MIN, m.rank});
        }
        std::sort(by_last[g].begin(), by_last[g].end());
        work += members_[g].size();
        if (missing.size() > kMaxMissingListed) {
          const int64_t pseudo = -1 - static_cast<int64_t>(g);
          missing_group[pseudo] = g;
          missing_of_[g] = std::move(missing);
        } else {
          missing_of_[g] = std::move(missing);
        }
      }
      for (const auto& [last, r] : by_last[g]) {
        if (last >= s) break;
        b.push_back(r);
      }
      const auto& missing = missing_of_[g];
      if (missing.size() > kMaxMissingListed) b.push_back(-1 - static_cast<int64_t>(g));
      else b.insert(b.end(), missing.begin(), missing.end());
      std::sort(b.begin(), b.end());
      b.erase(std::unique(b.begin(), b.end()), b.end());
      work += b.size();
      return b;
    };
    for (auto& [r, rs] : ranks_) {
      if (!rs.blocking) continue;
      const Entry& e = *rs.blocking;
      const int g = rs.blocking_gid;
      auto& b = own[r];
      blockers[r] = &b;
      waits_in[r] = group_text(g) + " " + (e.is_p2p ? "" : "#" + std::to_string(e.collective_seq_id) + " ") + e.profiling_name.substr(0, 60);
      if (e.is_p2p) {
        // A batched p2p block (batch_isend_irecv: its records share a p2p_seq_id, then
        // "coalesced") completes as one, so the rank waits on every peer that left one of the
        // block's operations unmet, not only on its oldest record's peer.
        const auto& entries = rs.dump->entries;
        for (std::size_t k = static_cast<std::size_t>(&e - entries.data()); k < entries.size(); ++k) {
          const Entry& x = entries[k];
          if (!x.is_p2p || x.group != e.group || x.p2p_seq_id != e.p2p_seq_id) break;
          if (auto it = unmatched_.find(&x); it != unmatched_.end()) b.push_back(it->second);
        }
        std::sort(b.begin(), b.end());
        b.erase(std::unique(b.begin(), b.end()), b.end());
        continue;
      }
      if (work > kMaxWaitWork) {
        cut = true;
        continue;
      }
      blockers[r] = &blockers_of(g, e.collective_seq_id);
    }
    // A rank in a p2p block whose operations all met theirs still waits when a peer's block
    // cannot finish: it waits on each pending peer that waits on someone, found outward from the
    // ranks with unmet operations (so every such edge points at a rank found before it, and
    // no cycle is made of blocks that merely wait together; a block in flight with every
    // operation met waits on no one).
    {
      std::unordered_map<int64_t, std::vector<int64_t>> waited_by;  // pending peer -> p2p ranks waiting with it
      std::deque<int64_t> found;
      std::unordered_set<int64_t> in;
      for (auto& [r, rs] : ranks_) {
        if (!rs.blocking || !rs.blocking->is_p2p) continue;
        if (!own[r].empty()) {
          found.push_back(r);
          in.insert(r);
          continue;
        }
        const auto& entries = rs.dump->entries;
        const Entry& e = *rs.blocking;
        for (std::size_t k = static_cast<std::size_t>(&e - entries.data()); k < entries.size(); ++k) {
          const Entry& x = entries[k];
          if (!x.is_p2p || x.group != e.group || x.p2p_seq_id != e.p2p_seq_id) break;
          if (x.state == EntryState::kCompleted) continue;
          if (auto it = peer_of_.find(&x); it != peer_of_.end() && it->second != r) waited_by[it->second].push_back(r);
        }
      }
      while (!found.empty()) {
        const int64_t x = found.front();
        found.pop_front();
        auto it = waited_by.find(x);
        if (it == waited_by.end()) continue;
        for (int64_t r : it->second) {
          if (!in.insert(r).second) continue;
          own[r].push_back(x);
          found.push_back(r);
        }
        work += it->second.size();
      }
    }
    // Every edge is walked below (the search, the roots): their number is bounded too.
    std::size_t edges = 0;
    for (const auto& [r, b] : blockers) edges += b->size();
    if (edges > kMaxWaitWork) cut = true;
    auto waits = [&](int64_t x) {
      auto it = blockers.find(x);
      return it != blockers.end() && !it->second->empty();
    };
    std::vector<int64_t> stuck;
    for (const auto& [r, b] : blockers) {
      if (b->empty()) stuck.push_back(r);
    }
    if (cut) stuck.clear();  // blockers left unfound are not "every member issued it"
    // Strongly connected parts of the waits (iterative Tarjan), in the order they close: each
    // after every part it waits on.
    std::unordered_map<int64_t, int64_t> index, low;
    std::unordered_map<int64_t, std::size_t> part_of;
    std::vector<std::vector<int64_t>> parts;
    std::vector<int64_t> stack;
    std::unordered_map<int64_t, char> on;
    int64_t counter = 0;
    for (const auto& [start, unused] : blockers) {
      if (cut) break;
      if (!waits(start) || index.count(start)) continue;
      std::vector<std::pair<int64_t, std::size_t>> frames{{start, 0}};
      index[start] = low[start] = counter++;
      stack.push_back(start);
      on[start] = 1;
      while (!frames.empty()) {
        auto& [v, next] = frames.back();
        const auto& bv = *blockers.at(v);
        if (next < bv.size()) {
          const int64_t w = bv[next++];
          if (!waits(w)) continue;
          if (!index.count(w)) {
            index[w] = low[w] = counter++;
            stack.push_back(w);
            on[w] = 1;
            frames.push_back({w, 0});
          } else if (on[w]) {
            low[v] = std::min(low[v], index[w]);
          }
          continue;
        }
        if (low[v] == index[v]) {
          std::vector<int64_t> part;
          int64_t w;
          do {
            w = stack.back();
            stack.pop_back();
            on[w] = 0;
            part.push_back(w);
            part_of[w] = parts.size();
          } while (w != v);
          std::sort(part.begin(), part.end());
          parts.push_back(std::move(part));
        }
        const int64_t done = v;
        frames.pop_back();
        if (!frames.empty()) low[frames.back().first] = std::min(low[frames.back().first], low[done]);
      }
    }
    // Each part's roots: what its waits reach that waits in nothing.
    std::vector<std::vector<int64_t>> roots(parts.size());
    for (std::size_t k = 0; k < parts.size() && !cut; ++k) {
      std::vector<int64_t> rs;
      for (int64_t v : parts[k]) {
        for (int64_t w : *blockers.at(v)) {
          if (!waits(w)) {
            rs.push_back(w);
          } else if (part_of[w] != k) {
            const auto& more = roots[part_of[w]];
            rs.insert(rs.end(), more.begin(), more.end());
            work += more.size();
          }
        }
      }
      std::sort(rs.begin(), rs.end());
      rs.erase(std::unique(rs.begin(), rs.end()), rs.end());
      roots[k] = std::move(rs);
      if (work > kMaxWaitWork) cut = true;
    }
    std::map<int64_t, std::vector<int64_t>> held_up;  // root -> ranks whose waits lead to it
    for (std::size_t k = 0; k < parts.size() && !cut; ++k) {
      for (int64_t root : roots[k]) {
        auto& h = held_up[root];
        h.insert(h.end(), parts[k].begin(), parts[k].end());
        work += parts[k].size();
      }
      if (work > kMaxWaitWork) cut = true;
    }
    if (cut) {
      held_up.clear();
      report_.notes.push_back(std::to_string(blockers.size()) + " ranks wait: their waits are too many to follow (over " +
                              std::to_string(kMaxWaitWork) + " steps), so no culprit is named from them");
    }
    // What a rank never issued that others wait in, and the p2p records that wait for it.
    std::unordered_map<int64_t, std::string> never_what, p2p_what;
    for (const auto& [key, never] : never_) {
      for (int64_t r : never) never_what.try_emplace(r, group_text(key.first) + " #" + std::to_string(key.second));
    }
    for (const auto& [e, peer] : unmatched_) {
      p2p_what.try_emplace(peer, std::string(e->op == "recv" ? "the send that " : "the receive that ") + e->profiling_name.substr(0, 60) +
                                     " (record " + std::to_string(e->record_id) + ") waits for");
    }
    for (auto& [root, rs] : held_up) {
      std::sort(rs.begin(), rs.end());
      if (auto pseudo = missing_group.find(root); pseudo != missing_group.end()) {
        const auto& missing = missing_of_[pseudo->second];
        report_.notes.push_back(group_text(pseudo->second) + ": " + counted(rs, 8) + " " + verb(rs, "wait") + " on its " +
                                std::to_string(missing.size()) + " members without dumps (" + format_ranks(missing, 8) +
                                "); each may be the one that holds them up");
        continue;
      }
      if (missing_.count(root)) {
        blame(root, "no dump; " + counted(rs, 8) + " " + verb(rs, "wait") + " on it");
        continue;
      }
      std::string what;
      if (auto it = never_what.find(root); it != never_what.end()) what = it->second;
      else if (auto jt = p2p_what.find(root); jt != p2p_what.end()) what = jt->second;
      const RankState& rs_root = ranks_.at(root);
      if (rs_root.blocking) {
        // It waits itself, in a collective every member with a dump issued: stuck inside it.
        const Entry& e = *rs_root.blocking;
        blame(root, "never issued " + (what.empty() ? std::string("what others wait in") : what) + ", which " +
                        counted(rs, 8) + " " + verb(rs, "wait") + " on; it is stuck in " + group_text(rs_root.blocking_gid) +
                        (e.is_p2p ? " " : " #" + std::to_string(e.collective_seq_id) + " ") + entry_text(e) +
                        ", which every member with a dump issued");
        continue;
      }
      const Dump& d = *rs_root.dump;
      blame(root, "never issued " + (what.empty() ? std::string("what others wait in") : what) + ", which " +
                      counted(rs, 8) + " " + verb(rs, "wait") + " on; it waits in nothing itself" +
                      (d.entries.empty() ? " (its dump holds no records)" : " (newest record: " + entry_text(d.entries.back()) + ")"));
    }
    // Cycles of waits: a part of more than one rank, or one that waits on itself.
    for (const auto& part : parts) {
      const auto& bv = *blockers.at(part.front());
      if (part.size() == 1 && std::find(bv.begin(), bv.end(), part.front()) == bv.end()) continue;
      Problem p;
      p.kind = "wait-cycle";
      p.ranks = part;
      std::string text;
      for (std::size_t k = 0; k < part.size() && k < 8; ++k) {
        text += (k ? "; " : "") + ("rank " + std::to_string(part[k]) + " waits in " + waits_in[part[k]]);
      }
      p.message = who(part) + " wait on each other (each waits in what another never issued): " + text;
      for (int64_t r : part) blame(r, "in a cycle of waits: " + waits_in[r]);
      add(std::move(p), -1);
    }
    // Ranks that wait in a collective every member issued (and no mismatch explains): in a dump
    // taken while the job ran this is the collective in flight, so it is a note, not a failure.
    std::map<std::pair<int, int64_t>, std::vector<int64_t>> stuck_in;
    for (int64_t r : stuck) {
      const RankState& rs = ranks_.at(r);
      if (rs.blocking->is_p2p) continue;
      const std::pair<int, int64_t> key{rs.blocking_gid, rs.blocking->collective_seq_id};
      if (!mismatched_.count(key)) stuck_in[key].push_back(r);
    }
    for (const auto& [key, rs] : stuck_in) {
      report_.notes.push_back(group_text(key.first) + " #" + std::to_string(key.second) + " " +
                              ranks_.at(rs.front()).blocking->profiling_name.substr(0, 60) + ": " + who(rs, 16) + " " + verb(rs, "wait") +
                              " in it and every member with a dump issued it (in flight when the dumps were taken, or "
                              "held up inside: the network, or a rank that stopped in it)");
    }
  }

  void finish() {
    // One line for a problem that repeats over consecutive collectives of a group.
    std::vector<Problem> merged;
    std::map<std::tuple<std::string, std::string, const std::vector<int64_t>*, std::vector<int64_t>>, std::size_t> last;
    for (auto& p : report_.problems) {
      auto key = std::make_tuple(p.kind, p.group, p.group_ranks.get(), p.ranks);
      auto it = last.find(key);
      if (p.seq >= 0 && it != last.end() && merged[it->second].seq >= 0 &&
          p.seq > std::max(merged[it->second].seq, merged[it->second].last_seq) && p.kind != "never-issued" && p.kind != "p2p" &&
          p.kind != "unmatched-p2p") {
        Problem& q = merged[it->second];
        q.last_seq = p.seq;
        ++q.repeats;
        continue;
      }
      last[key] = merged.size();
      merged.push_back(std::move(p));
    }
    report_.problems = std::move(merged);
    for (const auto& [r, why] : culprits_) report_.culprits.push_back(Culprit{r, why});
    report_.ok = report_.problems.empty();
  }

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

}  // namespace

CheckReport check_dumps(const std::vector<Dump>& dumps) { return Checker(dumps).run(); }

std::string report_text(const CheckReport& r, const DumpSet& set) {
  std::ostringstream out;
  std::string formats, versions;
  std::set<std::string> fs, vs;
  for (const auto& d : set.dumps) {
    fs.insert(d.format);
    vs.insert(d.version);
  }
  for (const auto& f : fs) formats += (formats.empty() ? "" : "+") + f;
  for (const auto& v : vs) versions += (versions.empty() ? "" : ", ") + v.substr(0, 20);
  out << "meshsim trace check: " << r.dumps << " dumps in '" << set.dir << "' (prefix '" << set.prefix << "', " << formats
      << ", version " << versions << "): " << r.groups << " groups, " << r.entries << " records; " << r.collectives_checked
      << " collectives and " << r.p2p_checked << " send/recv pairs checked\n";
  for (const auto& p : r.problems) {
    out << "FAILED " << p.kind << ": " << p.message;
    if (p.repeats > 0) out << " (and the same at " << p.repeats << " more collectives, to #" << p.last_seq << ")";
    out << "\n";
  }
  for (const auto& c : r.culprits) out << "culprit: rank " << c.rank << ": " << c.why << "\n";
  for (const auto& n : r.notes) out << "note: " << n << "\n";
  if (r.ok) {
    out << "OK\n";
  } else {
    std::vector<int64_t> cs;
    for (const auto& c : r.culprits) cs.push_back(c.rank);
    out << "FAILED: " << r.problems.size() << (r.problems.size() == 1 ? " problem" : " problems")
        << (cs.empty() ? std::string() : "; culprits: " + who(cs)) << "\n";
  }
  return out.str();
}

nlohmann::json report_json(const CheckReport& r, const DumpSet& set) {
  nlohmann::json j;
  j["ok"] = r.ok;
  j["dir"] = set.dir;
  j["prefix"] = set.prefix;
  j["dumps"] = r.dumps;
  j["groups"] = r.groups;
  j["records"] = r.entries;
  j["collectives_checked"] = r.collectives_checked;
  j["p2p_checked"] = r.p2p_checked;
  auto& ps = j["problems"] = nlohmann::json::array();
  nlohmann::json lists = nlohmann::json::array();
  std::map<const std::vector<int64_t>*, std::size_t> listed;
  for (const auto& p : r.problems) {
    nlohmann::json q{{"kind", p.kind}, {"ranks", p.ranks}, {"message", p.message}};
    if (p.group_ranks) {
      // As the text report bounds it (a problem of a 10^6-rank group is not 10^6 ranks long);
      // every group's whole list is in "group_list", once.
      q["group"] = p.group;
      q["desc"] = p.desc;
      q["group_size"] = p.group_ranks->size();
      q["group_ranks"] = format_ranks(*p.group_ranks, 64);
      if (listed.emplace(p.group_ranks.get(), lists.size()).second) {
        lists.push_back({{"group", p.group}, {"desc", p.desc}, {"size", p.group_ranks->size()},
                         {"ranks", format_ranks(*p.group_ranks, SIZE_MAX)}});
      }
      q["group_list_index"] = listed.at(p.group_ranks.get());
    }
    if (p.seq >= 0) q["seq"] = p.seq;
    if (p.repeats > 0) {
      q["repeats"] = p.repeats;
      q["last_seq"] = p.last_seq;
    }
    ps.push_back(std::move(q));
  }
  j["group_list"] = std::move(lists);
  auto& cs = j["culprits"] = nlohmann::json::array();
  for (const auto& c : r.culprits) cs.push_back({{"rank", c.rank}, {"why", c.why}});
  j["notes"] = r.notes;
  return j;
}

}  // namespace meshsim::trace
