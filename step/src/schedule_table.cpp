// The schedule table: every schedule meshsim builds by name (PyTorch's GPipe, 1F1B,
// Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble; Megatron's interleaved), each
// re-derived from its class, and the one table every name check reads (find_schedule).
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


}  // namespace

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

Schedule one_f_one_b_lowered(int64_t pp, int64_t microbatches) {
  check_sizes(pp, microbatches);
  Schedule s = empty(pp, microbatches);
  s.lowered = true;
  s.batches.resize(static_cast<std::size_t>(pp));
  for (int64_t r = 0; r < pp; ++r) {
    auto& l = s.ranks[static_cast<std::size_t>(r)];
    auto& batch = s.batches[static_cast<std::size_t>(r)];
    const bool first = r == 0, last = r == pp - 1;
    int32_t next_batch = 0;
    // post: one _batch_p2p call's ops; two (a send and a receive) are one batch_isend_irecv.
    auto post = [&](std::vector<Action> ops) {
      const int32_t id = ops.size() > 1 ? next_batch++ : -1;
      for (const Action& a : ops) {
        l.push_back(a);
        batch.push_back(id);
      }
    };
    auto compute = [&](ActionType t, int64_t mb) {
      l.push_back(act(r, t, mb));
      batch.push_back(-1);
    };
    const int64_t warmup = std::min(microbatches, pp - r);
    int64_t f = 0, b = 0;
    std::vector<Action> held;  // sends computed but not fired yet
    for (; f < warmup; ++f) {
      if (!first) post({act(r, ActionType::kRecvF, f)});
      compute(ActionType::kF, f);
      if (!last) {
        if (f != warmup - 1) post({act(r, ActionType::kSendF, f)});
        else held = {act(r, ActionType::kSendF, f)};
      }
    }
    while (true) {
      std::vector<Action> ops = held;
      if (!last) ops.push_back(act(r, ActionType::kRecvB, b));
      post(ops);
      compute(ActionType::kB, b);
      held.clear();
      if (!first) held = {act(r, ActionType::kSendB, b)};
      ++b;
      if (f == microbatches) break;
      ops = held;
      if (!first) ops.push_back(act(r, ActionType::kRecvF, f));
      post(ops);
      held.clear();
      compute(ActionType::kF, f);
      if (!last) held = {act(r, ActionType::kSendF, f)};
      ++f;
    }
    post(held);
    for (; b < microbatches; ++b) {
      if (!last) post({act(r, ActionType::kRecvB, b)});
      compute(ActionType::kB, b);
      if (!first) post({act(r, ActionType::kSendB, b)});
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

namespace {

constexpr ScheduleInfo kSchedules[] = {
    {ScheduleKind::kGPipe, "GPipe", true, true, false},
    {ScheduleKind::k1F1B, "1F1B", true, true, true},
    {ScheduleKind::kInterleaved1F1B, "Interleaved1F1B", false, true, true},
    {ScheduleKind::kLoopedBFS, "LoopedBFS", false, true, false},
    {ScheduleKind::kInterleavedZeroBubble, "InterleavedZeroBubble", false, true, false},
    {ScheduleKind::kZBVZeroBubble, "ZBVZeroBubble", false, true, false},
    {ScheduleKind::kMegatronInterleaved, "MegatronInterleaved", false, false, true},
};

}  // namespace

const ScheduleInfo* find_schedule(std::string_view name) {
  const std::string n = lower_case(name);
  for (const ScheduleInfo& s : kSchedules) {
    if (lower_case(s.name) == n) return &s;
  }
  return nullptr;
}

std::string schedule_names(bool megatron) {
  std::string out;
  for (const ScheduleInfo& s : kSchedules) {
    if (megatron ? s.megatron : s.pytorch) out += (out.empty() ? "" : ", ") + std::string(s.name);
  }
  return out;
}

bool is_single_stage(std::string_view name) {
  const ScheduleInfo* s = find_schedule(name);
  return s && s->single_stage;
}

bool known_schedule(std::string_view name) {
  const ScheduleInfo* s = find_schedule(name);
  return s && s->pytorch;
}

Schedule single_stage_lowered(std::string_view name, int64_t pp, int64_t microbatches) {
  Schedule compute = schedule_by_name(name, pp, pp, microbatches);
  const ScheduleInfo* info = find_schedule(name);
  if (!info->single_stage) throw InvalidArgument("schedule " + quote_input(name) + " is not a single-stage schedule");
  if (info->kind == ScheduleKind::k1F1B) return one_f_one_b_lowered(pp, microbatches);
  return lower(compute, Lowering::kAddSendRecv);
}

Schedule schedule_by_name(std::string_view name, int64_t pp, int64_t stages, int64_t microbatches) {
  const ScheduleInfo* info = find_schedule(name);
  if (!info || !info->pytorch) {
    throw NotFound("schedule " + quote_input(name) + " is not one meshsim builds (" + schedule_names() +
                   "); give DualPipeV or another as a CSV file");
  }
  switch (info->kind) {
    case ScheduleKind::kGPipe: return gpipe(pp, microbatches);
    case ScheduleKind::k1F1B:
      // PyTorch's Schedule1F1B refuses it (Megatron's 1F1B, one_f_one_b itself, does not).
      if (microbatches < pp) {
        throw InvalidArgument("Schedule1F1B: Number of microbatches (" + std::to_string(microbatches) +
                              ") must be greater than or equal to the number of stages (" + std::to_string(pp) +
                              ").  [PyTorch]");
      }
      return one_f_one_b(pp, microbatches);
    case ScheduleKind::kInterleaved1F1B: return interleaved_1f1b(pp, stages, microbatches);
    case ScheduleKind::kLoopedBFS: return looped_bfs(pp, stages, microbatches);
    case ScheduleKind::kInterleavedZeroBubble: return interleaved_zero_bubble(pp, stages, microbatches);
    case ScheduleKind::kZBVZeroBubble:
      if (stages != 2 * pp) {
        throw InvalidArgument("ZBV requires exactly 2 stages per rank, but got " + std::to_string(stages) + " stages over " +
                              std::to_string(pp) + " ranks.");
      }
      return zbv_zero_bubble(pp, microbatches);
    case ScheduleKind::kMegatronInterleaved: break;
  }
  throw Internal("schedule_by_name: " + std::string(info->name) + " has no builder");
}


}  // namespace meshsim::step
