#include "meshsim/job_file.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

#include "meshsim/error.hpp"
#include "meshsim/text_fields.hpp"
#include "meshsim/json_codec.hpp"
#include "meshsim/text_file.hpp"
#include "torchtitan_fields.hpp"

namespace meshsim::step {

namespace {

constexpr std::size_t kMaxJobFileBytes = std::size_t{4} << 20;  // a 405B model's saved config is ~0.6 MiB
constexpr int kMaxJobNesting = 64;

// The keys of the tables meshsim reads, as torchtitan declares them: the TOML era's JobConfig
// (torchtitan/config/job_config.py at 9810191bb^), 0.3.0's configs.py, and the token-budget keys
// of configs.py since 73aed7f6c. A key outside them is a misspelling torchtitan would refuse.
const std::vector<std::string>& training_keys() {
  static const std::vector<std::string> k{
      "dataset", "dataset_path", "local_batch_size", "global_batch_size", "seq_len", "max_norm", "steps",
      "enable_cpu_offload", "disable_cuda_graphs", "dtype", "mixed_precision_param", "mixed_precision_reduce",
      "gc_freq", "gc_debug", "dataloader", "num_tokens_per_microbatch_per_dp_rank", "num_tokens_per_train_step",
      "max_context_length", "batch_size"};
  return k;
}
const std::vector<std::string>& model_keys() {
  static const std::vector<std::string> k{"name", "flavor", "hf_assets_path", "tokenizer_path", "converters",
                                          "print_after_conversion"};
  return k;
}
const std::vector<std::string>& ac_keys() {
  static const std::vector<std::string> k{"mode", "selective_ac_option", "per_op_sac_force_recompute_mm_shapes_by_fqns",
                                          "force_recompute_mm_shapes_by_fqns", "early_stop", "memory_budget",
                                          "visualize_memory_budget_pareto", "preserve_rng_state", "determinism_check",
                                          "debug"};
  return k;
}

// torchtitan 0.3.0's Trainer.Config fields (the top level of the config it saves), its loss
// config's and its ModelSpec's as saved, the fields each activation-checkpointing policy's
// config holds, and the parallelism fields it types Optional (the only ones a saved config
// may hold as null). Read from torchtitan 0.3.0's trainer.py, protocols/model_spec.py,
// components/loss.py and distributed/activation_checkpoint.py.
const std::vector<std::string>& saved_top_keys() {
  static const std::vector<std::string> k{"model_spec", "hf_assets_path", "dump_folder", "profiler", "metrics",
                                          "tokenizer", "dataloader", "optimizer", "lr_scheduler", "training",
                                          "parallelism", "checkpoint", "activation_checkpoint", "compile", "comm",
                                          "validator", "debug", "override", "loss"};
  return k;
}
const std::vector<std::string>& saved_loss_keys() {
  static const std::vector<std::string> k{"num_chunks", "loss_fn"};
  return k;
}
const std::vector<std::string>& saved_model_spec_keys() {
  static const std::vector<std::string> k{"name", "flavor", "model", "parallelize_fn", "pipelining_fn",
                                          "post_optimizer_build_fn", "state_dict_adapter"};
  return k;
}
const std::vector<std::string>& saved_nullable_parallelism() {
  static const std::vector<std::string> k{"module_fqns_per_model_part", "pipeline_parallel_layers_per_stage",
                                          "pipeline_parallel_schedule_csv", "context_parallel_load_balancer",
                                          "context_parallel_ptrr_mask_key"};
  return k;
}
const std::vector<std::string> kAcCommon{"preserve_rng_state", "determinism_check", "debug"};
const std::vector<std::string> kAcSelective{"force_recompute_mm_shapes_by_fqns"};
const std::vector<std::string> kAcMemoryBudget{"memory_budget", "visualize_memory_budget_pareto"};

using text::lower_case;

const char* kind_of(const nlohmann::json& v) { return detail::json_kind(v); }

// Section reads one table of the job, whichever form it came in.
class Section {
 public:
  Section(std::string where, std::string name, const nlohmann::json* obj, std::vector<std::string> nullable = {})
      : where_(std::move(where)), name_(std::move(name)), obj_(obj), nullable_(std::move(nullable)) {}

  bool present() const { return obj_ != nullptr; }
  const nlohmann::json* raw(const std::string& key) const {
    if (!obj_) return nullptr;
    const auto it = obj_->find(key);
    if (it == obj_->end()) return nullptr;
    if (it->is_null()) {
      // null is None: only a field torchtitan types Optional holds it.
      if (std::find(nullable_.begin(), nullable_.end(), key) != nullable_.end()) return nullptr;
      throw InvalidArgument(where_ + ": " + name_ + "." + key + " is null, and torchtitan's " + name_ + "." + key +
                            " is not optional: give a value or leave the key out");
    }
    return &*it;
  }
  void check_keys(const std::vector<std::string>& known) const {
    if (!obj_) return;
    for (const auto& [k, _] : obj_->items()) {
      if (std::find(known.begin(), known.end(), k) == known.end()) {
        throw InvalidArgument(where_ + ": unknown key " + name_ + "." + quote_input(k) +
                              ": torchtitan's config has no such key" + preset::did_you_mean(k, known));
      }
    }
  }
  std::optional<Keyed<int64_t>> integer(const std::string& key) const {
    const nlohmann::json* v = raw(key);
    if (!v) return std::nullopt;
    if (v->is_number_float() && std::abs(v->get<double>()) >= 9223372036854775808.0 &&
        v->get<double>() == std::floor(v->get<double>())) {
      // JSON's reader keeps an integer past 2^64 as a float: it is an integer too large.
      throw OutOfRange(where_ + ": " + name_ + "." + key + " = " + v->dump() + " does not fit in 64 bits");
    }
    if (!v->is_number_integer()) throw InvalidArgument(where_ + ": " + name_ + "." + key + " is " + kind_of(*v) + ", not an integer");
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      throw OutOfRange(where_ + ": " + name_ + "." + key + " = " + v->dump() + " does not fit in 64 bits");
    }
    return Keyed<int64_t>{v->get<int64_t>(), name_ + "." + key};
  }
  std::optional<Keyed<int64_t>> positive(const std::string& key) const {
    auto v = integer(key);
    if (v && v->value < 1) {
      throw InvalidArgument(where_ + ": " + v->key + " = " + std::to_string(v->value) + " is not a positive integer");
    }
    return v;
  }
  std::optional<Keyed<std::string>> string(const std::string& key) const {
    const nlohmann::json* v = raw(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) throw InvalidArgument(where_ + ": " + name_ + "." + key + " is " + kind_of(*v) + ", not a string");
    return Keyed<std::string>{v->get<std::string>(), name_ + "." + key};
  }
  std::optional<bool> boolean(const std::string& key) const {
    const nlohmann::json* v = raw(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) throw InvalidArgument(where_ + ": " + name_ + "." + key + " is " + kind_of(*v) + ", not a boolean");
    return v->get<bool>();
  }
  const std::string& where() const { return where_; }

 private:
  std::string where_, name_;
  const nlohmann::json* obj_;
  std::vector<std::string> nullable_;
};

// toml_section is one TOML table as JSON (its scalars; an array or table as an empty one of its
// kind, which only the key checks and type errors look at).
std::optional<nlohmann::json> toml_section(const std::string& path, const std::string& table, const std::string& where) {
  const auto t = preset::read_toml_table(path, table, "--job", where, true);
  if (!t) return std::nullopt;
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : t->integers) j[k] = v;
  for (const auto& [k, v] : t->floats) j[k] = v;
  for (const auto& [k, v] : t->booleans) j[k] = v;
  for (const auto& [k, v] : t->strings) j[k] = v;
  for (const auto& [k, v] : t->others) j[k] = v == "an array" ? nlohmann::json::array() : nlohmann::json::object();
  return j;
}

void read_degrees_json(const Section& s, preset::Torchtitan& t) {
  for (const auto& [key, field] : preset::titan_degree_keys()) {
    if (auto v = s.integer(key)) t.*field = v->value;
  }
  if (auto etp = s.integer("expert_tensor_parallel_degree"); etp && etp->value != 1) {
    throw InvalidArgument(s.where() + ": parallelism.expert_tensor_parallel_degree=" + std::to_string(etp->value) +
                          ": torchtitan removed expert tensor parallelism; only 1 is accepted");
  }
  if (auto b = s.string("spmd_backend")) t.spmd_backend = b->value;
}

// python_constants is `text` with the constants Python's json module writes for floats that are
// not finite (Infinity, -Infinity, NaN: torchtitan's saved config holds them where a float
// field is inf) made JSON numbers: the largest double for Infinity and 0.0 for NaN (a float either
// way, so a field torchtitan types as a float holds it and one it types otherwise refuses it; no
// float's value is read). Strings are left as they are.
std::string python_constants(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) {
        out += text[++i];
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') in_string = true;
    if (text.compare(i, 8, "Infinity") == 0) {
      out += "1.7976931348623157e308";
      i += 7;
    } else if (text.compare(i, 3, "NaN") == 0) {
      out += "0.0";
      i += 2;
    } else {
      out += c;
    }
  }
  return out;
}

// saved_policy tells which policy a saved activation_checkpoint table is by its fields (0.3.0
// writes a policy's config without its class): FullAC's alone, SelectiveAC's (with
// force_recompute_mm_shapes_by_fqns), or MemoryBudgetAC's (memory_budget, the compiler's
// partitioner, which meshsim step does not model). A key of no policy, or of two, is refused.
Keyed<std::string> saved_policy(const nlohmann::json& ac, const std::string& where) {
  std::vector<std::string> all = kAcCommon;
  all.insert(all.end(), kAcSelective.begin(), kAcSelective.end());
  all.insert(all.end(), kAcMemoryBudget.begin(), kAcMemoryBudget.end());
  bool selective = false, budget = false;
  for (const auto& [k, _] : ac.items()) {
    if (std::find(all.begin(), all.end(), k) == all.end()) {
      throw InvalidArgument(where + ": unknown key activation_checkpoint." + quote_input(k) +
                            ": no activation-checkpointing policy of torchtitan 0.3.0 (FullAC, SelectiveAC, "
                            "MemoryBudgetAC) has it" + preset::did_you_mean(k, all) +
                            (k == "mode" ? " (mode is the TOML era's key; a saved config holds the policy's fields)" : ""));
    }
    selective |= std::find(kAcSelective.begin(), kAcSelective.end(), k) != kAcSelective.end();
    budget |= std::find(kAcMemoryBudget.begin(), kAcMemoryBudget.end(), k) != kAcMemoryBudget.end();
  }
  if (selective && budget) {
    throw InvalidArgument(where + ": activation_checkpoint holds fields of two policies (SelectiveAC's "
                          "force_recompute_mm_shapes_by_fqns and MemoryBudgetAC's memory budget): no config is both");
  }
  if (budget) {
    throw InvalidArgument(where + ": activation_checkpoint is MemoryBudgetAC (memory_budget): the compiler's partitioner "
                          "decides what is recomputed, which meshsim step does not model (none, selective and full are)");
  }
  if (selective) return {"selective", "activation_checkpoint (SelectiveAC)"};
  return {"full", "activation_checkpoint (FullAC)"};
}

// read_load_balance: the saved model's MoE layers (model_spec.model.layers[].moe) and their
// load_balance_coeff, as torchtitan's MoE and optimizer hold it: a positive number (MoE's assert)
// or null, alike in every MoE layer (_should_register_moe_balancing_hook's ValueError otherwise).
void read_load_balance(const nlohmann::json& doc, const std::string& where, const std::string& refused, JobFile& f) {
  const auto* spec = &doc["model_spec"];
  const auto model = spec->find("model");
  if (model == spec->end() || !model->is_object()) return;
  const auto layers = model->find("layers");
  if (layers == model->end() || !layers->is_array()) return;
  const std::string key = "model_spec.model.layers[].moe.load_balance_coeff";
  int64_t set = 0, unset = 0;
  for (const auto& layer : *layers) {
    if (!layer.is_object()) continue;
    const auto moe = layer.find("moe");
    if (moe == layer.end() || !moe->is_object()) continue;
    const auto c = moe->find("load_balance_coeff");
    if (c == moe->end() || c->is_null()) {
      ++unset;
    } else if (!c->is_number()) {
      throw InvalidArgument(where + ": " + key + " is " + kind_of(*c) + ", not a float or null");
    } else if (!(c->get<double>() > 0.0)) {
      throw InvalidArgument(refused + key + " = " + c->dump() + ": a MoE's load_balance_coeff must be > 0 (or null)");
    } else {
      ++set;
    }
  }
  if (set > 0 && unset > 0) {
    throw InvalidArgument(refused + "MoE load_balance_coeff must be configured consistently across all MoE layers (" + key +
                          ": set in " + std::to_string(set) + " layers, null in " + std::to_string(unset) + ")");
  }
  if (set + unset > 0) f.moe_load_balance = Keyed<bool>{set > 0, key};
}

}  // namespace

JobFile read_job_file(const std::string& path) {
  JobFile f;
  f.path = path;
  const std::string where = "--job " + quote_input(path);
  const bool json = path.size() > 5 && lower_case(path.substr(path.size() - 5)) == ".json";
  f.format = json ? "json" : "toml";
  nlohmann::json doc;
  std::optional<nlohmann::json> model_t, training_t, parallelism_t, ac_t;
  if (json) {
    const std::string text = read_text_file(path, kMaxJobFileBytes, "--job");
    if (json::max_nesting(text) > kMaxJobNesting) {
      throw InvalidArgument(where + " nests deeper than " + std::to_string(kMaxJobNesting) + " levels");
    }
    doc = nlohmann::json::parse(python_constants(text), nullptr, false);
    if (doc.is_discarded()) throw ParseError(where + " is not JSON (torchtitan's saved config is)");
    if (!doc.is_object() || !doc.contains("model_spec") || !doc.contains("parallelism") || !doc.contains("training")) {
      throw InvalidArgument(where + " is not a torchtitan config: it has no model_spec, training and parallelism "
                            "(the JSON torchtitan writes under debug.save_config_file)");
    }
  } else {
    f.degrees = preset::torchtitan_from_toml(path, "--job");  // the tables' names, [parallelism]'s keys and degrees
    model_t = toml_section(path, "model", where);
    training_t = toml_section(path, "training", where);
    parallelism_t = toml_section(path, "parallelism", where);
    ac_t = toml_section(path, "activation_checkpoint", where);
  }
  auto object = [&](const char* key) -> const nlohmann::json* {
    const auto it = doc.find(key);
    if (it == doc.end() || it->is_null()) return nullptr;
    if (!it->is_object()) throw InvalidArgument(where + ": " + key + " is " + kind_of(*it) + ", not a table");
    return &*it;
  };
  const Section model(where, json ? "model_spec" : "model", json ? object("model_spec") : model_t ? &*model_t : nullptr);
  const Section training(where, "training", json ? object("training") : training_t ? &*training_t : nullptr);
  const Section par(where, "parallelism", json ? object("parallelism") : parallelism_t ? &*parallelism_t : nullptr,
                    saved_nullable_parallelism());
  const Section ac(where, "activation_checkpoint", json ? object("activation_checkpoint") : ac_t ? &*ac_t : nullptr);
  training.check_keys(training_keys());
  par.check_keys(preset::titan_parallelism_keys());
  if (json) {
    for (const auto& [k, _] : doc.items()) {
      if (std::find(saved_top_keys().begin(), saved_top_keys().end(), k) == saved_top_keys().end()) {
        throw InvalidArgument(where + ": unknown key " + quote_input(k) + ": torchtitan 0.3.0's config has no such key" +
                              preset::did_you_mean(k, saved_top_keys()));
      }
    }
    model.check_keys(saved_model_spec_keys());
    detail::check_saved_fields(doc, where);  // every listed section's fields as torchtitan types them
    read_degrees_json(par, f.degrees);
    // What torchtitan 0.3.0's own configs refuse as they are built (Trainer.Config and
    // ParallelismConfig.__post_init__), in their words.
    const Section debug(where, "debug", object("debug"));
    const std::string refused = where + ": torchtitan refuses this config: ";
    read_load_balance(doc, where, refused, f);
    if (debug.boolean("batch_invariant") == true) {
      throw InvalidArgument(refused + "Batch-invariant mode is not supported in pre-training. (debug.batch_invariant)");
    }
    if (f.degrees.pp > 1 && training.boolean("disable_cuda_graphs") != true) {
      throw InvalidArgument(refused + "CUDA graphs do not support pipeline parallelism yet. Set "
                            "--training.disable_cuda_graphs. (training.disable_cuda_graphs is false, its default, with "
                            "pipeline_parallel_degree " + std::to_string(f.degrees.pp) + ")");
    }
    if (f.degrees.pp > 1 && f.degrees.spmd_backend == "spmd_types" && debug.boolean("spmd_typechecking") == true) {
      throw InvalidArgument(refused + "SPMD typechecking is not supported with pipeline parallelism. (debug.spmd_typechecking "
                            "with parallelism.spmd_backend spmd_types)");
    }
    if (auto lb = par.string("context_parallel_load_balancer"); lb && lb->value.empty()) {
      throw InvalidArgument(refused + "context_parallel_load_balancer cannot be an empty string. Use None to disable load "
                            "balancing.");
    }
  } else {
    model.check_keys(model_keys());
    ac.check_keys(ac_keys());
  }

  // The model: torchtitan's registry name and flavor, meshsim's built-in "<name>-<flavor>".
  const auto name = model.string("name");
  const auto flavor = model.string("flavor");
  if (name || flavor) {
    const std::string n = name ? name->value : "llama3", fl = flavor ? flavor->value : "debugmodel";
    f.model = Keyed<std::string>{lower_case(n + "-" + fl), (name ? name->key : flavor->key) + (name && flavor ? " and " + flavor->key : "")};
  }

  // The batch: torchtitan's sequences (local_batch_size and friends) or its token budget.
  if (auto old = training.integer("batch_size")) {
    throw InvalidArgument(where + ": training.batch_size is torchtitan's oldest spelling: write training.local_batch_size "
                          "(sequences per data-parallel rank)");
  }
  f.seq_len = training.positive("seq_len");
  f.local_batch_size = training.positive("local_batch_size");
  f.global_batch_size = training.integer("global_batch_size");
  f.microbatch_size = par.positive("pipeline_parallel_microbatch_size");
  f.tokens_per_microbatch = training.positive("num_tokens_per_microbatch_per_dp_rank");
  f.tokens_per_step = training.integer("num_tokens_per_train_step");
  f.pp_microbatches = par.positive("num_pp_microbatches");
  const auto ctx = training.positive("max_context_length");
  if (ctx && f.seq_len) {
    throw InvalidArgument(where + ": training.seq_len and training.max_context_length are two generations' spellings "
                          "of one setting: keep one");
  }
  f.max_context_length = ctx;  // the token-budget generation's document bound: that generation
  const std::optional<std::string> sequences = f.local_batch_size ? f.local_batch_size->key
                                               : f.global_batch_size ? f.global_batch_size->key
                                               : f.microbatch_size ? f.microbatch_size->key
                                                                   : std::optional<std::string>{};
  const std::optional<std::string> tokens = f.tokens_per_microbatch ? f.tokens_per_microbatch->key
                                            : f.tokens_per_step ? f.tokens_per_step->key
                                            : f.pp_microbatches ? f.pp_microbatches->key
                                            : ctx ? ctx->key
                                                  : std::optional<std::string>{};
  // torchtitan 0.3.0's saved config holds every key of its generation; a JSON of the newer
  // generation none of the older. A file that mixes them means one thing to one reader.
  if (sequences && tokens) {
    throw InvalidArgument(where + ": " + *sequences + " (sequences) and " + *tokens +
                          " (a token budget) are two generations of torchtitan's batch settings: use one");
  }

  // The pipeline.
  f.schedule = par.string("pipeline_parallel_schedule");
  if (auto csv = par.string("pipeline_parallel_schedule_csv"); csv && !csv->value.empty()) f.schedule_csv = csv;
  f.layers_per_stage = par.positive("pipeline_parallel_layers_per_stage");
  f.first_stage_less_layers = par.integer("pipeline_parallel_first_stage_less_layers");
  f.last_stage_less_layers = par.integer("pipeline_parallel_last_stage_less_layers");
  for (const auto* v : {&f.first_stage_less_layers, &f.last_stage_less_layers}) {
    if (*v && (*v)->value < 0) throw InvalidArgument(where + ": " + (*v)->key + " = " + std::to_string((*v)->value) + " is negative");
  }
  if (par.raw("module_fqns_per_model_part") && !par.raw("module_fqns_per_model_part")->empty()) {
    throw InvalidArgument(where + ": parallelism.module_fqns_per_model_part: meshsim step splits the layers as "
                          "torchtitan does without it (first and last stage less layers, layers per stage)");
  }
  f.reshard_after_forward = par.string("fsdp_reshard_after_forward");
  if (par.boolean("enable_sequence_parallel") == false) {
    throw InvalidArgument(where + ": parallelism.enable_sequence_parallel = false: meshsim step models tensor parallel "
                          "with sequence parallel (torchtitan's default) only");
  }
  if (par.boolean("disable_loss_parallel") == true) {
    throw InvalidArgument(where + ": parallelism.disable_loss_parallel = true: meshsim step models loss parallel "
                          "(torchtitan's default) only");
  }

  // Mixed precision: FSDP's all-gathers in bf16, its reduce-scatters in fp32 (torchtitan's default).
  if (auto p = training.string("mixed_precision_param"); p && p->value != "bfloat16") {
    throw InvalidArgument(where + ": training.mixed_precision_param = " + quote_input(p->value) +
                          ": meshsim step models bf16 parameters (torchtitan's default) only");
  }
  if (auto r = training.string("mixed_precision_reduce"); r && r->value != "float32") {
    throw InvalidArgument(where + ": training.mixed_precision_reduce = " + quote_input(r->value) +
                          ": meshsim step models fp32 gradient reduction (torchtitan's default) only");
  }

  // Activation checkpointing: TOML's mode; torchtitan 0.3.0 writes the checkpointing config's
  // fields but not its class: none is null, selective (SelectiveAC) the one with
  // force_recompute_mm_shapes_by_fqns, full (FullAC) the one without.
  if (json) {
    if (!doc.contains("activation_checkpoint")) {
      // torchtitan's default, SelectiveAC: left to run_step's default
    } else if (!ac.present()) {
      f.activation_checkpoint = Keyed<std::string>{"none", "activation_checkpoint (null)"};
    } else {
      f.activation_checkpoint = saved_policy(*object("activation_checkpoint"), where);
    }
    if (const nlohmann::json* loss = object("loss")) {
      const Section l(where, "loss", loss);
      l.check_keys(saved_loss_keys());
      f.loss_chunks = l.positive("num_chunks");
    }
  } else if (auto mode = ac.string("mode")) {
    const std::string m = lower_case(mode->value);
    if (m != "none" && m != "selective" && m != "full") {
      throw InvalidArgument(where + ": activation_checkpoint.mode = " + quote_input(mode->value) +
                            ": meshsim step models none, selective and full");
    }
    if (m == "selective") {
      if (const nlohmann::json* opt = ac.raw("selective_ac_option"); opt && !(opt->is_string() && opt->get<std::string>() == "op")) {
        throw InvalidArgument(where + ": activation_checkpoint.selective_ac_option = " + opt->dump() +
                              ": meshsim step models op-level selective checkpointing ('op') only");
      }
    }
    f.activation_checkpoint = Keyed<std::string>{m, mode->key};
  }
  return f;
}

}  // namespace meshsim::step
