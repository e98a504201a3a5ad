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
  // A rank's posted sends and receives: its next one, or the run of one batch
  // (batch_isend_irecv: Schedule::batches), [at, wend), each done or not.
  std::vector<std::size_t> wend(static_cast<std::size_t>(pp), 0);
  std::vector<std::vector<char>> wdone(static_cast<std::size_t>(pp));
  auto batch_of = [&](int64_t r, std::size_t k) -> int32_t {
    const auto R = static_cast<std::size_t>(r);
    return R < s.batches.size() && k < s.batches[R].size() ? s.batches[R][k] : -1;
  };
  // pos: the rank's next action not done (in a posted batch, the first still waiting).
  auto pos = [&](int64_t r) {
    const auto R = static_cast<std::size_t>(r);
    if (wend[R] > at[R]) {
      for (std::size_t k = 0; k < wdone[R].size(); ++k) {
        if (!wdone[R][k]) return at[R] + k;
      }
    }
    return at[R];
  };
  auto head = [&](int64_t r) -> const std::optional<Action>* {
    const auto& l = s.ranks[static_cast<std::size_t>(r)];
    const std::size_t k = pos(r);
    return k < l.size() ? &l[k] : nullptr;
  };
  auto is_p2p_slot = [](const std::optional<Action>& a) { return a && (is_send(a->type) || is_recv(a->type)); };
  auto open = [&](int64_t r) {
    const auto R = static_cast<std::size_t>(r);
    const auto& l = s.ranks[R];
    if (wend[R] > at[R]) return;
    std::size_t e = at[R] + 1;
    if (const int32_t b = batch_of(r, at[R]); b >= 0) {
      while (e < l.size() && is_p2p_slot(l[e]) && batch_of(r, e) == b) ++e;
    }
    wend[R] = e;
    wdone[R].assign(e - at[R], 0);
  };
  auto close = [&](int64_t r) {
    const auto R = static_cast<std::size_t>(r);
    if (wend[R] <= at[R]) return false;
    for (char d : wdone[R]) {
      if (!d) return false;
    }
    at[R] = wend[R];
    wdone[R].clear();
    return true;
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
      // The rank posts its next send or receive, or its batch's together, and goes on once each
      // has met its peer's (rendezvous) or, eager, its receives have their messages.
      open(r);
      const auto R = static_cast<std::size_t>(r);
      const auto& mine = s.ranks[R];
      for (std::size_t k = 0; k < wdone[R].size(); ++k) {
        if (wdone[R][k]) continue;
        const Action& o = *mine[at[R] + k];
        if (!has_input(r, o)) continue;
        const auto [match, peer] = peer_of(s, o);
        if (semantics == SendSemantics::kEager) {
          if (is_send(o.type)) {
            posted.insert(key(o));
            wake(peer);
          } else if (!posted.count(key(match))) {
            continue;
          }
          mark(o);
          wdone[R][k] = 1;
          continue;
        }
        if (peer == r) continue;
        const std::optional<Action>* ph = head(peer);
        if (!ph || !is_p2p_slot(*ph)) continue;
        open(peer);
        const auto P = static_cast<std::size_t>(peer);
        for (std::size_t q = 0; q < wdone[P].size(); ++q) {
          if (wdone[P][q] || !(*s.ranks[P][at[P] + q] == match)) continue;
          if (!has_input(peer, match)) break;
          mark(o);
          mark(match);
          wdone[R][k] = 1;
          wdone[P][q] = 1;
          if (close(peer)) wake(peer);
          break;
        }
      }
      if (close(r)) continue;
      break;
    }
  }
  Progress p;
  std::vector<int64_t> waiting;
  for (int64_t r = 0; r < pp; ++r) {
    if (head(r)) waiting.push_back(r);
    p.stopped_at.push_back(head(r) ? static_cast<int64_t>(pos(r)) : -1);
  }
  if (waiting.empty()) return p;
  p.ok = false;
  const std::string sem(send_semantics_name(semantics));
  auto waits = [&](int64_t r) {
    const Action& a = **head(r);
    const auto [match, peer] = peer_of(s, a);
    return "rank " + std::to_string(r) + " waits in its " + (is_send(a.type) ? "send " : "receive ") + to_string(a) +
           " (action " + std::to_string(pos(r)) + ") " + (is_send(a.type) ? "to" : "from") +
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
                  std::to_string(pos(w)) + ") lacks its input: " + needs +
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
