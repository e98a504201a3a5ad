// Lowering a compute schedule to what runs: PyTorch's runtime passes (_prepare_schedule_with_comms:
// UNSHARD / RESHARD / REDUCE_GRAD placed as its runtime does) and its _add_send_recv.
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

namespace {

// PyIntSet is a set of stage numbers that iterates in the order CPython 3.11's set of small
// non-negative ints does (PyTorch's _add_unshard_reshard evicts stages in that order): an open
// table of 8 slots or more, a key's first slot its value masked, then up to 9 slots on when they
// fit before the table's end, then the jump i = 5 i + 1 + (perturb >>= 5); a removed key leaves a
// dummy that a later add reuses (the last one its probe passed before a free slot); the table
// grows to 4 x the keys once 3/5 of it is filled (keys and dummies), re-placing the keys in slot
// order. Held to real Python sets by tests/torch/test_schedule_oracle.py.
class PyIntSet {
 public:
  PyIntSet() : table_(8, kUnused) {}
  bool contains(int64_t key) const {
    bool found = false;
    probe(key, [&](std::size_t j) {
      if (table_[j] == kUnused) return true;
      if (table_[j] == key) found = true;
      return found;
    });
    return found;
  }
  void add(int64_t key) {
    std::size_t free = SIZE_MAX, at = SIZE_MAX;
    bool present = false;
    probe(key, [&](std::size_t j) {
      if (table_[j] == kUnused) {
        at = j;
        return true;
      }
      if (table_[j] == key) return present = true;
      if (table_[j] == kDummy) free = j;
      return false;
    });
    if (present) return;
    ++used_;
    if (free != SIZE_MAX) {
      table_[free] = key;
      return;
    }
    table_[at] = key;
    ++fill_;
    if (fill_ * 5 >= mask() * 3) resize(used_ > 50000 ? used_ * 2 : used_ * 4);
  }
  void remove(int64_t key) {
    probe(key, [&](std::size_t j) {
      if (table_[j] == kUnused) throw Internal("PyIntSet::remove: " + std::to_string(key) + " is not held");
      if (table_[j] != key) return false;
      table_[j] = kDummy;
      --used_;
      return true;
    });
  }
  // keys in iteration order.
  std::vector<int64_t> keys() const {
    std::vector<int64_t> out;
    for (int64_t k : table_) {
      if (k >= 0) out.push_back(k);
    }
    return out;
  }

 private:
  static constexpr int64_t kUnused = -1, kDummy = -2;
  std::size_t mask() const { return table_.size() - 1; }
  // probe visits the key's slots in CPython's order until `visit` returns true.
  template <typename Visit>
  void probe(int64_t key, Visit&& visit) const {
    const std::size_t m = mask();
    auto perturb = static_cast<std::size_t>(key);
    std::size_t i = perturb & m;
    for (;;) {
      const std::size_t linear = i + 9 <= m ? 9 : 0;
      for (std::size_t j = i; j <= i + linear; ++j) {
        if (visit(j)) return;
      }
      perturb >>= 5;
      i = (i * 5 + 1 + perturb) & m;
    }
  }
  void resize(std::size_t min_used) {
    std::size_t n = 8;
    while (n <= min_used) n <<= 1;
    const std::vector<int64_t> old = keys();
    table_.assign(n, kUnused);
    fill_ = used_ = old.size();
    for (int64_t k : old) {
      probe(k, [&](std::size_t j) {
        if (table_[j] != kUnused) return false;
        table_[j] = k;
        return true;
      });
    }
  }
  std::vector<int64_t> table_;
  std::size_t fill_ = 0, used_ = 0;
};

}  // namespace

// prepare_for_runtime is what PyTorch's _PipelineScheduleRuntime does to a compute schedule
// before it places sends and receives (_prepare_schedule_with_comms): per rank, idle steps
// dropped, UNSHARD / RESHARD placed so that the next 3 stages the rank computes are unsharded
// (_add_unshard_reshard: before an action, the stages outside its next 3 resharded in set order,
// then the ones not yet unsharded fetched in the order they come; every stage still unsharded
// resharded at the end), and a REDUCE_GRAD after a stage's last B or W (_add_reduce_grad).
Schedule detail::prepare_for_runtime(const Schedule& compute) {
  constexpr int kActive = 3;  // _add_unshard_reshard's max_active_stages
  Schedule out;
  out.stages = compute.stages;
  out.microbatches = compute.microbatches;
  out.style = compute.style;
  out.ranks.resize(compute.ranks.size());
  std::vector<int64_t> grads(static_cast<std::size_t>(compute.stages), 0);
  for (std::size_t r = 0; r < compute.ranks.size(); ++r) {
    std::vector<Action> acts;
    for (std::size_t k = 0; k < compute.ranks[r].size(); ++k) {
      const auto& a = compute.ranks[r][k];
      if (!a) continue;
      if (a->type != ActionType::kF && a->type != ActionType::kB && a->type != ActionType::kI && a->type != ActionType::kW) {
        throw InvalidArgument("Expected compute-only schedule but found communication action '" + to_string(*a) + "' at rank " +
                              std::to_string(r) + ", position " + std::to_string(k) +
                              " (PyTorch's _prepare_schedule_with_comms places UNSHARD, RESHARD and REDUCE_GRAD itself): "
                              "give the schedule with its sends and receives, or --lowering add_send_recv");
      }
      acts.push_back(*a);
    }
    // next[k]: the first 3 distinct stages of acts[k..], in the order they come (-1: none), from
    // the back: stage k, then those of k + 1 without it (a suffix's first 3 hold its first 2 others).
    std::vector<std::array<int64_t, kActive>> next(acts.size());
    std::array<int64_t, kActive> after{-1, -1, -1};
    for (std::size_t k = acts.size(); k-- > 0;) {
      std::array<int64_t, kActive> cur{acts[k].stage, -1, -1};
      int n = 1;
      for (int64_t st : after) {
        if (st >= 0 && st != acts[k].stage && n < kActive) cur[static_cast<std::size_t>(n++)] = st;
      }
      next[k] = after = cur;
    }
    auto& l = out.ranks[r];
    l.reserve(acts.size() + acts.size() / 2 + 8);
    PyIntSet active;
    auto in_next = [](const std::array<int64_t, kActive>& n, int64_t st) { return std::find(n.begin(), n.end(), st) != n.end(); };
    for (std::size_t k = 0; k < acts.size(); ++k) {
      for (int64_t st : active.keys()) {
        if (!in_next(next[k], st)) {
          active.remove(st);
          l.push_back(Action{static_cast<int32_t>(st), ActionType::kReshard, std::nullopt});
        }
      }
      for (int64_t st : next[k]) {
        if (st >= 0 && !active.contains(st)) {
          active.add(st);
          l.push_back(Action{static_cast<int32_t>(st), ActionType::kUnshard, std::nullopt});
        }
      }
      const Action& a = acts[k];
      l.push_back(a);
      if ((a.type == ActionType::kB || a.type == ActionType::kW) && ++grads[static_cast<std::size_t>(a.stage)] == compute.microbatches) {
        l.push_back(Action{a.stage, ActionType::kReduceGrad, std::nullopt});
      }
    }
    for (int64_t st : active.keys()) l.push_back(Action{static_cast<int32_t>(st), ActionType::kReshard, std::nullopt});
  }
  return out;
}

Schedule lower(const Schedule& compute, Lowering how) {
  validate(compute);
  if (compute.lowered) throw InvalidArgument("lower: the schedule is lowered already (it holds sends and receives)");
  if (how == Lowering::kRuntime) return add_send_recv(prepare_for_runtime(compute));
  return add_send_recv(compute);
}

Lowering parse_lowering(std::string_view text, std::string_view what) {
  if (text == "runtime") return Lowering::kRuntime;
  if (text == "add_send_recv") return Lowering::kAddSendRecv;
  throw InvalidArgument(std::string(what) + " must be runtime (PyTorch's _prepare_schedule_with_comms) or add_send_recv, not '" +
                        std::string(text.substr(0, 64)) + "'");
}

// add_send_recv is PyTorch's _add_send_recv (see the header).
Schedule detail::add_send_recv(const Schedule& compute) {
  const int64_t pp = static_cast<int64_t>(compute.ranks.size());
  Schedule out;  // the compute schedule's fields, not a copy of its actions
  out.stages = compute.stages;
  out.microbatches = compute.microbatches;
  out.style = compute.style;
  out.ranks.resize(static_cast<std::size_t>(pp));
  out.lowered = true;
  // What each rank has done, as one flag per (stage, microbatch, type): every (stage,
  // microbatch) holds a forward and a backward, so this is at most kMaxActions x 11 bits.
  constexpr std::size_t kTypes = 11;
  const auto m_count = static_cast<std::size_t>(compute.microbatches);
  std::vector<bool> done(static_cast<std::size_t>(compute.stages) * m_count * kTypes, false);
  auto slot = [&](int64_t stage, ActionType t, int64_t mb) {
    return (static_cast<std::size_t>(stage) * m_count + static_cast<std::size_t>(mb)) * kTypes + static_cast<std::size_t>(t);
  };
  auto mark = [&](const Action& a) {
    if (a.microbatch && a.stage >= 0 && a.stage < compute.stages) done[slot(a.stage, a.type, *a.microbatch)] = true;
  };
  // A stage's flags are only ever set by the rank that holds it (its actions, or the receives
  // placed on it), so one table serves every rank.
  auto has = [&](int64_t stage, ActionType t, int64_t mb) {
    return stage >= 0 && stage < compute.stages && done[slot(stage, t, mb)];
  };
  auto has_comms = [&](const Action& a) {
    if (a.type == ActionType::kF) return a.stage != compute.stages - 1 && rank_of(compute, a.stage + 1) != rank_of(compute, a.stage);
    if (is_backward(a.type)) return a.stage != 0 && rank_of(compute, a.stage - 1) != rank_of(compute, a.stage);
    return false;
  };
  auto ready = [&](int64_t r, const Action& a) {
    const int64_t mb = a.microbatch.value_or(0);
    if (a.type == ActionType::kF && a.stage != 0) {
      return has(a.stage, ActionType::kRecvF, mb) ||
             (rank_of(compute, a.stage - 1) == r && has(a.stage - 1, ActionType::kF, mb));
    }
    if (is_backward(a.type) && a.stage != compute.stages - 1) {
      return has(a.stage, ActionType::kRecvB, mb) ||
             (rank_of(compute, a.stage + 1) == r && (has(a.stage + 1, ActionType::kI, mb) || has(a.stage + 1, ActionType::kB, mb)));
    }
    return true;
  };
  // Rounds: in each, every rank in turn (ascending) takes its next action if it has its input;
  // a send places the matching receive on its peer at once. A rank whose next action lacks its
  // input is visited again only once a receive lands on it (nothing else can change that), in
  // this round if it comes later in the turn, else in the next: the order PyTorch's
  // `_add_send_recv` gives, in time linear in the actions (not ranks x rounds).
  // Each rank's lowered list sized once: its actions, a send per action with comms, and the
  // receives its peers' sends place on it (no doubling growth: 2^24 actions are 670 MB).
  std::vector<std::size_t> sizes(static_cast<std::size_t>(pp), 0);
  for (int64_t r = 0; r < pp; ++r) {
    for (const auto& a : compute.ranks[static_cast<std::size_t>(r)]) {
      if (!a) continue;
      ++sizes[static_cast<std::size_t>(r)];
      if (has_comms(*a)) {
        ++sizes[static_cast<std::size_t>(r)];
        ++sizes[static_cast<std::size_t>(rank_of(compute, a->type == ActionType::kF ? a->stage + 1 : a->stage - 1))];
      }
    }
  }
  for (int64_t r = 0; r < pp; ++r) out.ranks[static_cast<std::size_t>(r)].reserve(sizes[static_cast<std::size_t>(r)]);
  std::vector<std::size_t> next(static_cast<std::size_t>(pp), 0);
  std::vector<char> blocked(static_cast<std::size_t>(pp), 0);
  std::set<int64_t> turn, later;
  int64_t unfinished = 0;
  for (int64_t r = 0; r < pp; ++r) {
    if (!compute.ranks[static_cast<std::size_t>(r)].empty()) {
      turn.insert(r);
      ++unfinished;
    }
  }
  while (unfinished > 0) {
    if (turn.empty()) {
      std::string heads;
      for (int64_t r = 0; r < pp; ++r) {
        const auto& l = compute.ranks[static_cast<std::size_t>(r)];
        const std::size_t k = next[static_cast<std::size_t>(r)];
        if (k < l.size() && l[k]) heads += (heads.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r) + " at " + to_string(*l[k]);
      }
      throw InvalidArgument("lower: the compute schedule cannot be lowered: no rank's next action has its input (" +
                            heads + ")");
    }
    while (!turn.empty()) {
      const int64_t r = *turn.begin();
      turn.erase(turn.begin());
      const auto& l = compute.ranks[static_cast<std::size_t>(r)];
      std::size_t& k = next[static_cast<std::size_t>(r)];
      const std::optional<Action>& a = l[k];
      if (a && !ready(r, *a)) {
        blocked[static_cast<std::size_t>(r)] = 1;
        continue;
      }
      if (a) {
        out.ranks[static_cast<std::size_t>(r)].push_back(*a);
        mark(*a);
        if (has_comms(*a)) {
          const int64_t mb = *a->microbatch;
          const Action send = act(a->stage, a->type == ActionType::kF ? ActionType::kSendF : ActionType::kSendB, mb);
          const auto [recv, peer] = peer_of(compute, send);
          out.ranks[static_cast<std::size_t>(r)].push_back(send);
          mark(send);
          out.ranks[static_cast<std::size_t>(peer)].push_back(recv);
          mark(recv);
          if (blocked[static_cast<std::size_t>(peer)]) {
            blocked[static_cast<std::size_t>(peer)] = 0;
            (peer > r ? turn : later).insert(peer);
          }
        }
      }
      if (++k == l.size()) {
        --unfinished;
      } else {
        later.insert(r);
      }
    }
    std::swap(turn, later);
  }
  return out;
}


}  // namespace meshsim::step
