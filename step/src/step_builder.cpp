// The step builders' shared part: the parameters' sizes on a rank and the schedule's walk.
#include "step_builder.hpp"

#include <string>

#include "meshsim/error.hpp"

namespace meshsim::step::detail {

StepBuilder::StepBuilder(const Job& job, const StageLayout& layout) : job_(job), layout_(layout) {
    const Parallel& p = job.parallel;
    const Model& m = job.model;
    z_.fsdp = p.dp_shard * p.cp;
    z_.tp = p.tp;
    z_.cp = p.cp;
    z_.tokens = checked_mul(job.local_batch_size, job.seq_len / p.cp, "the tokens of a microbatch");
    z_.hidden_bytes = checked_mul(checked_mul(z_.tokens, m.dim, "tokens x dim"), 2, "an activation's bytes");
    z_.pp_bytes = z_.hidden_bytes / p.tp;
    megatron_ = job.framework == Framework::kMegatron;
    // Megatron's distributed optimizer pads buffers, not parameters: sizes below are unpadded.
    const int64_t f = megatron_ ? 1 : z_.fsdp, t = p.tp;
    const int64_t seq_tokens = checked_mul(job.local_batch_size, job.seq_len, "K's bytes");
    if (mla(m)) {
      z_.k_bytes = checked_mul(checked_mul(seq_tokens, m.heads / t * (m.qk_nope_head_dim + m.qk_rope_head_dim), "K's bytes"), 2, "K's bytes");
      z_.v_bytes = checked_mul(checked_mul(seq_tokens, m.heads / t * m.v_head_dim, "V's bytes"), 2, "V's bytes");
    } else {
      z_.k_bytes = z_.v_bytes = checked_mul(checked_mul(seq_tokens, m.kv_heads / t * (m.dim / m.heads), "K's bytes"), 2, "K's bytes");
    }
    z_.logits_bytes = checked_mul(z_.tokens, 4, "the loss reduction's bytes");
    z_.counts_bytes = checked_mul(m.experts, 8, "the tokens per expert");
    z_.dispatch_bytes = checked_mul(checked_mul(z_.tokens / t, m.top_k, "the routed tokens"), checked_mul(m.dim, 2, "the routed tokens"),
                            "the routed tokens' bytes");
    const std::string w = "a block's parameters";
    // Attention: llama3's fused wqkv (colwise) and wo (rowwise); or MLA's projections, the
    // low-rank ones and their norms replicated over tp, the up-projections colwise, wo rowwise.
    if (mla(m)) {
      const int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
      attention_ = m.q_lora_rank == 0
                       ? padded(m.heads * qk / t, m.dim, f)
                       : checked_add(checked_add(padded(m.q_lora_rank, m.dim, f), padded(m.q_lora_rank, 1, f), w),
                             padded(m.heads * qk / t, m.q_lora_rank, f), w);
      attention_ = checked_add(attention_, padded(m.kv_lora_rank + m.qk_rope_head_dim, m.dim, f), w);
      attention_ = checked_add(attention_, padded(m.kv_lora_rank, 1, f), w);
      attention_ = checked_add(attention_, padded(m.heads * (m.qk_nope_head_dim + m.v_head_dim) / t, m.kv_lora_rank, f), w);
      attention_ = checked_add(attention_, padded(m.dim, m.heads * m.v_head_dim / t, f), w);
    } else {
      const int64_t head_dim = m.dim / m.heads;
      attention_ = checked_add(padded((m.heads + 2 * m.kv_heads) * head_dim / t, m.dim, f),
                       padded(m.dim, m.heads * head_dim / t, f), w);
    }
    attention_ = checked_add(attention_, checked_mul(padded(m.dim, 1, f), 2, w), w);  // attention_norm, ffn_norm
    dense_ffn_ = checked_add(checked_mul(padded(m.ffn_dim / t, m.dim, f), 2, w), padded(m.dim, m.ffn_dim / t, f), w);
    if (m.experts > 0) {
      // The router's gate (replicated over tp), the shared experts (a SwiGLU of
      // moe_ffn_dim x shared_experts, TP like the dense FFN), and the routed experts: with ep > 1
      // E / ep experts a rank, sharded over efsdp (dim 0, or dim 1 when efsdp x ep > E, as
      // torchtitan's _experts_shard_placement_fn); else sharded over tp (w1, w3 on their
      // hidden dim, w2 on its input) and over fsdp (dim 1 when fsdp > E).
      const int64_t fs = m.moe_ffn_dim * m.shared_experts;
      moe_dense_ = padded(m.experts, m.dim, f);
      if (fs > 0) moe_dense_ = checked_add(moe_dense_, checked_add(checked_mul(padded(fs / t, m.dim, f), 2, w), padded(m.dim, fs / t, f), w), w);
      const int64_t e = m.experts, F = m.moe_ffn_dim, D = m.dim;
      if (p.ep > 1) {
        const int64_t el = e / p.ep, fe = megatron_ ? 1 : dim_size(p, Dim::kEfsdp);
        z_.efsdp = dim_size(p, Dim::kEfsdp);
        routed_ = fe * p.ep > e ? checked_mul(el, checked_add(checked_mul(padded(F, D, fe), 2, w), padded(D, F, fe), w), w)
                                : checked_mul(padded(el, checked_mul(F, D, w), fe), 3, w);
      } else {
        routed_ = f > e ? checked_mul(e, checked_add(checked_mul(padded(F / t, D, f), 2, w), padded(D, F / t, f), w), w)
                        : checked_mul(padded(e, checked_mul(F / t, D, w), f), 3, w);
      }
    }
    embed_ = padded(m.vocab / t, m.dim, f);
    output_ = checked_add(padded(m.dim, 1, f), padded(m.vocab / t, m.dim, f), "the output unit");
    if (megatron_) {
      // Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by x tp.
      const int64_t unit = checked_mul(job.megatron_vocab_divisible, t, "the vocabulary's padding");
      const int64_t vocab = checked_mul((m.vocab + unit - 1) / unit, unit, "the padded vocabulary");
      embed_ = checked_mul(vocab / t, m.dim, "the embeddings");
      output_ = checked_mul(vocab / t, m.dim, "the output layer");  // the final norm is counted with the norms
    }
    if (m.weight_tying) embed_ = checked_add(embed_, padded(m.dim, 1, f), "the tied unit");
    ac_ = job.activation_checkpoint;
  }

void StepBuilder::run_schedule(int64_t pp_rank) {
    const Schedule& s = layout_.schedule;
    std::vector<int64_t> forwards(layout_.stages, 0);
    std::vector<bool> explicit_unshard(layout_.stages, false), explicit_reduce(layout_.stages, false);
    for (const auto& a : s.ranks[pp_rank]) {
      if (!a) continue;
      if (a->type == ActionType::kUnshard) explicit_unshard[a->stage] = true;
      if (a->type == ActionType::kReduceGrad) explicit_reduce[a->stage] = true;
    }
    const auto& row = s.ranks[pp_rank];
    for (std::size_t k = 0; k < row.size(); ++k) {
      const auto& a = row[k];
      if (!a) continue;
      const int64_t st = a->stage, mb = a->microbatch ? *a->microbatch + mb_base_ : -1;
      stage_ = static_cast<int32_t>(st);
      microbatch_ = static_cast<int32_t>(mb);
      switch (a->type) {
        case ActionType::kF:
          forward(st, mb, !explicit_unshard[st] && forwards[st]++ == 0);
          break;
        case ActionType::kB:
        case ActionType::kI:
          weight_grads_ = a->type == ActionType::kB;
          backward(st, mb, false, true);
          weight_grads_ = true;
          break;
        case ActionType::kW:
          backward(st, mb, false, false);
          break;
        case ActionType::kUnshard:
          unshard(st);
          break;
        case ActionType::kReduceGrad:
          reduce_grads(st);
          break;
        case ActionType::kReshard:
          break;
        case ActionType::kSendF:
        case ActionType::kRecvF:
        case ActionType::kSendB:
        case ActionType::kRecvB: {
          const bool fwd = a->type == ActionType::kSendF || a->type == ActionType::kRecvF;
          const bool send = a->type == ActionType::kSendF || a->type == ActionType::kSendB;
          // A forward's activation goes to the next stage, a backward's gradient to the previous.
          const int64_t peer_stage = (fwd == send) ? st + 1 : st - 1;
          Event e;
          e.op = send ? Op::kSend : Op::kRecv;
          e.dim = Dim::kPp;
          e.dtype = DType::kBF16;
          e.bytes = z_.pp_bytes;
          e.phase = fwd ? Phase::kFwd : Phase::kBwd;
          e.stage = stage_;
          e.microbatch = microbatch_;
          e.peer = stage_rank(layout_.schedule, peer_stage);
          e.what = fwd ? "activation" : "gradient";
          if (static_cast<std::size_t>(pp_rank) < s.batches.size() && k < s.batches[pp_rank].size()) {
            e.batch = s.batches[pp_rank][k];
          }
          push(e);
          break;
        }
      }
    }
    microbatch_ = -1;
    after_schedule(pp_rank, explicit_reduce);
  }

std::unique_ptr<StepBuilder> make_builder(const Job& job, const StageLayout& layout) {
  return job.framework == Framework::kMegatron ? make_megatron_step(job, layout) : make_titan_step(job, layout);
}

}  // namespace meshsim::step::detail
