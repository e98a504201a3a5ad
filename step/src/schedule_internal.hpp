// step/src/schedule_internal.hpp — what the schedule files share: actions' kinds, the size
// checks every built schedule passes, and a send's or receive's peer.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "meshsim/error.hpp"
#include "meshsim/schedule.hpp"

namespace meshsim::step::detail {

inline bool has_microbatch(ActionType t) {
  return t != ActionType::kUnshard && t != ActionType::kReshard && t != ActionType::kReduceGrad;
}
inline bool is_send(ActionType t) { return t == ActionType::kSendF || t == ActionType::kSendB; }
inline bool is_recv(ActionType t) { return t == ActionType::kRecvF || t == ActionType::kRecvB; }
inline bool is_backward(ActionType t) { return t == ActionType::kB || t == ActionType::kI; }

inline void check_sizes(int64_t pp, int64_t microbatches) {
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

inline Schedule empty(int64_t pp, int64_t microbatches) {
  Schedule s;
  s.stages = pp;
  s.microbatches = microbatches;
  s.ranks.resize(static_cast<std::size_t>(pp));
  return s;
}

// act narrows to the compact form: every caller passes a stage below kMaxStages and a
// microbatch below kMaxMicrobatches (both checked before any action is built).
inline Action act(int64_t stage, ActionType t, int64_t mb) {
  return Action{static_cast<int32_t>(stage), t, static_cast<int32_t>(mb)};
}

inline int64_t rank_of(const Schedule& s, int64_t stage) { return stage_rank(s, stage); }

// The peer of a send or receive: the action it matches and the rank that holds it.
inline std::pair<Action, int64_t> peer_of(const Schedule& s, const Action& a) {
  const int64_t mb = a.microbatch.value_or(0);
  switch (a.type) {
    case ActionType::kSendF: return {act(a.stage + 1, ActionType::kRecvF, mb), rank_of(s, a.stage + 1)};
    case ActionType::kRecvF: return {act(a.stage - 1, ActionType::kSendF, mb), rank_of(s, a.stage - 1)};
    case ActionType::kSendB: return {act(a.stage - 1, ActionType::kRecvB, mb), rank_of(s, a.stage - 1)};
    case ActionType::kRecvB: return {act(a.stage + 1, ActionType::kSendB, mb), rank_of(s, a.stage + 1)};
    default: throw Internal("peer_of: " + to_string(a) + " is no send or receive");
  }
}

// prepare_for_runtime and add_send_recv: PyTorch's lowering passes (schedule_lowering.cpp).
Schedule prepare_for_runtime(const Schedule& compute);
Schedule add_send_recv(const Schedule& compute);

}  // namespace meshsim::step::detail
