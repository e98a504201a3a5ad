// meshsim/torchtitan_job.hpp — a torchtitan job as its user has it, read whole: the one home of
// torchtitan's settings in meshsim. Every reader of a torchtitan job (`meshsim step --job`,
// `--preset torchtitan:FILE` of check, query and step) reads, checks and defaults it here, and the
// differential tests (torch:titan_config) hold this file to torchtitan's own ConfigManager.
//
// Two forms: a TOML job file of torchtitan's TOML era ([model] name and flavor, [training],
// [parallelism], [activation_checkpoint]; `local_batch_size` sequences per data-parallel rank,
// split into pipeline microbatches of `pipeline_parallel_microbatch_size`), and the JSON config
// torchtitan 0.3.0 writes of a resolved job (`debug.save_config_file`: `model_spec`, `training`,
// `parallelism`, `activation_checkpoint`, `loss`). Either may use the token-budget keys of
// torchtitan's newer configs (`num_tokens_per_microbatch_per_dp_rank`, `num_pp_microbatches`,
// `num_tokens_per_train_step`, `max_context_length`); the two batch spellings are not mixed.
//
//   JobFile f = read_job_file("train.toml");   // f.model->value == "llama3-8b"
//   Settings s = settings(f, degrees);          // torchtitan's defaults and rules applied
//
// Each value keeps the key it came from (`training.seq_len`), so a flag that overrides it can say
// which. A key the file leaves out is absent from JobFile; settings() fills torchtitan's default.
// Thread safety: plain values; read_job_file reads the file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "meshsim/preset.hpp"

namespace meshsim::torchtitan {

template <class T>
struct Keyed {
  T value;
  std::string key;  // where the file said it: "training.seq_len"
};

struct JobFile {
  std::string path;
  std::string where;            // how messages name it: "--job 'train.toml'"

  std::string format;           // "toml" or "json"
  preset::Torchtitan degrees;   // [parallelism]'s degrees (torchtitan's defaults where absent)
  std::optional<Keyed<std::string>> model;  // a built-in name: "<name>-<flavor>", lower case
  std::optional<Keyed<int64_t>> seq_len;            // training.seq_len
  std::optional<Keyed<int64_t>> local_batch_size;   // sequences per dp rank per accumulation step
  std::optional<Keyed<int64_t>> global_batch_size;  // sequences per step (-1: local * dp)
  std::optional<Keyed<int64_t>> microbatch_size;    // sequences per pipeline microbatch
  std::optional<Keyed<int64_t>> tokens_per_microbatch;  // per dp rank (the token-budget form)
  std::optional<Keyed<int64_t>> max_context_length;     // training.max_context_length (the token-budget generation)
  std::optional<Keyed<int64_t>> tokens_per_step;        // the token-budget form (-1: one accumulation step)
  std::optional<Keyed<int64_t>> pp_microbatches;        // the token-budget form's num_pp_microbatches
  std::optional<Keyed<std::string>> schedule;       // pipeline_parallel_schedule
  std::optional<Keyed<std::string>> schedule_csv;   // pipeline_parallel_schedule_csv (non-empty)
  std::optional<Keyed<int64_t>> layers_per_stage;
  std::optional<Keyed<int64_t>> first_stage_less_layers, last_stage_less_layers;
  std::optional<Keyed<std::string>> reshard_after_forward;
  std::optional<Keyed<std::string>> activation_checkpoint;  // none, selective or full
  std::optional<Keyed<int64_t>> loss_chunks;        // loss.num_chunks (ChunkedLossWrapper)
  // A saved config's MoE layers' load_balance_coeff: set in every one (true) or in none (false).
  std::optional<Keyed<bool>> moe_load_balance;
};

// read_job_file reads `path` (at most 4 MiB; .json is torchtitan's saved config, anything else
// TOML): unknown tables and keys of the tables meshsim reads are named (with the nearest known
// key), as are values of the wrong type, settings meshsim does not model (mixed precision other
// than bf16 params with fp32 reduction, `selective_ac_option` other than "op", torchtitan's
// removed `training.batch_size`), and the two batch spellings mixed. InvalidArgument / NotFound /
// ParseError naming the file and the key.
// `flag` starts each message ("--job", "--preset torchtitan:").
JobFile read_job_file(const std::string& path, const std::string& flag = "--job");

// Settings: the step a job file sets as torchtitan 0.3.0 reads it, every value the file's or
// torchtitan's default (its key then says "(default)").
struct Settings {
  Keyed<std::string> model;           // meshsim's built-in name: torchtitan's default llama3 debugmodel
  Keyed<int64_t> seq_len;             // tokens per sequence a microbatch moves
  Keyed<int64_t> per_microbatch;      // sequences per data-parallel rank and microbatch
  Keyed<int64_t> microbatches;        // pipeline microbatches per accumulation step (1 without pp)
  int64_t grad_accum_steps = 1;       // global batch / (local batch x dp), or the token budget's
  std::optional<Keyed<std::string>> schedule;  // with pp > 1: the CSV, the name, or 1F1B (default)
  std::optional<Keyed<std::string>> reshard_after_forward;
  std::optional<Keyed<std::string>> activation_checkpoint;  // absent: torchtitan's default (selective)
  std::optional<Keyed<int64_t>> loss_chunks;
  bool load_balance = true;           // the MoE's load_balance_coeff is set (or no MoE layer says)
};

// settings applies torchtitan's defaults and its batch rules (global_batch_size and
// num_tokens_per_train_step a multiple of a step's sequences or tokens, local_batch_size a
// multiple of pipeline_parallel_microbatch_size) to `f`, with `degrees` the job's degrees
// resolved (dp_shard known). InvalidArgument names the file, the key and the rule.
Settings settings(const JobFile& f, const preset::Torchtitan& degrees);

// PipelineSplit: the layers' split over the stages torchtitan's pipeline_parallel.py makes.
struct PipelineSplit {
  int64_t first_stage_less_layers = 1, last_stage_less_layers = 1;  // torchtitan's defaults
  std::optional<Keyed<int64_t>> stages;  // from pipeline_parallel_layers_per_stage, when given
};

// pipeline_split holds the file's stage settings to the model's `layers` and to the schedule that
// runs (`schedule`, and `single_stage`: one stage per rank): each *_stage_less_layers at most the
// layers, and layers per stage making a multiple of pp stages, exactly pp for a single-stage
// schedule and at least 2 x pp for a multi-stage one (torchtitan's rules; the file's CSV
// schedule, whose rows give the stages, takes none of them).
PipelineSplit pipeline_split(const JobFile& f, int64_t pp, int64_t layers, const std::string& schedule, bool single_stage);

}  // namespace meshsim::torchtitan
