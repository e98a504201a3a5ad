// meshsim/megatron_args.hpp — a Megatron-LM job as its user has it: the argument list of
// pretrain_gpt.py, read for `meshsim step --megatron-args "..."` (or "@args.txt"). The one home
// of Megatron's settings in meshsim: read, checked (Megatron-LM's parser and validate_args,
// megatron-core's TransformerConfig) and defaulted here; torch:megatron_buffer holds it to
// megatron-core itself.
//
//   MegatronArgs a = parse_megatron_args("--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 "
//                                        "--micro-batch-size 1 --global-batch-size 64 --seq-length 4096 --bf16 ...");
//
// What is read: the parallel sizes (tensor, pipeline, context, expert, expert tensor), virtual
// stages (--num-layers-per-virtual-pipeline-stage or --num-virtual-stages-per-pipeline-rank),
// the batch (--micro-batch-size, --global-batch-size, --seq-length), precision (--bf16,
// --grad-reduce-in-bf16), --sequence-parallel, --use-distributed-optimizer, --rerun-mode, the
// recomputation, and the model's shape (--num-layers, --hidden-size, --ffn-hidden-size,
// --num-attention-heads, --group-query-attention / --num-query-groups, --swiglu, --vocab-size,
// --untie-embeddings-and-output-weights, --disable-bias-linear, --add-qkv-bias, --normalization,
// --num-experts, --moe-router-topk, --moe-ffn-hidden-size,
// --moe-shared-expert-intermediate-size). Flags that change the step in ways meshsim does not
// model are refused by name (--fp16, --overlap-grad-reduce, ...); any other (learning rate, data
// paths, logging: no collective of the step) is listed in `ignored`, unless it is a near miss of a
// flag meshsim reads (`--tensor-model-paralel-size`), which is refused with the flag it missed.
// Thread safety: plain values; parse_megatron_args reads "@FILE".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "meshsim/preset.hpp"
#include "meshsim/step_program.hpp"

namespace meshsim::step {

struct MegatronArgs {
  int64_t tp = 1, pp = 1, cp = 1, ep = 1;
  std::optional<int64_t> etp;              // --expert-tensor-parallel-size (Megatron's default: tp)
  std::optional<int64_t> virtual_stages;   // per pipeline rank
  std::optional<int64_t> layers_per_virtual_stage;
  std::optional<int64_t> micro_batch_size, global_batch_size, seq_length;
  bool bf16 = false, grad_reduce_in_bf16 = false, sequence_parallel = false, distributed_optimizer = false;
  int64_t vocab_divisible = 128;  // --make-vocab-size-divisible-by (Megatron-LM's default 128)
  // The model's biases and norms, Megatron-LM's defaults: a bias in every linear layer
  // (add_bias_linear; --disable-bias-linear drops them, --add-qkv-bias keeps the QKV's) and
  // LayerNorm (a weight and a bias; --normalization RMSNorm: a weight).
  bool bias_linear = true, qkv_bias = false;
  std::string normalization = "LayerNorm";
  std::string rerun_mode = "validate_results";
  std::string recompute = "none";          // none, selective or full (--recompute-granularity)
  bool recompute_given = false;            // --recompute-granularity was given
  std::string recompute_method;            // full: "uniform" or "block" (--recompute-method)
  int64_t recompute_layers = 0;            // full: --recompute-num-layers
  std::optional<Model> model;              // when the shape flags are given
  std::vector<std::string> ignored;        // flags read and left alone (no collective of the step)
};

// MegatronJob: the step a Megatron-LM job's flags set, resolved as Megatron-LM resolves them
// for a world size (its data-parallel size, microbatches per step, virtual stages).
struct MegatronJob {
  preset::Megatron degrees;             // tp, pp, cp, ep, etp as given; dp = world / (tp x pp x cp)
  std::optional<int64_t> seq_length;    // --seq-length
  int64_t micro_batch_size = 1;         // --micro-batch-size (Megatron's default 1)
  int64_t microbatches = 1;             // --global-batch-size / (--micro-batch-size x dp)
  std::optional<int64_t> stages;        // pp x virtual stages per rank, when more than pp
};

// megatron_job holds `a` to Megatron-LM's rules for `world_size` ranks and a model of `layers`
// layers: the world a multiple of tp x pp x cp, the global batch a multiple of micro batch x dp,
// the layers per pipeline rank a multiple of the layers per virtual stage (validate_args'
// rules, in its words, "[Megatron]"), and the block recomputation meshsim models (every layer
// of the rank). InvalidArgument names the flag and the rule.
MegatronJob megatron_job(const MegatronArgs& a, int64_t world_size, int64_t layers);

// parse_megatron_args reads Megatron-LM's flags (`text`, or the file "@PATH": whitespace-separated,
// '#' to the end of a line a comment, a backslash before a newline joined). InvalidArgument names
// the flag and the rule for a missing or bad value, a flag given twice, and a flag meshsim does not
// model, and a near miss of a flag it reads.
MegatronArgs parse_megatron_args(const std::string& text);

}  // namespace meshsim::step
