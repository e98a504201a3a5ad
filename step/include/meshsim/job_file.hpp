// meshsim/job_file.hpp — a torchtitan job as its user has it, read whole for `meshsim step --job`.
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
//
// Each value keeps the key it came from (`training.seq_len`), so a flag that overrides it can say
// which. A key the file leaves out is absent here: run_step applies torchtitan's default.
// Thread safety: plain values; read_job_file reads the file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "meshsim/preset.hpp"

namespace meshsim::step {

template <class T>
struct Keyed {
  T value;
  std::string key;  // where the file said it: "training.seq_len"
};

struct JobFile {
  std::string path;
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
JobFile read_job_file(const std::string& path);

}  // namespace meshsim::step
