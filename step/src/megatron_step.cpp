// Megatron-core's step (megatron/core at NVIDIA/Megatron-LM d98e8a64ddf3; docs/step.md): each
// layer's TP with sequence parallel, CP's K and V, the alltoall MoE dispatcher, its pipeline
// schedules; finalize_model_grads' reduce-scatters of the distributed optimizer's buffers, the
// rerun state machine, the optimizer's gradient norm and parameter all-gathers, the loss report.
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "meshsim/error.hpp"
#include "step_builder.hpp"

namespace meshsim::step::detail {

namespace {

class MegatronStep final : public StepBuilder {
 public:
  MegatronStep(const Job& job, const StageLayout& layout) : StepBuilder(job, layout) {}

  std::vector<Event> build(int64_t pp_rank) override {
    out_.clear();
    const Parallel& p = job_.parallel;
    if (p.pp == 1) {
      for (int64_t mb = 0; mb < job_.microbatches; ++mb) {
        forward(0, mb, false);
        backward(0, mb, false, true);
      }
    } else {
      run_schedule(pp_rank);
    }
    stage_ = -1;
    microbatch_ = -1;
    // This rank's model chunks (stages), in chunk order.
    std::vector<int64_t> chunks;
    for (int64_t st = pp_rank; st < layout_.stages; st += p.pp) chunks.push_back(st);
    // finalize_model_grads: each chunk's buffers reduce-scattered (dense over dp x cp, experts
    // over the expert data-parallel group), then the sequence-parallel norms' gradients
    // all-reduced over tp, one coalesced tensor.
    // Under --bf16 the gradient buffers are fp32 unless --grad-reduce-in-bf16; the norms'
    // gradients all-reduced over tp are slices of them (main_grad), so of their dtype.
    const DType grad_type = job_.megatron_grad_reduce_in_bf16 ? DType::kBF16 : DType::kF32;
    const int64_t grad_width = job_.megatron_grad_reduce_in_bf16 ? 2 : 4;
    int64_t norms = 0;
    std::vector<Buffers> buffers;
    for (int64_t st : chunks) {
      buffers.push_back(megatron_buffers(st));
      stage_ = static_cast<int32_t>(st);
      emit_if(Op::kReduceScatter, Dim::kFsdp, grad_type, checked_mul(buffers.back().dense, grad_width, "a bucket's bytes"),
              Phase::kBwd, "grads");
      if (buffers.back().experts > 0) {
        emit_if(Op::kReduceScatter, Dim::kEfsdp, grad_type, checked_mul(buffers.back().experts, grad_width, "a bucket's bytes"),
                Phase::kBwd, "expert_grads");
      }
      norms = checked_add(norms, buffers.back().norms, "the norms");
    }
    stage_ = -1;
    emit_if(Op::kAllReduce, Dim::kTp, grad_type, checked_mul(norms, grad_width, "the norms' bytes"), Phase::kBwd, "norm_grads");
    // The rerun state machine (validate_results): whether any rank asks for a rerun, one int32
    // summed over the world, before the optimizer.
    if (job_.megatron_rerun_validate) emit_if(Op::kAllReduce, Dim::kWorld, DType::kI32, 4, Phase::kOptimizer, "rerun_requested");
    // optimizer.step(): the gradient norm over every rank of the distributed optimizer, then
    // each chunk's parameters gathered (overlap_param_gather off); train_step's reductions over
    // the model-parallel group (update_successful as a MIN of ints, the grad norm's MAX).
    emit_if(Op::kAllReduce, Dim::kWorld, DType::kF32, 4, Phase::kOptimizer, "grad_norm");
    for (std::size_t k = 0; k < chunks.size(); ++k) {
      stage_ = static_cast<int32_t>(chunks[k]);
      emit_if(Op::kAllGather, Dim::kFsdp, DType::kBF16, checked_mul(buffers[k].dense, 2, "a bucket's bytes"), Phase::kOptimizer,
              "params");
      if (buffers[k].experts > 0) {
        emit_if(Op::kAllGather, Dim::kEfsdp, DType::kBF16, checked_mul(buffers[k].experts, 2, "a bucket's bytes"),
                Phase::kOptimizer, "expert_params");
      }
    }
    stage_ = -1;
    emit_if(Op::kAllReduce, Dim::kMp, DType::kI32, 4, Phase::kOptimizer, "update_successful");
    emit_if(Op::kAllReduce, Dim::kMp, DType::kF32, 4, Phase::kOptimizer, "grad_norm_max");
    // The last stage's loss report: (loss sum, tokens) all-reduced over dp x cp.
    if (pp_rank == p.pp - 1 && job_.log_metrics) {
      emit_if(Op::kAllReduce, Dim::kFsdp, DType::kF32, 8, Phase::kMetrics, "lm_loss");
    }
    return std::move(out_);
  }

 private:
  void forward(int64_t stage, int64_t mb, bool) override {
    stage_ = static_cast<int32_t>(stage);
    microbatch_ = static_cast<int32_t>(mb);
    megatron_forward(stage);
  }
  void backward(int64_t stage, int64_t mb, bool, bool) override {
    stage_ = static_cast<int32_t>(stage);
    microbatch_ = static_cast<int32_t>(mb);
    megatron_backward(stage);
  }
  // Megatron's schedules hold no FSDP actions; its gradients are reduced by the step (build).
  void unshard(int64_t) override {}
  void reduce_grads(int64_t) override {}
  void after_schedule(int64_t, const std::vector<bool>&) override {}

  // megatron_layer_forward: one transformer layer's forward collectives with sequence parallel:
  // the column-parallel linears gather the sequence over tp (linear_qkv, linear_fc1), the
  // row-parallel ones reduce-scatter it (linear_proj, linear_fc2); CP gathers K and V (its
  // all_gather communication type); an MoE layer (the alltoall dispatcher, expert tp 1) gathers
  // the tokens per expert over ep, sends the tokens and their probabilities to their experts and
  // back (all-to-alls over ep), then runs its shared experts like an MLP.
  void megatron_layer_forward(int32_t layer, Phase ph) {
    attention_forward(layer, ph);
    if (!moe_layer(job_.model, layer)) {
      tp_pair("mlp", layer, ph);
      return;
    }
    emit_if(Op::kAllGather, Dim::kEp, DType::kI64, checked_mul(z_.counts_bytes, size(Dim::kEp), "the tokens per expert"), ph,
            "moe_counts", layer);
    emit_if(Op::kAllToAll, Dim::kEp, DType::kBF16, z_.dispatch_bytes, ph, "moe_dispatch", layer);
    emit_if(Op::kAllToAll, Dim::kEp, DType::kF32, z_.dispatch_bytes / job_.model.dim * 2, ph, "moe_probs", layer);
    emit_routed_if(Op::kAllToAll, Dim::kEp, DType::kBF16, z_.dispatch_bytes, ph, "moe_combine", layer);
    if (job_.model.shared_experts > 0) tp_pair("shared_experts", layer, ph);
  }

  // megatron_layer_backward: the same in reverse: a row-parallel linear's backward gathers its
  // output's gradient; a column-parallel one gathers its input again (for the weight gradient)
  // and reduce-scatters its input's gradient; CP reduce-scatters dK and dV; the all-to-alls run
  // back (combine, probabilities, tokens). Full recomputation runs the forward again first.
  void megatron_layer_backward(int32_t layer, Phase ph) {
    const int64_t h = z_.hidden_bytes;
    if (ac_ == Checkpoint::kFull) {
      recomputing_ = true;
      megatron_layer_forward(layer, ph);
      recomputing_ = false;
    }
    auto mlp = [&](const char* what) {
      emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, what, layer);
      emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, what, layer);
      emit_if(Op::kReduceScatter, Dim::kTp, DType::kBF16, h, ph, what, layer);
    };
    if (!moe_layer(job_.model, layer)) {
      mlp("mlp");
    } else {
      if (job_.model.shared_experts > 0) mlp("shared_experts");
      emit_if(Op::kAllToAll, Dim::kEp, DType::kBF16, z_.dispatch_bytes, ph, "moe_combine", layer);
      emit_routed_if(Op::kAllToAll, Dim::kEp, DType::kF32, z_.dispatch_bytes / job_.model.dim * 2, ph, "moe_probs", layer);
      emit_routed_if(Op::kAllToAll, Dim::kEp, DType::kBF16, z_.dispatch_bytes, ph, "moe_dispatch", layer);
    }
    emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, "attention", layer);
    emit_if(Op::kReduceScatter, Dim::kCp, DType::kBF16, z_.k_bytes, ph, "k", layer);
    emit_if(Op::kReduceScatter, Dim::kCp, DType::kBF16, z_.v_bytes, ph, "v", layer);
    emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, "attention", layer);
    emit_if(Op::kReduceScatter, Dim::kTp, DType::kBF16, h, ph, "attention", layer);
  }

  // megatron_forward: the embedding's reduce-scatter into the sequence-parallel region on the
  // first stage; the layers; on the last stage the output layer's gather and the vocabulary-
  // parallel cross entropy's all-reduces over tp (the logits' max, the target's logit, the sum
  // of exponentials).
  void megatron_forward(int64_t stage) {
    const Phase ph = Phase::kFwd;
    const int64_t h = z_.hidden_bytes;
    if (stage == 0) emit_if(Op::kReduceScatter, Dim::kTp, DType::kBF16, h, ph, "embeddings");
    for (int64_t l = 0; l < layout_.layer_count[stage]; ++l) {
      megatron_layer_forward(static_cast<int32_t>(layout_.first_layer[stage] + l), ph);
    }
    if (stage == layout_.stages - 1) {
      emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, "output_layer");
      for (const char* w : {"loss_max", "loss_target", "loss_sumexp"}) {
        emit_if(Op::kAllReduce, Dim::kTp, DType::kF32, z_.logits_bytes, ph, w);
      }
    }
  }
  void megatron_backward(int64_t stage) {
    const Phase ph = Phase::kBwd;
    const int64_t h = z_.hidden_bytes;
    if (stage == layout_.stages - 1) {
      emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, "output_layer");
      emit_if(Op::kReduceScatter, Dim::kTp, DType::kBF16, h, ph, "output_layer");
    }
    for (int64_t l = layout_.layer_count[stage] - 1; l >= 0; --l) {
      megatron_layer_backward(static_cast<int32_t>(layout_.first_layer[stage] + l), ph);
    }
    if (stage == 0) emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, "embeddings");
  }

  // megatron_buffers: one model chunk's (stage's) DDP buffers with the distributed optimizer,
  // dense and expert: every parameter's start aligned to 64 elements (pad_param_start), the
  // buffer's end to lcm(its data-parallel size, 128) (pad_bucket_end), parameters laid out in
  // backward order; one bucket each (overlap_grad_reduce off, Megatron's default). Returns the
  // padded element counts and the sequence-parallel norms' elements (all-reduced over tp).
  struct Buffers {
    int64_t dense = 0, experts = 0, norms = 0;
  };
  Buffers megatron_buffers(int64_t stage) const {
    const Model& m = job_.model;
    const Parallel& p = job_.parallel;
    const int64_t t = p.tp;
    std::vector<int64_t> dense, experts;
    int64_t norms = 0;
    // A norm: its weight, and LayerNorm's bias; sequence-parallel (all-reduced over tp).
    auto norm = [&] {
      for (int k = 0; k < (job_.megatron_layernorm ? 2 : 1); ++k) {
        dense.push_back(m.dim);
        norms += m.dim;
      }
    };
    // A row-parallel layer's bias is whole on every tp rank and sequence-parallel too
    // (tensor_parallel/layers.py), a column-parallel one's split over tp.
    const bool bias = job_.megatron_bias_linear, qkv_bias = bias || job_.megatron_qkv_bias;
    auto row_bias = [&] {
      if (!bias) return;
      dense.push_back(m.dim);
      norms += m.dim;
    };
    if (stage == 0) dense.push_back(embed_);
    for (int64_t l = 0; l < layout_.layer_count[stage]; ++l) {
      const int64_t layer = layout_.first_layer[stage] + l;
      // In the layer's parameter order (the buffer lays them out backward): input_layernorm,
      // the attention's linear_proj then linear_qkv (Attention registers linear_proj before
      // SelfAttention adds linear_qkv), pre_mlp_layernorm, the MLP's linear_fc1, linear_fc2.
      norm();
      if (mla(m)) {
        dense.push_back(attention_ - 2 * m.dim);  // the latent attention's projections
      } else {
        const int64_t head_dim = m.dim / m.heads;
        const int64_t qkv = (m.heads + 2 * m.kv_heads) * head_dim / t;
        dense.push_back(checked_mul(m.dim, m.heads * head_dim / t, "linear_proj"));
        row_bias();
        dense.push_back(checked_mul(qkv, m.dim, "linear_qkv"));
        if (qkv_bias) dense.push_back(qkv);
      }
      norm();
      if (!moe_layer(m, layer)) {
        dense.push_back(checked_mul(2 * m.ffn_dim / t, m.dim, "linear_fc1"));
        if (bias) dense.push_back(2 * m.ffn_dim / t);
        dense.push_back(checked_mul(m.dim, m.ffn_dim / t, "linear_fc2"));
        row_bias();
        continue;
      }
      dense.push_back(checked_mul(m.experts, m.dim, "the router"));
      if (m.shared_experts > 0) {
        const int64_t fs = m.moe_ffn_dim * m.shared_experts;
        dense.push_back(checked_mul(2 * fs / t, m.dim, "the shared experts' fc1"));
        dense.push_back(checked_mul(m.dim, fs / t, "the shared experts' fc2"));
      }
      for (int64_t e = 0; e < m.experts / p.ep; ++e) {
        experts.push_back(checked_mul(2 * m.moe_ffn_dim, m.dim, "an expert's fc1"));
        experts.push_back(checked_mul(m.dim, m.moe_ffn_dim, "an expert's fc2"));
      }
    }
    if (stage == layout_.stages - 1) {
      norm();  // final_layernorm
      if (!m.weight_tying || layout_.stages > 1) dense.push_back(output_);
    }
    auto pad = [](int64_t v, int64_t to) { return (v + to - 1) / to * to; };
    auto lay_out = [&](const std::vector<int64_t>& params, int64_t dp) {
      if (params.empty()) return int64_t{0};
      int64_t end = 0;
      for (auto it = params.rbegin(); it != params.rend(); ++it) end = checked_add(pad(end, 64), *it, "a DDP buffer");
      return pad(end, std::lcm(dp, int64_t{128}));
    };
    return Buffers{lay_out(dense, size(Dim::kFsdp)), lay_out(experts, size(Dim::kEfsdp)), norms};
  }
};

}  // namespace

std::unique_ptr<StepBuilder> make_megatron_step(const Job& job, const StageLayout& layout) {
  return std::make_unique<MegatronStep>(job, layout);
}

}  // namespace meshsim::step::detail
