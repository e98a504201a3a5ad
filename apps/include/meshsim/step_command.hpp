// step_command.hpp — `meshsim step` (in progress): one pipeline group's schedule, built in or read
// from PyTorch's CSV, lowered to sends and receives and checked under rendezvous or eager sends.
//
//   meshsim step --schedule 1F1B --pp 4 --microbatches 8
//   meshsim step --schedule my_schedule.csv --microbatches 8 --send-semantics rendezvous
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>

namespace meshsim::step_command {

struct Options {
  std::string schedule;               // GPipe, 1F1B or Interleaved1F1B (any case), or a CSV file of PyTorch's form
  std::optional<int64_t> pp;          // pipeline ranks: required with a built-in, a CSV's rows otherwise
  int64_t microbatches = 0;           // >= 1
  std::optional<int64_t> stages;      // Interleaved1F1B: required; a CSV: default its largest stage + 1
  std::string send_semantics = "rendezvous";  // or "eager"
  std::string dump_schedule;          // write the lowered schedule here, as CSV
  std::string format = "text";        // or "json"
  int64_t max_rows = 256;             // grid rows printed (text)
};

// run prints the schedule's grid (rank by step, PyTorch's _format_pipeline_order layout) and OK,
// or FAILED naming the ranks that wait forever; returns 0 or 1. Bad options or schedules throw
// meshsim::Error.
int run(const Options& o, std::ostream& out);

}  // namespace meshsim::step_command
