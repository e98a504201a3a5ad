// torchtitan's step (pytorch/torchtitan at 0.3.0; docs/step.md names each collective's source):
// the global token count; each microbatch's forward and backward in the schedule's order with
// FSDP2's all-gathers and reduce-scatters (the units, their prefetch and resharding), TP with
// sequence and loss parallel, CP's K and V, the MoE's all-to-alls, ChunkedLossWrapper; the
// gradient norm and the metrics of a logged step.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "meshsim/error.hpp"
#include "step_builder.hpp"

namespace meshsim::step::detail {

namespace {

class TitanStep final : public StepBuilder {
 public:
  TitanStep(const Job& job, const StageLayout& layout) : StepBuilder(job, layout) {
    const Parallel& p = job.parallel;
    const Model& m = job.model;
    const Reshard policy = job.reshard_after_forward;
    reshard_blocks_ = policy == Reshard::kAlways || (policy == Reshard::kDefault && p.pp == 1);
    reshard_output_ = policy == Reshard::kAlways;
    const int64_t f = z_.fsdp, t = p.tp;
    lm_head_ = padded(m.vocab / t, m.dim, f);
    norm_ = padded(m.dim, 1, f);
    chunks_ = job.loss_chunks;
    if (chunks_ < 0 || (chunks_ > 0 && (job.seq_len / p.cp) % chunks_ != 0)) {
      throw InvalidArgument("loss chunks (" + std::to_string(chunks_) + ") must divide a rank's sequence (" +
                            std::to_string(job.seq_len / p.cp) + " tokens)  [torchtitan's ChunkedLossWrapper]");
    }
    // A stage's parameters reduce their gradients in bf16 (the parameters' dtype) when the
    // backward reduces them; under pp in fp32 (FSDP's reduce dtype): PyTorch's schedules run
    // every backward without gradient sync, accumulating, and reduce once after the last
    // (schedules.py _step_microbatches: perform_reduce_grad).
    accumulated_ = p.pp > 1;
  }

  std::vector<Event> build(int64_t pp_rank) override {
    out_.clear();
    out_sharded_ = true;
    norm_pending_ = false;
    const Parallel& p = job_.parallel;
    if (p.dp_replicate * p.dp_shard > 1) emit(Op::kAllReduce, Dim::kBatch, DType::kI64, 8, Phase::kTokens, "tokens");
    // Gradient accumulation (torchtitan's train_step): each step's forward-backward whole, FSDP
    // gathering and reducing in each; its microbatches numbered on from the step before.
    for (int64_t a = 0; a < job_.grad_accum_steps; ++a) {
      if (p.pp == 1) {
        forward(0, a, true);
        backward(0, a, true, true);
      } else {
        mb_base_ = a * layout_.schedule.microbatches;
        run_schedule(pp_rank);
      }
    }
    mb_base_ = 0;
    stage_ = -1;
    microbatch_ = -1;
    // The optimizer: clip_grad_norm_ (torch.nn.utils.get_total_norm) stacks one norm per
    // parameter tensor, partial over the sharded dims: that vector all-reduced over fsdp, then
    // over tp (DTensor's redistribute, one dim at a time); the total then over pp. torchtitan
    // 0.3.0 checks the loss for finiteness on the rank, after the metrics' reductions.
    // With ep > 1 (torchtitan's _clip_grad_norm_with_ep) the routed experts' tensors (w1, w2, w3
    // of each MoE layer) are normed apart, over their own mesh (efsdp, ep), before the rest; a
    // rank holding none of one kind reduces nothing for it.
    const int64_t tensors = param_tensors(pp_rank), moe = p.ep > 1 ? moe_layers(pp_rank) : 0;
    if (moe > 0) {
      const int64_t bytes = checked_mul(moe, 3 * 4, "the gradient norms' bytes");
      emit_if(Op::kAllReduce, Dim::kEfsdp, DType::kF32, bytes, Phase::kOptimizer, "expert_grad_norm");
      emit_if(Op::kAllReduce, Dim::kEp, DType::kF32, bytes, Phase::kOptimizer, "expert_grad_norm");
    }
    if (const int64_t rest = tensors - 3 * moe; rest > 0) {
      const int64_t norms = checked_mul(rest, 4, "the gradient norms' bytes");
      emit_if(Op::kAllReduce, Dim::kFsdp, DType::kF32, norms, Phase::kOptimizer, "grad_norm");
      emit_if(Op::kAllReduce, Dim::kTp, DType::kF32, norms, Phase::kOptimizer, "grad_norm");
    }
    emit_if(Op::kAllReduce, Dim::kPp, DType::kF32, 4, Phase::kOptimizer, "grad_norm");
    // MoE load balancing (torchtitan's optimizer step pre-hook _update_expert_bias): the MoE
    // layers' tokens per expert, stacked (float32), all-reduced over tp when ep > 1, then over
    // the loss mesh.
    if (const int64_t held = moe_layers(pp_rank); held > 0 && job_.model.load_balance) {
      const int64_t bytes = checked_mul(checked_mul(held, job_.model.experts, "the tokens per expert"), 4, "the tokens per expert");
      if (p.ep > 1) emit_if(Op::kAllReduce, Dim::kTp, DType::kF32, bytes, Phase::kOptimizer, "expert_bias");
      emit_if(Op::kAllReduce, Dim::kLoss, DType::kF32, bytes, Phase::kOptimizer, "expert_bias");
    }
    if (job_.log_metrics) {
      emit_if(Op::kAllReduce, Dim::kLoss, DType::kF32, 4, Phase::kMetrics, "loss_sum");
      emit_if(Op::kAllReduce, Dim::kLoss, DType::kF32, 4, Phase::kMetrics, "loss_max");
      emit_if(Op::kAllReduce, Dim::kLoss, DType::kI64, 8, Phase::kMetrics, "tokens_seen");
    }
    return std::move(out_);
  }

 private:
  // param_tensors: the parameter tensors of the stages `pp_rank` holds (torchtitan's modules:
  // llama3's fused wqkv and wo, MLA's wq or wq_a/q_norm/wq_b, wkv_a, kv_norm, wkv_b, wo; two
  // norms a block; w1/w2/w3, or the MoE's grouped experts, router gate and shared experts).
  int64_t param_tensors(int64_t pp_rank) const {
    const Model& m = job_.model;
    int64_t n = 0;
    for (int64_t st = 0; st < layout_.stages; ++st) {
      if (!holds_stage(pp_rank, st)) continue;
      if (st == 0) n += 1;
      // The final norm has no gradient where FSDP never reduces one (loses_norm_grad).
      if (st == layout_.stages - 1) n += m.weight_tying ? 1 : loses_norm_grad(pp_rank, st) ? 1 : 2;
      for (int64_t l = 0; l < layout_.layer_count[st]; ++l) {
        const int64_t layer = layout_.first_layer[st] + l;
        n += 2 + (mla(m) ? (m.q_lora_rank == 0 ? 1 : 3) + 4 : 2);
        n += moe_layer(m, layer) ? 4 + (m.shared_experts > 0 ? 3 : 0) : 3;
      }
    }
    return n;
  }

  // moe_layers: the MoE layers of the stages `pp_rank` holds.
  int64_t moe_layers(int64_t pp_rank) const {
    int64_t n = 0;
    for (int64_t st = 0; st < layout_.stages; ++st) {
      if (!holds_stage(pp_rank, st)) continue;
      for (int64_t l = 0; l < layout_.layer_count[st]; ++l) n += moe_layer(job_.model, layout_.first_layer[st] + l) ? 1 : 0;
    }
    return n;
  }

  // loses_norm_grad: whether the final norm on the last stage gets no gradient FSDP sees: the
  // loss chunked and the stage's backward split into I and W (see backward).
  bool loses_norm_grad(int64_t pp_rank, int64_t stage) const {
    if (chunks_ == 0 || job_.model.weight_tying || job_.parallel.pp == 1) return false;
    for (const auto& a : layout_.schedule.ranks[pp_rank]) {
      if (a && a->stage == stage && a->type == ActionType::kI) return true;
    }
    return false;
  }

  // units: the stage's FSDP units in forward order: the embeddings (tied to the output when the
  // model ties them) on the first stage, a unit per block, the final norm with the lm_head on
  // the last stage.
  std::vector<Unit> units(int64_t stage) const {
    std::vector<Unit> u;
    if (stage == 0) u.push_back({job_.model.weight_tying ? "tied_embeddings" : "embeddings", -1, embed_});
    for (int64_t l = 0; l < layout_.layer_count[stage]; ++l) {
      const int64_t layer = layout_.first_layer[stage] + l;
      if (!moe_layer(job_.model, layer)) {
        u.push_back({"block", static_cast<int32_t>(layer), checked_add(attention_, dense_ffn_, "a block")});
      } else if (job_.parallel.ep > 1) {
        u.push_back({"block", static_cast<int32_t>(layer), checked_add(attention_, moe_dense_, "a block"), routed_});
      } else {
        u.push_back({"block", static_cast<int32_t>(layer), checked_add(checked_add(attention_, moe_dense_, "a block"), routed_, "a block")});
      }
    }
    if (stage == layout_.stages - 1 && !job_.model.weight_tying) u.push_back({"output", -1, output_});
    return u;
  }

  // gather: FSDP's all-gather of a unit; the routed experts' on their own mesh after the rest in
  // forward, before it in backward (FSDP2 keeps a parameter group per mesh and runs a unit's
  // groups in reverse in backward: observed alike for the reduce-scatters).
  void gather(const Unit& u, Phase ph) {
    auto experts = [&] {
      if (u.sparse_elements) {
        emit_if(Op::kAllGather, Dim::kEfsdp, DType::kBF16, checked_mul(u.sparse_elements, 2, "an all-gather's bytes"), ph,
                "experts", u.layer);
      }
    };
    if (ph == Phase::kBwd) experts();
    emit_if(Op::kAllGather, Dim::kFsdp, DType::kBF16, checked_mul(u.elements, 2, "an all-gather's bytes"), ph, "params", u.layer);
    if (ph != Phase::kBwd) experts();
  }
  // replicated: the elements of a block's parameters that TP leaves whole (torchtitan's
  // NoParallel and the norms), in the block's order (attention: MLA's wq_a, q_norm, wkv_a,
  // kv_norm; attention_norm, ffn_norm; the MoE router's gate). Under sequence parallel their
  // gradients are partial over tp and FSDP all-reduces each before its reduce-scatter.
  std::vector<int64_t> replicated(int32_t layer) const {
    const Model& m = job_.model;
    std::vector<int64_t> v;
    if (mla(m)) {
      if (m.q_lora_rank > 0) {
        v.push_back(checked_mul(m.q_lora_rank, m.dim, "a replicated weight"));
        v.push_back(m.q_lora_rank);
      }
      v.push_back(checked_mul(checked_add(m.kv_lora_rank, m.qk_rope_head_dim, "wkv_a"), m.dim, "a replicated weight"));
      v.push_back(m.kv_lora_rank);
    }
    v.push_back(m.dim);
    v.push_back(m.dim);
    if (moe_layer(m, layer)) v.push_back(checked_mul(m.experts, m.dim, "the router's gate"));
    return v;
  }
  // reduce: FSDP's post-backward reduction of a unit: under sequence parallel the norms'
  // gradients (replicated weights, partial gradients) all-reduced over tp first, one each
  // (_fsdp_param_group.py post_backward: unsharded_grad_data), then the reduce-scatter.
  // With the loss chunked, the output unit's lm_head reduced at the last chunk: its norm here.
  void reduce(const Unit& u) {
    if (chunks_ > 0 && is_output(u)) {
      if (!norm_pending_) return;
      norm_pending_ = false;
      return reduce(u, norm_, Phase::kBwd, "grads");
    }
    reduce(u, u.elements, Phase::kBwd, "grads");
  }
  // The routed experts' group is reduced first (see gather); HSDP all-reduces each shard's
  // gradient over the replicas after its reduce-scatter.
  void reduce(const Unit& u, int64_t elements, Phase ph, const char* what) {
    const bool block = u.layer >= 0, output = std::strcmp(u.what, "output") == 0;
    if (u.sparse_elements) {
      emit_if(Op::kReduceScatter, Dim::kEfsdp, DType::kF32, checked_mul(u.sparse_elements, 4, "a reduce-scatter's bytes"),
              Phase::kBwd, "expert_grads", u.layer);
      emit_if(Op::kAllReduce, Dim::kDpReplicate, DType::kF32, checked_mul(u.sparse_elements / z_.efsdp, 4, "an all-reduce's bytes"),
              Phase::kBwd, "expert_grads", u.layer);
    }
    std::vector<int64_t> whole;
    if (block) {
      whole = replicated(u.layer);
    } else if ((output && elements != lm_head_) || std::strcmp(u.what, "tied_embeddings") == 0) {
      whole.push_back(job_.model.dim);  // the final norm
    }
    for (const int64_t n : whole) {
      emit_if(Op::kAllReduce, Dim::kTp, accumulated_ ? DType::kF32 : DType::kBF16,
              checked_mul(n, accumulated_ ? 4 : 2, "a replicated parameter's gradient"), ph, "norm_grads", u.layer);
    }
    emit_if(Op::kReduceScatter, Dim::kFsdp, DType::kF32, checked_mul(elements, 4, "a reduce-scatter's bytes"), ph, what,
            u.layer);
    emit_if(Op::kAllReduce, Dim::kDpReplicate, DType::kF32, checked_mul(elements / z_.fsdp, 4, "an all-reduce's bytes"), ph,
            what, u.layer);
  }

  // ffn_forward / ffn_backward: a block's FFN: dense (TP's gather and reduce-scatter around the
  // MLP), or MoE as torchtitan's moe_sharding lays it out. With ep > 1 the routed experts take
  // the sequence shard as it is: the token counts, the dispatch and the combine all-to-all over
  // ep; the shared experts gather the sequence over tp and reduce-scatter their output. With
  // ep = 1 the MoE gathers its input over tp, and the routed and the shared experts each
  // reduce-scatter their (partial) output.
  void ffn_forward(int32_t layer, Phase ph) {
    const int64_t h = z_.hidden_bytes;
    const bool shared = job_.model.shared_experts > 0;
    if (!moe_layer(job_.model, layer)) {
      tp_pair("mlp", layer, ph);
    } else if (job_.parallel.ep > 1) {
      emit_if(Op::kAllToAll, Dim::kEp, DType::kI64, z_.counts_bytes, ph, "moe_counts", layer);
      emit_if(Op::kAllToAll, Dim::kEp, DType::kBF16, z_.dispatch_bytes, ph, "moe_dispatch", layer);
      emit_routed_if(Op::kAllToAll, Dim::kEp, DType::kBF16, z_.dispatch_bytes, ph, "moe_combine", layer);
      if (shared) tp_pair("shared_experts", layer, ph);
    } else {
      emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, "moe", layer);
      emit_if(Op::kReduceScatter, Dim::kTp, DType::kBF16, h, ph, "routed_experts", layer);
      if (shared) emit_if(Op::kReduceScatter, Dim::kTp, DType::kBF16, h, ph, "shared_experts", layer);
    }
  }
  // ffn_backward: `led` when the gradient of the FFN's output reduce-scatter was issued already
  // (ffn_output_reduce: before a recompute).
  void ffn_backward(int32_t layer, Phase ph, bool led = false) {
    const int64_t h = z_.hidden_bytes;
    const bool shared = job_.model.shared_experts > 0;
    if (!moe_layer(job_.model, layer)) {
      if (!led) emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, "mlp", layer);
      emit_if(Op::kReduceScatter, Dim::kTp, DType::kBF16, h, ph, "mlp", layer);
    } else if (job_.parallel.ep > 1) {
      if (shared) {
        if (!led) emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, "shared_experts", layer);
        emit_if(Op::kReduceScatter, Dim::kTp, DType::kBF16, h, ph, "shared_experts", layer);
      }
      emit_if(Op::kAllToAll, Dim::kEp, DType::kBF16, z_.dispatch_bytes, ph, "moe_combine", layer);
      emit_routed_if(Op::kAllToAll, Dim::kEp, DType::kBF16, z_.dispatch_bytes, ph, "moe_dispatch", layer);
    } else {
      if (shared && !led) emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, "shared_experts", layer);
      if (shared || !led) emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, "routed_experts", layer);
      emit_if(Op::kReduceScatter, Dim::kTp, DType::kBF16, h, ph, "moe", layer);
    }
  }
  // ffn_output_reduce: what the FFN's last forward collective is when it is a reduce-scatter over
  // tp (the MLP's, the shared experts', or with ep 1 and no shared experts the routed
  // experts'), whose gradient is an all-gather; null otherwise (an ep MoE without shared experts
  // ends in its combine and the tokens' unpermutation, which saves its indices).
  const char* ffn_output_reduce(int32_t layer) const {
    if (size(Dim::kTp) == 1) return nullptr;
    if (!moe_layer(job_.model, layer)) return "mlp";
    if (job_.model.shared_experts > 0) return "shared_experts";
    return job_.parallel.ep > 1 ? nullptr : "routed_experts";
  }
  bool resharded(const Unit& u) const {
    if (job_.parallel.pp > 1) return false;  // pipelining keeps them unsharded until the step ends
    if (std::strcmp(u.what, "output") == 0 || std::strcmp(u.what, "tied_embeddings") == 0) return reshard_output_;
    return reshard_blocks_;
  }

  // block_forward: a block's forward collectives (attention, CP's K and V, the FFN or MoE).
  void block_forward(int32_t layer, Phase ph) {
    attention_forward(layer, ph);
    ffn_forward(layer, ph);
  }

  // recompute: activation checkpointing runs a block's forward again at the start of its
  // backward. torchtitan's default, selective per-op AC, saves the outputs of reduce-scatters
  // and all-to-alls (its comm_ops save list) but not of all-gathers, so those are issued again;
  // full AC issues every forward collective again.
  void recompute(int32_t layer) {
    if (ac_ == Checkpoint::kNone) return;
    recomputing_ = true;
    block_forward(layer, Phase::kBwd);
    recomputing_ = false;
  }

  // forward: one microbatch through `stage`; `gather_params` when its FSDP units are sharded now.
  void forward(int64_t stage, int64_t mb, bool gather_params) override {
    stage_ = static_cast<int32_t>(stage);
    microbatch_ = static_cast<int32_t>(mb);
    const Phase ph = Phase::kFwd;
    const int64_t h = z_.hidden_bytes;
    // With ep > 1 torchtitan sets FSDP's forward prefetch explicitly (distributed/fsdp.py: "D2H
    // syncs in EP could interfere with implicit prefetching"): each unit's pre-forward gathers the
    // next one (the embeddings the first block, the last block the norm and lm_head) before its
    // own collectives.
    const std::vector<Unit> us = units(stage);
    auto sharded = [&](const Unit& u) { return chunks_ > 0 && is_output(u) ? out_sharded_ : gather_params; };
    bool prefetched = false;
    for (std::size_t i = 0; i < us.size(); ++i) {
      const Unit& u = us[i];
      if (!prefetched && sharded(u)) gather(u, ph);
      prefetched = job_.parallel.ep > 1 && i + 1 < us.size() && sharded(us[i + 1]);
      if (prefetched) gather(us[i + 1], ph);
      if (u.layer >= 0) {
        block_forward(u.layer, ph);
      } else if (std::strcmp(u.what, "output") != 0) {
        // RowwiseParallel embedding with a sequence-sharded output: a reduce-scatter.
        emit_if(Op::kReduceScatter, Dim::kTp, DType::kBF16, h, ph, "embeddings");
      }
    }
    if (stage == layout_.stages - 1) {
      // The final norm's sequence shard gathered for the lm_head, then loss parallel's
      // reductions over the vocabulary shards (max, sum of exponentials, the target's logit).
      // ChunkedLossWrapper (torchtitan 0.3.0's loss.py): the norm's post-forward reshards
      // the output unit (the wrapper left its policy "reshard after forward"), the wrapper
      // gathers it again (lm_head.unshard()), runs the reductions per chunk of the sequence,
      // each chunk's backward inside the loss, reduces at the last chunk the gradients the unit
      // holds (the lm_head's; under pp the norm's accumulated from earlier backwards too) and
      // reshards it.
      emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, "lm_head");
      const bool wrapper = chunks_ > 0 && !job_.model.weight_tying;
      if (wrapper) gather(Unit{"output", -1, output_}, ph);
      const int64_t n = std::max<int64_t>(chunks_, 1);
      for (int64_t c = 0; c < n; ++c) {
        for (const char* w : {"loss_max", "loss_sumexp", "loss_target"}) {
          emit_if(Op::kAllReduce, Dim::kTp, DType::kF32, z_.logits_bytes / n, ph, w);
        }
      }
      if (wrapper) {
        reduce(Unit{"output", -1, output_}, norm_pending_ ? checked_add(lm_head_, norm_, "the output unit") : lm_head_, ph,
               "lm_head_grads");
        norm_pending_ = false;
        out_sharded_ = true;
      }
    }
  }
  static bool is_output(const Unit& u) { return std::strcmp(u.what, "output") == 0; }

  // backward: one microbatch back through `stage` (its units in reverse), gathering again the
  // units resharded after forward, reducing the gradients on the stage's last backward;
  // `input_grads` false for a weight-only backward (W), which moves no activations.
  void backward(int64_t stage, int64_t mb, bool reduce_grads, bool input_grads) override {
    stage_ = static_cast<int32_t>(stage);
    microbatch_ = static_cast<int32_t>(mb);
    const Phase ph = Phase::kBwd;
    const int64_t h = z_.hidden_bytes;
    auto us = units(stage);
    std::reverse(us.begin(), us.end());
    const bool output_unit = !us.empty() && is_output(us.front());
    if (stage == layout_.stages - 1 && input_grads && !output_unit) {
      emit_if(Op::kReduceScatter, Dim::kTp, DType::kBF16, h, ph, "lm_head");
    }
    // A unit resharded after forward is gathered again; FSDP's implicit backward prefetch
    // gathers the next unit (in backward order) at this unit's pre-backward, so before this
    // unit's own collectives and reduction (_fsdp_state.py _pre_backward, _prefetch_unshard).
    // The wrapper's output unit: gathered at its pre-backward when sharded (after a forward);
    // kept after a backward that does not reduce (pp's), resharded after one that does.
    auto regather = [&](const Unit& u) {
      return input_grads && (chunks_ > 0 && is_output(u) ? out_sharded_ : resharded(u));
    };
    for (std::size_t i = 0; i < us.size(); ++i) {
      const Unit& u = us[i];
      if (i == 0 && regather(u)) gather(u, ph);
      if (i + 1 < us.size() && regather(us[i + 1])) gather(us[i + 1], ph);
      if (input_grads && is_output(u)) emit_if(Op::kReduceScatter, Dim::kTp, DType::kBF16, h, ph, "lm_head");
      if (input_grads) {
        if (u.layer >= 0) {
          // A checkpointed block's backward starts before its recompute: the gradient of the
          // FFN's output reduce-scatter (an all-gather) needs no saved tensor, so autograd runs
          // it first; the recompute (torch.utils.checkpoint, non-reentrant) starts at the first
          // op that unpacks one.
          const char* lead = ac_ == Checkpoint::kNone ? nullptr : ffn_output_reduce(u.layer);
          if (lead) emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, lead, u.layer);
          recompute(u.layer);
          ffn_backward(u.layer, ph, lead != nullptr);
          emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, "attention", u.layer);
          emit_if(Op::kReduceScatter, Dim::kCp, DType::kBF16, z_.k_bytes, ph, "k", u.layer);
          emit_if(Op::kReduceScatter, Dim::kCp, DType::kBF16, z_.v_bytes, ph, "v", u.layer);
          emit_if(Op::kReduceScatter, Dim::kTp, DType::kBF16, h, ph, "attention", u.layer);
        } else if (!is_output(u)) {
          emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, "embeddings");
        }
      }
      // The final norm's gradient, for FSDP to reduce, comes from a full backward only. A
      // zero-bubble schedule's I computes none, and its W sets the gradients on the weights
      // its forward used (PyTorch 2.13 pipelining/_backward.py stage_backward_weight), which
      // ChunkedLossWrapper has resharded since: FSDP reduces no gradient of the final norm in
      // such a step (observed on every rank holding the last stage: the wrapper's reductions
      // hold the lm_head alone, and REDUCE_GRAD none of the norm's).
      if (chunks_ > 0 && is_output(u)) {
        if (input_grads) out_sharded_ = reduce_grads;
        if (input_grads && weight_grads_) norm_pending_ = true;
      }
      if (reduce_grads) reduce(u);
    }
  }

  void unshard(int64_t st) override {
    for (const Unit& u : units(st)) {
      if (chunks_ > 0 && is_output(u)) {
        if (out_sharded_) gather(u, Phase::kFwd);
        out_sharded_ = false;
      } else {
        gather(u, Phase::kFwd);
      }
    }
  }
  void reduce_grads(int64_t st) override {
    for (const Unit& u : units(st)) reduce(u);
  }
  // Without REDUCE_GRAD actions the schedule reduces each stage's gradients after all its
  // actions, the stage's units in forward order (schedules.py _step_microbatches:
  // perform_reduce_grad).
  void after_schedule(int64_t pp_rank, const std::vector<bool>& reduced) override {
    for (int64_t st = 0; st < layout_.stages; ++st) {
      if (!holds_stage(pp_rank, st) || reduced[st]) continue;
      stage_ = static_cast<int32_t>(st);
      for (const Unit& u : units(st)) reduce(u);
    }
  }

  bool reshard_blocks_ = true, reshard_output_ = false;
  bool accumulated_ = false;  // the stage's gradients accumulate over microbatches before FSDP reduces them
  int64_t chunks_ = 0, lm_head_ = 0, norm_ = 0;
  bool out_sharded_ = true;    // the wrapper's output unit is sharded now
  bool norm_pending_ = false;  // the final norm holds a gradient not reduced yet
};

}  // namespace

std::unique_ptr<StepBuilder> make_titan_step(const Job& job, const StageLayout& layout) {
  return std::make_unique<TitanStep>(job, layout);
}

}  // namespace meshsim::step::detail
