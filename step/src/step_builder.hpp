// step/src/step_builder.hpp — the base of a framework's step builder: a rank's program is built
// by walking its pipeline schedule (or one forward and backward without pp) and emitting each
// collective with its group, dtype and bytes. What is shared lives here: the model's sizes on a
// rank (Sizes, the units' elements), emitting events (a one-rank group's collectives left out),
// and the schedule's walk (run_schedule); each framework says what a forward, a backward and the
// step around them issue: torchtitan's in titan_step.cpp, Megatron-core's in megatron_step.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "meshsim/step_program.hpp"
#include "step_internal.hpp"

namespace meshsim::step::detail {

// Unit is one FSDP unit of a stage: its parameters' elements on a rank after TP, padded for
// FSDP's dim-0 sharding.
struct Unit {
  const char* what;
  int32_t layer;
  int64_t elements;             // on the fsdp mesh
  int64_t sparse_elements = 0;  // the routed experts on the efsdp mesh (ep > 1)
};

struct Sizes {
  int64_t fsdp, tp, cp, tokens;  // tokens: a microbatch's tokens on a rank (before SP)
  int64_t efsdp = 1;
  int64_t hidden_bytes;          // tokens x dim, bf16
  int64_t pp_bytes;              // what a stage sends: its sequence shard under SP
  int64_t k_bytes, v_bytes;      // K and V gathered over cp
  int64_t counts_bytes;          // the MoE's tokens per expert (int64)
  int64_t dispatch_bytes;        // the MoE's routed tokens: the sequence shard x top_k x dim, bf16
  int64_t logits_bytes;          // one loss-parallel reduction, fp32 per token
};

inline int64_t padded(int64_t dim0, int64_t rest, int64_t fsdp) {
  return checked_mul((dim0 + fsdp - 1) / fsdp * fsdp, rest, "a parameter's padded size");
}

class StepBuilder {
 public:
  virtual ~StepBuilder() = default;
  // build: the ordered program of every rank at pp coordinate `pp_rank`.
  virtual std::vector<Event> build(int64_t pp_rank) = 0;

 protected:
  // The parameters' sizes on a rank (after TP; padded for FSDP's dim-0 sharding under torchtitan,
  // unpadded under Megatron, whose distributed optimizer pads its buffers instead).
  StepBuilder(const Job& job, const StageLayout& layout);

  // forward / backward: one microbatch through (back through) `stage`; `gather_params` when its
  // FSDP units are sharded now; `input_grads` false for a weight-only backward (W).
  virtual void forward(int64_t stage, int64_t mb, bool gather_params) = 0;
  virtual void backward(int64_t stage, int64_t mb, bool reduce_grads, bool input_grads) = 0;
  // unshard / reduce_grads: a lowered schedule's UNSHARD and REDUCE_GRAD actions for `stage`.
  virtual void unshard(int64_t stage) = 0;
  virtual void reduce_grads(int64_t stage) = 0;
  // after_schedule: what the step issues once the rank's schedule has run (`reduced[st]`: the
  // schedule held a REDUCE_GRAD for stage st).
  virtual void after_schedule(int64_t pp_rank, const std::vector<bool>& reduced) = 0;

  // run_schedule walks the rank's lowered schedule: computes, FSDP actions, sends and receives.
  void run_schedule(int64_t pp_rank);

  int64_t size(Dim d) const { return dim_size(job_.parallel, d); }
  void emit(Op op, Dim d, DType t, int64_t bytes, Phase ph, const char* what, int32_t layer = -1) {
    if (recomputing_ && ac_ == Checkpoint::kSelective && op != Op::kAllGather) return;
    Event e;
    e.recompute = recomputing_;
    e.op = op;
    e.dim = d;
    e.dtype = t;
    e.bytes = bytes;
    e.phase = ph;
    e.stage = stage_;
    e.layer = layer;
    e.microbatch = microbatch_;
    e.what = what;
    push(e);
  }
  void push(const Event& e) {
    if (static_cast<int64_t>(out_.size()) >= kMaxEvents) {
      throw ResourceExhausted("one rank's step program holds over " + std::to_string(kMaxEvents) +
                              " events (layers x microbatches): check fewer");
    }
    out_.push_back(e);
  }
  // emit_if skips a collective over a one-rank group (it moves nothing; PyTorch's functional
  // collectives return at once for it).
  void emit_if(Op op, Dim d, DType t, int64_t bytes, Phase ph, const char* what, int32_t layer = -1) {
    if (size(d) > 1) emit(op, d, t, bytes, ph, what, layer);
  }

  // emit_routed_if: emit_if for an all-to-all whose bytes follow the routing (Event::routed).
  void emit_routed_if(Op op, Dim d, DType t, int64_t bytes, Phase ph, const char* what, int32_t layer) {
    const std::size_t n = out_.size();
    emit_if(op, d, t, bytes, ph, what, layer);
    if (out_.size() > n) out_.back().routed = true;
  }

  // tp_pair: sequence parallel around a block's part `what` (an MLP, the shared experts): the
  // column-parallel linear's all-gather of the sequence over tp, the row-parallel one's
  // reduce-scatter (a backward's, for its input's gradient, alike).
  void tp_pair(const char* what, int32_t layer, Phase ph) {
    emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, z_.hidden_bytes, ph, what, layer);
    emit_if(Op::kReduceScatter, Dim::kTp, DType::kBF16, z_.hidden_bytes, ph, what, layer);
  }
  // attention_forward: the attention's forward under TP with sequence parallel and CP: the
  // sequence gathered over tp for the QKV projection, K and V gathered over cp, the output
  // projection's reduce-scatter (torchtitan's and Megatron-core's alike).
  void attention_forward(int32_t layer, Phase ph) {
    emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, z_.hidden_bytes, ph, "attention", layer);
    emit_if(Op::kAllGather, Dim::kCp, DType::kBF16, z_.k_bytes, ph, "k", layer);
    emit_if(Op::kAllGather, Dim::kCp, DType::kBF16, z_.v_bytes, ph, "v", layer);
    emit_if(Op::kReduceScatter, Dim::kTp, DType::kBF16, z_.hidden_bytes, ph, "attention", layer);
  }

  bool holds_stage(int64_t pp_rank, int64_t stage) const {
    if (job_.parallel.pp == 1) return true;
    for (const auto& a : layout_.schedule.ranks[pp_rank]) {
      if (a && a->stage == stage) return true;
    }
    return false;
  }

  const Job& job_;
  const StageLayout& layout_;
  bool megatron_ = false;
  Sizes z_{};
  int64_t attention_ = 0, dense_ffn_ = 0, moe_dense_ = 0, routed_ = 0, embed_ = 0, output_ = 0;
  Checkpoint ac_ = Checkpoint::kSelective;
  bool recomputing_ = false;
  bool weight_grads_ = true;  // the backward running computes the weights' gradients too (false for an I action)
  int64_t mb_base_ = 0;  // the first microbatch's number in this accumulation step
  int32_t stage_ = -1, microbatch_ = -1;
  std::vector<Event> out_;
};

// The builders of torchtitan's step (titan_step.cpp) and Megatron-core's (megatron_step.cpp);
// make_builder picks the job's framework.
std::unique_ptr<StepBuilder> make_titan_step(const Job& job, const StageLayout& layout);
std::unique_ptr<StepBuilder> make_megatron_step(const Job& job, const StageLayout& layout);
std::unique_ptr<StepBuilder> make_builder(const Job& job, const StageLayout& layout);

}  // namespace meshsim::step::detail
