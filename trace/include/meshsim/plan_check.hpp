// plan_check.hpp — Flight Recorder dumps held to the step `meshsim step` planned: `meshsim trace
// check DIR --against "--preset torchtitan:... --model ..."`.
//
// Each dumped rank's kept records are compared, in order, with its planned program (the step's
// events, repeated step after step): the same operation (all_gather, reduce_scatter,
// all_reduce, all_to_all, send, recv, whatever c10d names the variant), on the same group (the
// members of the planned dim's group, or for a send or receive the planned peer), with the same
// dtype and bytes (an all_gather's output, a reduce_scatter's input, the buffer, the tensor).
// The kept records may start mid-step (the ring buffer wrapped) or before the first step (setup
// collectives): they are aligned to the plan where the longest run of records agrees with it, and
// the first record after that which leaves the plan is reported: "rank 3 issued nccl:reduce_scatter
// #37 on group '5' (tp [2, 3]) where the plan has all_gather tp ... (event 12 of the step: ...)".
// Barriers and coalesced-block markers are not step events and are passed over.
//
// Thread safety: plain values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshsim/flight_recorder.hpp"
#include "meshsim/step_job.hpp"

namespace meshsim::trace {

struct PlanDivergence {
  int64_t rank = 0;
  int64_t record_id = -1;  // the record that leaves the plan (-1: the records end early)
  std::string message;
};

struct PlanReport {
  bool ok = true;
  int64_t ranks_compared = 0, records_compared = 0;
  std::vector<PlanDivergence> divergences;  // by rank, the first place each leaves the plan
  std::vector<std::string> notes;
};

// check_against_plan: errors: OutOfRange when a dump's rank is outside the plan's world.
PlanReport check_against_plan(const std::vector<Dump>& dumps, const step::StepRun& plan);

}  // namespace meshsim::trace
