// The progress check of a lowered schedule: every rank steps through its actions under
// rendezvous or eager sends; a rank that cannot move is named with what it waits for.
#include <algorithm>
#include <array>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "meshsim/error.hpp"
#include "meshsim/schedule.hpp"
#include "schedule_internal.hpp"
#include "step_internal.hpp"

namespace meshsim::step {

using namespace detail;

Progress check_progress(const Schedule& s, SendSemantics semantics) {
  const int64_t pp = static_cast<int64_t>(s.ranks.size());
  for (int64_t r = 0; r < pp; ++r) {
    for (const auto& a : s.ranks[static_cast<std::size_t>(r)]) {
      if (a && (is_send(a->type) || is_recv(a->type))) {
        const int64_t peer_stage = peer_of(s, *a).first.stage;
        if (peer_stage < 0 || peer_stage >= s.stages) {
          throw InvalidArgument("rank " + std::to_string(r) + "'s " + to_string(*a) + " has no peer stage " +
                                std::to_string(peer_stage));
        }
      }
    }
  }
  std::vector<std::size_t> at(static_cast<std::size_t>(pp), 0);
  std::set<std::tuple<int64_t, int, int64_t>> posted;  // eager sends issued
  // What each rank has run, per (stage, type, microbatch): a flat table when the stages and
  // microbatches are no more than the actions (every valid schedule), else a set.
  constexpr std::size_t kTypes = 11;
  const auto m_count = static_cast<std::size_t>(std::max<int64_t>(s.microbatches, 1));
  std::size_t actions = 0;
  for (const auto& l : s.ranks) actions += l.size();
  const bool flat = s.stages >= 0 && static_cast<std::size_t>(s.stages) <= (2 * actions + 64) / m_count;
  std::vector<bool> ran_table(flat ? static_cast<std::size_t>(s.stages) * m_count * kTypes : 0, false);
  std::set<std::tuple<int64_t, int, int64_t>> ran_set;
  auto ran = [&](int64_t stage, ActionType t, int64_t mb) {
    if (stage < 0 || stage >= s.stages || mb < 0 || mb >= s.microbatches) return false;
    if (!flat) return ran_set.count({stage, static_cast<int>(t), mb}) > 0;
    return static_cast<bool>(ran_table[(static_cast<std::size_t>(stage) * m_count + static_cast<std::size_t>(mb)) * kTypes +
                                       static_cast<std::size_t>(t)]);
  };
  auto mark = [&](const Action& a) {
    if (!a.microbatch || a.stage < 0 || a.stage >= s.stages || *a.microbatch < 0 || *a.microbatch >= s.microbatches) return;
    if (!flat) {
      ran_set.insert({a.stage, static_cast<int>(a.type), *a.microbatch});
      return;
    }
    ran_table[(static_cast<std::size_t>(a.stage) * m_count + static_cast<std::size_t>(*a.microbatch)) * kTypes +
              static_cast<std::size_t>(a.type)] = true;
  };
  // has_input: PyTorch's _simulate_comms_compute rules. A forward needs its stage's receive, or
  // the previous stage's forward on this rank; a backward (full or input) the next stage's
  // gradient the same way; a send the compute that made what it sends. Weight backwards and the
  // FSDP actions need nothing here.
  auto has_input = [&](int64_t r, const Action& a) {
    const int64_t mb = a.microbatch.value_or(0);
    switch (a.type) {
      case ActionType::kF:
        return a.stage == 0 || ran(a.stage, ActionType::kRecvF, mb) ||
               (stage_rank(s, a.stage - 1) == r && ran(a.stage - 1, ActionType::kF, mb));
      case ActionType::kB:
      case ActionType::kI:
        return a.stage == s.stages - 1 || ran(a.stage, ActionType::kRecvB, mb) ||
               (stage_rank(s, a.stage + 1) == r && (ran(a.stage + 1, ActionType::kI, mb) || ran(a.stage + 1, ActionType::kB, mb)));
      case ActionType::kSendF: return ran(a.stage, ActionType::kF, mb);
      case ActionType::kSendB: return ran(a.stage, ActionType::kI, mb) || ran(a.stage, ActionType::kB, mb);
      default: return true;
    }
  };
  auto key = [](const Action& a) { return std::tuple<int64_t, int, int64_t>{a.stage, static_cast<int>(a.type), a.microbatch.value_or(-1)}; };
  auto head = [&](int64_t r) -> const std::optional<Action>* {
    const auto& l = s.ranks[static_cast<std::size_t>(r)];
    const std::size_t k = at[static_cast<std::size_t>(r)];
    return k < l.size() ? &l[k] : nullptr;
  };
  // Each rank runs as far as it can; one whose progress may let another on (a send posted, a
  // pair met) puts that one back on the work list. The end state does not depend on the order
  // (each rank's progress only grows), and the work is linear in the actions.
  std::vector<char> queued(static_cast<std::size_t>(pp), 1);
  std::deque<int64_t> work;
  for (int64_t r = 0; r < pp; ++r) work.push_back(r);
  auto wake = [&](int64_t r) {
    if (!queued[static_cast<std::size_t>(r)]) {
      queued[static_cast<std::size_t>(r)] = 1;
      work.push_back(r);
    }
  };
  while (!work.empty()) {
    const int64_t r = work.front();
    work.pop_front();
    queued[static_cast<std::size_t>(r)] = 0;
    while (const std::optional<Action>* h = head(r)) {
      const std::optional<Action>& a = *h;
      if (a && !has_input(r, *a)) break;  // it can only come from this rank's own earlier actions
      if (!a || !(is_send(a->type) || is_recv(a->type))) {
        if (a) mark(*a);
        ++at[static_cast<std::size_t>(r)];
        continue;
      }
      const auto [match, peer] = peer_of(s, *a);
      if (semantics == SendSemantics::kEager) {
        if (is_send(a->type)) {
          posted.insert(key(*a));
          wake(peer);
        } else if (!posted.count(key(match))) {
          break;
        }
        mark(*a);
        ++at[static_cast<std::size_t>(r)];
        continue;
      }
      const std::optional<Action>* ph = head(peer);
      if (peer == r || !ph || !*ph || !(**ph == match) || !has_input(peer, match)) break;
      mark(*a);
      mark(match);
      ++at[static_cast<std::size_t>(r)];
      ++at[static_cast<std::size_t>(peer)];
      wake(peer);
    }
  }
  Progress p;
  std::vector<int64_t> waiting;
  for (int64_t r = 0; r < pp; ++r) {
    if (head(r)) waiting.push_back(r);
    p.stopped_at.push_back(head(r) ? static_cast<int64_t>(at[static_cast<std::size_t>(r)]) : -1);
  }
  if (waiting.empty()) return p;
  p.ok = false;
  const std::string sem(send_semantics_name(semantics));
  auto waits = [&](int64_t r) {
    const Action& a = **head(r);
    const auto [match, peer] = peer_of(s, a);
    return "rank " + std::to_string(r) + " waits in its " + (is_send(a.type) ? "send " : "receive ") + to_string(a) +
           " (action " + std::to_string(at[static_cast<std::size_t>(r)]) + ") " + (is_send(a.type) ? "to" : "from") +
           " rank " + std::to_string(peer) + " (" + to_string(match) + ")";
  };
  // A rank whose next action lacks its input (a forward before its receive, a send before the
  // compute that makes what it sends) waits forever on itself: that is the fault.
  for (int64_t w : waiting) {
    const Action& a = **head(w);
    if (has_input(w, a)) continue;
    const bool backward = is_backward(a.type) || a.type == ActionType::kSendB;
    const int64_t mb = a.microbatch.value_or(0);
    const std::string needs =
        a.type == ActionType::kSendF   ? to_string(act(a.stage, ActionType::kF, mb))
        : a.type == ActionType::kSendB ? to_string(act(a.stage, ActionType::kB, mb)) + " or " + to_string(act(a.stage, ActionType::kI, mb))
        : backward                     ? to_string(act(a.stage, ActionType::kRecvB, mb))
                                       : to_string(act(a.stage, ActionType::kRecvF, mb));
    p.diagnosis = "pipeline hang under " + sem + " sends: rank " + std::to_string(w) + "'s " + to_string(a) + " (action " +
                  std::to_string(at[static_cast<std::size_t>(w)]) + ") lacks its input: " + needs +
                  " must run on rank " + std::to_string(w) + " before it (PyTorch's _simulate_comms_compute stops here too)";
    p.ranks = {w};
    return p;
  }
  // Follow who waits for whom from the first waiting rank: a cycle, or a rank that has ended.
  std::vector<int64_t> path;
  std::map<int64_t, std::size_t> on_path;
  int64_t r = waiting.front();
  while (true) {
    if (auto it = on_path.find(r); it != on_path.end()) {
      std::vector<int64_t> cycle(path.begin() + static_cast<std::ptrdiff_t>(it->second), path.end());
      std::string text;
      for (std::size_t i = 0; i < cycle.size(); ++i) text += (i ? ", while " : "") + waits(cycle[i]);
      p.diagnosis = "pipeline deadlock under " + sem + " sends: " + text;
      std::sort(cycle.begin(), cycle.end());
      p.ranks = cycle;
      return p;
    }
    if (!head(r)) {
      const int64_t from = path.back();
      p.diagnosis = "pipeline hang under " + sem + " sends: " + waits(from) + ", which has ended its schedule without it";
      p.ranks = {from};
      return p;
    }
    on_path[r] = path.size();
    path.push_back(r);
    r = peer_of(s, **head(r)).second;
  }
}


}  // namespace meshsim::step
