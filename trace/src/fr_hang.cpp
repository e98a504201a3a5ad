// A hang followed through the ranks' waits: each rank's oldest record not completed, the
// members it waits for, to the ranks that hold everyone up (the culprits) or to a cycle of waits.
#include <algorithm>
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

namespace meshsim::trace::detail {

// follow_waits: every rank's oldest pending record is what it waits in; the members that never
// issued it (or the peer that never met it) hold it up. Following these waits ends at ranks
// that wait in nothing (the roots: culprits), at ranks without a dump, or in a cycle.
// follow_waits: who each waiting rank waits on, the ranks at the end of those waits (the
// roots that hold everyone up) and cycles of waits. Linear in the waits and the roots reached:
// the blockers of a (group, sequence id) are found once, a group's members without dumps are
// one node when there are many, cycles are found by an iterative Tarjan (no recursion), and
// each strongly connected part's roots are computed once, sinks first. Past kMaxWaitWork the
// rest is not followed and a note says so.
void Checker::follow_waits() {
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
                              std::to_string(missing.size()) + " members without dumps (" + format_rank_runs(missing, 8) +
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
    p.kind = ProblemKind::kWaitCycle;
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

}  // namespace meshsim::trace::detail
