#include "meshsim/schedule.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <deque>
#include <map>
#include <set>
#include <tuple>

#include "meshsim/error.hpp"

namespace meshsim::step {

namespace {

struct TypeName {
  ActionType type;
  std::string_view name;
};
// Longest names first, so "SEND_F" is not read as a stage followed by junk.
constexpr TypeName kTypes[] = {{ActionType::kReduceGrad, "REDUCE_GRAD"}, {ActionType::kUnshard, "UNSHARD"},
                               {ActionType::kReshard, "RESHARD"},        {ActionType::kSendF, "SEND_F"},
                               {ActionType::kRecvF, "RECV_F"},           {ActionType::kSendB, "SEND_B"},
                               {ActionType::kRecvB, "RECV_B"},           {ActionType::kF, "F"},
                               {ActionType::kI, "I"},                    {ActionType::kW, "W"},
                               {ActionType::kB, "B"}};

bool has_microbatch(ActionType t) {
  return t != ActionType::kUnshard && t != ActionType::kReshard && t != ActionType::kReduceGrad;
}
bool is_send(ActionType t) { return t == ActionType::kSendF || t == ActionType::kSendB; }
bool is_recv(ActionType t) { return t == ActionType::kRecvF || t == ActionType::kRecvB; }
bool is_backward(ActionType t) { return t == ActionType::kB || t == ActionType::kI; }

// digits reads a decimal number at `at` (advancing it), at most `max`; nullopt when none.
std::optional<int64_t> digits(std::string_view s, std::size_t& at, int64_t max, std::string_view what) {
  const std::size_t start = at;
  int64_t v = 0;
  while (at < s.size() && s[at] >= '0' && s[at] <= '9') {
    v = v * 10 + (s[at] - '0');
    if (v > max) {
      throw OutOfRange("action " + quote_input(s) + ": its " + std::string(what) + " is over the limit of " +
                       std::to_string(max));
    }
    ++at;
  }
  if (at == start) return std::nullopt;
  return v;
}

void check_sizes(int64_t pp, int64_t microbatches) {
  if (pp < 1 || pp > kMaxStages) {
    throw InvalidArgument("pipeline size " + std::to_string(pp) + " is out of range [1, " + std::to_string(kMaxStages) + "]");
  }
  if (microbatches < 1 || microbatches > kMaxMicrobatches) {
    throw InvalidArgument("microbatches " + std::to_string(microbatches) + " is out of range [1, " +
                          std::to_string(kMaxMicrobatches) + "]");
  }
  if (pp * microbatches * 4 > kMaxActions) {
    throw ResourceExhausted("a schedule of " + std::to_string(pp) + " ranks and " + std::to_string(microbatches) +
                            " microbatches holds more than " + std::to_string(kMaxActions) + " actions");
  }
}

Schedule empty(int64_t pp, int64_t microbatches) {
  Schedule s;
  s.stages = pp;
  s.microbatches = microbatches;
  s.ranks.resize(static_cast<std::size_t>(pp));
  return s;
}

// act narrows to the compact form: every caller passes a stage below kMaxStages and a
// microbatch below kMaxMicrobatches (both checked before any action is built).
Action act(int64_t stage, ActionType t, int64_t mb) {
  return Action{static_cast<int32_t>(stage), t, static_cast<int32_t>(mb)};
}

int64_t rank_of(const Schedule& s, int64_t stage) { return stage_rank(s, stage); }

// The peer of a send or receive: the action it matches and the rank that holds it.
std::pair<Action, int64_t> peer_of(const Schedule& s, const Action& a) {
  const int64_t mb = a.microbatch.value_or(0);
  switch (a.type) {
    case ActionType::kSendF: return {act(a.stage + 1, ActionType::kRecvF, mb), rank_of(s, a.stage + 1)};
    case ActionType::kRecvF: return {act(a.stage - 1, ActionType::kSendF, mb), rank_of(s, a.stage - 1)};
    case ActionType::kSendB: return {act(a.stage - 1, ActionType::kRecvB, mb), rank_of(s, a.stage - 1)};
    case ActionType::kRecvB: return {act(a.stage + 1, ActionType::kSendB, mb), rank_of(s, a.stage + 1)};
    default: throw Internal("peer_of: " + to_string(a) + " is no send or receive");
  }
}

std::string lower_name(std::string_view n) {
  std::string r(n);
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

void check_multi(std::string_view name, int64_t pp, int64_t stages, int64_t microbatches) {
  check_sizes(pp, microbatches);
  if (stages < pp || stages % pp != 0 || stages > kMaxStages) {
    throw InvalidArgument(std::string(name) + ": " + std::to_string(stages) + " stages over " + std::to_string(pp) +
                          " ranks: the stages must be a multiple of the ranks (and at most " + std::to_string(kMaxStages) + ")");
  }
  if ((stages / pp) * microbatches * pp * 4 > kMaxActions) {
    throw ResourceExhausted("a " + std::string(name) + " schedule of " + std::to_string(stages) + " stages and " +
                            std::to_string(microbatches) + " microbatches holds more than " + std::to_string(kMaxActions) +
                            " actions");
  }
  // The multi-stage schedules keep step with each other as PyTorch's do, idle steps included: a
  // rank's list holds about 3 x its actions (local stages x max(M, 2 pp)) and 4 x local x pp
  // idle steps, so the grid grows as pp^2. Bounded like the actions, before anything is built.
  const int64_t local = stages / pp;
  const int64_t per_rank = local * std::max(microbatches, 2 * pp) * 3 + 4 * local * pp;
  if (per_rank > kMaxActions / pp) {
    throw ResourceExhausted("a " + std::string(name) + " schedule of " + std::to_string(pp) + " ranks, " +
                            std::to_string(stages) + " stages and " + std::to_string(microbatches) +
                            " microbatches would hold about " + std::to_string(per_rank) + " steps per rank, over " +
                            std::to_string(kMaxActions) + " steps (idle ones included) in all");
  }
}

// rank_ops_1f1b is PyTorch's _get_1f1b_rank_ops re-derived: r idle steps, the warm-up forwards,
// idle steps until the first backward can arrive (pp - r - 1 with zero bubble), then a forward
// and a backward (I with zero bubble, and a W once past the rank's first `deferred` backwards)
// per step, then the cool-down backwards (each after an idle step without zero bubble), then the
// W left over.
template <class Fwd, class Bwd>
std::vector<std::optional<Action>> rank_ops_1f1b(int64_t local, int64_t pp, int64_t warmup, int64_t fwd_bwd, int64_t cooldown,
                                                 int64_t r, Fwd forward_stage, Bwd backward_stage, int64_t deferred,
                                                 bool zero_bubble) {
  std::map<int64_t, int64_t> next_f, next_b, next_w;
  std::vector<std::optional<Action>> l(static_cast<std::size_t>(r));
  int64_t post_warmup = (local * pp + 2 * (pp - 1 - r)) - (warmup + r);
  if (zero_bubble) post_warmup = pp - r - 1;
  const int64_t total = warmup + fwd_bwd + cooldown;
  const ActionType backward = zero_bubble ? ActionType::kI : ActionType::kB;
  std::vector<int64_t> backward_ops;
  std::size_t weights = 0;
  auto weight = [&] {
    const int64_t st = backward_stage(backward_ops[weights++]);
    l.push_back(act(st, ActionType::kW, next_w[st]++));
  };
  for (int64_t op = 0; op < total; ++op) {
    if (op < warmup) {
      const int64_t st = forward_stage(op);
      l.push_back(act(st, ActionType::kF, next_f[st]++));
      if (op == warmup - 1) l.resize(l.size() + static_cast<std::size_t>(std::max<int64_t>(0, post_warmup)));
      continue;
    }
    if (op < warmup + fwd_bwd) {
      const int64_t st = forward_stage(op);
      l.push_back(act(st, ActionType::kF, next_f[st]++));
    } else if (!zero_bubble) {
      l.emplace_back();  // cool-down: keep step with the others' 1F1B
    }
    const int64_t st = backward_stage(op);
    l.push_back(act(st, backward, next_b[st]++));
    backward_ops.push_back(op);
    if (zero_bubble && op - warmup >= deferred) weight();
  }
  while (zero_bubble && weights < backward_ops.size()) weight();
  return l;
}

// add_bubbles is PyTorch's _add_bubbles_to_actions: all ranks step together; a rank whose next
// forward's previous stage has not run that microbatch in an earlier step (or whose next full
// backward's later stage has not) idles this step instead.
Schedule add_bubbles(const Schedule& in) {
  Schedule out = in;
  const std::size_t pp = in.ranks.size();
  for (auto& l : out.ranks) l.clear();
  std::set<std::tuple<int64_t, ActionType, int64_t>> seen;
  std::vector<std::size_t> next(pp, 0);
  auto need_bubble = [&](const Action& a) {
    const int64_t mb = a.microbatch.value_or(0);
    if (a.type == ActionType::kF) return a.stage != 0 && !seen.count({a.stage - 1, ActionType::kF, mb});
    if (a.type == ActionType::kB) {
      if (a.stage == in.stages - 1) return !seen.count({a.stage, ActionType::kF, mb});
      return !seen.count({a.stage + 1, ActionType::kB, mb});
    }
    return false;
  };
  while (true) {
    bool stop = true;
    std::vector<std::tuple<int64_t, ActionType, int64_t>> now;
    for (std::size_t r = 0; r < pp; ++r) {
      const auto& l = in.ranks[r];
      if (next[r] >= l.size()) continue;
      stop = false;
      const auto& a = l[next[r]];
      if (a && need_bubble(*a)) {
        out.ranks[r].emplace_back();
        continue;
      }
      out.ranks[r].push_back(a);
      if (a && a->microbatch) now.emplace_back(a->stage, a->type, *a->microbatch);
      ++next[r];
    }
    seen.insert(now.begin(), now.end());
    if (stop) break;
    if (static_cast<int64_t>(out.ranks[0].size()) > kMaxActions / static_cast<int64_t>(pp)) {
      throw ResourceExhausted("the schedule with its idle steps would hold more than " + std::to_string(kMaxActions) + " steps");
    }
  }
  return out;
}

// interleaved builds Interleaved1F1B (zero_bubble false: warm-up factor 2, full backwards) or
// the interleaved zero-bubble schedule (factor 1, I and W, the first r backwards' W deferred).
Schedule interleaved(int64_t pp, int64_t stages, int64_t microbatches, bool zero_bubble) {
  const std::string name = zero_bubble ? "InterleavedZeroBubble" : "Interleaved1F1B";
  check_multi(name, pp, stages, microbatches);
  const int64_t local = stages / pp;
  const int64_t rounds = std::max<int64_t>(1, microbatches / pp);
  const int64_t per_round = microbatches / rounds;
  if (microbatches % rounds != 0) {
    throw InvalidArgument(std::string(zero_bubble ? "Zero bubble" : "Interleaved 1F1B") +
                          " requires the number of microbatches to be a multiple of the number of rounds (" +
                          std::to_string(rounds) + "), but got " + std::to_string(microbatches) + ".");
  }
  Schedule s = empty(pp, microbatches);
  s.stages = stages;
  const int64_t factor = zero_bubble ? 1 : 2;
  for (int64_t r = 0; r < pp; ++r) {
    const int64_t warmup = std::min((local - 1) * per_round + factor * (pp - 1 - r), microbatches * local);
    const int64_t ops = local * microbatches;
    const int64_t fwd_bwd = ops - warmup;
    const int64_t cooldown = ops - fwd_bwd;
    auto forward_stage = [&](int64_t step) { return ((step / per_round) % local) * pp + r; };
    auto backward_stage = [&](int64_t step) { return (local - 1 - ((step - warmup) / per_round) % local) * pp + r; };
    s.ranks[static_cast<std::size_t>(r)] =
        rank_ops_1f1b(local, pp, warmup, fwd_bwd, cooldown, r, forward_stage, backward_stage, zero_bubble ? r : 0, zero_bubble);
  }
  return s;
}

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

// prepare_for_runtime is what PyTorch's _PipelineScheduleRuntime does to a compute schedule
// before it places sends and receives (_prepare_schedule_with_comms): per rank, idle steps
// dropped, UNSHARD / RESHARD placed so that the next 3 stages the rank computes are unsharded
// (_add_unshard_reshard: before an action, the stages outside its next 3 resharded in set order,
// then the ones not yet unsharded fetched in the order they come; every stage still unsharded
// resharded at the end), and a REDUCE_GRAD after a stage's last B or W (_add_reduce_grad).
Schedule prepare_for_runtime(const Schedule& compute) {
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

Schedule add_send_recv(const Schedule& compute);

}  // namespace

int64_t stage_rank(const Schedule& s, int64_t stage) {
  const auto pp = static_cast<int64_t>(s.ranks.size());
  if (s.style == StageStyle::kV) return stage < pp ? stage : 2 * pp - 1 - stage;
  return stage % pp;
}

std::string_view type_name(ActionType t) {
  for (const TypeName& n : kTypes) {
    if (n.type == t) return n.name;
  }
  return "?";
}

std::string to_string(const Action& a) {
  std::string out = std::to_string(a.stage) + std::string(type_name(a.type));
  if (a.microbatch) out += std::to_string(*a.microbatch);
  return out;
}

Action parse_action(std::string_view text) {
  std::string_view s = text;
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  std::size_t at = 0;
  const std::optional<int64_t> stage = digits(s, at, kMaxStages - 1, "stage");
  if (!stage) {
    throw InvalidArgument("action " + quote_input(text) + " does not start with a stage number "
                          "(PyTorch's form: <stage><F|I|W|B|SEND_F|RECV_F|SEND_B|RECV_B|UNSHARD|RESHARD|REDUCE_GRAD><microbatch>)");
  }
  Action a;
  a.stage = static_cast<int32_t>(*stage);  // below kMaxStages
  bool found = false;
  for (const TypeName& n : kTypes) {
    if (s.substr(at, n.name.size()) == n.name) {
      a.type = n.type;
      at += n.name.size();
      found = true;
      break;
    }
  }
  if (!found) {
    throw InvalidArgument("action " + quote_input(text) + ": no action type after the stage (F, I, W, B, SEND_F, RECV_F, "
                          "SEND_B, RECV_B, UNSHARD, RESHARD, REDUCE_GRAD)");
  }
  if (const auto mb = digits(s, at, kMaxMicrobatches - 1, "microbatch")) a.microbatch = static_cast<int32_t>(*mb);
  if (at != s.size()) throw InvalidArgument("action " + quote_input(text) + " has text after its microbatch");
  if (has_microbatch(a.type) && !a.microbatch) {
    throw InvalidArgument("action " + quote_input(text) + ": " + std::string(type_name(a.type)) + " needs a microbatch");
  }
  if (!has_microbatch(a.type) && a.microbatch) {
    throw InvalidArgument("action " + quote_input(text) + ": " + std::string(type_name(a.type)) + " takes no microbatch");
  }
  return a;
}

Schedule gpipe(int64_t pp, int64_t microbatches) {
  check_sizes(pp, microbatches);
  Schedule s = empty(pp, microbatches);
  for (int64_t r = 0; r < pp; ++r) {
    auto& l = s.ranks[static_cast<std::size_t>(r)];
    for (int64_t m = 0; m < microbatches; ++m) l.push_back(act(r, ActionType::kF, m));
    for (int64_t m = 0; m < microbatches; ++m) l.push_back(act(r, ActionType::kB, m));
  }
  return s;
}

Schedule one_f_one_b(int64_t pp, int64_t microbatches) {
  check_sizes(pp, microbatches);
  Schedule s = empty(pp, microbatches);
  for (int64_t r = 0; r < pp; ++r) {
    auto& l = s.ranks[static_cast<std::size_t>(r)];
    int64_t f = 0, b = 0;
    for (const int64_t warmup = std::min(microbatches, pp - r); f < warmup; ++f) l.push_back(act(r, ActionType::kF, f));
    while (b < microbatches) {
      l.push_back(act(r, ActionType::kB, b++));
      if (f < microbatches) l.push_back(act(r, ActionType::kF, f++));
    }
  }
  return s;
}

Schedule interleaved_1f1b(int64_t pp, int64_t stages, int64_t microbatches) {
  return interleaved(pp, stages, microbatches, false);
}

Schedule interleaved_zero_bubble(int64_t pp, int64_t stages, int64_t microbatches) {
  return add_bubbles(interleaved(pp, stages, microbatches, true));
}

std::vector<std::pair<int64_t, int64_t>> megatron_schedule_table(int64_t microbatches, int64_t chunks, int64_t group) {
  std::vector<std::pair<int64_t, int64_t>> table;
  for (int64_t first = 0; first < microbatches; first += group) {
    const int64_t end = first + group >= microbatches ? microbatches : first + group;
    for (int64_t c = 0; c < chunks; ++c) {
      for (int64_t m = first; m < end; ++m) table.emplace_back(m, c);
    }
  }
  return table;
}

Schedule megatron_interleaved(int64_t pp, int64_t stages, int64_t microbatches, int64_t group,
                              const std::vector<int64_t>& without_parity) {
  check_multi("MegatronInterleaved", pp, stages, microbatches);
  const int64_t chunks = stages / pp;
  if (group == 0) group = pp;  // microbatch_group_size_per_vp_stage's default
  // Megatron's refusals (forward_backward_pipelining_with_interleaving).
  if (group > microbatches || group < pp) {
    throw InvalidArgument("MegatronInterleaved: the microbatch group size per virtual stage (" + std::to_string(group) +
                          ") must be at least the pipeline size (" + std::to_string(pp) + ") and at most the microbatches (" +
                          std::to_string(microbatches) + ")");
  }
  if (const int64_t last = microbatches % group; last > 0 && last < pp) {
    throw InvalidArgument("MegatronInterleaved: the last microbatch group has " + std::to_string(last) +
                          " microbatches, fewer than the pipeline size (" + std::to_string(pp) + ")");
  }
  if (microbatches * stages * 6 > kMaxActions) {  // both bounded by check_multi: no overflow
    throw ResourceExhausted("MegatronInterleaved: " + std::to_string(microbatches) + " microbatches over " +
                            std::to_string(stages) + " stages is over " + std::to_string(kMaxActions) + " actions");
  }
  const auto table = megatron_schedule_table(microbatches, chunks, group);
  const int64_t total = microbatches * chunks;
  // One rank's operations in issue order: compute, and sends and receives whose receives are
  // labelled once every rank's sends are known (the k-th receive from a peer meets its k-th send).
  enum class Op { kCompute, kSendNext, kRecvPrev, kSendPrev, kRecvNext };
  struct Item {
    Op op;
    Action a;  // compute and sends: the action; receives: filled in below
  };
  std::vector<std::vector<Item>> items(static_cast<std::size_t>(pp));
  for (int64_t r = 0; r < pp; ++r) {
    auto& out = items[static_cast<std::size_t>(r)];
    const bool even = r % 2 == 0 || std::find(without_parity.begin(), without_parity.end(), r) != without_parity.end();
    auto chunk = [&](int64_t v, bool forward) {
      const int64_t c = table[static_cast<std::size_t>(v % total)].second;
      return forward ? c : chunks - c - 1;
    };
    // The k-th forward (backward) of a chunk runs its k-th microbatch of the table (backwards
    // release a chunk's inputs first in, first out).
    std::vector<int64_t> forwards(static_cast<std::size_t>(chunks), 0), backwards(static_cast<std::size_t>(chunks), 0);
    std::vector<std::vector<int64_t>> order(static_cast<std::size_t>(chunks));
    for (const auto& [m, c] : table) order[static_cast<std::size_t>(c)].push_back(m);
    // recv_tensor_from_previous_stage: whether the rank receives after virtual microbatch v.
    auto receives = [&](int64_t v, bool forward) {
      const bool leading = forward ? r == 0 : r == pp - 1;
      if (!leading) return true;
      if (v < pp - 1) return false;
      return chunk(v - (pp - 1), forward) != (forward ? chunks - 1 : 0);
    };
    auto call = [&](std::optional<Action> send_next, bool recv_prev, std::optional<Action> send_prev, bool recv_next) {
      auto put = [&](Op op, const std::optional<Action>& a) { out.push_back({op, a.value_or(Action{})}); };
      if (even) {
        if (send_next) put(Op::kSendNext, send_next);
        if (recv_prev) put(Op::kRecvPrev, std::nullopt);
        if (send_prev) put(Op::kSendPrev, send_prev);
        if (recv_next) put(Op::kRecvNext, std::nullopt);
      } else {
        if (recv_prev) put(Op::kRecvPrev, std::nullopt);
        if (send_next) put(Op::kSendNext, send_next);
        if (recv_next) put(Op::kRecvNext, std::nullopt);
        if (send_prev) put(Op::kSendPrev, send_prev);
      }
    };
    auto forward = [&](int64_t v) -> std::optional<Action> {
      const int64_t c = chunk(v, true);
      const int64_t m = order[static_cast<std::size_t>(c)][static_cast<std::size_t>(forwards[static_cast<std::size_t>(c)]++)];
      const int64_t stage = c * pp + r;
      out.push_back({Op::kCompute, act(stage, ActionType::kF, m)});
      if (stage == stages - 1) return std::nullopt;  // the last stage sends nothing forward
      return act(stage, ActionType::kSendF, m);
    };
    auto backward = [&](int64_t v) -> std::optional<Action> {
      const int64_t c = chunk(v, false);
      const int64_t m = order[static_cast<std::size_t>(c)][static_cast<std::size_t>(backwards[static_cast<std::size_t>(c)]++)];
      const int64_t stage = c * pp + r;
      out.push_back({Op::kCompute, act(stage, ActionType::kB, m)});
      if (stage == 0) return std::nullopt;  // the first stage sends nothing backward
      return act(stage, ActionType::kSendB, m);
    };
    int64_t warmup = 2 * (pp - 1 - r) + (chunks - 1) * group;
    const bool all_warmup = warmup >= total;
    if (all_warmup) warmup = total;
    const int64_t remaining = total - warmup;
    if (r != 0) call(std::nullopt, true, std::nullopt, false);  // recv_forward of the first input
    for (int64_t k = 0; k < warmup; ++k) {
      const auto send = forward(k);
      const bool recv = receives(k, true) && k != total - 1;
      call(send, recv, std::nullopt, false);  // send_forward_recv_forward (waited)
      if (k == warmup - 1 && !all_warmup) call(std::nullopt, false, std::nullopt, r != pp - 1);  // send_backward_recv_backward
    }
    for (int64_t k = 0; k < remaining; ++k) {
      const int64_t fk = k + warmup;
      const auto send = forward(fk);
      call(send, receives(fk, true) && k != remaining - 1, std::nullopt, false);  // pp_post_forward
      const auto grad = backward(k);
      call(std::nullopt, false, grad, receives(k, false));  // pp_post_backward
    }
    if (all_warmup && r != pp - 1) call(std::nullopt, false, std::nullopt, true);  // recv_backward
    for (int64_t k = remaining; k < total; ++k) {
      const auto grad = backward(k);
      call(std::nullopt, false, grad, receives(k, false) && k != total - 1);  // send_backward_recv_backward
    }
  }
  // Label each receive by the send it meets: the k-th receive at r from a peer meets the peer's
  // k-th send to r.
  Schedule s = empty(pp, microbatches);
  s.stages = stages;
  s.lowered = true;
  for (int64_t r = 0; r < pp; ++r) {
    const int64_t prev = (r + pp - 1) % pp, next = (r + 1) % pp;
    std::vector<Action> from_prev, from_next;  // the peers' sends to r, in order
    for (const Item& it : items[static_cast<std::size_t>(prev)]) {
      if (it.op == Op::kSendNext) from_prev.push_back(it.a);
    }
    for (const Item& it : items[static_cast<std::size_t>(next)]) {
      if (it.op == Op::kSendPrev) from_next.push_back(it.a);
    }
    std::size_t fp = 0, fn = 0;
    auto& l = s.ranks[static_cast<std::size_t>(r)];
    for (const Item& it : items[static_cast<std::size_t>(r)]) {
      if (it.op == Op::kRecvPrev || it.op == Op::kRecvNext) {
        auto& src = it.op == Op::kRecvPrev ? from_prev : from_next;
        std::size_t& i = it.op == Op::kRecvPrev ? fp : fn;
        if (i >= src.size()) {
          throw Internal("MegatronInterleaved: rank " + std::to_string(r) + " posts more receives than its peer sends");
        }
        const Action& sent = src[i++];
        l.push_back(it.op == Op::kRecvPrev ? act(sent.stage + 1, ActionType::kRecvF, *sent.microbatch)
                                           : act(sent.stage - 1, ActionType::kRecvB, *sent.microbatch));
      } else {
        l.push_back(it.a);
      }
    }
  }
  return s;
}

Schedule looped_bfs(int64_t pp, int64_t stages, int64_t microbatches) {
  check_multi("LoopedBFS", pp, stages, microbatches);
  Schedule s = empty(pp, microbatches);
  s.stages = stages;
  for (int64_t r = 0; r < pp; ++r) {
    auto& l = s.ranks[static_cast<std::size_t>(r)];
    l.resize(static_cast<std::size_t>(r));
    for (int64_t st = r; st < stages; st += pp) {
      for (int64_t m = 0; m < microbatches; ++m) l.push_back(act(st, ActionType::kF, m));
    }
    l.resize(l.size() + static_cast<std::size_t>(2 * (pp - 1 - r)));
    for (int64_t st = stages - pp + r; st >= 0; st -= pp) {
      for (int64_t m = microbatches - 1; m >= 0; --m) l.push_back(act(st, ActionType::kB, m));
    }
  }
  return s;
}

Schedule zbv_zero_bubble(int64_t pp, int64_t microbatches) {
  check_multi("ZBVZeroBubble", pp, 2 * pp, microbatches);
  Schedule s = empty(pp, microbatches);
  s.stages = 2 * pp;
  s.style = pp > 1 ? StageStyle::kV : StageStyle::kLoop;  // one rank: the two placements agree
  const int64_t n = std::max(2 * pp - 1, microbatches);
  for (int64_t r = 0; r < pp; ++r) {
    auto& l = s.ranks[static_cast<std::size_t>(r)];
    l.resize(static_cast<std::size_t>(r));
    const int64_t c0 = r, c1 = 2 * pp - 1 - r;
    int64_t f0 = 0, f1 = 0, b0 = 0, b1 = 0;
    auto put = [&](int64_t st, ActionType t, int64_t mb) { l.push_back(act(st, t, mb)); };
    for (int64_t k = 0; k < 2 * (pp - r) - 1; ++k) put(c0, ActionType::kF, f0++);
    for (int64_t k = 0; k < r; ++k) {
      put(c1, ActionType::kF, f1++);
      put(c0, ActionType::kF, f0++);
    }
    for (int64_t k = 0; k < pp - r; ++k) {
      put(c1, ActionType::kF, f1++);
      put(c1, ActionType::kI, b1);
      put(c1, ActionType::kW, b1++);
    }
    while (f1 < f0 || f0 < n) {
      if (f0 < n) put(c0, ActionType::kF, f0++);
      put(c0, ActionType::kI, b0);
      put(c0, ActionType::kW, b0++);
      put(c1, ActionType::kF, f1++);
      put(c1, ActionType::kI, b1);
      put(c1, ActionType::kW, b1++);
    }
    int64_t w0 = b0, w1 = b1;
    for (int64_t k = 0; k < r; ++k) {
      put(c0, ActionType::kI, b0++);
      put(c1, ActionType::kI, b1++);
    }
    for (int64_t k = 0; k < pp - r; ++k) {
      put(c0, ActionType::kI, b0++);
      put(c0, ActionType::kW, w0++);
    }
    while (w1 < b1) put(c1, ActionType::kW, w1++);
    while (w0 < b0) put(c0, ActionType::kW, w0++);
    if (w0 != f0 || b0 != f0 || w1 != f1 || b1 != f1) throw Internal("zbv_zero_bubble: the counts do not close");
    // The microbatches past M (run to fill the pipeline) are idle.
    for (auto& a : l) {
      if (a && a->microbatch && *a->microbatch >= microbatches) a.reset();
    }
  }
  return s;
}

bool is_single_stage(std::string_view name) {
  const std::string n = lower_name(name);
  return n == "gpipe" || n == "1f1b";
}

bool known_schedule(std::string_view name) {
  const std::string n = lower_name(name);
  return is_single_stage(n) || n == "interleaved1f1b" || n == "loopedbfs" || n == "interleavedzerobubble" ||
         n == "zbvzerobubble";
}

Schedule schedule_by_name(std::string_view name, int64_t pp, int64_t stages, int64_t microbatches) {
  const std::string n = lower_name(name);
  if (n == "gpipe") return gpipe(pp, microbatches);
  if (n == "1f1b") {
    // PyTorch's Schedule1F1B refuses it (Megatron's 1F1B, one_f_one_b itself, does not).
    if (microbatches < pp) {
      throw InvalidArgument("Schedule1F1B: Number of microbatches (" + std::to_string(microbatches) +
                            ") must be greater than or equal to the number of stages (" + std::to_string(pp) +
                            ").  [PyTorch]");
    }
    return one_f_one_b(pp, microbatches);
  }
  if (n == "interleaved1f1b") return interleaved_1f1b(pp, stages, microbatches);
  if (n == "loopedbfs") return looped_bfs(pp, stages, microbatches);
  if (n == "interleavedzerobubble") return interleaved_zero_bubble(pp, stages, microbatches);
  if (n == "zbvzerobubble") {
    if (stages != 2 * pp) {
      throw InvalidArgument("ZBV requires exactly 2 stages per rank, but got " + std::to_string(stages) + " stages over " +
                            std::to_string(pp) + " ranks.");
    }
    return zbv_zero_bubble(pp, microbatches);
  }
  throw NotFound("schedule " + quote_input(name) +
                 " is not one meshsim builds (GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, "
                 "ZBVZeroBubble); give DualPipeV or another as a CSV file");
}

void validate(const Schedule& s) {
  const int64_t pp = static_cast<int64_t>(s.ranks.size());
  if (pp < 1) throw InvalidArgument("a schedule needs at least one rank");
  if (s.stages < pp || s.stages % pp != 0) {
    throw InvalidArgument("a schedule of " + std::to_string(s.stages) + " stages over " + std::to_string(pp) +
                          " ranks: the stages must be a multiple of the ranks (stage s on rank s mod pp)");
  }
  // Per (stage, microbatch): forwards, full backwards, input backwards, weight backwards seen
  // (a flat table: a (stage, microbatch) holds at least two actions, so it is bounded by them).
  // A CSV may name far more (stage, microbatch) pairs than it holds actions: then a map.
  const auto m_count = static_cast<std::size_t>(s.microbatches);
  std::size_t actions = 0;
  for (const auto& l : s.ranks) actions += l.size();
  const std::size_t cells = static_cast<std::size_t>(s.stages) * m_count;
  const bool flat = s.microbatches > 0 && static_cast<std::size_t>(s.stages) <= SIZE_MAX / m_count && cells <= 2 * actions + 64;
  std::vector<std::array<int, 4>> table(flat ? cells : 0, std::array<int, 4>{});
  std::map<std::size_t, std::array<int, 4>> sparse;
  auto seen = [&](int64_t stage, int64_t mb) -> std::array<int, 4>& {
    const std::size_t at = static_cast<std::size_t>(stage) * m_count + static_cast<std::size_t>(mb);
    return flat ? table[at] : sparse[at];
  };
  for (int64_t r = 0; r < pp; ++r) {
    const auto& l = s.ranks[static_cast<std::size_t>(r)];
    for (std::size_t k = 0; k < l.size(); ++k) {
      if (!l[k]) continue;
      const Action& a = *l[k];
      const std::string where = "rank " + std::to_string(r) + " action " + std::to_string(k) + " (" + to_string(a) + ")";
      if (a.stage >= s.stages) throw InvalidArgument(where + ": stage " + std::to_string(a.stage) + " is past the last stage");
      if (rank_of(s, a.stage) != r) {
        throw InvalidArgument(where + ": stage " + std::to_string(a.stage) + " lives on rank " + std::to_string(rank_of(s, a.stage)));
      }
      if (a.microbatch && *a.microbatch >= s.microbatches) {
        throw InvalidArgument(where + ": microbatch " + std::to_string(*a.microbatch) + " is past the last of " +
                              std::to_string(s.microbatches));
      }
      if (a.type != ActionType::kF && a.type != ActionType::kB && a.type != ActionType::kI && a.type != ActionType::kW) continue;
      auto& c = seen(a.stage, *a.microbatch);
      const int idx = a.type == ActionType::kF ? 0 : a.type == ActionType::kB ? 1 : a.type == ActionType::kI ? 2 : 3;
      if (c[static_cast<std::size_t>(idx)]++) throw InvalidArgument(where + ": runs a second time");
      if (idx != 0 && !c[0]) throw InvalidArgument(where + ": a backward before its forward");
      if (idx == 3 && !c[2] && !c[1]) throw InvalidArgument(where + ": a weight backward before its input backward");
    }
  }
  for (int64_t st = 0; st < s.stages; ++st) {
    for (int64_t m = 0; m < s.microbatches; ++m) {
      const std::array<int, 4> c = seen(st, m);
      const bool backward = c[1] == 1 ? c[2] == 0 && c[3] == 0 : c[2] == 1 && c[3] == 1;
      if (c[0] != 1 || !backward) {
        throw InvalidArgument("stage " + std::to_string(st) + " microbatch " + std::to_string(m) + " runs " +
                              std::to_string(c[0]) + " forwards and " + (backward ? "its" : "not exactly one") +
                              " backward (B, or I then W)");
      }
    }
  }
}

void validate_lowered(const Schedule& s) {
  // validate passes over sends and receives (it checks their stage's rank only), so the lowered
  // schedule is checked as it is: an action is named by its place in the CSV's row.
  validate(s);
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

namespace {

// add_send_recv is PyTorch's _add_send_recv (see the header).
Schedule add_send_recv(const Schedule& compute) {
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

}  // namespace

Schedule read_csv(std::string_view text, int64_t stages, int64_t microbatches, bool lowered) {
  if (text.size() > (std::size_t{16} << 20)) throw ResourceExhausted("a schedule CSV is over 16 MiB");
  Schedule s;
  s.stages = stages;
  s.microbatches = microbatches;
  s.lowered = lowered;
  int64_t total = 0;
  std::size_t line_no = 0;
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() && text.empty()) break;  // the final newline
    if (static_cast<int64_t>(s.ranks.size()) >= kMaxStages) throw ResourceExhausted("a schedule CSV has over " + std::to_string(kMaxStages) + " rows");
    auto& row = s.ranks.emplace_back();
    std::size_t cell = 0;
    while (true) {
      const std::size_t comma = line.find(',');
      const std::string_view c = line.substr(0, comma);
      ++cell;
      if (++total > kMaxActions) throw ResourceExhausted("a schedule CSV holds over " + std::to_string(kMaxActions) + " cells");
      if (c.find_first_not_of(' ') == std::string_view::npos) {
        row.emplace_back();
      } else {
        try {
          row.push_back(parse_action(c));
        } catch (const Error& e) {
          throw InvalidArgument("schedule CSV line " + std::to_string(line_no) + " cell " + std::to_string(cell) + ": " + e.what());
        }
        const Action& a = *row.back();
        if (!lowered && (is_send(a.type) || is_recv(a.type))) {
          throw InvalidArgument("schedule CSV line " + std::to_string(line_no) + " cell " + std::to_string(cell) + ": " +
                                to_string(a) + " is a send or receive in a compute_only schedule");
        }
      }
      if (comma == std::string_view::npos) break;
      line.remove_prefix(comma + 1);
    }
  }
  if (s.ranks.empty()) throw InvalidArgument("a schedule CSV has no rows (one per pp rank)");
  // Two stages per rank whose rows hold stages r and 2 pp - 1 - r (and not r and r + pp) are
  // PyTorch's "v" placement (ZBVZeroBubble, DualPipeV).
  const auto pp = static_cast<int64_t>(s.ranks.size());
  if (pp > 1 && s.stages == 2 * pp) {
    auto fits = [&](StageStyle style) {
      Schedule probe;
      probe.ranks.resize(s.ranks.size());
      probe.style = style;
      for (int64_t r = 0; r < pp; ++r) {
        for (const auto& a : s.ranks[static_cast<std::size_t>(r)]) {
          if (a && stage_rank(probe, a->stage) != r) return false;
        }
      }
      return true;
    };
    if (!fits(StageStyle::kLoop) && fits(StageStyle::kV)) s.style = StageStyle::kV;
  }
  return s;
}

std::string write_csv(const Schedule& s) {
  std::string out;
  for (const auto& row : s.ranks) {
    for (std::size_t k = 0; k < row.size(); ++k) {
      if (k) out += ',';
      if (row[k]) out += to_string(*row[k]);
    }
    out += '\n';
  }
  return out;
}

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
  const std::string sem = semantics == SendSemantics::kRendezvous ? "rendezvous" : "eager";
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
