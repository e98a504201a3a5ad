// Each group's records compared across its members: the Nth collective's type, sizes, dtypes and
// state against the majority, each record's own size rule, the members that never issued it, and
// sends paired with receives per (src, dst) in order.
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

void Checker::check_collectives(int g) {
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
    // Agreement: the ranks against the majority. The common case, every member alike, is found
    // on the fields and makes no text (the variants by signature only when members differ).
    bool agree = true;
    for (std::size_t k = 1; agree && k < present.size(); ++k) agree = same_signature(*present[k].second, *present[0].second);
    std::map<std::string, std::vector<std::size_t>> variants;
    if (!agree) {
      for (std::size_t k = 0; k < present.size(); ++k) variants[signature(*present[k].second)].push_back(k);
      if (variants.size() > 1) mismatch(g, s, present, variants);
    }
    // Each variant's own rules (once per variant, naming its ranks).
    auto rules = [&](const std::size_t* idx, std::size_t count) {
      const auto& bundle = *present[idx[0]].second;
      for (const Entry* e : bundle) {
        const auto rule = own_rule(*e, n);
        if (!rule) continue;
        const auto& [kind, why] = *rule;
        Problem p;
        p.kind = kind;
        p.seq = s;
        for (std::size_t k = 0; k < count; ++k) p.ranks.push_back(present[idx[k]].first);
        p.message = group_text(g) + " #" + std::to_string(s) + ": " + who(p.ranks) + " issued " + entry_text(*e) +
                    ": " + why;
        for (int64_t r : p.ranks) blame(r, std::string(problem_kind_name(kind)) + " rule broken at " + group_text(g) + " #" + std::to_string(s));
        add(std::move(p), g);
        break;
      }
    };
    if (agree) {
      // idx 0..n-1 only when a rule is broken (rare): the first bundle decides.
      bool broken = false;
      for (const Entry* e : *present[0].second) broken = broken || own_rule(*e, n).has_value();
      if (broken) {
        std::vector<std::size_t> all(present.size());
        for (std::size_t k = 0; k < present.size(); ++k) all[k] = k;
        rules(all.data(), all.size());
      }
    } else {
      for (const auto& [sig, idx] : variants) rules(idx.data(), idx.size());
    }
    const std::size_t kinds_of = agree ? 1 : variants.size();
    // An all_to_all moves every element it sends: over the whole group the inputs total what
    // the outputs do (the records hold each rank's totals, not its splits). Named: the ranks
    // whose own input and output differ, when they are fewer than the rest (an even exchange
    // where one rank's splits went wrong); otherwise the group, with no one blamed.
    const bool all_to_all = ref.op.rfind("all_to_all", 0) == 0 || ref.op.rfind("alltoall", 0) == 0;
    if (all_to_all && !options_.all_to_all_totals) ++unchecked_totals_;
    if (kinds_of == 1 && static_cast<int64_t>(present.size()) == n && present.front().second->size() == 1 && all_to_all &&
        options_.all_to_all_totals) {
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
        p.kind = ProblemKind::kSize;
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
      p.kind = ProblemKind::kState;
      p.seq = s;
      p.ranks = pending;
      p.message = group_text(g) + " #" + std::to_string(s) + " " + ref.profiling_name.substr(0, 60) + ": " +
                  who(done) + " completed it while " + who(pending) + (pending.size() == 1 ? " has it " : " have it ") +
                  state_name(ranks_pending_state(present)) + "";
      add(std::move(p), g);
    }
    if (!never.empty()) {
      Problem p;
      p.kind = ProblemKind::kNeverIssued;
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
      // Completed by the members that issued it, never issued by fewer others: no wait leads to
      // them (a backend that completes alone, as `fake` under meshsim record, or retired
      // records), so they are blamed here, as the odd ones out.
      if (pending.empty() && never.size() < done.size()) {
        for (int64_t r : never) {
          blame(r, "never issued " + group_text(g) + " #" + std::to_string(s) + ", which " + counted(done, 16) + " completed");
        }
      }
    }
    if (!absent.empty()) {
      Problem p;
      p.kind = ProblemKind::kAbsent;
      p.seq = s;
      p.ranks = absent;
      p.message = group_text(g) + " #" + std::to_string(s) + " " + entry_text(ref) + ": " + who(absent) +
                  " hold records of this group before and after it but none of it";
      for (int64_t r : absent) blame(r, "skipped " + group_text(g) + " #" + std::to_string(s));
      add(std::move(p), g);
    }
  }
}

EntryState Checker::ranks_pending_state(const std::vector<std::pair<int64_t, const std::vector<const Entry*>*>>& present) {
  EntryState st = EntryState::kCompleted;
  for (const auto& [r, b] : present) {
    for (const Entry* e : *b) {
      if (e->state != EntryState::kCompleted) st = std::min(st, e->state);
    }
  }
  return st;
}

void Checker::mismatch(int g, int64_t s, const std::vector<std::pair<int64_t, const std::vector<const Entry*>*>>& present,
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
    ProblemKind kind = ProblemKind::kType;
    std::size_t at = 0;
    if (ob.size() == mb.size()) {
      for (at = 0; at < ob.size(); ++at) {
        if (signature({ob[at]}) != signature({mb[at]})) break;
      }
      if (at == ob.size()) at = 0;
      const Entry& x = *ob[at];
      const Entry& y = *mb[at];
      if (x.op != y.op) kind = ProblemKind::kType;
      else if (dtypes_text(x.input_dtypes) != dtypes_text(y.input_dtypes) || dtypes_text(x.output_dtypes) != dtypes_text(y.output_dtypes)) kind = ProblemKind::kDtype;
      else kind = ProblemKind::kSize;
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
    for (int64_t r : p.ranks) blame(r, std::string(tie ? "one side of " : "the odd one out of ") + group_text(g) + " #" + std::to_string(s) + " (" + std::string(problem_kind_name(kind)) + ")");
    if (tie) {
      for (int64_t r : major_ranks) blame(r, "one side of " + group_text(g) + " #" + std::to_string(s) + " (" + std::string(problem_kind_name(kind)) + ")");
    }
    mismatched_.insert({g, s});
    add(std::move(p), g);
  }
}

void Checker::check_p2p(int g) {
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
        p.kind = ProblemKind::kP2p;
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
      p.kind = ProblemKind::kP2p;
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
        p.kind = ProblemKind::kUnmatchedP2p;
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
        p.kind = ProblemKind::kUnmatchedP2p;
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

}  // namespace meshsim::trace::detail
