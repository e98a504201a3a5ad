// step_command.hpp — `meshsim step`: with --preset, one torchtitan training step's collectives on
// every rank, checked (every group's members agree, the step makes progress) and counted per dim
// and per link; without, one pipeline group's schedule, built in or read from PyTorch's CSV,
// lowered to sends and receives and checked under rendezvous or eager sends.
//
//   meshsim step --preset torchtitan:pp=4,dp_shard=8,tp=2 --model llama3-8b --seq-len 8192
//                --local-batch-size 8 --microbatches 8 --gpus-per-host 8
//   meshsim step --schedule 1F1B --pp 4 --microbatches 8
//   meshsim step --schedule my_schedule.csv --microbatches 8 --send-semantics rendezvous
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "meshsim/step_job.hpp"

namespace meshsim::step_command {

struct Options {
  // The step's fields (step_fields(): --preset, --model, --schedule, --microbatches, --stages,
  // --fault, ...), read into the typed spec the Python binding fills too.
  step::StepSpec spec;
  std::optional<int64_t> pp;          // pipeline ranks (without --preset): required with a built-in, a CSV's rows otherwise
  std::string trace;                  // write Chrome/Perfetto trace JSON here
  std::string chakra;                 // write Chakra execution traces PREFIX.<npu>.et here
  std::string chakra_world = "all";   // every rank, or "replica" (one data-parallel replica)
  bool grid = false;                  // print the pipeline's step x rank grid (always when it deadlocks)
  std::string dump_schedule;          // write the lowered schedule here, as CSV
  std::string format = "text";        // or "json"
  int64_t max_rows = 256;             // grid rows printed (text)
  int64_t max_cols = 64;              // grid rank columns printed (text)
};

// run prints the schedule's grid (rank by step, PyTorch's _format_pipeline_order layout) and OK,
// or FAILED naming the ranks that wait forever; returns 0 or 1. Bad options or schedules throw
// meshsim::Error.
int run(const Options& o, std::ostream& out);

}  // namespace meshsim::step_command
