// meshsim/step_job.hpp — a torchtitan job's step as users name it (the preset, the model by name
// or file, a schedule by name or CSV file, faults and ranks as text), resolved into a Job and
// checked, with the report as JSON: what `meshsim step --preset ...` and Python's
// `meshsim.step(...)` both run.
//
//   StepSpec s{.preset = "torchtitan:pp=4,dp_shard=8,tp=2", .model = "llama3-8b",
//              .seq_len = 8192, .local_batch_size = 8, .microbatches = 8, .gpus_per_host = 8};
//   StepRun run = run_step(s);            // run.report.ok, run.report.diagnosis
//   nlohmann::json j = step_json(run);     // the fields docs/step.md lists
//
// Thread safety: plain values; run_step reads the files the spec names.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "meshsim/chrome_trace.hpp"
#include "meshsim/preset.hpp"
#include "meshsim/schedule.hpp"
#include "meshsim/step_program.hpp"

namespace meshsim::step {

struct StepSpec {
  std::string preset;                  // torchtitan:KEY=V,... or torchtitan:FILE.toml (read as --job)
  std::string job;                     // a torchtitan job file (TOML, or 0.3.0's saved JSON): read whole
  std::string megatron_args;           // Megatron-LM's own flags ("--tensor-model-parallel-size 2 ...", or "@FILE")
  std::optional<int64_t> world_size;   // for dp_shard = -1
  std::string model;                   // a built-in name or a .toml file with a [model] table
  std::optional<int64_t> seq_len, local_batch_size;
  std::optional<int64_t> microbatches;  // default 1 (torchtitan's num_pp_microbatches)
  std::optional<int64_t> loss_chunks;   // torchtitan's loss.num_chunks; default 1 (unchunked)
  std::string schedule;                // GPipe, 1F1B (default), Interleaved1F1B or a CSV file
  std::optional<int64_t> stages;       // total stages (a multiple of pp)
  std::string send_semantics = "rendezvous";  // or "eager"
  std::string lowering = "runtime";    // or "add_send_recv" (multi-stage schedules, compute-only CSVs)
  std::optional<int64_t> gpus_per_host;
  int64_t rank = 0;
  std::string ranks;                   // "all", or "0,3,8-15"
  std::vector<std::string> faults;     // KIND@RANK
  std::string reshard_after_forward;   // "" = the job file's, else "default"; always, never
  std::string activation_checkpoint;   // "" = the job file's, else torchtitan's selective; full, none
  bool log_metrics = true;
  bool load_balance = true;            // torchtitan's MoE load balancing (load_balance_coeff set)
};

// StepField is one field of StepSpec as every front names it: the tool's flag (`meshsim step`
// and `trace check --against`), Python's keyword (`meshsim.step(seq_len=...)`), and whether it
// defines the step's job (what `--against` takes) or only how it is checked. step_fields() is
// the one table the tool's flags, `--against` and the Python binding are read through.
struct StepField {
  using Member = std::variant<std::string StepSpec::*, std::optional<int64_t> StepSpec::*, int64_t StepSpec::*,
                              std::vector<std::string> StepSpec::*, bool StepSpec::*>;
  std::string_view flag;     // "--seq-len"; a bool's flag turns it off ("--no-metrics")
  std::string_view keyword;  // "seq_len"
  Member member;
  bool defines_step;         // a setting of the job, not of the check (ranks, faults, hosts)
  std::string_view help;
};
const std::vector<StepField>& step_fields();
// find_step_field: the field a flag ("--seq-len") or keyword ("seq_len") names, nullptr for none.
const StepField* find_step_field(std::string_view name);
// set_step_field sets a field from its text as the tool reads it: integers by text::parse_int
// (InvalidArgument / OverflowError naming `where` and the value), a list field appended to, a
// bool's flag (no value) turning it off.
void set_step_field(StepSpec& spec, const StepField& f, const std::string& value, const std::string& where);

struct StepRun {
  preset::Torchtitan degrees;  // dp_shard resolved
  Job job;
  Options options;
  Report report;
  std::string job_file;            // the job file read (--job, or --preset torchtitan:FILE.toml)
  int64_t loss_chunks = 0;         // the step's loss.num_chunks (Job::loss_chunks; 0: no ChunkedLossWrapper)
  std::vector<std::string> notes;  // a flag overriding the job file, a setting modelled otherwise
};

// megatron_parallel: Megatron-core's sizes laid out in its order as the preset's views are
// (preset::megatron_views, its checks included): dp_shard is Megatron's dp, and the axes' row-major
// order is the dense and expert views'. Any order the preset accepts.
Parallel megatron_parallel(const preset::Megatron& mg, std::optional<int64_t> world_size);
// titan_parallel: torchtitan's degrees laid out as its preset's views are
// (preset::torchtitan_views: dense (pp, dp_replicate, dp_shard, cp, tp), sparse (pp,
// dp_replicate, efsdp, ep)); each view dim held to its axis' size.
Parallel titan_parallel(const preset::TorchtitanViews& v);

// run_step resolves the spec (InvalidArgument / NotFound / ParseError / OutOfRange naming the
// flag and value) and checks the step.
StepRun run_step(const StepSpec& spec);
// step_json is the report as docs/step.md lists it.
nlohmann::json step_json(const StepRun& run);
// trace_json and traced_ranks (the Chrome/Perfetto writer) are in chrome_trace.hpp.

// read_schedule_file reads a CSV of PyTorch's form, compute_only or compute_comms (told by
// whether it holds sends and receives), lowered; `pp` checks its rows, `stages` defaults to the
// largest stage + 1; a compute-only one lowered `how` (PyTorch's runtime by default, as its
// _load_csv does); `as_written` (when given) says whether it held its sends and receives. Errors
// start with `what` ("--schedule 'f.csv'").
Schedule read_schedule_file(const std::string& path, std::optional<int64_t> pp, std::optional<int64_t> stages,
                            int64_t microbatches, const std::string& what, Lowering how = Lowering::kRuntime,
                            bool* as_written = nullptr);
// parse_ranks reads "0,3,8-15" (ranks below `world`, at most 2^20 of them), ascending, unique.
std::vector<int64_t> parse_ranks(const std::string& text, int64_t world);

}  // namespace meshsim::step
