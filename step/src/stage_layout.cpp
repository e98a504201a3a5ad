// The stage layout: which layers each pipeline stage holds and the schedule it runs, resolved
// and checked as torchtitan does (layout) or as Megatron-core does (megatron_layout).
#include <string>
#include <vector>

#include "meshsim/error.hpp"
#include "meshsim/step_program.hpp"
#include "step_internal.hpp"

namespace meshsim::step {

using namespace detail;

// split_layers is torchtitan's _generate_llm_fqn_per_model_part: the embeddings and the output
// count as input_weight and output_weight layers; stages take the effective layers evenly, the
// first ones one more.
void detail::split_layers(StageLayout& l, int64_t layers, int64_t input_weight, int64_t output_weight) {
  const int64_t n = l.stages;
  l.first_layer.assign(n, 0);
  l.layer_count.assign(n, 0);
  if (n == 1) {
    l.layer_count[0] = layers;
    return;
  }
  const int64_t effective = layers + input_weight + output_weight;
  if (n > effective) {
    throw InvalidArgument("Number of stages (" + std::to_string(n) + ") cannot be greater than effective layers (" +
                          std::to_string(effective) + ")  [torchtitan]");
  }
  const int64_t per = effective / n, extra = effective % n;
  if (input_weight > per) {
    throw InvalidArgument("input_weight (" + std::to_string(input_weight) + ") exceeds minimum layers per stage (" +
                          std::to_string(per) + ")  [torchtitan]");
  }
  if (output_weight > per) {
    throw InvalidArgument("output_weight (" + std::to_string(output_weight) +
                          ") exceeds minimum layers per stage (" + std::to_string(per) + ")  [torchtitan]");
  }
  int64_t current = 0;
  for (int64_t s = 0; s < n; ++s) {
    int64_t take = per + (s < extra ? 1 : 0);
    if (s == 0) take -= input_weight;
    else if (s == n - 1) take -= output_weight;
    take = std::max<int64_t>(0, std::min(take, layers - current));
    l.first_layer[s] = current;
    l.layer_count[s] = take;
    current += take;
  }
}

namespace {

// megatron_layout: Megatron-core's rules for a step: layers split evenly over the stages
// (pipeline x virtual stages; Megatron asserts they divide), 1F1B without virtual stages (its
// compute order is PyTorch's 1F1B; Megatron batches each call's sends and receives, so their
// order in a call does not matter), its interleaved schedule with them.
StageLayout megatron_layout(const Job& job) {
  const Parallel& p = job.parallel;
  const Model& m = job.model;
  if (m.experts > 0 && p.ep < 2) {
    throw InvalidArgument("megatron: an MoE model with ep 1 (experts sharded over expert tp) is not modeled: give ep > 1");
  }
  if (job.schedule_override) throw InvalidArgument("megatron: a schedule CSV is not taken (Megatron builds its own)");
  const ScheduleInfo* schedule = find_schedule(job.schedule);
  if (!schedule || !schedule->megatron) {
    throw InvalidArgument("megatron: --schedule " + quote_input(job.schedule) + " is not one Megatron runs (" +
                          schedule_names(true) + "; the interleaved ones with --stages > pp)");
  }
  StageLayout l;
  int64_t per = job.stages_per_rank ? job.stages_per_rank : (schedule->single_stage ? 1 : 2);
  if (p.pp == 1 && per != 1) throw InvalidArgument("megatron: virtual pipeline stages need pp > 1");
  if (p.pp > 1 && m.weight_tying) {
    throw InvalidArgument("model " + quote_input(m.name) +
                          " ties its embeddings to its output: with pp > 1 Megatron all-reduces their gradients over the "
                          "first and last stage, which meshsim step does not model");
  }
  l.stages_per_rank = per;
  l.stages = checked_mul(per, p.pp, "the stages");
  if (l.stages > kMaxStages || m.layers % l.stages != 0) {
    throw InvalidArgument("megatron: " + std::to_string(m.layers) + " layers over " + std::to_string(l.stages) +
                          " stages: Number of layers should be divisible by the pipeline-model-parallel size (times "
                          "the virtual stages)  [Megatron]");
  }
  if (p.pp > 1) {
    if (per == 1) {
      l.schedule = lower(one_f_one_b(p.pp, job.microbatches));
      l.lowering = "megatron";
    } else {
      std::vector<int64_t> off;
      if (!job.megatron_parity) {
        for (int64_t r = 0; r < p.pp; ++r) off.push_back(r);
      }
      l.schedule = megatron_interleaved(p.pp, l.stages, job.microbatches, 0, off);
      l.lowering = "megatron";
    }
  }
  split_layers(l, m.layers, 0, 0);
  return l;
}

}  // namespace

StageLayout layout(const Job& job) {
  const Parallel& p = job.parallel;
  const Model& m = job.model;
  validate_model(m);
  for (const auto& [k, v] : std::vector<std::pair<const char*, int64_t>>{{"pp", p.pp}, {"dp_replicate", p.dp_replicate},
                                                                         {"dp_shard", p.dp_shard}, {"cp", p.cp}, {"tp", p.tp}}) {
    if (v < 1) throw InvalidArgument(std::string(k) + " " + std::to_string(v) + " is not >= 1");
  }
  if (const int64_t w = world_size(p); w > kMaxWorld) {
    throw ResourceExhausted("a world of " + std::to_string(w) + " ranks is over the " + std::to_string(kMaxWorld) +
                            " meshsim step checks");
  }
  validate_groups(p);
  if (job.microbatches < 1 || job.microbatches > kMaxMicrobatches) {
    throw InvalidArgument("--microbatches " + std::to_string(job.microbatches) + " is out of range [1, " +
                          std::to_string(kMaxMicrobatches) + "] (torchtitan: num_pp_microbatches must be greater than 0)");
  }
  if (job.grad_accum_steps < 1 || job.grad_accum_steps > kMaxMicrobatches / job.microbatches) {
    throw InvalidArgument("gradient accumulation steps " + std::to_string(job.grad_accum_steps) + " x microbatches " +
                          std::to_string(job.microbatches) + " is out of range [1, " + std::to_string(kMaxMicrobatches) +
                          "] (the microbatches one step runs)");
  }
  if (job.seq_len < 1 || job.seq_len > kMaxSize) {
    throw InvalidArgument("--seq-len " + std::to_string(job.seq_len) + " is out of range [1, 2^32]");
  }
  if (job.local_batch_size < 1 || job.local_batch_size > kMaxSize) {
    throw InvalidArgument("--local-batch-size " + std::to_string(job.local_batch_size) + " is out of range [1, 2^32]");
  }
  const std::string tp = "tp " + std::to_string(p.tp);
  if (m.heads % p.tp != 0 || m.kv_heads % p.tp != 0) {
    throw InvalidArgument(tp + " does not divide the model's heads (" + std::to_string(m.heads) + ") and kv heads (" +
                          std::to_string(m.kv_heads) + "): tensor parallelism shards attention by heads");
  }
  if (p.ep < 1) throw InvalidArgument("ep " + std::to_string(p.ep) + " is not >= 1");
  if (p.ep > 1 && m.experts == 0) {
    throw InvalidArgument("ep " + std::to_string(p.ep) + " needs an MoE model: " + quote_input(m.name) + " has no experts");
  }
  if (p.ep > 1 && (m.experts % p.ep != 0 || (p.dp_shard * p.cp * p.tp) % p.ep != 0)) {
    throw InvalidArgument("ep " + std::to_string(p.ep) + " does not divide the model's " + std::to_string(m.experts) +
                          " experts (and dp_shard x cp x tp " + std::to_string(p.dp_shard * p.cp * p.tp) +
                          "): expert parallelism shards the experts over ep");
  }
  if (m.experts > 0 && (m.moe_ffn_dim % p.tp != 0 || (m.moe_ffn_dim * m.shared_experts) % p.tp != 0)) {
    throw InvalidArgument(tp + " does not divide the experts' ffn dim (" + std::to_string(m.moe_ffn_dim) + ")");
  }
  if (m.ffn_dim % p.tp != 0 || m.vocab % p.tp != 0) {
    throw InvalidArgument(tp + " does not divide the model's ffn dim (" + std::to_string(m.ffn_dim) + ") and vocabulary (" +
                          std::to_string(m.vocab) + ")");
  }
  const int64_t seq_shards = p.cp > 1 ? checked_mul(2 * p.cp, p.tp, "cp x tp") : p.tp;
  if (job.seq_len % seq_shards != 0) {
    throw InvalidArgument("--seq-len " + std::to_string(job.seq_len) + " is not divisible by " +
                          (p.cp > 1 ? "2 x cp x tp (" : "tp (") + std::to_string(seq_shards) +
                          "): sequence parallel shards each sequence over tp" +
                          (p.cp > 1 ? ", and context parallel's head-tail load balancer in 2 x cp chunks" : ""));
  }
  if (job.framework == Framework::kMegatron) return megatron_layout(job);
  StageLayout l;
  if (p.pp == 1) {
    // torchtitan ignores num_pp_microbatches without pipeline parallelism.
    split_layers(l, m.layers, 0, 0);
    return l;
  }
  if (m.weight_tying) {
    throw InvalidArgument("model " + quote_input(m.name) +
                          " ties its embeddings to its output: with pp > 1 the tied unit spans the first and the last "
                          "stage, which meshsim step does not model");
  }
  if (job.reshard_after_forward == Reshard::kAlways) {
    throw InvalidArgument("reshard_after_forward 'always' with pp > 1: FSDP's gathers between microbatches are not "
                          "modeled; use default or never");
  }
  if (job.schedule_override) {
    const Schedule& s = *job.schedule_override;
    if (static_cast<int64_t>(s.ranks.size()) != p.pp) {
      throw InvalidArgument("the schedule has " + std::to_string(s.ranks.size()) + " rows but pp is " + std::to_string(p.pp));
    }
    if (s.stages % p.pp != 0) {
      throw InvalidArgument("the schedule's " + std::to_string(s.stages) + " stages are not a multiple of pp " +
                            std::to_string(p.pp));
    }
    if (s.microbatches != job.microbatches) {
      throw InvalidArgument("the schedule runs " + std::to_string(s.microbatches) + " microbatches but --microbatches is " +
                            std::to_string(job.microbatches));
    }
    l.stages = s.stages;
    l.stages_per_rank = s.stages / p.pp;
    if (s.lowered) {
      // Its compute actions must be a schedule PyTorch accepts (each stage on its rank, each
      // microbatch's forward and backward once), whatever its sends and receives say.
      validate_lowered(s);
      l.schedule = s;
      l.lowering = !job.override_as_written ? (job.lowering == Lowering::kRuntime ? "runtime" : "add_send_recv") : "as written";
    } else {
      l.schedule = lower(s, job.lowering);
      l.lowering = job.lowering == Lowering::kRuntime ? "runtime" : "add_send_recv";
    }
  } else {
    if (!known_schedule(job.schedule)) {
      throw InvalidArgument("--schedule " + quote_input(job.schedule) + ": meshsim step builds " + schedule_names() +
                            " (or reads a CSV)");
    }
    const bool single = is_single_stage(job.schedule);
    int64_t per = job.stages_per_rank ? job.stages_per_rank : (single ? 1 : 2);
    if (single && per != 1) {
      throw InvalidArgument("Single stage schedule requires exactly 1 stage per rank, but got " + std::to_string(per) +
                            " stages per rank.  [torchtitan]");
    }
    if (!single && per < 2) {
      throw InvalidArgument("Multi-stage schedule requires at least 2 stages per rank, but got " + std::to_string(per) +
                            " stages per rank.  [torchtitan]");
    }
    l.stages_per_rank = per;
    l.stages = checked_mul(per, p.pp, "the stages");
    if (l.stages > kMaxStages) throw InvalidArgument("the pipeline's " + std::to_string(l.stages) + " stages are over " + std::to_string(kMaxStages));
    // PyTorch runs GPipe and 1F1B by their own loops (GPipe's in the order of _add_send_recv,
    // 1F1B's with its sends and receives paired in batches), the others through its runtime's
    // lowering.
    if (single) {
      l.schedule = single_stage_lowered(job.schedule, p.pp, job.microbatches);
      l.lowering = l.schedule.batches.empty() ? "add_send_recv" : "step_microbatches";
    } else {
      l.schedule = lower(schedule_by_name(job.schedule, p.pp, l.stages, job.microbatches), job.lowering);
      l.lowering = job.lowering == Lowering::kRuntime ? "runtime" : "add_send_recv";
    }
  }
  split_layers(l, m.layers, job.first_stage_less_layers, job.last_stage_less_layers);
  return l;
}

}  // namespace meshsim::step
