#include "meshsim/schedule.hpp"

#include <algorithm>
#include <array>
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

Action act(int64_t stage, ActionType t, int64_t mb) { return Action{stage, t, mb}; }

int64_t rank_of(const Schedule& s, int64_t stage) { return stage % static_cast<int64_t>(s.ranks.size()); }

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

}  // namespace

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
  a.stage = *stage;
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
  a.microbatch = digits(s, at, kMaxMicrobatches - 1, "microbatch");
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
  check_sizes(pp, microbatches);
  if (stages < pp || stages % pp != 0 || stages > kMaxStages) {
    throw InvalidArgument("Interleaved1F1B: " + std::to_string(stages) + " stages over " + std::to_string(pp) +
                          " ranks: the stages must be a multiple of the ranks (and at most " + std::to_string(kMaxStages) + ")");
  }
  const int64_t local = stages / pp;
  if (local * microbatches * pp * 4 > kMaxActions) {
    throw ResourceExhausted("an Interleaved1F1B schedule of " + std::to_string(stages) + " stages and " +
                            std::to_string(microbatches) + " microbatches holds more than " + std::to_string(kMaxActions) + " actions");
  }
  const int64_t rounds = std::max<int64_t>(1, microbatches / pp);
  const int64_t per_round = microbatches / rounds;
  if (microbatches % rounds != 0) {
    throw InvalidArgument("Interleaved 1F1B requires the number of microbatches to be a multiple of the number of rounds (" +
                          std::to_string(rounds) + "), but got " + std::to_string(microbatches) + ".");
  }
  Schedule s = empty(pp, microbatches);
  s.stages = stages;
  for (int64_t r = 0; r < pp; ++r) {
    auto& l = s.ranks[static_cast<std::size_t>(r)];
    const int64_t warmup = std::min((local - 1) * per_round + 2 * (pp - 1 - r), microbatches * local);
    const int64_t ops = local * microbatches;
    const int64_t fwd_bwd = ops - warmup;
    const int64_t total = warmup + fwd_bwd + warmup;
    const int64_t post_warmup = (local * pp + 2 * (pp - 1 - r)) - (warmup + r);
    auto forward_stage = [&](int64_t step) { return ((step / per_round) % local) * pp + r; };
    auto backward_stage = [&](int64_t step) { return (local - 1 - ((step - warmup) / per_round) % local) * pp + r; };
    std::vector<int64_t> next_f(static_cast<std::size_t>(stages), 0), next_b(static_cast<std::size_t>(stages), 0);
    l.resize(static_cast<std::size_t>(r));  // idle until the first forward reaches this rank
    for (int64_t op = 0; op < total; ++op) {
      if (op < warmup + fwd_bwd) {
        const int64_t st = forward_stage(op);
        l.push_back(act(st, ActionType::kF, next_f[static_cast<std::size_t>(st)]++));
        if (op == warmup - 1) l.resize(l.size() + static_cast<std::size_t>(std::max<int64_t>(0, post_warmup)));
      }
      if (op >= warmup) {
        if (op >= warmup + fwd_bwd) l.emplace_back();  // cooldown: keep step with the others' 1F1B
        const int64_t st = backward_stage(op);
        l.push_back(act(st, ActionType::kB, next_b[static_cast<std::size_t>(st)]++));
      }
    }
  }
  return s;
}

void validate(const Schedule& s) {
  const int64_t pp = static_cast<int64_t>(s.ranks.size());
  if (pp < 1) throw InvalidArgument("a schedule needs at least one rank");
  if (s.stages < pp || s.stages % pp != 0) {
    throw InvalidArgument("a schedule of " + std::to_string(s.stages) + " stages over " + std::to_string(pp) +
                          " ranks: the stages must be a multiple of the ranks (stage s on rank s mod pp)");
  }
  // Per (stage, microbatch): forwards, full backwards, input backwards, weight backwards seen.
  std::map<std::pair<int64_t, int64_t>, std::array<int, 4>> seen;
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
      auto& c = seen[{a.stage, *a.microbatch}];
      const int idx = a.type == ActionType::kF ? 0 : a.type == ActionType::kB ? 1 : a.type == ActionType::kI ? 2 : 3;
      if (c[static_cast<std::size_t>(idx)]++) throw InvalidArgument(where + ": runs a second time");
      if (idx != 0 && !c[0]) throw InvalidArgument(where + ": a backward before its forward");
      if (idx == 3 && !c[2] && !c[1]) throw InvalidArgument(where + ": a weight backward before its input backward");
    }
  }
  for (int64_t st = 0; st < s.stages; ++st) {
    for (int64_t m = 0; m < s.microbatches; ++m) {
      auto it = seen.find({st, m});
      const std::array<int, 4> c = it == seen.end() ? std::array<int, 4>{} : it->second;
      const bool backward = c[1] == 1 ? c[2] == 0 && c[3] == 0 : c[2] == 1 && c[3] == 1;
      if (c[0] != 1 || !backward) {
        throw InvalidArgument("stage " + std::to_string(st) + " microbatch " + std::to_string(m) + " runs " +
                              std::to_string(c[0]) + " forwards and " + (backward ? "its" : "not exactly one") +
                              " backward (B, or I then W)");
      }
    }
  }
}

Schedule lower(const Schedule& compute) {
  validate(compute);
  if (compute.lowered) throw InvalidArgument("lower: the schedule is lowered already (it holds sends and receives)");
  Schedule out = compute;
  const int64_t pp = static_cast<int64_t>(compute.ranks.size());
  for (auto& l : out.ranks) l.clear();
  out.lowered = true;
  std::vector<std::set<std::tuple<int64_t, int, int64_t>>> done(static_cast<std::size_t>(pp));
  auto key = [](const Action& a) { return std::tuple<int64_t, int, int64_t>{a.stage, static_cast<int>(a.type), a.microbatch.value_or(-1)}; };
  auto has = [&](int64_t r, int64_t stage, ActionType t, int64_t mb) {
    return done[static_cast<std::size_t>(r)].count({stage, static_cast<int>(t), mb}) > 0;
  };
  auto has_comms = [&](const Action& a) {
    if (a.type == ActionType::kF) return a.stage != compute.stages - 1 && rank_of(compute, a.stage + 1) != rank_of(compute, a.stage);
    if (is_backward(a.type)) return a.stage != 0 && rank_of(compute, a.stage - 1) != rank_of(compute, a.stage);
    return false;
  };
  auto ready = [&](int64_t r, const Action& a) {
    const int64_t mb = a.microbatch.value_or(0);
    if (a.type == ActionType::kF && a.stage != 0) {
      return has(r, a.stage, ActionType::kRecvF, mb) || has(r, a.stage - 1, ActionType::kF, mb);
    }
    if (is_backward(a.type) && a.stage != compute.stages - 1) {
      return has(r, a.stage, ActionType::kRecvB, mb) || has(r, a.stage + 1, ActionType::kI, mb) ||
             has(r, a.stage + 1, ActionType::kB, mb);
    }
    return true;
  };
  std::vector<std::size_t> next(static_cast<std::size_t>(pp), 0);
  for (bool left = true; left;) {
    left = false;
    bool progress = false;
    for (int64_t r = 0; r < pp; ++r) {
      const auto& l = compute.ranks[static_cast<std::size_t>(r)];
      std::size_t& k = next[static_cast<std::size_t>(r)];
      if (k == l.size()) continue;
      left = true;
      const std::optional<Action>& a = l[k];
      if (a && !ready(r, *a)) continue;
      if (a) {
        out.ranks[static_cast<std::size_t>(r)].push_back(*a);
        done[static_cast<std::size_t>(r)].insert(key(*a));
        if (has_comms(*a)) {
          const int64_t mb = *a->microbatch;
          const Action send = act(a->stage, a->type == ActionType::kF ? ActionType::kSendF : ActionType::kSendB, mb);
          const auto [recv, peer] = peer_of(compute, send);
          out.ranks[static_cast<std::size_t>(r)].push_back(send);
          done[static_cast<std::size_t>(r)].insert(key(send));
          out.ranks[static_cast<std::size_t>(peer)].push_back(recv);
          done[static_cast<std::size_t>(peer)].insert(key(recv));
        }
      }
      ++k;
      progress = true;
    }
    if (left && !progress) {
      std::string heads;
      for (int64_t r = 0; r < pp; ++r) {
        const auto& l = compute.ranks[static_cast<std::size_t>(r)];
        const std::size_t k = next[static_cast<std::size_t>(r)];
        if (k < l.size() && l[k]) heads += (heads.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r) + " at " + to_string(*l[k]);
      }
      throw InvalidArgument("lower: the compute schedule cannot be lowered: no rank's next action has its input (" +
                            heads + ")");
    }
  }
  return out;
}

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
  auto key = [](const Action& a) { return std::tuple<int64_t, int, int64_t>{a.stage, static_cast<int>(a.type), a.microbatch.value_or(-1)}; };
  auto head = [&](int64_t r) -> const std::optional<Action>* {
    const auto& l = s.ranks[static_cast<std::size_t>(r)];
    const std::size_t k = at[static_cast<std::size_t>(r)];
    return k < l.size() ? &l[k] : nullptr;
  };
  for (bool moved = true; moved;) {
    moved = false;
    for (int64_t r = 0; r < pp; ++r) {
      while (const std::optional<Action>* h = head(r)) {
        const std::optional<Action>& a = *h;
        if (!a || !(is_send(a->type) || is_recv(a->type))) {
          ++at[static_cast<std::size_t>(r)];
          moved = true;
          continue;
        }
        const auto [match, peer] = peer_of(s, *a);
        if (semantics == SendSemantics::kEager) {
          if (is_send(a->type)) {
            posted.insert(key(*a));
          } else if (!posted.count(key(match))) {
            break;
          }
          ++at[static_cast<std::size_t>(r)];
          moved = true;
          continue;
        }
        const std::optional<Action>* ph = head(peer);
        if (peer == r || !ph || !*ph || !(**ph == match)) break;
        ++at[static_cast<std::size_t>(r)];
        ++at[static_cast<std::size_t>(peer)];
        moved = true;
      }
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
