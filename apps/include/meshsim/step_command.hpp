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

namespace meshsim::step_command {

struct Options {
  std::string schedule;               // GPipe, 1F1B or Interleaved1F1B (any case), or a CSV file of PyTorch's form
  std::optional<int64_t> pp;          // pipeline ranks: required with a built-in, a CSV's rows otherwise
  std::optional<int64_t> loss_chunks;   // torchtitan's loss.num_chunks (ChunkedLossWrapper)
  std::optional<int64_t> microbatches;  // >= 1; required without --preset, default 1 with it
  // The step of a torchtitan job (--preset):
  std::string preset;                 // torchtitan:KEY=V,... or torchtitan:FILE.toml
  std::optional<int64_t> world_size;  // for dp_shard = -1
  std::string model;                  // a built-in name or a .toml file with a [model] table
  std::optional<int64_t> seq_len, local_batch_size;
  std::optional<int64_t> gpus_per_host;
  int64_t rank = 0;                   // the rank whose program the table reports
  std::string ranks;                  // simulate exactly: "all", or "0,3,8-15"
  std::vector<std::string> faults;    // KIND@RANK
  std::string trace;                  // write Chrome/Perfetto trace JSON here
  std::string chakra;                 // write Chakra execution traces PREFIX.<npu>.et here
  std::string chakra_world = "all";   // every rank, or "replica" (one data-parallel replica)
  std::string job;                    // a torchtitan job file, read whole
  std::string megatron_args;          // Megatron-LM's flags, or @FILE
  std::string reshard_after_forward;  // "" = the job file's, else default
  std::string activation_checkpoint;  // "" = the job file's, else selective
  bool no_metrics = false;            // a step that does not log
  bool grid = false;                  // print the pipeline's step x rank grid (always when it deadlocks)
  std::optional<int64_t> stages;      // Interleaved1F1B: required; a CSV: default its largest stage + 1
  std::string send_semantics = "rendezvous";  // or "eager"
  std::string lowering = "runtime";           // or "add_send_recv"
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
