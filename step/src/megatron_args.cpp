#include "meshsim/megatron_args.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include "megatron_lm_flags.hpp"
#include "meshsim/error.hpp"
#include "meshsim/preset.hpp"
#include "meshsim/text_fields.hpp"
#include "meshsim/text_file.hpp"

namespace meshsim::step {

namespace {

constexpr std::size_t kMaxArgsBytes = std::size_t{1} << 20;
constexpr std::size_t kMaxArgs = 1 << 14;

// The flags that take an integer, and where each goes.
enum class Flag {
  kTp, kPp, kCp, kEp, kEtp, kVirtual, kLayersPerVirtual, kMbs, kGbs, kSeq, kLayers, kHidden, kFfn, kHeads,
  kGroups, kVocab, kExperts, kTopk, kMoeFfn, kSharedFfn, kVocabDivisible
};
const std::map<std::string, Flag>& int_flags() {
  static const std::map<std::string, Flag> m{
      {"--tensor-model-parallel-size", Flag::kTp}, {"--pipeline-model-parallel-size", Flag::kPp},
      {"--context-parallel-size", Flag::kCp}, {"--expert-model-parallel-size", Flag::kEp},
      {"--expert-tensor-parallel-size", Flag::kEtp}, {"--num-virtual-stages-per-pipeline-rank", Flag::kVirtual},
      {"--num-layers-per-virtual-pipeline-stage", Flag::kLayersPerVirtual}, {"--micro-batch-size", Flag::kMbs},
      {"--global-batch-size", Flag::kGbs}, {"--seq-length", Flag::kSeq}, {"--num-layers", Flag::kLayers},
      {"--hidden-size", Flag::kHidden}, {"--ffn-hidden-size", Flag::kFfn}, {"--num-attention-heads", Flag::kHeads},
      {"--num-query-groups", Flag::kGroups}, {"--vocab-size", Flag::kVocab}, {"--num-experts", Flag::kExperts},
      {"--moe-router-topk", Flag::kTopk}, {"--moe-ffn-hidden-size", Flag::kMoeFfn},
      {"--moe-shared-expert-intermediate-size", Flag::kSharedFfn},
      {"--make-vocab-size-divisible-by", Flag::kVocabDivisible}};
  return m;
}
const std::set<std::string>& bool_flags() {
  static const std::set<std::string> s{"--bf16", "--grad-reduce-in-bf16", "--sequence-parallel",
                                       "--use-distributed-optimizer", "--group-query-attention", "--swiglu",
                                       "--untie-embeddings-and-output-weights", "--disable-bias-linear",
                                       "--add-qkv-bias", "--moe-router-pre-softmax"};
  return s;
}
const std::set<std::string>& string_flags() {
  static const std::set<std::string> s{"--rerun-mode", "--recompute-granularity", "--recompute-method",
                                       "--recompute-num-layers", "--pipeline-model-parallel-layout", "--normalization",
                                       "--moe-router-score-function", "--moe-router-load-balancing-type"};
  return s;
}
// Flags that change the step's collectives in ways meshsim does not model, and why.
const std::map<std::string, std::string>& refused_flags() {
  static const std::map<std::string, std::string> m{
      {"--fp16", "meshsim step models --bf16 training"},
      {"--fp8-format", "fp8 training is not modelled"},
      {"--overlap-grad-reduce", "meshsim models one gradient bucket per model chunk (overlap_grad_reduce off)"},
      {"--overlap-param-gather", "meshsim models one parameter gather per model chunk (overlap_param_gather off)"},
      {"--tp-comm-overlap", "tensor-parallel communication overlap is not modelled"},
      {"--decoder-first-pipeline-num-layers", "meshsim splits the layers evenly over the stages"},
      {"--decoder-last-pipeline-num-layers", "meshsim splits the layers evenly over the stages"},
      {"--pipeline-model-parallel-layout", "meshsim splits the layers evenly over the stages"},
      {"--account-for-embedding-in-pipeline-split", "meshsim splits the layers evenly over the stages"},
      {"--account-for-loss-in-pipeline-split", "meshsim splits the layers evenly over the stages"},
      {"--moe-token-dispatcher-type", "meshsim models the alltoall dispatcher (Megatron's default)"},
      {"--use-torch-fsdp2", "meshsim models Megatron's distributed optimizer, not FSDP2"},
      {"--use-megatron-fsdp", "meshsim models Megatron's distributed optimizer, not Megatron-FSDP"},
      {"--cross-entropy-loss-fusion", "the fused cross entropy's collectives are not modelled"},
      {"--defer-embedding-wgrad-compute", "not modelled"},
      {"--use-tp-pp-dp-mapping", "meshsim lays out Megatron's default order tp-cp-ep-dp-pp"},
      {"--num-distributed-optimizer-instances", "meshsim models one distributed optimizer instance"},
      {"--qk-layernorm", "the query and key layernorms' parameters (and their tensor-parallel all-reduce) are not modelled"}};
  return m;
}

std::vector<std::string> known_names() {
  std::vector<std::string> out;
  for (const auto& [k, _] : int_flags()) out.push_back(k);
  for (const auto& k : bool_flags()) out.push_back(k);
  for (const auto& k : string_flags()) out.push_back(k);
  for (const auto& [k, _] : refused_flags()) out.push_back(k);
  return out;
}

}  // namespace

MegatronArgs parse_megatron_args(const std::string& text_or_file) {
  std::string text = text_or_file;
  if (!text.empty() && text[0] == '@') text = read_text_file(text.substr(1), kMaxArgsBytes, "--megatron-args");
  if (text.size() > kMaxArgsBytes) throw ResourceExhausted("--megatron-args is over 1 MiB");
  const std::vector<std::string> w = text::shell_words(text, "--megatron-args", kMaxArgs);
  MegatronArgs a;
  std::map<Flag, int64_t> ints;
  std::map<std::string, std::string> strs;
  std::set<std::string> seen;
  const std::vector<std::string> known = known_names();
  for (std::size_t i = 0; i < w.size(); ++i) {
    std::string flag = w[i], value;
    bool has_value = false;
    if (flag.rfind("--", 0) != 0) {
      throw InvalidArgument("--megatron-args: " + quote_input(flag) + " is not a flag (Megatron-LM's take --NAME [VALUE])");
    }
    if (const auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_value = true;
    }
    std::replace(flag.begin() + 2, flag.end(), '_', '-');  // Megatron's parser takes both spellings
    auto take_value = [&]() -> std::string {
      if (has_value) return value;
      if (i + 1 >= w.size() || w[i + 1].rfind("--", 0) == 0) {
        throw InvalidArgument("--megatron-args: " + flag + " expects a value");
      }
      return w[++i];
    };
    const bool read = int_flags().count(flag) || bool_flags().count(flag) || string_flags().count(flag);
    if (read && !seen.insert(flag).second) {
      throw InvalidArgument("--megatron-args: " + flag + " is given twice");
    }
    if (const auto r = refused_flags().find(flag); r != refused_flags().end()) {
      throw InvalidArgument("--megatron-args: " + flag + ": " + r->second);
    }
    if (const auto f = int_flags().find(flag); f != int_flags().end()) {
      const std::string v = take_value();
      const int64_t n = text::parse_int(v, "--megatron-args: " + flag);
      if (n < 1) throw InvalidArgument("--megatron-args: " + flag + " " + v + " is not a positive integer");
      ints[f->second] = n;
    } else if (bool_flags().count(flag)) {
      if (has_value) throw InvalidArgument("--megatron-args: " + flag + " takes no value");
      if (flag == "--bf16") a.bf16 = true;
      else if (flag == "--grad-reduce-in-bf16") a.grad_reduce_in_bf16 = true;
      else if (flag == "--sequence-parallel") a.sequence_parallel = true;
      else if (flag == "--use-distributed-optimizer") a.distributed_optimizer = true;
      else if (flag == "--disable-bias-linear") a.bias_linear = false;
      else if (flag == "--add-qkv-bias") a.qkv_bias = true;
      else strs[flag] = "true";
    } else if (string_flags().count(flag)) {
      strs[flag] = take_value();
    } else if (is_megatron_lm_flag(flag)) {
      // A flag of Megatron-LM's that moves no collective meshsim models: noted as not read, with
      // its values (Megatron-LM takes no positional arguments: every word up to the next flag).
      if (!has_value) {
        while (i + 1 < w.size() && w[i + 1].rfind("--", 0) != 0) ++i;
      }
      a.ignored.push_back(flag);
    } else {
      // Not Megatron-LM's: a misspelling of one meshsim reads, or a flag Megatron-LM refuses.
      const std::string near = preset::did_you_mean(flag, known);
      throw InvalidArgument("--megatron-args: " + quote_input(flag) + " is not a flag of Megatron-LM (core_v0.16.1's "
                            "argument parser defines " + std::to_string(megatron_lm_flag_count()) + ")" + near);
    }
  }
  auto get = [&](Flag f) -> std::optional<int64_t> {
    const auto it = ints.find(f);
    return it == ints.end() ? std::nullopt : std::optional<int64_t>(it->second);
  };
  a.tp = get(Flag::kTp).value_or(1);
  a.pp = get(Flag::kPp).value_or(1);
  a.cp = get(Flag::kCp).value_or(1);
  a.ep = get(Flag::kEp).value_or(1);
  a.etp = get(Flag::kEtp);
  a.vocab_divisible = get(Flag::kVocabDivisible).value_or(128);
  a.virtual_stages = get(Flag::kVirtual);
  a.layers_per_virtual_stage = get(Flag::kLayersPerVirtual);
  a.micro_batch_size = get(Flag::kMbs);
  a.global_batch_size = get(Flag::kGbs);
  a.seq_length = get(Flag::kSeq);
  if (a.virtual_stages && a.layers_per_virtual_stage) {
    throw InvalidArgument("--megatron-args: --num-layers-per-virtual-pipeline-stage and "
                          "--num-virtual-stages-per-pipeline-rank are mutually exclusive  [Megatron]");
  }
  if (!a.bf16) throw InvalidArgument("--megatron-args: meshsim step models --bf16 training: give --bf16");
  if (!a.distributed_optimizer) {
    throw InvalidArgument("--megatron-args: meshsim step models the distributed optimizer's reduce-scatter and gather: "
                          "give --use-distributed-optimizer");
  }
  if (a.tp > 1 && !a.sequence_parallel) {
    throw InvalidArgument("--megatron-args: --tensor-model-parallel-size " + std::to_string(a.tp) +
                          " without --sequence-parallel: meshsim step models Megatron's tensor parallel with sequence "
                          "parallel");
  }
  if (auto it = strs.find("--normalization"); it != strs.end()) {
    if (it->second != "LayerNorm" && it->second != "RMSNorm") {
      throw InvalidArgument("--megatron-args: --normalization " + quote_input(it->second) +
                            ": invalid choice (choose from LayerNorm, RMSNorm)  [Megatron]");
    }
    a.normalization = it->second;
  }
  if (auto it = strs.find("--rerun-mode"); it != strs.end()) {
    if (it->second != "disabled" && it->second != "validate_results" && it->second != "report_stats") {
      throw InvalidArgument("--megatron-args: --rerun-mode " + quote_input(it->second) +
                            ": invalid choice (choose from disabled, validate_results, report_stats)  [Megatron]");
    }
    if (it->second == "report_stats") {
      throw InvalidArgument("--megatron-args: --rerun-mode report_stats reruns every step: not modelled");
    }
    a.rerun_mode = it->second;
  }
  if (auto it = strs.find("--recompute-granularity"); it != strs.end()) {
    if (it->second != "full" && it->second != "selective") {
      throw InvalidArgument("--megatron-args: --recompute-granularity " + quote_input(it->second) +
                            ": invalid choice (choose from full, selective)  [Megatron]");
    }
    // TransformerConfig.__post_init__'s rules (megatron-core 0.16.1), in its words.
    const bool full = it->second == "full";
    const auto method = strs.find("--recompute-method");
    const auto count = strs.find("--recompute-num-layers");
    if (method != strs.end() && method->second != "block" && method->second != "uniform") {
      throw InvalidArgument("--megatron-args: recompute_method: " + method->second + " must be \"block\" or \"uniform\".  [Megatron]");
    }
    if (method == strs.end() && full) {
      throw InvalidArgument("--megatron-args: Using recompute_granularity: full so recompute_method must be \"block\" or "
                            "\"uniform\"  [Megatron]");
    }
    if (full && count == strs.end()) {
      throw InvalidArgument("--megatron-args: When using recompute_granularity: full recompute_num_layers must be between 1 "
                            "and num_layers_per_pipeline_rank  [Megatron]");
    }
    if (!full && count != strs.end()) {
      throw InvalidArgument("--megatron-args: When using recompute_granularity: selective recompute_num_layers must be "
                            "None.  [Megatron]");
    }
    if (full) {
      a.recompute_method = method->second;
      a.recompute_layers = text::parse_int(count->second, "--megatron-args: --recompute-num-layers");
      if (a.recompute_layers < 1) {
        throw InvalidArgument("--megatron-args: --recompute-num-layers " + count->second + " is not a positive integer");
      }
      if (a.recompute_method == "uniform" && a.recompute_layers != 1) {
        throw InvalidArgument("--megatron-args: --recompute-method uniform --recompute-num-layers " + count->second +
                              ": meshsim models full recomputation of every layer (uniform, 1 layer per checkpoint)");
      }
    }
    a.recompute = it->second;
    a.recompute_given = true;
  }
  // The model's shape, when given (else `--model` names one).
  const auto layers = get(Flag::kLayers), hidden = get(Flag::kHidden), heads = get(Flag::kHeads);
  if (layers || hidden || heads || get(Flag::kFfn) || get(Flag::kVocab) || get(Flag::kExperts)) {
    for (const auto& [v, flag] : {std::pair{layers, "--num-layers"}, {hidden, "--hidden-size"},
                                  {heads, "--num-attention-heads"}, {get(Flag::kVocab), "--vocab-size"}}) {
      if (!v) throw InvalidArgument(std::string("--megatron-args: the model's shape needs ") + flag);
    }
    if (*hidden > (int64_t{1} << 32)) {
      throw OutOfRange("--megatron-args: --hidden-size " + std::to_string(*hidden) + " is over 2^32");
    }
    Model m;
    m.name = "megatron";
    m.layers = *layers;
    m.dim = *hidden;
    m.heads = *heads;
    m.vocab = *get(Flag::kVocab);
    const bool gqa = strs.count("--group-query-attention") > 0;
    if (get(Flag::kGroups) && !gqa) {
      throw InvalidArgument("--megatron-args: --num-query-groups is read with --group-query-attention  [Megatron]");
    }
    m.kv_heads = gqa ? get(Flag::kGroups).value_or(1) : m.heads;
    // Megatron's defaults: 4 x hidden, or with --swiglu int(4 x hidden x 2 / 3 / 64) x 64.
    const bool swiglu = strs.count("--swiglu") > 0;
    if (!swiglu) {
      throw InvalidArgument("--megatron-args: meshsim models SwiGLU MLPs (two fc1 halves): give --swiglu");
    }
    m.ffn_dim = get(Flag::kFfn).value_or(((4 * m.dim * 2 / 3) / 64) * 64);
    m.weight_tying = strs.count("--untie-embeddings-and-output-weights") == 0;  // Megatron ties by default
    if (const auto e = get(Flag::kExperts)) {
      if (a.bias_linear) {
        throw InvalidArgument("--megatron-args: --num-experts " + std::to_string(*e) + " with biases in the linear layers "
                              "(Megatron's default, add_bias_linear): the experts' biases are not modelled; give "
                              "--disable-bias-linear");
      }
      m.experts = *e;
      m.top_k = get(Flag::kTopk).value_or(2);
      // TransformerConfig.__post_init__: softmax over one selected expert has no gradient.
      const auto score = strs.find("--moe-router-score-function"), balance = strs.find("--moe-router-load-balancing-type");
      if (m.top_k == 1 && (score == strs.end() || score->second == "softmax") && !strs.count("--moe-router-pre-softmax") &&
          (balance == strs.end() || balance->second != "sinkhorn")) {
        throw InvalidArgument("--megatron-args: --moe-router-topk 1: Please use --moe-router-pre-softmax when topk is 1.  "
                              "[Megatron]");
      }
      m.moe_ffn_dim = get(Flag::kMoeFfn).value_or(m.ffn_dim);
      if (const auto s = get(Flag::kSharedFfn)) {
        if (*s % m.moe_ffn_dim != 0) {
          throw InvalidArgument("--megatron-args: --moe-shared-expert-intermediate-size " + std::to_string(*s) +
                                " is not a multiple of the expert's ffn " + std::to_string(m.moe_ffn_dim));
        }
        m.shared_experts = *s / m.moe_ffn_dim;
      }
    }
    validate_model(m);
    a.model = m;
  }
  return a;
}

MegatronJob megatron_job(const MegatronArgs& a, int64_t world_size, int64_t layers) {
  using text::checked_mul;
  const int64_t mp = checked_mul(checked_mul(a.tp, a.pp, "tp x pp"), a.cp, "tp x pp x cp");
  if (world_size < 1 || world_size % mp != 0) {
    throw InvalidArgument("--megatron-args: world size (" + std::to_string(world_size) +
                          ") is not divisible by tensor parallel size (" + std::to_string(a.tp) + ") times pipeline "
                          "parallel size (" + std::to_string(a.pp) + ") times context parallel size (" +
                          std::to_string(a.cp) + ")  [Megatron]");
  }
  MegatronJob j;
  const int64_t dp = world_size / mp;
  j.degrees.tp = a.tp;
  j.degrees.pp = a.pp;
  j.degrees.cp = a.cp;
  j.degrees.ep = a.ep;
  j.degrees.etp = a.etp;
  j.degrees.dp = dp;
  j.seq_length = a.seq_length;
  j.micro_batch_size = a.micro_batch_size.value_or(1);
  const int64_t per = checked_mul(j.micro_batch_size, dp, "micro batch size x data parallel size");
  const int64_t gbs = a.global_batch_size.value_or(per);
  if (gbs % per != 0) {
    throw InvalidArgument("--megatron-args: global batch size (" + std::to_string(gbs) + ") is not divisible by micro "
                          "batch size (" + std::to_string(j.micro_batch_size) + ") times data parallel size (" +
                          std::to_string(dp) + ")  [Megatron]");
  }
  j.microbatches = gbs / per;
  if (a.layers_per_virtual_stage) {
    if (a.pp == 1 || layers % a.pp != 0 || (layers / a.pp) % *a.layers_per_virtual_stage != 0) {
      throw InvalidArgument("--megatron-args: --num-layers-per-virtual-pipeline-stage " +
                            std::to_string(*a.layers_per_virtual_stage) + ": number of layers per pipeline stage (" +
                            std::to_string(layers) + " / pp " + std::to_string(a.pp) +
                            ") must be divisible by number of layers per virtual pipeline stage  [Megatron]");
    }
    j.stages = a.pp * (layers / a.pp / *a.layers_per_virtual_stage);
  } else if (a.virtual_stages) {
    j.stages = checked_mul(a.pp, *a.virtual_stages, "the virtual stages");
  }
  if (j.stages && *j.stages <= a.pp) j.stages.reset();
  if (a.recompute_method == "block" && a.recompute_layers < layers / a.pp) {
    // Megatron's block method recomputes the first N layers of each pipeline rank and keeps the
    // rest's activations: not every layer, which is what meshsim models.
    throw InvalidArgument("--megatron-args: --recompute-method block --recompute-num-layers " +
                          std::to_string(a.recompute_layers) + " recomputes " + std::to_string(a.recompute_layers) +
                          " of the " + std::to_string(layers / a.pp) + " layers of each pipeline rank: meshsim models "
                          "full recomputation of every layer (uniform with 1, or block with every layer of the rank)");
  }
  return j;
}

}  // namespace meshsim::step
