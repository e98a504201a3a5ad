#include "meshsim/step_program.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>
#include <deque>
#include <numeric>
#include <set>
#include <unordered_map>

#include "meshsim/error.hpp"
#include "meshsim/preset.hpp"

namespace meshsim::step {

namespace {

constexpr std::array<std::string_view, kDims> kDimNames = {"pp",    "dp_replicate", "fsdp",  "cp", "tp",   "batch",
                                                           "loss",  "ep",           "efsdp", "mp", "world"};

// kMaxEvents bounds the events of the programs held at once (one per pp rank and faulted rank),
// and kMaxSimulatedEvents the events an exact simulation steps through.
constexpr int64_t kMaxEvents = int64_t{1} << 22;
constexpr int64_t kMaxSimulatedEvents = int64_t{1} << 27;
// kMaxSize bounds a model's sizes and the job's (far past any model, far from overflow in the
// products below, which are checked anyway).
constexpr int64_t kMaxSize = int64_t{1} << 32;
// kMaxLayers bounds a model's layers (the largest models have a few hundred) and kMaxWorld the
// world a step is checked over (bytes per link walk every rank's groups).
constexpr int64_t kMaxLayers = int64_t{1} << 16;
constexpr int64_t kMaxWorld = int64_t{1} << 22;

int64_t mul(int64_t a, int64_t b, const std::string& what) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) throw OverflowError(what + " overflows 64-bit arithmetic");
  return r;
}
int64_t add(int64_t a, int64_t b, const std::string& what) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) throw OverflowError(what + " overflows 64-bit arithmetic");
  return r;
}

std::string lower_case(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

// Axis masks over the dense view (pp, dp_replicate, dp_shard, cp, tp), or for ep and efsdp over
// the sparse view (pp, dp_replicate, efsdp, ep, 1): torchtitan's "sparse" mesh unflattens
// dp_shard x cp x tp into efsdp x ep, ep the faster.
constexpr std::array<std::array<bool, 5>, kDims> kAxes = {{
    {true, false, false, false, false},   // pp
    {false, true, false, false, false},   // dp_replicate
    {false, false, true, true, false},    // fsdp
    {false, false, false, true, false},   // cp
    {false, false, false, false, true},   // tp
    {false, true, true, false, false},    // batch
    {false, true, true, true, false},     // loss
    {false, false, false, true, false},   // ep (sparse view)
    {false, false, true, false, false},   // efsdp (sparse view)
    {true, false, false, false, true},    // mp (Megatron's model-parallel group: pp x tp)
    {true, true, true, true, true},       // world
}};

bool sparse(Dim d) { return d == Dim::kEp || d == Dim::kEfsdp; }

std::array<int64_t, 5> radix(const Parallel& p, Dim d = Dim::kPp) {
  if (sparse(d)) return {p.pp, p.dp_replicate, p.dp_shard * p.cp * p.tp / p.ep, p.ep, 1};
  return {p.pp, p.dp_replicate, p.dp_shard, p.cp, p.tp};
}

std::array<int64_t, 5> coords(const Parallel& p, int64_t rank, Dim d = Dim::kPp) {
  const auto r = radix(p, d);
  std::array<int64_t, 5> c{};
  for (int i = 4; i >= 0; --i) {
    c[i] = rank % r[i];
    rank /= r[i];
  }
  return c;
}
int64_t rank_of(const Parallel& p, const std::array<int64_t, 5>& c, Dim d = Dim::kPp) {
  const auto r = radix(p, d);
  int64_t rank = 0;
  for (int i = 0; i < 5; ++i) rank = rank * r[i] + c[i];
  return rank;
}
// leader: the lowest rank of `rank`'s group on d.
int64_t leader(const Parallel& p, Dim d, int64_t rank) {
  auto c = coords(p, rank, d);
  for (int i = 0; i < 5; ++i) {
    if (kAxes[static_cast<int>(d)][i]) c[i] = 0;
  }
  return rank_of(p, c, d);
}
int64_t with_pp(const Parallel& p, int64_t rank, int64_t pp) {
  auto c = coords(p, rank);
  c[0] = pp;
  return rank_of(p, c);
}

bool is_p2p(Op o) { return o == Op::kSend || o == Op::kRecv; }

// ---- models ---------------------------------------------------------------------------------

int64_t ffn_hidden(int64_t dim, int64_t multiple_of, double multiplier) {
  auto hidden = static_cast<int64_t>(2 * 4 * dim / 3);
  if (multiplier > 0) hidden = static_cast<int64_t>(multiplier * static_cast<double>(hidden));
  return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

Model deepseek(const char* name, int64_t layers, int64_t dim, int64_t dense_ffn, int64_t heads, int64_t vocab,
               int64_t q_lora, int64_t experts, int64_t top_k, int64_t moe_ffn, int64_t shared, int64_t dense_layers) {
  Model m;
  m.name = name;
  m.layers = layers;
  m.dim = dim;
  m.ffn_dim = dense_ffn;
  m.heads = heads;
  m.kv_heads = heads;
  m.vocab = vocab;
  m.q_lora_rank = q_lora;
  m.kv_lora_rank = 512;
  m.qk_nope_head_dim = 128;
  m.qk_rope_head_dim = 64;
  m.v_head_dim = 128;
  m.experts = experts;
  m.top_k = top_k;
  m.moe_ffn_dim = moe_ffn;
  m.shared_experts = shared;
  m.dense_layers = dense_layers;
  return m;
}

bool mla(const Model& m) { return m.kv_lora_rank > 0; }
bool moe_layer(const Model& m, int64_t layer) { return m.experts > 0 && layer >= m.dense_layers; }

std::vector<Model> builtins() {
  // torchtitan/models/llama3/__init__.py: dims, heads, kv heads, layers, vocab; the FFN width is
  // compute_ffn_hidden_dim(dim, multiple_of, ffn_dim_multiplier).
  return {
      {"llama3-debugmodel", 6, 256, ffn_hidden(256, 256, 0), 16, 16, 2048, false},
      {"llama3-1b", 16, 2048, ffn_hidden(2048, 1024, 1.5), 32, 8, 128256, true},
      {"llama3-3b", 28, 3072, ffn_hidden(3072, 1024, 1.0), 24, 8, 128256, true},
      {"llama3-8b", 32, 4096, ffn_hidden(4096, 1024, 1.3), 32, 8, 128256, false},
      {"llama3-70b", 80, 8192, ffn_hidden(8192, 4096, 1.3), 64, 8, 128256, false},
      {"llama3-405b", 126, 16384, ffn_hidden(16384, 4096, 1.2), 128, 8, 128256, false},
      // torchtitan/models/deepseek_v3/__init__.py: dim, layers, vocab, heads, the dense FFN
      // (dense_hidden_dim), MLA's ranks and head dims, experts, top-k, the experts' width,
      // shared experts, dense layers.
      deepseek("deepseek_v3-debugmodel", 6, 256, 1024, 16, 2048, 0, 8, 3, 256, 2, 1),
      deepseek("deepseek_v3-16b", 27, 2048, 10944, 16, 102400, 0, 64, 6, 1408, 2, 1),
      deepseek("deepseek_v3-236b", 60, 5120, 12288, 128, 102400, 1536, 160, 6, 1536, 2, 1),
      deepseek("deepseek_v3-671b", 61, 7168, 18432, 128, 129280, 1536, 256, 8, 2048, 1, 3),
  };
}

// ---- the stage layout -----------------------------------------------------------------------

// split_layers is torchtitan's _generate_llm_fqn_per_model_part: the embeddings and the output
// count as input_weight and output_weight layers; stages take the effective layers evenly, the
// first ones one more.
void split_layers(StageLayout& l, int64_t layers, int64_t input_weight, int64_t output_weight) {
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

// ---- programs -------------------------------------------------------------------------------

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

int64_t padded(int64_t dim0, int64_t rest, int64_t fsdp) {
  return mul((dim0 + fsdp - 1) / fsdp * fsdp, rest, "a parameter's padded size");
}

class Builder {
 public:
  Builder(const Job& job, const StageLayout& layout) : job_(job), layout_(layout) {
    const Parallel& p = job.parallel;
    const Model& m = job.model;
    z_.fsdp = p.dp_shard * p.cp;
    z_.tp = p.tp;
    z_.cp = p.cp;
    z_.tokens = mul(job.local_batch_size, job.seq_len / p.cp, "the tokens of a microbatch");
    z_.hidden_bytes = mul(mul(z_.tokens, m.dim, "tokens x dim"), 2, "an activation's bytes");
    z_.pp_bytes = z_.hidden_bytes / p.tp;
    megatron_ = job.framework == "megatron";
    // Megatron's distributed optimizer pads buffers, not parameters: sizes below are unpadded.
    const int64_t f = megatron_ ? 1 : z_.fsdp, t = p.tp;
    const int64_t seq_tokens = mul(job.local_batch_size, job.seq_len, "K's bytes");
    if (mla(m)) {
      z_.k_bytes = mul(mul(seq_tokens, m.heads / t * (m.qk_nope_head_dim + m.qk_rope_head_dim), "K's bytes"), 2, "K's bytes");
      z_.v_bytes = mul(mul(seq_tokens, m.heads / t * m.v_head_dim, "V's bytes"), 2, "V's bytes");
    } else {
      z_.k_bytes = z_.v_bytes = mul(mul(seq_tokens, m.kv_heads / t * (m.dim / m.heads), "K's bytes"), 2, "K's bytes");
    }
    z_.logits_bytes = mul(z_.tokens, 4, "the loss reduction's bytes");
    z_.counts_bytes = mul(m.experts, 8, "the tokens per expert");
    z_.dispatch_bytes = mul(mul(z_.tokens / t, m.top_k, "the routed tokens"), mul(m.dim, 2, "the routed tokens"),
                            "the routed tokens' bytes");
    const std::string w = "a block's parameters";
    // Attention: llama3's fused wqkv (colwise) and wo (rowwise); or MLA's projections, the
    // low-rank ones and their norms replicated over tp, the up-projections colwise, wo rowwise.
    if (mla(m)) {
      const int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
      attention_ = m.q_lora_rank == 0
                       ? padded(m.heads * qk / t, m.dim, f)
                       : add(add(padded(m.q_lora_rank, m.dim, f), padded(m.q_lora_rank, 1, f), w),
                             padded(m.heads * qk / t, m.q_lora_rank, f), w);
      attention_ = add(attention_, padded(m.kv_lora_rank + m.qk_rope_head_dim, m.dim, f), w);
      attention_ = add(attention_, padded(m.kv_lora_rank, 1, f), w);
      attention_ = add(attention_, padded(m.heads * (m.qk_nope_head_dim + m.v_head_dim) / t, m.kv_lora_rank, f), w);
      attention_ = add(attention_, padded(m.dim, m.heads * m.v_head_dim / t, f), w);
    } else {
      const int64_t head_dim = m.dim / m.heads;
      attention_ = add(padded((m.heads + 2 * m.kv_heads) * head_dim / t, m.dim, f),
                       padded(m.dim, m.heads * head_dim / t, f), w);
    }
    attention_ = add(attention_, mul(padded(m.dim, 1, f), 2, w), w);  // attention_norm, ffn_norm
    dense_ffn_ = add(mul(padded(m.ffn_dim / t, m.dim, f), 2, w), padded(m.dim, m.ffn_dim / t, f), w);
    if (m.experts > 0) {
      // The router's gate (replicated over tp), the shared experts (a SwiGLU of
      // moe_ffn_dim x shared_experts, TP like the dense FFN), and the routed experts: with ep > 1
      // E / ep experts a rank, sharded over efsdp (dim 0, or dim 1 when efsdp x ep > E, as
      // torchtitan's _experts_shard_placement_fn); else sharded over tp (w1, w3 on their
      // hidden dim, w2 on its input) and over fsdp (dim 1 when fsdp > E).
      const int64_t fs = m.moe_ffn_dim * m.shared_experts;
      moe_dense_ = padded(m.experts, m.dim, f);
      if (fs > 0) moe_dense_ = add(moe_dense_, add(mul(padded(fs / t, m.dim, f), 2, w), padded(m.dim, fs / t, f), w), w);
      const int64_t e = m.experts, F = m.moe_ffn_dim, D = m.dim;
      if (p.ep > 1) {
        const int64_t el = e / p.ep, fe = megatron_ ? 1 : dim_size(p, Dim::kEfsdp);
        z_.efsdp = dim_size(p, Dim::kEfsdp);
        routed_ = fe * p.ep > e ? mul(el, add(mul(padded(F, D, fe), 2, w), padded(D, F, fe), w), w)
                                : mul(padded(el, mul(F, D, w), fe), 3, w);
      } else {
        routed_ = f > e ? mul(e, add(mul(padded(F / t, D, f), 2, w), padded(D, F / t, f), w), w)
                        : mul(padded(e, mul(F / t, D, w), f), 3, w);
      }
    }
    embed_ = padded(m.vocab / t, m.dim, f);
    output_ = add(padded(m.dim, 1, f), padded(m.vocab / t, m.dim, f), "the output unit");
    if (megatron_) {
      // Megatron pads the vocabulary to a multiple of 128 x tp (make_vocab_size_divisible_by).
      const int64_t unit = mul(128, t, "the vocabulary's padding");
      const int64_t vocab = mul((m.vocab + unit - 1) / unit, unit, "the padded vocabulary");
      embed_ = mul(vocab / t, m.dim, "the embeddings");
      output_ = mul(vocab / t, m.dim, "the output layer");  // the final norm is counted with the norms
    }
    if (m.weight_tying) embed_ = add(embed_, padded(m.dim, 1, f), "the tied unit");
    const std::string policy = lower_case(job.reshard_after_forward);
    reshard_blocks_ = policy == "always" || (policy == "default" && p.pp == 1);
    reshard_output_ = policy == "always";
    const std::string ac = lower_case(job.activation_checkpoint);
    ac_ = ac == "none" ? Ac::kNone : ac == "full" ? Ac::kFull : Ac::kSelective;
    lm_head_ = padded(m.vocab / t, m.dim, f);
    norm_ = padded(m.dim, 1, f);
    chunks_ = megatron_ ? 0 : job.loss_chunks;
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

  std::vector<Event> build(int64_t pp_rank) {
    out_.clear();
    out_sharded_ = true;
    norm_pending_ = false;
    if (megatron_) return build_megatron(pp_rank);
    const Parallel& p = job_.parallel;
    if (p.dp_replicate * p.dp_shard > 1) emit(Op::kAllReduce, Dim::kBatch, DType::kI64, 8, Phase::kTokens, "tokens");
    // Gradient accumulation (torchtitan's train_step): each step's forward-backward whole, FSDP
    // gathering and reducing in each; its microbatches numbered on from the step before.
    for (int64_t a = 0; a < job_.grad_accum_steps; ++a) {
      if (p.pp == 1) {
        forward(0, a, true);
        backward(0, a, true);
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
    const int64_t norms = p.ep > 1 ? 4 : mul(param_tensors(pp_rank), 4, "the gradient norms' bytes");
    emit_if(Op::kAllReduce, Dim::kFsdp, DType::kF32, norms, Phase::kOptimizer, "grad_norm");
    emit_if(Op::kAllReduce, Dim::kTp, DType::kF32, norms, Phase::kOptimizer, "grad_norm");
    emit_if(Op::kAllReduce, Dim::kPp, DType::kF32, 4, Phase::kOptimizer, "grad_norm");
    if (job_.log_metrics) {
      emit_if(Op::kAllReduce, Dim::kLoss, DType::kF32, 4, Phase::kMetrics, "loss_sum");
      emit_if(Op::kAllReduce, Dim::kLoss, DType::kF32, 4, Phase::kMetrics, "loss_max");
      emit_if(Op::kAllReduce, Dim::kLoss, DType::kI64, 8, Phase::kMetrics, "tokens_seen");
    }
    return std::move(out_);
  }

 private:
  int64_t mb_base_ = 0;  // the first microbatch's number in this accumulation step
  int64_t size(Dim d) const { return dim_size(job_.parallel, d); }

  void emit(Op op, Dim d, DType t, int64_t bytes, Phase ph, const char* what, int32_t layer = -1) {
    if (recomputing_ && ac_ == Ac::kSelective && op != Op::kAllGather) return;
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

  bool holds_stage(int64_t pp_rank, int64_t stage) const {
    if (job_.parallel.pp == 1) return true;
    for (const auto& a : layout_.schedule.ranks[pp_rank]) {
      if (a && a->stage == stage) return true;
    }
    return false;
  }

  // param_tensors: the parameter tensors of the stages `pp_rank` holds (torchtitan's modules:
  // llama3's fused wqkv and wo, MLA's wq or wq_a/q_norm/wq_b, wkv_a, kv_norm, wkv_b, wo; two
  // norms a block; w1/w2/w3, or the MoE's grouped experts, router gate and shared experts).
  int64_t param_tensors(int64_t pp_rank) const {
    const Model& m = job_.model;
    int64_t n = 0;
    for (int64_t st = 0; st < layout_.stages; ++st) {
      if (!holds_stage(pp_rank, st)) continue;
      if (st == 0) n += 1;
      if (st == layout_.stages - 1) n += m.weight_tying ? 1 : 2;
      for (int64_t l = 0; l < layout_.layer_count[st]; ++l) {
        const int64_t layer = layout_.first_layer[st] + l;
        n += 2 + (mla(m) ? (m.q_lora_rank == 0 ? 1 : 3) + 4 : 2);
        n += moe_layer(m, layer) ? 4 + (m.shared_experts > 0 ? 3 : 0) : 3;
      }
    }
    return n;
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
        u.push_back({"block", static_cast<int32_t>(layer), add(attention_, dense_ffn_, "a block")});
      } else if (job_.parallel.ep > 1) {
        u.push_back({"block", static_cast<int32_t>(layer), add(attention_, moe_dense_, "a block"), routed_});
      } else {
        u.push_back({"block", static_cast<int32_t>(layer), add(add(attention_, moe_dense_, "a block"), routed_, "a block")});
      }
    }
    if (stage == layout_.stages - 1 && !job_.model.weight_tying) u.push_back({"output", -1, output_});
    return u;
  }

  // gather: FSDP's all-gather of a unit, the routed experts' on their own mesh after the rest.
  void gather(const Unit& u, Phase ph) {
    emit_if(Op::kAllGather, Dim::kFsdp, DType::kBF16, mul(u.elements, 2, "an all-gather's bytes"), ph, "params", u.layer);
    if (u.sparse_elements) {
      emit_if(Op::kAllGather, Dim::kEfsdp, DType::kBF16, mul(u.sparse_elements, 2, "an all-gather's bytes"), ph, "experts",
              u.layer);
    }
  }
  // reduce: FSDP's post-backward reduction of a unit: under sequence parallel the norms'
  // gradients (replicated weights, partial gradients) all-reduced over tp first, one each
  // (_fsdp_param_group.py post_backward: unsharded_grad_data), then the reduce-scatter.
  // With the loss chunked, the output unit's lm_head reduced at the last chunk: its norm here.
  void reduce(const Unit& u) {
    if (chunks_ > 0 && is_output(u)) {
      norm_pending_ = false;
      return reduce(u, norm_, Phase::kBwd, "grads");
    }
    reduce(u, u.elements, Phase::kBwd, "grads");
  }
  void reduce(const Unit& u, int64_t elements, Phase ph, const char* what) {
    const bool block = u.layer >= 0, output = std::strcmp(u.what, "output") == 0;
    const int64_t norms = block ? 2 : (output && elements != lm_head_) || std::strcmp(u.what, "tied_embeddings") == 0 ? 1 : 0;
    for (int64_t k = 0; k < norms; ++k) {
      emit_if(Op::kAllReduce, Dim::kTp, accumulated_ ? DType::kF32 : DType::kBF16,
              mul(job_.model.dim, accumulated_ ? 4 : 2, "a norm's gradient"), ph, "norm_grads", u.layer);
    }
    emit_if(Op::kReduceScatter, Dim::kFsdp, DType::kF32, mul(elements, 4, "a reduce-scatter's bytes"), ph, what,
            u.layer);
    if (u.sparse_elements) {
      emit_if(Op::kReduceScatter, Dim::kEfsdp, DType::kF32, mul(u.sparse_elements, 4, "a reduce-scatter's bytes"),
              Phase::kBwd, "expert_grads", u.layer);
    }
    // HSDP: the shard's gradient all-reduced over the replicas.
    emit_if(Op::kAllReduce, Dim::kDpReplicate, DType::kF32, mul(elements / z_.fsdp, 4, "an all-reduce's bytes"), ph,
            what, u.layer);
    if (u.sparse_elements) {
      emit_if(Op::kAllReduce, Dim::kDpReplicate, DType::kF32, mul(u.sparse_elements / z_.efsdp, 4, "an all-reduce's bytes"),
              Phase::kBwd, "expert_grads", u.layer);
    }
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
      emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, "mlp", layer);
      emit_if(Op::kReduceScatter, Dim::kTp, DType::kBF16, h, ph, "mlp", layer);
    } else if (job_.parallel.ep > 1) {
      emit_if(Op::kAllToAll, Dim::kEp, DType::kI64, z_.counts_bytes, ph, "moe_counts", layer);
      emit_if(Op::kAllToAll, Dim::kEp, DType::kBF16, z_.dispatch_bytes, ph, "moe_dispatch", layer);
      emit_if(Op::kAllToAll, Dim::kEp, DType::kBF16, z_.dispatch_bytes, ph, "moe_combine", layer);
      if (shared) {
        emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, "shared_experts", layer);
        emit_if(Op::kReduceScatter, Dim::kTp, DType::kBF16, h, ph, "shared_experts", layer);
      }
    } else {
      emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, "moe", layer);
      emit_if(Op::kReduceScatter, Dim::kTp, DType::kBF16, h, ph, "routed_experts", layer);
      if (shared) emit_if(Op::kReduceScatter, Dim::kTp, DType::kBF16, h, ph, "shared_experts", layer);
    }
  }
  void ffn_backward(int32_t layer, Phase ph) {
    const int64_t h = z_.hidden_bytes;
    const bool shared = job_.model.shared_experts > 0;
    if (!moe_layer(job_.model, layer)) {
      emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, "mlp", layer);
      emit_if(Op::kReduceScatter, Dim::kTp, DType::kBF16, h, ph, "mlp", layer);
    } else if (job_.parallel.ep > 1) {
      if (shared) {
        emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, "shared_experts", layer);
        emit_if(Op::kReduceScatter, Dim::kTp, DType::kBF16, h, ph, "shared_experts", layer);
      }
      emit_if(Op::kAllToAll, Dim::kEp, DType::kBF16, z_.dispatch_bytes, ph, "moe_combine", layer);
      emit_if(Op::kAllToAll, Dim::kEp, DType::kBF16, z_.dispatch_bytes, ph, "moe_dispatch", layer);
    } else {
      if (shared) emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, "shared_experts", layer);
      emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, "routed_experts", layer);
      emit_if(Op::kReduceScatter, Dim::kTp, DType::kBF16, h, ph, "moe", layer);
    }
  }
  bool resharded(const Unit& u) const {
    if (job_.parallel.pp > 1) return false;  // pipelining keeps them unsharded until the step ends
    if (std::strcmp(u.what, "output") == 0 || std::strcmp(u.what, "tied_embeddings") == 0) return reshard_output_;
    return reshard_blocks_;
  }

  // block_forward: a block's forward collectives (attention, CP's K and V, the FFN or MoE).
  void block_forward(int32_t layer, Phase ph) {
    const int64_t h = z_.hidden_bytes;
    emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, "attention", layer);
    emit_if(Op::kAllGather, Dim::kCp, DType::kBF16, z_.k_bytes, ph, "k", layer);
    emit_if(Op::kAllGather, Dim::kCp, DType::kBF16, z_.v_bytes, ph, "v", layer);
    emit_if(Op::kReduceScatter, Dim::kTp, DType::kBF16, h, ph, "attention", layer);
    ffn_forward(layer, ph);
  }

  // recompute: activation checkpointing runs a block's forward again at the start of its
  // backward. torchtitan's default, selective per-op AC, saves the outputs of reduce-scatters
  // and all-to-alls (its comm_ops save list) but not of all-gathers, so those are issued again;
  // full AC issues every forward collective again.
  void recompute(int32_t layer) {
    if (ac_ == Ac::kNone) return;
    recomputing_ = true;
    block_forward(layer, Phase::kBwd);
    recomputing_ = false;
  }

  // forward: one microbatch through `stage`; `gather_params` when its FSDP units are sharded now.
  void forward(int64_t stage, int64_t mb, bool gather_params) {
    stage_ = static_cast<int32_t>(stage);
    microbatch_ = static_cast<int32_t>(mb);
    if (megatron_) return megatron_forward(stage);
    const Phase ph = Phase::kFwd;
    const int64_t h = z_.hidden_bytes;
    for (const Unit& u : units(stage)) {
      if (chunks_ > 0 && is_output(u) ? out_sharded_ : gather_params) gather(u, ph);
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
        reduce(Unit{"output", -1, output_}, norm_pending_ ? add(lm_head_, norm_, "the output unit") : lm_head_, ph,
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
  void backward(int64_t stage, int64_t mb, bool reduce_grads, bool input_grads = true) {
    stage_ = static_cast<int32_t>(stage);
    microbatch_ = static_cast<int32_t>(mb);
    if (megatron_) return megatron_backward(stage);
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
          recompute(u.layer);
          ffn_backward(u.layer, ph);
          emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, "attention", u.layer);
          emit_if(Op::kReduceScatter, Dim::kCp, DType::kBF16, z_.k_bytes, ph, "k", u.layer);
          emit_if(Op::kReduceScatter, Dim::kCp, DType::kBF16, z_.v_bytes, ph, "v", u.layer);
          emit_if(Op::kReduceScatter, Dim::kTp, DType::kBF16, h, ph, "attention", u.layer);
        } else if (!is_output(u)) {
          emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, "embeddings");
        }
      }
      if (chunks_ > 0 && is_output(u) && input_grads) {
        out_sharded_ = reduce_grads;
        norm_pending_ = !reduce_grads;
      }
      if (reduce_grads) reduce(u);
    }
  }

  void run_schedule(int64_t pp_rank) {
    const Schedule& s = layout_.schedule;
    std::vector<int64_t> forwards(layout_.stages, 0);
    std::vector<bool> explicit_unshard(layout_.stages, false), explicit_reduce(layout_.stages, false);
    for (const auto& a : s.ranks[pp_rank]) {
      if (!a) continue;
      if (a->type == ActionType::kUnshard) explicit_unshard[a->stage] = true;
      if (a->type == ActionType::kReduceGrad) explicit_reduce[a->stage] = true;
    }
    for (const auto& a : s.ranks[pp_rank]) {
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
          backward(st, mb, false);
          break;
        case ActionType::kW:
          backward(st, mb, false, false);
          break;
        case ActionType::kUnshard:
          for (const Unit& u : units(st)) {
            if (chunks_ > 0 && is_output(u)) {
              if (out_sharded_) gather(u, Phase::kFwd);
              out_sharded_ = false;
            } else {
              gather(u, Phase::kFwd);
            }
          }
          break;
        case ActionType::kReduceGrad:
          for (const Unit& u : units(st)) reduce(u);
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
          push(e);
          break;
        }
      }
    }
    // Without REDUCE_GRAD actions the schedule reduces each stage's gradients after all its
    // actions, the stage's units in forward order (schedules.py _step_microbatches:
    // perform_reduce_grad).
    microbatch_ = -1;
    for (int64_t st = 0; st < layout_.stages && !megatron_; ++st) {
      if (!holds_stage(pp_rank, st) || explicit_reduce[st]) continue;
      stage_ = static_cast<int32_t>(st);
      for (const Unit& u : units(st)) reduce(u);
    }
  }

  // ---- Megatron-core's step (megatron/core at NVIDIA/Megatron-LM d98e8a64ddf3) -----------------

  // megatron_layer_forward: one transformer layer's forward collectives with sequence parallel:
  // the column-parallel linears gather the sequence over tp (linear_qkv, linear_fc1), the
  // row-parallel ones reduce-scatter it (linear_proj, linear_fc2); CP gathers K and V (its
  // all_gather communication type); an MoE layer (the alltoall dispatcher, expert tp 1) gathers
  // the tokens per expert over ep, sends the tokens and their probabilities to their experts and
  // back (all-to-alls over ep), then runs its shared experts like an MLP.
  void megatron_layer_forward(int32_t layer, Phase ph) {
    const int64_t h = z_.hidden_bytes;
    emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, "attention", layer);
    emit_if(Op::kAllGather, Dim::kCp, DType::kBF16, z_.k_bytes, ph, "k", layer);
    emit_if(Op::kAllGather, Dim::kCp, DType::kBF16, z_.v_bytes, ph, "v", layer);
    emit_if(Op::kReduceScatter, Dim::kTp, DType::kBF16, h, ph, "attention", layer);
    if (!moe_layer(job_.model, layer)) {
      emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, "mlp", layer);
      emit_if(Op::kReduceScatter, Dim::kTp, DType::kBF16, h, ph, "mlp", layer);
      return;
    }
    emit_if(Op::kAllGather, Dim::kEp, DType::kI64, mul(z_.counts_bytes, size(Dim::kEp), "the tokens per expert"), ph,
            "moe_counts", layer);
    emit_if(Op::kAllToAll, Dim::kEp, DType::kBF16, z_.dispatch_bytes, ph, "moe_dispatch", layer);
    emit_if(Op::kAllToAll, Dim::kEp, DType::kF32, z_.dispatch_bytes / job_.model.dim * 2, ph, "moe_probs", layer);
    emit_if(Op::kAllToAll, Dim::kEp, DType::kBF16, z_.dispatch_bytes, ph, "moe_combine", layer);
    if (job_.model.shared_experts > 0) {
      emit_if(Op::kAllGather, Dim::kTp, DType::kBF16, h, ph, "shared_experts", layer);
      emit_if(Op::kReduceScatter, Dim::kTp, DType::kBF16, h, ph, "shared_experts", layer);
    }
  }

  // megatron_layer_backward: the same in reverse: a row-parallel linear's backward gathers its
  // output's gradient; a column-parallel one gathers its input again (for the weight gradient)
  // and reduce-scatters its input's gradient; CP reduce-scatters dK and dV; the all-to-alls run
  // back (combine, probabilities, tokens). Full recomputation runs the forward again first.
  void megatron_layer_backward(int32_t layer, Phase ph) {
    const int64_t h = z_.hidden_bytes;
    if (ac_ == Ac::kFull) {
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
      emit_if(Op::kAllToAll, Dim::kEp, DType::kF32, z_.dispatch_bytes / job_.model.dim * 2, ph, "moe_probs", layer);
      emit_if(Op::kAllToAll, Dim::kEp, DType::kBF16, z_.dispatch_bytes, ph, "moe_dispatch", layer);
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
    if (stage == 0) dense.push_back(embed_);
    for (int64_t l = 0; l < layout_.layer_count[stage]; ++l) {
      const int64_t layer = layout_.first_layer[stage] + l;
      dense.push_back(m.dim);  // input_layernorm
      dense.push_back(attention_ - 2 * m.dim);  // the attention's projections
      dense.push_back(m.dim);  // pre_mlp_layernorm
      norms += 2 * m.dim;
      if (!moe_layer(m, layer)) {
        dense.push_back(mul(2 * m.ffn_dim / t, m.dim, "linear_fc1"));
        dense.push_back(mul(m.dim, m.ffn_dim / t, "linear_fc2"));
        continue;
      }
      dense.push_back(mul(m.experts, m.dim, "the router"));
      if (m.shared_experts > 0) {
        const int64_t fs = m.moe_ffn_dim * m.shared_experts;
        dense.push_back(mul(2 * fs / t, m.dim, "the shared experts' fc1"));
        dense.push_back(mul(m.dim, fs / t, "the shared experts' fc2"));
      }
      for (int64_t e = 0; e < m.experts / p.ep; ++e) {
        experts.push_back(mul(2 * m.moe_ffn_dim, m.dim, "an expert's fc1"));
        experts.push_back(mul(m.dim, m.moe_ffn_dim, "an expert's fc2"));
      }
    }
    if (stage == layout_.stages - 1) {
      dense.push_back(m.dim);  // final_layernorm
      norms += m.dim;
      if (!m.weight_tying || layout_.stages > 1) dense.push_back(output_);
    }
    auto pad = [](int64_t v, int64_t to) { return (v + to - 1) / to * to; };
    auto lay_out = [&](const std::vector<int64_t>& params, int64_t dp) {
      if (params.empty()) return int64_t{0};
      int64_t end = 0;
      for (auto it = params.rbegin(); it != params.rend(); ++it) end = add(pad(end, 64), *it, "a DDP buffer");
      return pad(end, std::lcm(dp, int64_t{128}));
    };
    return Buffers{lay_out(dense, size(Dim::kFsdp)), lay_out(experts, size(Dim::kEfsdp)), norms};
  }

  std::vector<Event> build_megatron(int64_t pp_rank) {
    const Parallel& p = job_.parallel;
    if (p.pp == 1) {
      for (int64_t mb = 0; mb < job_.microbatches; ++mb) {
        forward(0, mb, false);
        backward(0, mb, false);
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
      emit_if(Op::kReduceScatter, Dim::kFsdp, grad_type, mul(buffers.back().dense, grad_width, "a bucket's bytes"),
              Phase::kBwd, "grads");
      if (buffers.back().experts > 0) {
        emit_if(Op::kReduceScatter, Dim::kEfsdp, grad_type, mul(buffers.back().experts, grad_width, "a bucket's bytes"),
                Phase::kBwd, "expert_grads");
      }
      norms = add(norms, buffers.back().norms, "the norms");
    }
    stage_ = -1;
    emit_if(Op::kAllReduce, Dim::kTp, grad_type, mul(norms, grad_width, "the norms' bytes"), Phase::kBwd, "norm_grads");
    // The rerun state machine (validate_results): whether any rank asks for a rerun, one int32
    // summed over the world, before the optimizer.
    if (job_.megatron_rerun_validate) emit_if(Op::kAllReduce, Dim::kWorld, DType::kI32, 4, Phase::kOptimizer, "rerun_requested");
    // optimizer.step(): the gradient norm over every rank of the distributed optimizer, then
    // each chunk's parameters gathered (overlap_param_gather off); train_step's reductions over
    // the model-parallel group (update_successful as a MIN of ints, the grad norm's MAX).
    emit_if(Op::kAllReduce, Dim::kWorld, DType::kF32, 4, Phase::kOptimizer, "grad_norm");
    for (std::size_t k = 0; k < chunks.size(); ++k) {
      stage_ = static_cast<int32_t>(chunks[k]);
      emit_if(Op::kAllGather, Dim::kFsdp, DType::kBF16, mul(buffers[k].dense, 2, "a bucket's bytes"), Phase::kOptimizer,
              "params");
      if (buffers[k].experts > 0) {
        emit_if(Op::kAllGather, Dim::kEfsdp, DType::kBF16, mul(buffers[k].experts, 2, "a bucket's bytes"),
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

  bool megatron_ = false;
  const Job& job_;
  const StageLayout& layout_;
  Sizes z_{};
  int64_t attention_ = 0, dense_ffn_ = 0, moe_dense_ = 0, routed_ = 0, embed_ = 0, output_ = 0;
  bool reshard_blocks_ = true, reshard_output_ = false;
  enum class Ac { kNone, kSelective, kFull } ac_ = Ac::kSelective;
  bool recomputing_ = false;
  bool accumulated_ = false;  // the stage's gradients accumulate over microbatches before FSDP reduces them
  int64_t chunks_ = 0, lm_head_ = 0, norm_ = 0;
  bool out_sharded_ = true;    // the wrapper's output unit is sharded now
  bool norm_pending_ = false;  // the final norm holds a gradient not reduced yet
  int32_t stage_ = -1, microbatch_ = -1;
  std::vector<Event> out_;
};

// member_at: the k-th member (0-based, rank order) of `rank`'s group on d.
int64_t member_at(const Parallel& p, Dim d, int64_t rank, int64_t k) {
  const auto r = radix(p, d);
  auto c = coords(p, rank, d);
  for (int i = 4; i >= 0; --i) {
    if (!kAxes[static_cast<int>(d)][i]) continue;
    c[i] = k % r[i];
    k /= r[i];
  }
  return rank_of(p, c, d);
}

// group_text: "tp group [16, 17]", the first 8 members of a larger group then its size.
std::string group_text(const Job& job, Dim d, int64_t rank) {
  const Parallel& p = job.parallel;
  const int64_t n = dim_size(p, d);
  std::string s = std::string(dim_label(job, d)) + " group [";
  for (int64_t k = 0; k < std::min<int64_t>(n, 8); ++k) s += (k ? ", " : "") + std::to_string(member_at(p, d, rank, k));
  if (n > 8) s += ", ... (" + std::to_string(n) + " ranks)";
  return s + "]";
}

bool same_collective(const Event& a, const Event& b) {
  return a.op == b.op && a.dtype == b.dtype && a.bytes == b.bytes;
}

// ---- the check ------------------------------------------------------------------------------

class Checker {
 public:
  Checker(const Job& job, const StageLayout& layout, const Options& o) : job_(job), p_(job.parallel), o_(o) {
    world_ = world_size(p_);
    Builder b(job, layout);
    int64_t total = 0;
    for (int64_t pp = 0; pp < p_.pp; ++pp) {
      base_.push_back(b.build(pp));
      total += static_cast<int64_t>(base_.back().size());
      if (total > kMaxEvents) {
        throw ResourceExhausted("the step's programs hold over " + std::to_string(kMaxEvents) +
                                " events (pp ranks x layers x microbatches): check fewer microbatches or layers");
      }
    }
    // A faulted rank's program is a copy of its pp rank's: the copies count against the same bound.
    for (const Fault& f : o.faults) {
      auto it = faulted_.find(f.rank);
      if (it == faulted_.end()) {
        const std::vector<Event>& base = base_[pp_coordinate(p_, f.rank)];
        total += static_cast<int64_t>(base.size());
        if (total > kMaxEvents) {
          throw ResourceExhausted("the step's programs with " + std::to_string(faulted_.size() + 1) +
                                  " faulted ranks (each a copy of its program) hold over " + std::to_string(kMaxEvents) +
                                  " events: plant fewer faults, or check fewer microbatches or layers");
        }
        it = faulted_.emplace(f.rank, base).first;
      }
      apply_fault(job, f, it->second);
    }
  }

  const std::vector<Event>& program_of(int64_t rank) const {
    if (auto it = faulted_.find(rank); it != faulted_.end()) return it->second;
    return base_[pp_coordinate(p_, rank)];
  }
  // class_of: -1 - faulted index for a faulted rank, else its pp coordinate.
  int64_t class_of(int64_t rank) const {
    if (auto it = faulted_.find(rank); it != faulted_.end()) return -2 - std::distance(faulted_.begin(), it);
    return pp_coordinate(p_, rank);
  }

  // agree checks one group: every member issues the same collectives on it, in order.
  bool agree(Dim d, int64_t rank, Report& r) {
    const int64_t lead = leader(p_, d, rank);
    if (!checked_.insert({static_cast<int>(d), lead}).second) return true;
    ++r.groups_checked;
    // The members' classes without listing the members (a group may hold millions): a non-pp
    // group shares one pp coordinate, so its classes are that coordinate's and its faulted
    // members'; a pp group has one member per pp coordinate.
    std::map<int64_t, int64_t> classes;  // class -> its lowest member
    std::set<int64_t> faulted_here;
    for (const auto& [f, _] : faulted_) {
      if (leader(p_, d, f) == lead) faulted_here.insert(f);
    }
    if (d == Dim::kPp) {
      for (int64_t pp = 0; pp < p_.pp; ++pp) {
        const int64_t m = with_pp(p_, lead, pp);
        classes.emplace(class_of(m), m);
      }
    } else {
      for (int64_t f : faulted_here) classes.emplace(class_of(f), f);
      // The lowest member that is not faulted, if any: walk the group in order past the faulted.
      if (static_cast<int64_t>(faulted_here.size()) < dim_size(p_, d)) {
        int64_t m = lead;
        for (std::size_t k = 0; faulted_here.count(m); ++k) m = nth_member(d, lead, static_cast<int64_t>(k) + 1);
        classes.emplace(class_of(m), m);
      }
    }
    if (classes.size() < 2) return true;
    // The reference: the lowest member that is not faulted (else the lowest member).
    int64_t ref = -1;
    for (const auto& [cls, m] : classes) {
      if (!faulted_.count(m) && (ref < 0 || m < ref)) ref = m;
    }
    if (ref < 0) {
      for (const auto& [cls, m] : classes) ref = ref < 0 ? m : std::min(ref, m);
    }
    const auto ref_events = projection(program_of(ref), d);
    for (const auto& [cls, m] : classes) {
      if (cls == class_of(ref)) continue;
      const auto other = projection(program_of(m), d);
      const std::size_t n = std::min(ref_events.size(), other.size());
      for (std::size_t i = 0; i <= n; ++i) {
        if (i < n && same_collective(*ref_events[i], *other[i])) continue;
        if (i == n && ref_events.size() == other.size()) break;
        r.ok = false;
        r.ranks = {std::min(ref, m), std::max(ref, m)};
        const std::string where = group_text(job_, d, lead);
        const std::string nth = "collective #" + std::to_string(i + 1);
        if (i < n) {
          r.diagnosis = "FAILED: rank " + std::to_string(m) + " and rank " + std::to_string(ref) + " disagree on their " +
                        where + " at its " + nth + ": rank " + std::to_string(m) + " issues " + describe(*other[i]) +
                        ", rank " + std::to_string(ref) + " issues " + describe(*ref_events[i]);
        } else {
          const bool ref_longer = ref_events.size() > other.size();
          const int64_t more = ref_longer ? ref : m, fewer = ref_longer ? m : ref;
          const Event& next = ref_longer ? *ref_events[i] : *other[i];
          r.diagnosis = "FAILED: rank " + std::to_string(fewer) + " issues " + std::to_string(n) +
                        " collectives on its " + where + ", rank " + std::to_string(more) + " issues " +
                        std::to_string(std::max(ref_events.size(), other.size())) + ": rank " + std::to_string(more) +
                        "'s " + nth + ", " + describe(next) + ", is never met";
        }
        return false;
      }
    }
    return true;
  }

  int64_t nth_member(Dim d, int64_t lead, int64_t k) const { return member_at(p_, d, lead, k); }

  static std::vector<const Event*> projection(const std::vector<Event>& prog, Dim d) {
    std::vector<const Event*> out;
    for (const Event& e : prog) {
      if (e.dim == d && !is_p2p(e.op)) out.push_back(&e);
    }
    return out;
  }

  void check_agreement(Report& r) {
    std::vector<int64_t> seeds;
    if (o_.all_ranks) {
      for (int d = 0; d < kDims; ++d) {
        if (dim_size(p_, static_cast<Dim>(d)) < 2) continue;
        for (int64_t rank = 0; rank < world_; ++rank) {
          if (leader(p_, static_cast<Dim>(d), rank) == rank && !agree(static_cast<Dim>(d), rank, r)) return;
        }
      }
      return;
    }
    for (int64_t pp = 0; pp < p_.pp; ++pp) seeds.push_back(with_pp(p_, 0, pp));
    for (const auto& [rank, _] : faulted_) seeds.push_back(rank);
    for (int64_t rank : o_.ranks) seeds.push_back(rank);
    seeds.push_back(o_.rank);
    for (int d = 0; d < kDims; ++d) {
      if (dim_size(p_, static_cast<Dim>(d)) < 2) continue;
      for (int64_t s : seeds) {
        if (!agree(static_cast<Dim>(d), s, r)) return;
      }
    }
  }

  // ---- progress ----

  struct Arrival {
    int64_t expected = 0;
    std::vector<std::size_t> waiting;  // simulated indexes
  };

  void simulate(Report& r) {
    std::vector<int64_t> set;
    if (o_.all_ranks) {
      if (mul(world_, static_cast<int64_t>(longest()), "the simulation's events") > kMaxSimulatedEvents) {
        throw ResourceExhausted("simulating every rank steps through over " + std::to_string(kMaxSimulatedEvents) +
                                " events: leave out --ranks all (one program per pp rank is exact for a step "
                                "without faults) or name fewer ranks");
      }
      set.resize(world_);
      for (int64_t i = 0; i < world_; ++i) set[i] = i;
    } else {
      std::set<int64_t> s;
      auto add_pipeline = [&](int64_t rank) {
        for (int64_t pp = 0; pp < p_.pp; ++pp) s.insert(with_pp(p_, rank, pp));
      };
      add_pipeline(o_.rank);
      for (const auto& [rank, _] : faulted_) add_pipeline(rank);
      for (int64_t rank : o_.ranks) add_pipeline(rank);
      set.assign(s.begin(), s.end());
      if (mul(static_cast<int64_t>(set.size()), static_cast<int64_t>(longest()), "the simulation's events") >
          kMaxSimulatedEvents) {
        throw ResourceExhausted("simulating the pipelines of " + std::to_string(set.size()) + " ranks steps through over " +
                                std::to_string(kMaxSimulatedEvents) + " events: name fewer --ranks");
      }
    }
    r.ranks_simulated = static_cast<int64_t>(set.size());
    const std::size_t n = set.size();
    std::unordered_map<int64_t, std::size_t> index;
    index.reserve(n * 2);
    for (std::size_t i = 0; i < n; ++i) index.emplace(set[i], i);
    std::vector<const std::vector<Event>*> prog(n);
    for (std::size_t i = 0; i < n; ++i) prog[i] = &program_of(set[i]);
    std::vector<std::size_t> pc(n, 0);
    std::vector<bool> arrived(n, false);   // registered at its current collective
    std::map<std::pair<int, int64_t>, Arrival> arrivals;
    // Eager sends in flight per (from, to): the events, in order.
    std::map<std::pair<std::size_t, std::size_t>, std::deque<const Event*>> in_flight;
    std::deque<std::size_t> ready;
    for (std::size_t i = 0; i < n; ++i) ready.push_back(i);
    auto head = [&](std::size_t i) -> const Event* { return pc[i] < prog[i]->size() ? &(*prog[i])[pc[i]] : nullptr; };
    // The members of a group in the simulated set: all of it when every rank runs, else those
    // of the set on it (the set is a few pipeline groups), counted once per group.
    std::map<std::pair<int, int64_t>, int64_t> expected_cache;
    auto expected_members = [&](Dim d, int64_t lead) {
      if (o_.all_ranks) return dim_size(p_, d);
      auto [it, fresh] = expected_cache.try_emplace({static_cast<int>(d), lead}, 0);
      if (fresh) {
        for (int64_t m : set) it->second += leader(p_, d, m) == lead ? 1 : 0;
      }
      return it->second;
    };
    auto peer_index = [&](std::size_t i, const Event& e) -> std::optional<std::size_t> {
      const auto it = index.find(with_pp(p_, set[i], e.peer));
      if (it == index.end()) return std::nullopt;
      return it->second;
    };
    // p2p_fail reports a send met by a receive that is not its own (another size or microbatch).
    auto p2p_fail = [&](std::size_t s, const Event& se, std::size_t t, const Event& re) {
      r.ok = false;
      r.ranks = {std::min(set[s], set[t]), std::max(set[s], set[t])};
      r.diagnosis = "FAILED: rank " + std::to_string(set[s]) + "'s send to rank " + std::to_string(set[t]) + ", " +
                    describe(se) + ", meets rank " + std::to_string(set[t]) + "'s receive " + describe(re);
    };
    auto matches = [](const Event& s, const Event& rcv) {
      return s.bytes == rcv.bytes && s.dtype == rcv.dtype && s.microbatch == rcv.microbatch &&
             std::string_view(s.what) == rcv.what;
    };
    while (!ready.empty() && r.ok) {
      const std::size_t i = ready.front();
      ready.pop_front();
      while (r.ok) {
        const Event* e = head(i);
        if (!e || arrived[i]) break;
        if (!is_p2p(e->op)) {
          const auto key = std::make_pair(static_cast<int>(e->dim), leader(p_, e->dim, set[i]));
          auto [it, fresh] = arrivals.try_emplace(key);
          if (fresh) it->second.expected = expected_members(e->dim, key.second);
          it->second.waiting.push_back(i);
          arrived[i] = true;
          if (static_cast<int64_t>(it->second.waiting.size()) == it->second.expected) {
            for (std::size_t w : it->second.waiting) {
              arrived[w] = false;
              ++pc[w];
              if (w != i) ready.push_back(w);
            }
            arrivals.erase(it);
            continue;
          }
          break;
        }
        const auto peer = peer_index(i, *e);
        if (!peer) break;  // outside the simulated set: waits forever (diagnosed below)
        const std::size_t j = *peer;
        if (e->op == Op::kSend) {
          if (o_.semantics == SendSemantics::kEager) {
            in_flight[{i, j}].push_back(e);
            ++pc[i];
            if (const Event* h = head(j); h && h->op == Op::kRecv && h->peer == pp_coordinate(p_, set[i])) {
              ready.push_back(j);
            }
            continue;
          }
          const Event* h = head(j);
          if (h && h->op == Op::kRecv && h->peer == pp_coordinate(p_, set[i]) && !arrived[j]) {
            if (!matches(*e, *h)) {
              p2p_fail(i, *e, j, *h);
              break;
            }
            ++pc[i];
            ++pc[j];
            ready.push_back(j);
            continue;
          }
          break;
        }
        // A receive.
        if (o_.semantics == SendSemantics::kEager) {
          auto it = in_flight.find({j, i});
          if (it == in_flight.end() || it->second.empty()) break;
          const Event* s = it->second.front();
          if (!matches(*s, *e)) {
            p2p_fail(j, *s, i, *e);
            break;
          }
          it->second.pop_front();
          ++pc[i];
          continue;
        }
        const Event* h = head(j);
        if (h && h->op == Op::kSend && h->peer == pp_coordinate(p_, set[i])) {
          if (!matches(*h, *e)) {
            p2p_fail(j, *h, i, *e);
            break;
          }
          ++pc[i];
          ++pc[j];
          ready.push_back(j);
          continue;
        }
        break;
      }
    }
    if (!r.ok) return;
    std::vector<std::size_t> stuck;
    for (std::size_t i = 0; i < n; ++i) {
      if (head(i)) stuck.push_back(i);
    }
    if (stuck.empty()) return;
    // The wait-for graph: a rank in a collective waits for the first member of its group (in
    // the simulated set) not there yet; a rank in a send or receive waits for its peer.
    auto waits_for = [&](std::size_t i) -> std::optional<std::size_t> {
      const Event& e = *head(i);
      if (is_p2p(e.op)) return peer_index(i, e);
      const int64_t lead = leader(p_, e.dim, set[i]);
      for (std::size_t k = 0; k < n; ++k) {
        const int64_t m = set[k];
        if (k == i || leader(p_, e.dim, m) != lead) continue;
        const auto it = index.find(m);
        const Event* h = head(it->second);
        if (!h || !arrived[it->second] || h->dim != e.dim || leader(p_, h->dim, m) != leader(p_, e.dim, set[i])) {
          return it->second;
        }
      }
      return std::nullopt;
    };
    auto waiting_text = [&](std::size_t i) {
      const Event& e = *head(i);
      std::string s = "rank " + std::to_string(set[i]) + " waits in its ";
      if (e.op == Op::kSend) s += "send to rank " + std::to_string(with_pp(p_, set[i], e.peer));
      else if (e.op == Op::kRecv) s += "receive from rank " + std::to_string(with_pp(p_, set[i], e.peer));
      else s += std::string(op_name(e.op)) + " on its " + group_text(job_, e.dim, set[i]);
      return s + " (" + describe(e) + ", its event #" + std::to_string(pc[i] + 1) + ")";
    };
    // Follow the waits from the first stuck rank (a faulted or named one when stuck) until one
    // repeats: that is the cycle.
    std::vector<std::size_t> path;
    std::map<std::size_t, std::size_t> seen;
    std::optional<std::size_t> at = stuck.front();
    for (std::size_t i : stuck) {
      if (faulted_.count(set[i]) || std::find(o_.ranks.begin(), o_.ranks.end(), set[i]) != o_.ranks.end()) {
        at = i;
        break;
      }
    }
    while (at && head(*at) && !seen.count(*at)) {
      seen.emplace(*at, path.size());
      path.push_back(*at);
      at = waits_for(*at);
    }
    std::vector<std::size_t> cycle;
    if (at && seen.count(*at)) cycle.assign(path.begin() + static_cast<std::ptrdiff_t>(seen[*at]), path.end());
    else cycle = path;
    r.ok = false;
    r.ranks.clear();
    for (std::size_t c : cycle) r.ranks.push_back(set[c]);
    std::sort(r.ranks.begin(), r.ranks.end());
    std::string text;
    const std::size_t shown = std::min<std::size_t>(cycle.size(), 6);
    for (std::size_t k = 0; k < shown; ++k) text += (k ? "; " : "") + waiting_text(cycle[k]);
    if (shown < cycle.size()) text += "; ... (" + std::to_string(cycle.size()) + " ranks in the cycle)";
    r.diagnosis = "FAILED: the step cannot progress (" +
                  std::string(o_.semantics == SendSemantics::kRendezvous ? "rendezvous" : "eager") + " sends): " + text;
  }

  std::size_t longest() const {
    std::size_t m = 0;
    for (const auto& b : base_) m = std::max(m, b.size());
    for (const auto& [_, f] : faulted_) m = std::max(m, f.size());
    return m;
  }

  // ---- bytes per link ----

  // sent: the bytes one rank sends for a collective, by ring (all_gather, reduce_scatter,
  // all_reduce) or pairwise exchange (all_to_all, to each other member).
  static int64_t ring_sent(const Event& e, int64_t n) {
    // floor(bytes x (n - 1) / n) without a wide product: n is at most the world size.
    const int64_t share = e.bytes / n * (n - 1) + (e.bytes % n) * (n - 1) / n;
    switch (e.op) {
      case Op::kAllGather:
      case Op::kReduceScatter: return share;
      case Op::kAllReduce: return mul(share, 2, "an all-reduce's ring bytes");
      default: return e.bytes;
    }
  }

  void links(int64_t gpus, Report& r) {
    LinkBytes world{};
    for (int d = 0; d < kDims; ++d) {
      const Dim dim = static_cast<Dim>(d);
      const int64_t n = dim_size(p_, dim);
      if (n < 2) continue;
      // Per pp coordinate: ranks whose ring successor is on their host; for all_to_all, the
      // members each rank shares a host with (itself left out).
      std::vector<int64_t> ring_same(p_.pp, 0), pair_same(p_.pp, 0), ranks_at(p_.pp, 0);
      std::vector<std::map<int64_t, int64_t>> peer_same(p_.pp);  // pp -> peer pp -> ranks on one host
      for (int64_t rank = 0; rank < world_; ++rank) {
        if (leader(p_, dim, rank) != rank) continue;
        const auto members = group_members(p_, dim, rank);
        std::map<int64_t, int64_t> per_host;
        for (int64_t m : members) ++per_host[m / gpus];
        for (std::size_t k = 0; k < members.size(); ++k) {
          const int64_t m = members[k], next = members[(k + 1) % members.size()];
          const int64_t pp = pp_coordinate(p_, m);
          ++ranks_at[pp];
          if (m / gpus == next / gpus) ++ring_same[pp];
          pair_same[pp] += per_host[m / gpus] - 1;
        }
      }
      if (dim == Dim::kPp) {
        for (int64_t rank = 0; rank < world_; ++rank) {
          const int64_t pp = pp_coordinate(p_, rank);
          for (int64_t q : {pp - 1, pp + 1}) {
            if (q < 0 || q >= p_.pp) continue;
            peer_same[pp][q] += (rank / gpus == with_pp(p_, rank, q) / gpus) ? 1 : 0;
          }
        }
      }
      LinkBytes here{};
      const std::string what = "the " + std::string(dim_name(dim)) + " dim's link bytes";
      for (int64_t pp = 0; pp < p_.pp; ++pp) {
        for (const Event& e : base_[pp]) {
          if (e.dim != dim || e.op == Op::kRecv) continue;
          int64_t intra = 0, inter = 0;
          if (e.op == Op::kSend) {
            const auto it = peer_same[pp].find(e.peer);
            const int64_t same = it == peer_same[pp].end() ? 0 : it->second;
            intra = mul(e.bytes, same, what);
            inter = mul(e.bytes, ranks_at[pp] - same, what);
          } else if (e.op == Op::kAllToAll) {
            const int64_t share = e.bytes / n;
            intra = mul(share, pair_same[pp], what);
            inter = mul(share, mul(ranks_at[pp], n - 1, what) - pair_same[pp], what);
          } else {
            const int64_t sent = ring_sent(e, n);
            intra = mul(sent, ring_same[pp], what);
            inter = mul(sent, ranks_at[pp] - ring_same[pp], what);
          }
          here.intra_host = add(here.intra_host, intra, what);
          here.inter_host = add(here.inter_host, inter, what);
        }
      }
      LinkBytes& slot = r.link_by_dim[std::string(dim_label(job_, dim))];  // Megatron's dp_cp names two dims
      slot.intra_host = add(slot.intra_host, here.intra_host, "the dim's link bytes");
      slot.inter_host = add(slot.inter_host, here.inter_host, "the dim's link bytes");
      world.intra_host = add(world.intra_host, here.intra_host, "the world's link bytes");
      world.inter_host = add(world.inter_host, here.inter_host, "the world's link bytes");
    }
    r.by_link = world;
  }

  int64_t programs() const { return static_cast<int64_t>(base_.size() + faulted_.size()); }

 private:
  const Job& job_;
  const Parallel& p_;
  const Options& o_;
  int64_t world_ = 0;
  std::vector<std::vector<Event>> base_;
  std::map<int64_t, std::vector<Event>> faulted_;
  std::set<std::pair<int, int64_t>> checked_;
};

}  // namespace

std::string_view dim_name(Dim d) { return kDimNames[static_cast<int>(d)]; }

std::string_view dim_label(const Job& job, Dim d) {
  if (job.framework == "megatron") {
    switch (d) {
      case Dim::kFsdp: return "dp_cp";
      case Dim::kBatch: return "dp";
      case Dim::kLoss: return "dp_cp";
      case Dim::kEfsdp: return "edp";
      default: break;
    }
  }
  return dim_name(d);
}

std::string_view view_name(Dim d) {
  switch (d) {
    case Dim::kFsdp: return "dense[dp_shard,cp]";
    case Dim::kBatch: return "dataloading";
    case Dim::kLoss: return "loss";
    case Dim::kEp:
    case Dim::kEfsdp: return "sparse";
    case Dim::kMp: return "mp";
    case Dim::kWorld: return "world";
    default: return "dense";
  }
}

std::string_view op_name(Op o) {
  switch (o) {
    case Op::kAllGather: return "all_gather";
    case Op::kReduceScatter: return "reduce_scatter";
    case Op::kAllReduce: return "all_reduce";
    case Op::kAllToAll: return "all_to_all";
    case Op::kSend: return "send";
    case Op::kRecv: return "recv";
  }
  return "?";
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kBF16: return "bfloat16";
    case DType::kF32: return "float32";
    case DType::kI64: return "int64";
    case DType::kI32: return "int32";
  }
  return "?";
}

std::string_view phase_name(Phase p) {
  switch (p) {
    case Phase::kTokens: return "tokens";
    case Phase::kFwd: return "fwd";
    case Phase::kBwd: return "bwd";
    case Phase::kOptimizer: return "optimizer";
    case Phase::kMetrics: return "metrics";
  }
  return "?";
}

std::string describe(const Event& e) {
  std::string s = std::string(op_name(e.op)) + " " + std::string(dtype_name(e.dtype)) + " " + std::to_string(e.bytes) +
                  " B (" + std::string(phase_name(e.phase));
  if (e.stage >= 0) s += " stage " + std::to_string(e.stage);
  if (e.layer >= 0) s += " layer " + std::to_string(e.layer);
  if (e.microbatch >= 0) s += " microbatch " + std::to_string(e.microbatch);
  if (*e.what) s += " " + std::string(e.what);
  if (e.recompute) s += " recomputed";
  return s + ")";
}

Model builtin_model(std::string_view name) {
  const std::string want = lower_case(name);
  for (const Model& m : builtins()) {
    if (m.name == want) return m;
  }
  std::string known;
  for (const auto& n : builtin_model_names()) known += (known.empty() ? "" : ", ") + n;
  throw NotFound("--model " + quote_input(name) + " is not a model meshsim knows (" + known + ") nor a .toml file");
}

std::vector<std::string> builtin_model_names() {
  std::vector<std::string> names;
  for (const Model& m : builtins()) names.push_back(m.name);
  return names;
}

Model model_from_toml(const std::string& path) {
  const std::string where = "--model " + quote_input(path);
  const auto t = preset::read_toml_table(path, "model", "--model", where);
  if (!t) throw InvalidArgument(where + " has no [model] table");
  Model m;
  m.name = "model";
  // kind_of names what a key holds, for the type errors below.
  auto kind_of = [&](const std::string& k) -> const char* {
    if (t->integers.count(k)) return "an integer";
    if (t->floats.count(k)) return "a float";
    if (t->booleans.count(k)) return "a boolean";
    if (t->strings.count(k)) return "a string";
    return nullptr;
  };
  if (auto it = t->strings.find("name"); it != t->strings.end()) {
    m.name = it->second;
  } else if (const char* got = kind_of("name")) {
    throw InvalidArgument(where + ": model.name is " + got + ", not a string");
  }
  const std::vector<std::pair<std::string, int64_t*>> keys = {
      {"n_layers", &m.layers},  {"dim", &m.dim},           {"ffn_dim", &m.ffn_dim},
      {"n_heads", &m.heads},    {"n_kv_heads", &m.kv_heads}, {"vocab_size", &m.vocab}};
  const std::vector<std::pair<std::string, int64_t*>> optional = {
      {"q_lora_rank", &m.q_lora_rank},         {"kv_lora_rank", &m.kv_lora_rank},   {"qk_nope_head_dim", &m.qk_nope_head_dim},
      {"qk_rope_head_dim", &m.qk_rope_head_dim}, {"v_head_dim", &m.v_head_dim},     {"num_experts", &m.experts},
      {"top_k", &m.top_k},                     {"moe_ffn_dim", &m.moe_ffn_dim},     {"num_shared_experts", &m.shared_experts},
      {"n_dense_layers", &m.dense_layers}};
  auto known = [&](const std::string& k) {
    return k == "name" || k == "enable_weight_tying" ||
           std::any_of(keys.begin(), keys.end(), [&](const auto& kv) { return kv.first == k; }) ||
           std::any_of(optional.begin(), optional.end(), [&](const auto& kv) { return kv.first == k; });
  };
  // Every key, whatever it holds: a misspelt one (n_layerz = "3", foo = true) is named.
  auto refuse_unknown = [&](const std::string& k) {
    if (known(k)) return;
    throw InvalidArgument(where + ": unknown key model." + quote_input(k) + " (" + kind_of(k) +
                          "; known: name, n_layers, dim, ffn_dim, n_heads, n_kv_heads, vocab_size, enable_weight_tying, "
                          "q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, num_experts, "
                          "top_k, moe_ffn_dim, num_shared_experts, n_dense_layers)");
  };
  for (const auto& [k, _] : t->integers) refuse_unknown(k);
  for (const auto& [k, _] : t->floats) refuse_unknown(k);
  for (const auto& [k, _] : t->booleans) refuse_unknown(k);
  for (const auto& [k, _] : t->strings) refuse_unknown(k);
  if (!t->integers.count("n_kv_heads") && t->integers.count("n_heads") && t->integers.count("kv_lora_rank")) {
    m.kv_heads = t->integers.at("n_heads");  // latent attention: one key and value per head
  }
  for (const auto& [k, into] : keys) {
    const auto it = t->integers.find(k);
    if (it == t->integers.end() && k == "n_kv_heads" && m.kv_heads > 0) continue;
    if (it == t->integers.end()) {
      const char* got = kind_of(k);
      throw InvalidArgument(where + ": model." + k +
                            (got ? std::string(" is ") + got + ", not an integer" : std::string(" is missing (an integer)")));
    }
    *into = it->second;
  }
  if (auto it = t->booleans.find("enable_weight_tying"); it != t->booleans.end()) {
    m.weight_tying = it->second;
  } else if (const char* got = kind_of("enable_weight_tying")) {
    throw InvalidArgument(where + ": model.enable_weight_tying is " + got + ", not a boolean (true or false)");
  }
  for (const auto& [k, into] : optional) {
    if (auto it = t->integers.find(k); it != t->integers.end()) {
      *into = it->second;
    } else if (const char* got = kind_of(k)) {
      throw InvalidArgument(where + ": model." + k + " is " + got + ", not an integer");
    }
  }
  validate_model(m);
  return m;
}

void validate_model(const Model& m) {
  const std::vector<std::pair<const char*, int64_t>> sizes = {{"n_layers", m.layers}, {"dim", m.dim},
                                                              {"ffn_dim", m.ffn_dim}, {"n_heads", m.heads},
                                                              {"n_kv_heads", m.kv_heads}, {"vocab_size", m.vocab}};
  for (const auto& [k, v] : sizes) {
    if (v < 1 || v > kMaxSize) {
      throw InvalidArgument("model " + quote_input(m.name) + ": " + k + " " + std::to_string(v) + " is out of range [1, 2^32]");
    }
  }
  if (m.layers > kMaxLayers) {
    throw InvalidArgument("model " + quote_input(m.name) + ": n_layers " + std::to_string(m.layers) + " is over " +
                          std::to_string(kMaxLayers));
  }
  const std::string who = "model " + quote_input(m.name) + ": ";
  const std::vector<std::pair<const char*, int64_t>> more = {
      {"q_lora_rank", m.q_lora_rank},         {"kv_lora_rank", m.kv_lora_rank},   {"qk_nope_head_dim", m.qk_nope_head_dim},
      {"qk_rope_head_dim", m.qk_rope_head_dim}, {"v_head_dim", m.v_head_dim},     {"num_experts", m.experts},
      {"top_k", m.top_k},                     {"moe_ffn_dim", m.moe_ffn_dim},     {"num_shared_experts", m.shared_experts},
      {"n_dense_layers", m.dense_layers}};
  for (const auto& [k, v] : more) {
    if (v < 0 || v > kMaxSize) throw InvalidArgument(who + k + " " + std::to_string(v) + " is out of range [0, 2^32]");
  }
  if (mla(m)) {
    for (const auto& [k, v] : std::vector<std::pair<const char*, int64_t>>{
             {"qk_nope_head_dim", m.qk_nope_head_dim}, {"qk_rope_head_dim", m.qk_rope_head_dim}, {"v_head_dim", m.v_head_dim}}) {
      if (v < 1) throw InvalidArgument(who + k + " " + std::to_string(v) + " is not >= 1 (latent attention: kv_lora_rank > 0)");
    }
    if (m.kv_heads != m.heads) {
      throw InvalidArgument(who + "n_kv_heads " + std::to_string(m.kv_heads) + " is not n_heads " + std::to_string(m.heads) +
                            ": latent attention has a key and a value per head");
    }
  } else {
    if (m.dim % m.heads != 0) {
      throw InvalidArgument(who + "dim " + std::to_string(m.dim) + " is not a multiple of n_heads " + std::to_string(m.heads));
    }
    if (m.heads % m.kv_heads != 0) {
      throw InvalidArgument(who + "n_heads " + std::to_string(m.heads) + " is not a multiple of n_kv_heads " +
                            std::to_string(m.kv_heads));
    }
  }
  if (m.experts > 0) {
    if (m.top_k < 1 || m.top_k > m.experts) {
      throw InvalidArgument(who + "top_k " + std::to_string(m.top_k) + " is out of range [1, num_experts " +
                            std::to_string(m.experts) + "]");
    }
    if (m.moe_ffn_dim < 1) throw InvalidArgument(who + "moe_ffn_dim " + std::to_string(m.moe_ffn_dim) + " is not >= 1");
    if (m.dense_layers > m.layers) {
      throw InvalidArgument(who + "n_dense_layers " + std::to_string(m.dense_layers) + " is over n_layers " +
                            std::to_string(m.layers));
    }
  }
}

int64_t parameter_count(const Model& m) {
  validate_model(m);
  const std::string w = "model " + m.name + "'s parameter count";
  int64_t attention = 0;
  if (mla(m)) {
    const int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    attention = m.q_lora_rank == 0 ? mul(m.dim, mul(m.heads, qk, w), w)
                                   : add(add(mul(m.dim, m.q_lora_rank, w), m.q_lora_rank, w),
                                         mul(m.q_lora_rank, mul(m.heads, qk, w), w), w);
    attention = add(attention, mul(m.dim, m.kv_lora_rank + m.qk_rope_head_dim, w), w);
    attention = add(attention, m.kv_lora_rank, w);
    attention = add(attention, mul(m.kv_lora_rank, mul(m.heads, m.qk_nope_head_dim + m.v_head_dim, w), w), w);
    attention = add(attention, mul(mul(m.heads, m.v_head_dim, w), m.dim, w), w);
  } else {
    const int64_t hd = m.dim / m.heads;
    attention = add(mul(m.dim, (m.heads + 2 * m.kv_heads) * hd, w), mul(m.heads * hd, m.dim, w), w);
  }
  attention = add(attention, 2 * m.dim, w);  // the two norms
  const int64_t dense = mul(mul(m.dim, m.ffn_dim, w), 3, w);
  int64_t moe = 0;
  if (m.experts > 0) {
    moe = mul(m.experts, m.dim, w);                                                      // the router's gate
    moe = add(moe, mul(mul(m.experts, mul(m.moe_ffn_dim, m.dim, w), w), 3, w), w);        // routed experts
    moe = add(moe, mul(mul(m.dim, mul(m.moe_ffn_dim, m.shared_experts, w), w), 3, w), w);  // shared experts
  }
  const int64_t dense_layers = m.experts > 0 ? m.dense_layers : m.layers;
  int64_t total = add(mul(add(attention, dense, w), dense_layers, w),
                      mul(add(attention, moe, w), m.layers - dense_layers, w), w);
  total = add(total, mul(m.vocab, m.dim, w), w);  // embeddings
  total = add(total, m.dim, w);                    // norm
  if (!m.weight_tying) total = add(total, mul(m.vocab, m.dim, w), w);
  return total;
}

int64_t world_size(const Parallel& p) {
  int64_t w = 1;
  for (int64_t v : radix(p)) w = mul(w, v, "the world size");
  return w;
}

int64_t dim_size(const Parallel& p, Dim d) {
  const auto r = radix(p, d);
  int64_t s = 1;
  for (int i = 0; i < 5; ++i) {
    if (kAxes[static_cast<int>(d)][i]) s *= r[i];
  }
  return s;
}

int64_t pp_coordinate(const Parallel& p, int64_t rank) { return rank / (world_size(p) / p.pp); }

int64_t group_member(const Parallel& p, Dim d, int64_t rank, int64_t k) {
  if (k < 0 || k >= dim_size(p, d)) {
    throw OutOfRange("member " + std::to_string(k) + " of a " + std::string(dim_name(d)) + " group of " +
                     std::to_string(dim_size(p, d)));
  }
  return member_at(p, d, rank, k);
}

std::vector<int64_t> group_members(const Parallel& p, Dim d, int64_t rank) {
  const auto r = radix(p, d);
  auto c = coords(p, rank, d);
  std::vector<int> axes;
  for (int i = 0; i < 5; ++i) {
    if (kAxes[static_cast<int>(d)][i]) {
      axes.push_back(i);
      c[i] = 0;
    }
  }
  std::vector<int64_t> out;
  out.reserve(static_cast<std::size_t>(dim_size(p, d)));
  // Row-major over the dim's axes (the last fastest): ascending ranks.
  while (true) {
    out.push_back(rank_of(p, c, d));
    int k = static_cast<int>(axes.size()) - 1;
    for (; k >= 0; --k) {
      if (++c[axes[k]] < r[axes[k]]) break;
      c[axes[k]] = 0;
    }
    if (k < 0) break;
  }
  return out;
}

Fault parse_fault(std::string_view text) {
  const auto at = text.find('@');
  const std::string kind(text.substr(0, at));
  const std::string where = "--fault " + quote_input(text);
  if (at == std::string_view::npos || at + 1 >= text.size()) {
    throw InvalidArgument(where + ": expected KIND@RANK (skip, swap, wrong-group, wrong-peer)");
  }
  Fault f;
  if (kind == "skip") f.kind = FaultKind::kSkip;
  else if (kind == "swap") f.kind = FaultKind::kSwap;
  else if (kind == "wrong-group") f.kind = FaultKind::kWrongGroup;
  else if (kind == "wrong-peer") f.kind = FaultKind::kWrongPeer;
  else throw InvalidArgument(where + ": unknown kind " + quote_input(kind) + " (skip, swap, wrong-group, wrong-peer)");
  const std::string_view digits = text.substr(at + 1);
  int64_t v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') throw InvalidArgument(where + ": the rank " + quote_input(digits) + " is not a number >= 0");
    if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, c - '0', &v)) {
      throw OverflowError(where + ": the rank " + quote_input(digits) + " does not fit in 64 bits");
    }
  }
  f.rank = v;
  return f;
}

namespace {

// megatron_layout: Megatron-core's rules for a step: layers split evenly over the stages
// (pipeline x virtual stages; Megatron asserts they divide), 1F1B without virtual stages (its
// compute order is PyTorch's 1F1B; Megatron batches each call's sends and receives, so their
// order in a call does not matter), its interleaved schedule with them.
StageLayout megatron_layout(const Job& job) {
  const Parallel& p = job.parallel;
  const Model& m = job.model;
  const std::string ac = lower_case(job.activation_checkpoint);
  if (ac != "selective" && ac != "full" && ac != "none") {
    throw InvalidArgument("--activation-checkpoint " + quote_input(job.activation_checkpoint) +
                          " is not none (Megatron's default), selective (core attention: no collectives) or full");
  }
  if (m.experts > 0 && p.ep < 2) {
    throw InvalidArgument("megatron: an MoE model with ep 1 (experts sharded over expert tp) is not modeled: give ep > 1");
  }
  if (job.schedule_override) throw InvalidArgument("megatron: a schedule CSV is not taken (Megatron builds its own)");
  const std::string schedule = lower_case(job.schedule);
  if (schedule != "1f1b" && schedule != "interleaved1f1b" && schedule != "megatroninterleaved") {
    throw InvalidArgument("megatron: --schedule " + quote_input(job.schedule) +
                          " is not Megatron's (1F1B, or its interleaved schedule with --stages > pp)");
  }
  StageLayout l;
  int64_t per = job.stages_per_rank ? job.stages_per_rank : (schedule == "1f1b" ? 1 : 2);
  if (p.pp == 1 && per != 1) throw InvalidArgument("megatron: virtual pipeline stages need pp > 1");
  if (p.pp > 1 && m.weight_tying) {
    throw InvalidArgument("model " + quote_input(m.name) +
                          " ties its embeddings to its output: with pp > 1 Megatron all-reduces their gradients over the "
                          "first and last stage, which meshsim step does not model");
  }
  l.stages_per_rank = per;
  l.stages = mul(per, p.pp, "the stages");
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
  const int64_t seq_shards = p.cp > 1 ? mul(2 * p.cp, p.tp, "cp x tp") : p.tp;
  if (job.seq_len % seq_shards != 0) {
    throw InvalidArgument("--seq-len " + std::to_string(job.seq_len) + " is not divisible by " +
                          (p.cp > 1 ? "2 x cp x tp (" : "tp (") + std::to_string(seq_shards) +
                          "): sequence parallel shards each sequence over tp" +
                          (p.cp > 1 ? ", and context parallel's head-tail load balancer in 2 x cp chunks" : ""));
  }
  if (job.framework == "megatron") return megatron_layout(job);
  const std::string ac = lower_case(job.activation_checkpoint);
  if (ac != "selective" && ac != "full" && ac != "none") {
    throw InvalidArgument("--activation-checkpoint " + quote_input(job.activation_checkpoint) +
                          " is not selective (torchtitan's default, per op), full or none");
  }
  const std::string policy = lower_case(job.reshard_after_forward);
  if (policy != "default" && policy != "always" && policy != "never") {
    throw InvalidArgument("Invalid reshard_after_forward_policy: " + quote_input(job.reshard_after_forward) +
                          ". [torchtitan: always, never or default]");
  }
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
  if (policy == "always") {
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
      throw InvalidArgument("--schedule " + quote_input(job.schedule) +
                            ": meshsim step builds GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble and "
                            "ZBVZeroBubble (or reads a CSV)");
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
    l.stages = mul(per, p.pp, "the stages");
    if (l.stages > kMaxStages) throw InvalidArgument("the pipeline's " + std::to_string(l.stages) + " stages are over " + std::to_string(kMaxStages));
    // PyTorch runs GPipe and 1F1B by their own loop (the order of _add_send_recv), the others
    // through its runtime's lowering.
    const Lowering how = single ? Lowering::kAddSendRecv : job.lowering;
    l.schedule = lower(schedule_by_name(job.schedule, p.pp, l.stages, job.microbatches), how);
    l.lowering = how == Lowering::kRuntime ? "runtime" : "add_send_recv";
  }
  split_layers(l, m.layers, job.first_stage_less_layers, job.last_stage_less_layers);
  return l;
}

std::vector<Event> program(const Job& job, const StageLayout& l, int64_t pp_rank) {
  if (pp_rank < 0 || pp_rank >= job.parallel.pp) {
    throw OutOfRange("pp rank " + std::to_string(pp_rank) + " is out of range [0, " + std::to_string(job.parallel.pp) + ")");
  }
  return Builder(job, l).build(pp_rank);
}

void apply_fault(const Job& job, const Fault& f, std::vector<Event>& events) {
  const Parallel& p = job.parallel;
  const std::string who = "rank " + std::to_string(f.rank);
  switch (f.kind) {
    case FaultKind::kSkip: {
      int32_t last = -1;
      for (const Event& e : events) last = std::max(last, e.microbatch);
      if (last < 0) throw InvalidArgument("skip@" + std::to_string(f.rank) + ": " + who + " runs no microbatch");
      std::erase_if(events, [&](const Event& e) {
        return e.microbatch == last && (e.phase == Phase::kFwd || e.phase == Phase::kBwd);
      });
      return;
    }
    case FaultKind::kSwap: {
      for (std::size_t i = 0; i < events.size(); ++i) {
        if (is_p2p(events[i].op)) continue;
        for (std::size_t j = i + 1; j < events.size(); ++j) {
          if (events[j].dim != events[i].dim || is_p2p(events[j].op)) continue;
          if (!same_collective(events[i], events[j])) {
            std::swap(events[i], events[j]);
            return;
          }
          break;
        }
      }
      throw InvalidArgument("swap@" + std::to_string(f.rank) + ": " + who +
                            "'s program has no two different collectives in a row on one group");
    }
    case FaultKind::kWrongGroup: {
      auto it = std::find_if(events.begin(), events.end(), [](const Event& e) { return e.dim == Dim::kTp && !is_p2p(e.op); });
      if (it == events.end()) it = std::find_if(events.begin(), events.end(), [](const Event& e) { return !is_p2p(e.op); });
      if (it == events.end()) throw InvalidArgument("wrong-group@" + std::to_string(f.rank) + ": " + who + " issues no collective");
      for (Dim d : {Dim::kFsdp, Dim::kDpReplicate, Dim::kCp, Dim::kTp, Dim::kPp}) {
        if (d != it->dim && dim_size(p, d) > 1) {
          it->dim = d;
          return;
        }
      }
      throw InvalidArgument("wrong-group@" + std::to_string(f.rank) +
                            ": the mesh has no second dim of size > 1 to issue a collective on");
    }
    case FaultKind::kWrongPeer: {
      auto it = std::find_if(events.begin(), events.end(), [](const Event& e) { return e.op == Op::kSend; });
      if (it == events.end()) {
        throw InvalidArgument("wrong-peer@" + std::to_string(f.rank) + ": " + who + " sends nothing (pp is " +
                              std::to_string(p.pp) + ")");
      }
      it->peer = (it->peer + 1) % p.pp;
      return;
    }
  }
}

Report check_step(const Job& job, const Options& o) {
  Report r;
  r.layout = layout(job);
  const Parallel& p = job.parallel;
  r.world_size = world_size(p);
  auto check_rank = [&](int64_t rank, const std::string& what) {
    if (rank < 0 || rank >= r.world_size) {
      throw OutOfRange(what + " " + std::to_string(rank) + " is out of range [0, " + std::to_string(r.world_size) + ")");
    }
  };
  check_rank(o.rank, "--rank");
  for (const Fault& f : o.faults) check_rank(f.rank, "--fault's rank");
  for (int64_t rank : o.ranks) check_rank(rank, "--ranks' rank");
  if (o.gpus_per_host && (*o.gpus_per_host < 1 || *o.gpus_per_host > (int64_t{1} << 40))) {
    throw InvalidArgument("--gpus-per-host " + std::to_string(*o.gpus_per_host) + " is out of range [1, 2^40]");
  }
  r.rank = o.rank;
  Checker c(job, r.layout, o);
  r.programs = c.programs();
  r.program = c.program_of(o.rank);
  for (const Event& e : r.program) {
    OpTotal& t = r.by_dim[std::string(dim_label(job, e.dim))][std::string(op_name(e.op))];
    ++t.calls;
    t.bytes = add(t.bytes, e.bytes, "rank " + std::to_string(o.rank) + "'s bytes");
  }
  if (o.gpus_per_host) c.links(*o.gpus_per_host, r);
  c.check_agreement(r);
  if (r.ok) c.simulate(r);
  return r;
}

}  // namespace meshsim::step
