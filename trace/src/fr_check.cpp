// The cross-rank check of Flight Recorder dumps (fr_check.hpp): its run, the groups the dumps
// list (or imply) and their members, and the problems merged at the end.
#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "fr_checker.hpp"
#include "meshsim/error.hpp"
#include "meshsim/stop.hpp"

namespace meshsim::trace {
namespace detail {

Checker::Checker(const std::vector<Dump>& dumps, const CheckOptions& options) : options_(options) {
  for (const auto& d : dumps) {
    RankState& rs = ranks_[d.rank];
    rs.dump = &d;
    rs.wrapped = !d.entries.empty() && d.entries.front().record_id > 0;
    report_.entries += static_cast<int64_t>(d.entries.size());
  }
  report_.dumps = static_cast<int64_t>(dumps.size());
}

CheckReport Checker::run() {
  build_groups();
  check_group_names();
  check_membership();
  check_missing_dumps();
  assign_entries();
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    check_stop();
    check_collectives(static_cast<int>(g));
    check_p2p(static_cast<int>(g));
  }
  follow_waits();
  finish();
  return std::move(report_);
}

std::string Checker::group_text(int g) const {
  const Group& G = groups_[g];
  return "group '" + G.name.substr(0, 60) + "'" + (G.desc.empty() || G.desc == "undefined" ? "" : " (" + G.desc.substr(0, 60) + ")") +
         " ranks [" + format_rank_runs(G.ranks, 8) + "]";
}

void Checker::add(Problem p, int g) {
  if (g >= 0) {
    p.group = groups_[g].name;
    p.desc = groups_[g].desc;
    p.group_ranks = groups_[g].ranks.shared();
  }
  std::sort(p.ranks.begin(), p.ranks.end());
  report_.problems.push_back(std::move(p));
}

void Checker::blame(int64_t rank, const std::string& why) {
  auto& c = culprits_[rank];
  if (c.empty()) c = why;
}

void Checker::build_groups() {
  // A group is its name and its members: indexed by the dumps' own lists (shared by the readers:
  // one list, compared by identity, for a group every dump lists in the same words), ordered by
  // name, size, then bytes (any strict order serves an index; memcmp compares a long list at
  // memory speed).
  struct Key {
    std::string_view name;
    const RankList* ranks;
  };
  struct Less {
    bool operator()(const Key& a, const Key& b) const {
      if (a.name != b.name) return a.name < b.name;
      if (a.ranks->size() != b.ranks->size()) return a.ranks->size() < b.ranks->size();
      return !a.ranks->empty() && !a.ranks->same(*b.ranks) &&
             std::memcmp(a.ranks->data(), b.ranks->data(), a.ranks->size() * sizeof(int64_t)) < 0;
    }
  };
  std::map<Key, int, Less> index;
  bool unnamed = false;
  for (auto& [r, rs] : ranks_) {
    for (const auto& c : rs.dump->groups) {
      // PyTorch's Gloo backend registers its groups before they are named: its pg_config holds
      // one entry named '' (the last group registered), which no record names.
      if (c.name.empty() && c.desc.empty()) {
        unnamed = true;
        continue;
      }
      auto [it, fresh] = index.emplace(Key{c.name, &c.ranks}, static_cast<int>(groups_.size()));
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
void Checker::infer_unlisted_groups(bool unnamed) {
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
    std::vector<int64_t> members;
    if (whole) {
      for (int64_t r = 0; r < world; ++r) members.push_back(r);
    } else {
      members.assign(u.second.begin(), u.second.end());
    }
    G.ranks = RankList(std::move(members));
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

void Checker::check_group_names() {
  // A group some dumped member does not list (by its name, with its ranks) is incomplete; incomplete groups of the
  // same ranks are one group its members name differently (2.14's local-sync counter, say).
  std::map<std::vector<int64_t>, std::vector<int>> clusters;  // ranks -> incomplete groups
  std::vector<int> first_of;                                  // clusters in the groups' order
  std::map<int, std::vector<int64_t>> unnamed;                // group -> its dumped members without its name
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const Group& G = groups_[g];
    std::vector<int64_t> without;
    for (int64_t m : G.ranks) {
      auto it = ranks_.find(m);
      if (it == ranks_.end()) continue;
      auto named = it->second.gid_of.find(G.name);
      if (named == it->second.gid_of.end() || named->second != static_cast<int>(g)) without.push_back(m);
    }
    if (without.empty()) continue;
    unnamed[static_cast<int>(g)] = std::move(without);
    auto& c = clusters[G.ranks.get()];
    if (c.empty()) first_of.push_back(static_cast<int>(g));
    c.push_back(static_cast<int>(g));
  }
  for (int first : first_of) {
    const std::vector<int>& cluster = clusters.at(groups_[first].ranks.get());
    std::set<int64_t> named, without;
    std::string parts;
    for (int g : cluster) {
      const Group& G = groups_[g];
      named.insert(G.claimers.begin(), G.claimers.end());
      without.insert(unnamed[g].begin(), unnamed[g].end());
      parts += std::string(parts.empty() ? "" : ", ") + who(G.claimers, 16) + " as '" + G.name.substr(0, 60) + "'";
    }
    std::vector<int64_t> none;
    for (int64_t m : without) {
      if (!named.count(m)) none.push_back(m);
    }
    Problem p;
    p.kind = ProblemKind::kGroupName;
    p.ranks.assign(named.begin(), named.end());
    p.ranks.insert(p.ranks.end(), none.begin(), none.end());
    if (cluster.size() > 1) {
      p.message = group_text(first) + ": its members know it by different names: " + parts +
                  (none.empty() ? "" : ", and " + who(none, 16) + " by none") +
                  ": members that name one group differently rendezvous under different store prefixes and wait for each other forever";
    } else {
      // No member knows these ranks by another name: the lists disagree (a membership problem).
      p.kind = ProblemKind::kMembership;
      p.message = group_text(first) + ": " + who(groups_[first].claimers, 16) + " " + verb(groups_[first].claimers, "list") + " it but " +
                  who(none, 16) + ", " + (none.size() == 1 ? "a member, lists" : "members, list") + " no group of these ranks";
    }
    add(std::move(p), first);
  }
}

void Checker::check_membership() {
  // Groups of one name must not share a rank (split groups share a name, never a member);
  // one group's ranks must agree on its description; a rank must be in the groups it lists.
  std::map<std::string, std::unordered_map<int64_t, int>> owner;
  std::set<std::pair<int, int>> reported;
  std::map<int64_t, int> odd_desc;  // rank -> how odd its descriptions are
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const Group& G = groups_[g];
    auto& own = owner[G.name];
    for (int64_t m : G.ranks) {
      auto [it, fresh] = own.emplace(m, static_cast<int>(g));
      if (fresh || !reported.emplace(it->second, static_cast<int>(g)).second) continue;
      const Group& H = groups_[it->second];
      Problem p;
      p.kind = ProblemKind::kMembership;
      p.ranks = H.claimers;
      p.ranks.insert(p.ranks.end(), G.claimers.begin(), G.claimers.end());
      p.message = "group '" + G.name.substr(0, 60) + "': " + who(H.claimers) + " " + verb(H.claimers, "list") + " its ranks as [" +
                  format_rank_runs(H.ranks, 16) + "] but " + who(G.claimers) + " as [" + format_rank_runs(G.ranks, 16) +
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
      // Who is odd: a rank on a smaller side scores 2, one on a tied side 1 (summed over groups).
      std::size_t most = 0, at_most = 0;
      for (const auto& [desc, rs] : G.descs) most = std::max(most, rs.size());
      for (const auto& [desc, rs] : G.descs) at_most += rs.size() == most;
      for (const auto& [desc, rs] : G.descs) {
        if (rs.size() < most || at_most > 1) {
          for (int64_t r : rs) odd_desc[r] += rs.size() < most ? 2 : 1;
        }
      }
      Problem p;
      p.kind = ProblemKind::kMembership;
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
      p.kind = ProblemKind::kMembership;
      p.ranks = outside;
      p.message = group_text(static_cast<int>(g)) + ": " + who(outside) + " " + verb(outside, "list") + " it but " + (outside.size() == 1 ? "is" : "are") + " not among its ranks";
      for (int64_t r : outside) blame(r, "lists " + group_text(static_cast<int>(g)) + " without being a member");
      add(std::move(p), static_cast<int>(g));
    }
  }
  // The ranks most often on the odd side of a description disagreement (a rank that built its
  // mesh with another dim order calls every group it is in by another dim's name).
  int best = 0;
  for (const auto& [r, n] : odd_desc) best = std::max(best, n);
  if (best >= 2) {
    for (const auto& [r, n] : odd_desc) {
      if (n == best) blame(r, "it describes its groups unlike their other members (another mesh, or the mesh's dims in another order?)");
    }
  }
}

void Checker::check_missing_dumps() {
  std::set<int64_t> expected;
  for (const auto& G : groups_) expected.insert(G.ranks.begin(), G.ranks.end());
  for (const auto& [r, rs] : ranks_) expected.erase(r);
  if (expected.empty()) return;
  Problem p;
  p.kind = ProblemKind::kMissingDump;
  p.ranks.assign(expected.begin(), expected.end());
  p.message = "no dump from " + who(p.ranks) + " (members of the groups the dumps list): what they issued is unknown";
  missing_.insert(expected.begin(), expected.end());
  add(std::move(p), -1);
}

void Checker::assign_entries() {
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
      p.kind = ProblemKind::kUnknownGroup;
      p.ranks = {r};
      p.message = "rank " + std::to_string(r) + " has " + std::to_string(n) + " records on group '" + name.substr(0, 60) +
                  "', which its pg_config does not list: they are not checked";
      add(std::move(p), -1);
    }
  }
}

Member* Checker::member(int g, int64_t r) {
  auto& ms = members_[g];
  auto it = std::lower_bound(ms.begin(), ms.end(), r, [](const Member& m, int64_t x) { return m.rank < x; });
  return it != ms.end() && it->rank == r ? &*it : nullptr;
}

// never_issued: whether member m certainly never issued collective `seq` of its group: its
// newest record of the group is older, or it holds none and its buffer never wrapped.
bool Checker::never_issued(const Member& m, int64_t seq) const {
  if (!m.dumped) return false;
  if (m.bundles.empty()) return !ranks_.at(m.rank).wrapped;
  return seq > m.bundles.back().first;
}

void Checker::finish() {
  // One line for a problem that repeats over consecutive collectives of a group.
  std::vector<Problem> merged;
  std::map<std::tuple<ProblemKind, std::string, const std::vector<int64_t>*, std::vector<int64_t>>, std::size_t> last;
  for (auto& p : report_.problems) {
    auto key = std::make_tuple(p.kind, p.group, p.group_ranks.get(), p.ranks);
    auto it = last.find(key);
    if (p.seq >= 0 && it != last.end() && merged[it->second].seq >= 0 &&
        p.seq > std::max(merged[it->second].seq, merged[it->second].last_seq) && p.kind != ProblemKind::kNeverIssued && p.kind != ProblemKind::kP2p &&
        p.kind != ProblemKind::kUnmatchedP2p) {
      Problem& q = merged[it->second];
      q.last_seq = p.seq;
      ++q.repeats;
      continue;
    }
    last[key] = merged.size();
    merged.push_back(std::move(p));
  }
  report_.problems = std::move(merged);
  if (unchecked_totals_ > 0) {
    report_.notes.push_back(std::to_string(unchecked_totals_) + " all_to_all collectives' totals over their groups not compared: the fake "
                            "backend hands each rank its own input back, so sizes that follow an earlier exchange (an MoE's "
                            "token counts) are not what the peers sent");
  }
  for (const auto& [r, why] : culprits_) report_.culprits.push_back(Culprit{r, why});
  report_.ok = report_.problems.empty();
}

}  // namespace detail

CheckReport check_dumps(const std::vector<Dump>& dumps) { return detail::Checker(dumps).run(); }
CheckReport check_dumps(const std::vector<Dump>& dumps, const CheckOptions& options) {
  return detail::Checker(dumps, options).run();
}

}  // namespace meshsim::trace
