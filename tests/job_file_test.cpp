// `meshsim step --job`: a torchtitan job file read whole (recipes/src/torchtitan_job.cpp, run_step).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "meshsim/error.hpp"
#include "meshsim/preset.hpp"
#include "meshsim/step_job.hpp"
#include "meshsim/torchtitan_job.hpp"

namespace meshsim::step {
namespace {

namespace fs = std::filesystem;

std::string write(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / ("meshsim_job_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p) << text;
  return p.string();
}

StepRun run_job(const std::string& path, StepSpec s = {}) {
  s.job = path;
  return run_step(s);
}

int64_t calls(const StepRun& r, const std::string& dim, const std::string& op) {
  const auto d = r.report.by_dim.find(dim);
  if (d == r.report.by_dim.end()) return 0;
  const auto o = d->second.find(op);
  return o == d->second.end() ? 0 : o->second.calls;
}

// What each refused file's message must name.
void expect_refused(const std::string& name, const std::string& text, const std::string& says) {
  const std::string path = write(name, text);
  try {
    (void)run_job(path);
    ADD_FAILURE() << name << ": accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << name << ": " << e.what();
  }
}

const char* kPipelineJob = R"(
[job]
description = "Llama 3 8B training"
[model]
name = "llama3"
flavor = "8B"
tokenizer_path = "./assets/tokenizer/original/tokenizer.model"
[training]
local_batch_size = 4
global_batch_size = 64
seq_len = 8192
mixed_precision_param = "bfloat16"
[parallelism]
data_parallel_shard_degree = 4
tensor_parallel_degree = 2
pipeline_parallel_degree = 2
pipeline_parallel_microbatch_size = 2
pipeline_parallel_schedule = "Interleaved1F1B"
[activation_checkpoint]
mode = "full"
)";

TEST(JobFile, EveryValueOfATomlJobIsRead) {
  const StepRun r = run_job(write("pipeline.toml", kPipelineJob));
  EXPECT_EQ(r.job.model.name, "llama3-8b");
  EXPECT_EQ(r.job.seq_len, 8192);
  EXPECT_EQ(r.job.local_batch_size, 2);   // sequences per microbatch: the microbatch size
  EXPECT_EQ(r.job.microbatches, 2);       // local_batch_size 4 / microbatch size 2
  EXPECT_EQ(r.job.grad_accum_steps, 4);   // 64 / (4 x dp 4)
  EXPECT_EQ(r.job.schedule, "Interleaved1F1B");
  EXPECT_EQ(r.job.activation_checkpoint, Checkpoint::kFull);
  EXPECT_EQ(r.report.layout.stages, 4);   // torchtitan's default: 2 per rank for a multi-stage schedule
  EXPECT_TRUE(r.notes.empty());
  EXPECT_TRUE(r.report.ok) << r.report.diagnosis;
  // --preset torchtitan:FILE.toml is the same reading.
  StepSpec s;
  s.preset = "torchtitan:" + write("pipeline2.toml", kPipelineJob);
  const StepRun p = run_step(s);
  EXPECT_EQ(p.job.grad_accum_steps, 4);
  EXPECT_EQ(p.job.activation_checkpoint, Checkpoint::kFull);
  EXPECT_EQ(step_json(p)["by_dim"], step_json(r)["by_dim"]);
}

TEST(JobFile, AFlagGivenTooOverridesTheFileAndSaysSo) {
  StepSpec s;
  s.seq_len = 4096;
  s.activation_checkpoint = "selective";
  const StepRun r = run_job(write("override.toml", kPipelineJob), s);
  EXPECT_EQ(r.job.seq_len, 4096);
  EXPECT_EQ(r.job.activation_checkpoint, Checkpoint::kSelective);
  ASSERT_EQ(r.notes.size(), 2u);
  EXPECT_NE(r.notes[0].find("--seq-len 4096 overrides training.seq_len = 8192"), std::string::npos) << r.notes[0];
  EXPECT_NE(r.notes[1].find("--activation-checkpoint selective overrides activation_checkpoint.mode = full"),
            std::string::npos) << r.notes[1];
}

TEST(JobFile, EachAccumulationStepGathersAndReducesAgain) {
  const std::string base = "[model]\nname = \"llama3\"\nflavor = \"debugmodel\"\n[training]\nlocal_batch_size = 2\n"
                           "seq_len = 256\n[parallelism]\ndata_parallel_shard_degree = 4\ntensor_parallel_degree = 2\n";
  const StepRun one = run_job(write("accum1.toml", base));
  const std::string more = "[model]\nname = \"llama3\"\nflavor = \"debugmodel\"\n[training]\nlocal_batch_size = 2\n"
                           "global_batch_size = 24\nseq_len = 256\n[parallelism]\ndata_parallel_shard_degree = 4\n"
                           "tensor_parallel_degree = 2\n";
  const StepRun acc = run_job(write("accum3b.toml", more));
  EXPECT_EQ(one.job.grad_accum_steps, 1);
  ASSERT_EQ(acc.job.grad_accum_steps, 3);  // 24 / (2 x 4)
  EXPECT_GT(calls(one, "fsdp", "all_gather"), 0);
  EXPECT_EQ(calls(acc, "fsdp", "all_gather"), 3 * calls(one, "fsdp", "all_gather"));
  EXPECT_EQ(calls(acc, "fsdp", "reduce_scatter"), 3 * calls(one, "fsdp", "reduce_scatter"));
  EXPECT_EQ(calls(acc, "tp", "reduce_scatter"), 3 * calls(one, "tp", "reduce_scatter"));
  EXPECT_EQ(calls(acc, "batch", "all_reduce"), 1);  // the token count, once per step
  EXPECT_EQ(calls(acc, "loss", "all_reduce"), calls(one, "loss", "all_reduce"));
  EXPECT_TRUE(acc.report.ok) << acc.report.diagnosis;
}

TEST(JobFile, TheTokenBudgetFormIsTokensPerMicrobatch) {
  const StepRun r = run_job(write("tokens.toml",
                                  "[training]\nnum_tokens_per_microbatch_per_dp_rank = 4096\n"
                                  "num_tokens_per_train_step = 65536\n[parallelism]\npipeline_parallel_degree = 2\n"
                                  "num_pp_microbatches = 4\ndata_parallel_shard_degree = 2\n"));
  EXPECT_EQ(r.job.model.name, "llama3-debugmodel");  // torchtitan's default model
  EXPECT_EQ(r.job.seq_len, 4096);
  EXPECT_EQ(r.job.local_batch_size, 1);
  EXPECT_EQ(r.job.microbatches, 4);
  EXPECT_EQ(r.job.grad_accum_steps, 2);  // 65536 / (4096 x 4 x dp 2)
  EXPECT_EQ(r.job.schedule, "1F1B");     // torchtitan's default
}

TEST(JobFile, LayersPerStageSetTheStagesAsTorchtitanDoes) {
  // llama3 debugmodel: 6 layers; (6 + 1 + 1) / 2 = 4 stages on pp 2.
  const std::string job = "[parallelism]\npipeline_parallel_degree = 2\ndata_parallel_shard_degree = 1\n"
                          "pipeline_parallel_schedule = \"Interleaved1F1B\"\npipeline_parallel_layers_per_stage = 2\n"
                          "[training]\nlocal_batch_size = 4\n";
  const StepRun r = run_job(write("lps.toml", job));
  EXPECT_EQ(r.report.layout.stages, 4);
  expect_refused("lps3.toml", "[parallelism]\npipeline_parallel_degree = 2\ndata_parallel_shard_degree = 1\n"
                              "pipeline_parallel_layers_per_stage = 3\n", "not a multiple of pp 2");
  expect_refused("lpsbig.toml", "[parallelism]\npipeline_parallel_degree = 2\ndata_parallel_shard_degree = 1\n"
                                "pipeline_parallel_layers_per_stage = 9223372036854775807\n", "not a multiple of pp 2");
  expect_refused("lessbig.toml", "[parallelism]\npipeline_parallel_degree = 2\ndata_parallel_shard_degree = 1\n"
                                 "pipeline_parallel_first_stage_less_layers = 9223372036854775807\n",
                 "is more than the model's 6 layers");
  expect_refused("lps1.toml", "[parallelism]\npipeline_parallel_degree = 2\ndata_parallel_shard_degree = 1\n"
                              "pipeline_parallel_layers_per_stage = 1\n", "needs exactly 1 stage per rank");
}

TEST(JobFile, WhatTorchtitanRefusesOrMeshsimDoesNotModelIsNamed) {
  expect_refused("typo.toml", "[training]\nseq_lne = 8\n", "unknown key training.'seq_lne'");
  expect_refused("typo2.toml", "[training]\nseq_lne = 8\n", "did you mean 'seq_len'");
  expect_refused("old.toml", "[training]\nbatch_size = 8\n", "training.batch_size");
  expect_refused("mixed.toml", "[training]\nlocal_batch_size = 8\nnum_tokens_per_microbatch_per_dp_rank = 8\n",
                 "two generations");
  expect_refused("div.toml", "[training]\nlocal_batch_size = 3\n[parallelism]\npipeline_parallel_degree = 2\n"
                             "data_parallel_shard_degree = 1\npipeline_parallel_microbatch_size = 2\n",
                 "not divisible by parallelism.pipeline_parallel_microbatch_size");
  expect_refused("gbs.toml", "[training]\nlocal_batch_size = 2\nglobal_batch_size = 5\n[parallelism]\n"
                             "data_parallel_shard_degree = 2\n", "training.global_batch_size = 5");
  expect_refused("mp.toml", "[training]\nmixed_precision_param = \"float32\"\n[parallelism]\ndata_parallel_shard_degree = 2\n",
                 "mixed_precision_param");
  expect_refused("sac.toml", "[activation_checkpoint]\nmode = \"selective\"\nselective_ac_option = \"2\"\n"
                             "[parallelism]\ndata_parallel_shard_degree = 2\n", "selective_ac_option");
  expect_refused("mode.toml", "[activation_checkpoint]\nmode = \"memory_budget\"\n[parallelism]\n"
                              "data_parallel_shard_degree = 2\n", "activation_checkpoint.mode");
  expect_refused("type.toml", "[training]\nseq_len = \"8192\"\n[parallelism]\ndata_parallel_shard_degree = 2\n",
                 "training.seq_len is a string, not an integer");
  expect_refused("zero.toml", "[training]\nseq_len = 0\n[parallelism]\ndata_parallel_shard_degree = 2\n",
                 "not a positive integer");
  expect_refused("model.toml", "[model]\nname = \"llama3\"\nflavor = \"9B\"\n[parallelism]\ndata_parallel_shard_degree = 2\n",
                 "'llama3-9b'");
  expect_refused("sp.toml", "[parallelism]\ndata_parallel_shard_degree = 1\ntensor_parallel_degree = 2\n"
                            "enable_sequence_parallel = false\n", "enable_sequence_parallel");
  expect_refused("table.toml", "[trainning]\nseq_len = 8\n", "unknown table 'trainning'");
  expect_refused("notjson.json", "{\"a\": 1", "is not JSON");
  expect_refused("other.json", "{\"a\": 1}", "is not a torchtitan config");
  expect_refused("deep.json", std::string(5000, '[') + std::string(5000, ']'), "nests deeper than 64");
  expect_refused("big.json", R"({"model_spec": {"name": "llama3", "flavor": "debugmodel"}, "training": {"seq_len": 9223372036854775808},
                   "parallelism": {"data_parallel_shard_degree": 2}})", "does not fit in 64 bits");
  StepSpec s;
  s.preset = "torchtitan:dp_shard=2";
  s.job = write("both.toml", "[parallelism]\ndata_parallel_shard_degree = 2\n");
  EXPECT_THROW((void)run_step(s), InvalidArgument);
}

// Every reader of a torchtitan job reads it in one place (torchtitan_job.hpp): the preset of
// check, show and query (--preset torchtitan:FILE) refuses what the step's --job refuses, in the
// same words, and reads torchtitan's saved JSON config as the step does.
TEST(JobFile, EveryReaderOfATorchtitanJobReadsItInOnePlace) {
  const std::map<std::string, std::string> refused{
      {"misspelled.toml", "[training]\nseq_lne = 64\n[parallelism]\ndata_parallel_shard_degree = 2\n"},
      {"model_part.toml", "[parallelism]\ndata_parallel_shard_degree = 2\npipeline_parallel_degree = 2\n"
                          "module_fqns_per_model_part = [[\"tok_embeddings\", \"layers.0\"], [\"layers.1\", \"norm\"]]\n"},
      {"wrong_kind.toml", "[parallelism]\ntensor_parallel_degree = \"2\"\n"},
      {"batch_invariant.json", R"({"model_spec": {"name": "llama3", "flavor": "debugmodel"}, "training": {},
         "parallelism": {"data_parallel_shard_degree": 2}, "debug": {"batch_invariant": true}})"},
      {"null.json", R"({"model_spec": {}, "training": {"seq_len": null}, "parallelism": {"data_parallel_shard_degree": 2}})"},
  };
  for (const auto& [name, text] : refused) {
    const std::string path = write(name, text);
    std::string by_step, by_preset;
    try {
      (void)run_job(path);
    } catch (const InvalidArgument& e) {
      by_step = e.what();
    }
    try {
      (void)preset::recipe("torchtitan:" + path, std::nullopt);
    } catch (const InvalidArgument& e) {
      by_preset = e.what();
    }
    const std::string step_prefix = "--job '" + path + "'", preset_prefix = "--preset torchtitan: '" + path + "'";
    ASSERT_EQ(by_step.rfind(step_prefix, 0), 0u) << name << ": " << by_step;
    ASSERT_EQ(by_preset.rfind(preset_prefix, 0), 0u) << name << ": " << by_preset;
    EXPECT_EQ(by_step.substr(step_prefix.size()), by_preset.substr(preset_prefix.size())) << name;
  }
  // A saved config's degrees, for a mesh as for a step.
  const std::string saved = write("degrees.json", R"({"model_spec": {"name": "llama3", "flavor": "debugmodel"},
    "training": {"local_batch_size": 2, "seq_len": 64}, "parallelism": {"data_parallel_replicate_degree": 2,
    "data_parallel_shard_degree": 2, "tensor_parallel_degree": 2}})");
  const preset::Torchtitan t = preset::torchtitan_spec("torchtitan:" + saved);
  EXPECT_EQ(t.dp_replicate, 2);
  EXPECT_EQ(t.dp_shard, 2);
  EXPECT_EQ(t.tp, 2);
  EXPECT_EQ(preset::torchtitan_views(t, std::nullopt).world, run_job(saved).report.world_size);
}

// torchtitan's defaults are filled in one place, each named by its key: a file silent on the
// batch is torchtitan's seq_len 2048 and local_batch_size 8, a pipeline's microbatches of 1.
TEST(JobFile, TorchtitansDefaultsAreFilledWhereTheFileIsRead) {
  const torchtitan::JobFile f =
      torchtitan::read_job_file(write("silent.toml", "[parallelism]\ndata_parallel_shard_degree = 2\npipeline_parallel_degree = 2\n"));
  const torchtitan::Settings s = torchtitan::settings(f, f.degrees);
  EXPECT_EQ(s.model.value, "llama3-debugmodel");
  EXPECT_EQ(s.seq_len.value, 2048);
  EXPECT_EQ(s.seq_len.key, "training.seq_len (default)");
  EXPECT_EQ(s.per_microbatch.value, 1);
  EXPECT_EQ(s.microbatches.value, 8);
  ASSERT_TRUE(s.schedule);
  EXPECT_EQ(s.schedule->value, "1F1B");
  const torchtitan::PipelineSplit split = torchtitan::pipeline_split(f, 2, 6, "1F1B", true);
  EXPECT_EQ(split.first_stage_less_layers, 1);
  EXPECT_EQ(split.last_stage_less_layers, 1);
  EXPECT_FALSE(split.stages);
}

TEST(JobFile, TorchtitansSavedConfigIsRead) {
  // The shape of what torchtitan 0.3.0 writes under debug.save_config_file (trimmed); the full
  // files torchtitan writes are read by torch:job_file.
  const StepRun r = run_job(write("saved.json", R"({
    "model_spec": {"name": "llama3", "flavor": "debugmodel", "model": {"dim": 256}},
    "training": {"local_batch_size": 8, "global_batch_size": -1, "seq_len": 2048, "mixed_precision_param": "bfloat16",
                 "mixed_precision_reduce": "float32", "disable_cuda_graphs": true},
    "parallelism": {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": 2, "tensor_parallel_degree": 2,
                    "pipeline_parallel_degree": 2, "pipeline_parallel_schedule": "Interleaved1F1B",
                    "pipeline_parallel_schedule_csv": "", "pipeline_parallel_microbatch_size": 1,
                    "pipeline_parallel_layers_per_stage": null, "fsdp_reshard_after_forward": "default",
                    "enable_sequence_parallel": true, "context_parallel_degree": 1, "expert_parallel_degree": 1},
    "activation_checkpoint": {"preserve_rng_state": true, "force_recompute_mm_shapes_by_fqns": ["moe.router.gate"]},
    "loss": {"num_chunks": 8}})"));
  EXPECT_EQ(r.job.microbatches, 8);
  EXPECT_EQ(r.job.activation_checkpoint, Checkpoint::kSelective);
  EXPECT_EQ(r.loss_chunks, 8);
  EXPECT_EQ(r.job.loss_chunks, 8);
  EXPECT_TRUE(r.notes.empty());
  const StepRun full = run_job(write("full.json", R"({"model_spec": {"name": "llama3", "flavor": "debugmodel"},
    "training": {"local_batch_size": 2}, "parallelism": {"data_parallel_shard_degree": 2},
    "activation_checkpoint": {"preserve_rng_state": true}})"));
  EXPECT_EQ(full.job.activation_checkpoint, Checkpoint::kFull);
  const StepRun none = run_job(write("none.json", R"({"model_spec": {"name": "llama3", "flavor": "debugmodel"},
    "training": {"local_batch_size": 2}, "parallelism": {"data_parallel_shard_degree": 2},
    "activation_checkpoint": null})"));
  EXPECT_EQ(none.job.activation_checkpoint, Checkpoint::kNone);
}

// A saved MoE model's layers say whether its load balancing is on (load_balance_coeff set in
// every MoE layer: the optimizer's pre-step hook all-reduces the tokens per expert) or off (null
// in every one); torchtitan refuses a mix and a coefficient that is not > 0.
TEST(JobFile, ASavedMoesLoadBalanceIsReadFromItsLayers) {
  auto saved = [](const std::string& coeffs) {
    std::string layers = R"({"moe": null})";
    for (std::size_t k = 0; k < coeffs.size(); ++k) {
      layers += std::string(R"(, {"moe": {"num_experts": 8, "load_balance_coeff": )") + (coeffs[k] == '1' ? "0.001" : coeffs[k] == '0' ? "null" : "-1.0") + "}}";
    }
    return std::string(R"({"model_spec": {"name": "deepseek_v3", "flavor": "debugmodel", "model": {"layers": [)") + layers +
           R"(]}}, "training": {"local_batch_size": 1, "seq_len": 256}, "parallelism": {"data_parallel_shard_degree": 2,
           "expert_parallel_degree": 2}, "activation_checkpoint": null})";
  };
  const StepRun on = run_job(write("lb_on.json", saved("11111")));
  const StepRun off = run_job(write("lb_off.json", saved("00000")));
  EXPECT_TRUE(on.job.model.load_balance);
  EXPECT_FALSE(off.job.model.load_balance);
  EXPECT_EQ(calls(on, "loss", "all_reduce") - calls(off, "loss", "all_reduce"), 1);  // the tokens per expert
  StepSpec flag;
  flag.load_balance = false;
  EXPECT_FALSE(run_job(write("lb_flag.json", saved("11111")), flag).job.model.load_balance);
  expect_refused("lb_mixed.json", saved("11011"), "load_balance_coeff must be configured consistently");
  expect_refused("lb_negative.json", saved("11x11"), "must be > 0");
}

// A saved config's keys, nulls and non-finite floats as torchtitan 0.3.0's own config types read
// them (trainer.py's Trainer.Config, the policies of activation_checkpoint.py): a misspelled key
// at any level is refused by name, null only where the field is Optional, a policy told by its
// fields, and Python's Infinity / NaN read.
TEST(JobFile, ASavedConfigIsHeldToTorchtitansOwnFields) {
  const std::string base = R"({"model_spec": {"name": "llama3", "flavor": "debugmodel"},
    "training": {"local_batch_size": 2, "seq_len": 512, "max_norm": 1.0},
    "parallelism": {"data_parallel_shard_degree": 2, "pipeline_parallel_layers_per_stage": null},
    "activation_checkpoint": {"preserve_rng_state": true, "force_recompute_mm_shapes_by_fqns": []},
    "loss": {"num_chunks": 1}})";
  EXPECT_EQ(run_job(write("base.json", base)).job.seq_len, 512);
  auto refusal = [&](const std::string& from, const std::string& to) -> std::string {
    std::string text = base;
    const std::size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    try {
      run_job(write("mutated.json", text));
    } catch (const Error& e) {
      return e.what();
    }
    return "(accepted)";
  };
  const std::vector<std::pair<std::pair<std::string, std::string>, std::string>> cases{
      {{"\"num_chunks\": 1", "\"num_chunk\": 4"}, "unknown key loss.'num_chunk'"},
      {{"\"flavor\": \"debugmodel\"", "\"flavour\": \"8B\""}, "unknown key model_spec.'flavour'"},
      {{"\"loss\":", "\"los\":"}, "unknown key 'los'"},
      {{"\"seq_len\": 512", "\"seq_len\": null"}, "training.seq_len is null"},
      {{"\"local_batch_size\": 2", "\"local_batch_size\": 2, \"max_context_length\": 512"}, "two generations"},
      {{"\"force_recompute_mm_shapes_by_fqns\": []", "\"memory_budget\": 0.5"}, "MemoryBudgetAC"},
      {{"\"preserve_rng_state\": true, \"force_recompute_mm_shapes_by_fqns\": []", "\"mode\": \"none\""},
       "unknown key activation_checkpoint.'mode'"},
      {{"\"preserve_rng_state\": true", "\"preserve_rng_stat\": true"}, "activation_checkpoint.'preserve_rng_stat'"},
      {{"\"force_recompute_mm_shapes_by_fqns\": []", "\"force_recompute_mm_shapes_by_fqns\": [], \"memory_budget\": 0.5"},
       "two policies"},
      {{"\"seq_len\": 512", "\"seq_len\": 18446744073709551617"}, "does not fit in 64 bits"},
      // What torchtitan's own configs refuse as they are built.
      {{"\"loss\":", "\"debug\": {\"batch_invariant\": true}, \"loss\":"}, "Batch-invariant mode is not supported"},
      {{"\"data_parallel_shard_degree\": 2", "\"data_parallel_shard_degree\": 1, \"pipeline_parallel_degree\": 2"},
       "CUDA graphs do not support pipeline parallelism yet"},
      {{"\"data_parallel_shard_degree\": 2", "\"data_parallel_shard_degree\": 2, \"context_parallel_load_balancer\": \"\""},
       "context_parallel_load_balancer cannot be an empty string"},
  };
  for (const auto& [edit, words] : cases) {
    const std::string got = refusal(edit.first, edit.second);
    EXPECT_NE(got.find(words), std::string::npos) << edit.second << ": " << got;
  }
  // Accepted: an Optional field's null, a FullAC table (no SelectiveAC field), Python's
  // non-finite floats outside strings and the words inside them.
  EXPECT_EQ(refusal("\"force_recompute_mm_shapes_by_fqns\": []", "\"debug\": false"), "(accepted)");
  EXPECT_EQ(refusal("\"max_norm\": 1.0", "\"max_norm\": Infinity, \"dataset\": \"NaN Infinity\""), "(accepted)");
  EXPECT_EQ(refusal("\"max_norm\": 1.0", "\"max_norm\": NaN"), "(accepted)");
  // ... but not where torchtitan types an integer; the other fields of its sections are held to
  // its types too, those meshsim models nothing of included.
  for (const auto& [edit, words] : std::vector<std::pair<std::pair<std::string, std::string>, std::string>>{
           {{"\"max_norm\": 1.0", "\"max_norm\": -Infinity, \"gc_freq\": NaN"}, "training.gc_freq is a float, not an integer"},
           {{"\"max_norm\": 1.0", "\"max_norm\": \"1.0\""}, "training.max_norm is a string, not a number"},
           {{"\"loss\":", "\"comm\": {\"trace_buf_size\": \"big\"}, \"loss\":"}, "comm.trace_buf_size is a string"},
           {{"\"loss\":", "\"comm\": {\"mode\": \"fake\"}, \"loss\":"}, "comm.mode = 'fake' is not one of torchtitan's choices"},
           {{"\"loss\":", "\"checkpoint\": {\"intervall\": 10}, \"loss\":"}, "unknown key checkpoint.'intervall'"},
           {{"\"loss\":", "\"metrics\": {\"log_freq\": null}, \"loss\":"}, "metrics.log_freq is null"},
           {{"\"preserve_rng_state\": true", "\"preserve_rng_state\": 1"}, "activation_checkpoint.preserve_rng_state is an integer, not a boolean"},
       }) {
    const std::string got = refusal(edit.first, edit.second);
    EXPECT_NE(got.find(words), std::string::npos) << edit.second << ": " << got;
  }
  EXPECT_EQ(refusal("\"loss\":", "\"profiler\": {\"profiler_repeat\": null}, \"loss\":"), "(accepted)");  // Optional
  try {
    run_job(write("spmd.json", R"({"model_spec": {"name": "llama3", "flavor": "debugmodel"},
      "training": {"local_batch_size": 2, "disable_cuda_graphs": true},
      "parallelism": {"pipeline_parallel_degree": 2, "spmd_backend": "spmd_types"}, "debug": {"spmd_typechecking": true}})"));
    ADD_FAILURE() << "SPMD typechecking under pipeline parallelism was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("SPMD typechecking is not supported with pipeline parallelism"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(run_job(write("ctx.json", R"({"model_spec": {"name": "llama3", "flavor": "debugmodel"},
    "training": {"max_context_length": 1024, "num_tokens_per_microbatch_per_dp_rank": 2048},
    "parallelism": {"data_parallel_shard_degree": 2}})")).job.seq_len, 2048);  // a microbatch's tokens
  // max_context_length alone is the token-budget generation: its default microbatch, 16,384 tokens.
  EXPECT_EQ(run_job(write("ctx1.json", R"({"model_spec": {"name": "llama3", "flavor": "debugmodel"},
    "training": {"max_context_length": 1024}, "parallelism": {"data_parallel_shard_degree": 2}})")).job.seq_len, 16384);
}

// --loss-chunks (torchtitan 0.3.0's loss.num_chunks): a flag beside the file overrides it and says
// so; a count below 1, one that does not divide the sequence (up to 2^63 - 1), and Megatron's step
// are refused by name, never wrapped.
TEST(JobFile, LossChunksAreCheckedAndOverrideTheFile) {
  const std::string path = write("chunks.json", R"({"model_spec": {"name": "llama3", "flavor": "debugmodel"},
    "training": {"local_batch_size": 2, "seq_len": 256}, "parallelism": {"data_parallel_shard_degree": 2,
    "tensor_parallel_degree": 2}, "loss": {"num_chunks": 8}})");
  StepSpec s;
  s.job = path;
  const StepRun eight = run_step(s);
  EXPECT_EQ(eight.job.loss_chunks, 8);
  s.loss_chunks = 4;
  const StepRun four = run_step(s);
  EXPECT_EQ(four.job.loss_chunks, 4);
  ASSERT_EQ(four.notes.size(), 1u);
  EXPECT_NE(four.notes[0].find("--loss-chunks 4 overrides loss.num_chunks = 8"), std::string::npos) << four.notes[0];
  for (int64_t bad : {int64_t{0}, int64_t{-3}}) {
    s.loss_chunks = bad;
    try {
      (void)run_step(s);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("--loss-chunks " + std::to_string(bad)), std::string::npos) << e.what();
    }
  }
  for (int64_t bad : {int64_t{3}, int64_t{512}, INT64_MAX}) {
    s.loss_chunks = bad;
    try {
      (void)run_step(s);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("must divide a rank's sequence (256 tokens)"), std::string::npos) << e.what();
    }
  }
  StepSpec m;
  m.preset = "megatron:tp=2,pp=1,dp=2";
  m.model = "llama3-debugmodel";
  m.seq_len = 256;
  m.local_batch_size = 1;
  m.loss_chunks = 2;
  EXPECT_THROW((void)run_step(m), InvalidArgument);
}

}  // namespace
}  // namespace meshsim::step
