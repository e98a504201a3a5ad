#include "meshsim/torchtitan_job.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <sstream>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>
#include <vector>

#include "meshsim/error.hpp"
#include "meshsim/text_fields.hpp"
#include "meshsim/json_codec.hpp"
#include "meshsim/text_file.hpp"
#include "toml_file.hpp"
#include "torchtitan_fields.hpp"

namespace meshsim::torchtitan {

namespace {

constexpr std::size_t kMaxJsonBytes = std::size_t{4} << 20;  // a 405B model's saved config is ~0.6 MiB
constexpr std::size_t kMaxTomlBytes = std::size_t{1} << 20;  // torchtitan's TOML job files are a few KB
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
// The tables and [parallelism] keys torchtitan's JobConfig declares (torchtitan/config/
// job_config.py at 9810191bb^, the last TOML-era config, plus the keys ParallelismConfig added
// since, configs.py at b5bcd76c): torchtitan refuses any other ("Invalid field names").
const std::vector<std::string>& toml_tables() {
  static const std::vector<std::string> t{"job",        "profiling",  "metrics",  "model",
                                          "optimizer",  "lr_scheduler", "training", "parallelism",
                                          "checkpoint", "activation_checkpoint", "compile", "quantize",
                                          "comm",       "memory_estimation", "fault_tolerance", "experimental",
                                          "validation", "debug"};
  return t;
}

const std::vector<std::string>& parallelism_keys() {
  static const std::vector<std::string> k{
      "data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
      "enable_fsdp_symm_mem", "tensor_parallel_degree", "enable_sequence_parallel", "disable_loss_parallel",
      "enable_async_tensor_parallel", "spmd_backend", "pipeline_parallel_degree", "module_fqns_per_model_part",
      "pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers",
      "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule", "pipeline_parallel_schedule_csv",
      "pipeline_parallel_microbatch_size", "num_pp_microbatches", "pipeline_parallel_expert_parallel_overlap",
      "context_parallel_degree", "context_parallel_load_balancer", "context_parallel_rotate_method",
      "context_parallel_ptrr_mask_key", "expert_parallel_degree", "expert_tensor_parallel_degree",
      "expert_parallel_comm_backend"};
  return k;
}

const std::vector<std::pair<std::string, int64_t preset::Torchtitan::*>>& titan_degree_keys() {
  static const std::vector<std::pair<std::string, int64_t preset::Torchtitan::*>> k{
      {"data_parallel_replicate_degree", &preset::Torchtitan::dp_replicate}, {"data_parallel_shard_degree", &preset::Torchtitan::dp_shard},
      {"context_parallel_degree", &preset::Torchtitan::cp}, {"tensor_parallel_degree", &preset::Torchtitan::tp},
      {"pipeline_parallel_degree", &preset::Torchtitan::pp}, {"expert_parallel_degree", &preset::Torchtitan::ep}};
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

// as_json is a TOML node as JSON: tables, arrays and scalars as they are; a date or time as its
// TOML text (a string: no torchtitan field holds one). The nesting is the parser's, which
// check_key_parts and toml++'s own limit bound.
nlohmann::json as_json(const toml::node& n) {
  if (const auto* t = n.as_table()) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [k, v] : *t) j[std::string(k.str())] = as_json(v);
    return j;
  }
  if (const auto* a = n.as_array()) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& v : *a) j.push_back(as_json(v));
    return j;
  }
  if (const auto* i = n.as_integer()) return i->get();
  if (const auto* f = n.as_floating_point()) return f->get();
  if (const auto* b = n.as_boolean()) return b->get();
  if (const auto* s = n.as_string()) return s->get();
  std::ostringstream text;
  n.visit([&](const auto& v) { text << v; });
  return text.str();
}

// read_toml reads a TOML job file of torchtitan's TOML era as the JSON of its tables, refusing a
// table torchtitan's JobConfig does not declare (unless the job extends the config with its own
// module, experimental.custom_args_module, which may add tables).
nlohmann::json read_toml(const std::string& path, const std::string& flag, const std::string& where) {
  const toml::table doc = meshsim::detail::parse_toml_file(path, kMaxTomlBytes, flag, where);
  const bool extended = static_cast<bool>(doc["experimental"]["custom_args_module"]);
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [key, node] : doc) {
    const std::string k(key.str());
    const auto& known = toml_tables();
    if (!extended && std::find(known.begin(), known.end(), k) == known.end()) {
      throw InvalidArgument(where + ": unknown table " + quote_input(k) + ": torchtitan's job config has no such "
                            "section" + preset::did_you_mean(k, known));
    }
    j[k] = as_json(node);
  }
  return j;
}

void read_degrees_json(const Section& s, preset::Torchtitan& t) {
  for (const auto& [key, field] : titan_degree_keys()) {
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

JobFile read_job_file(const std::string& path, const std::string& flag) {
  JobFile f;
  f.path = path;
  const std::string where = flag + " " + quote_input(path);
  f.where = where;
  const bool json = path.size() > 5 && lower_case(path.substr(path.size() - 5)) == ".json";
  f.format = json ? "json" : "toml";
  nlohmann::json doc;
  if (json) {
    const std::string text = read_text_file(path, kMaxJsonBytes, flag);
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
    doc = read_toml(path, flag, where);
  }
  auto object = [&](const char* key) -> const nlohmann::json* {
    const auto it = doc.find(key);
    if (it == doc.end() || it->is_null()) return nullptr;
    if (!it->is_object()) throw InvalidArgument(where + ": " + key + " is " + kind_of(*it) + ", not a table");
    return &*it;
  };
  const Section model(where, json ? "model_spec" : "model", object(json ? "model_spec" : "model"));
  const Section training(where, "training", object("training"));
  const Section par(where, "parallelism", object("parallelism"), saved_nullable_parallelism());
  const Section ac(where, "activation_checkpoint", object("activation_checkpoint"));
  training.check_keys(training_keys());
  par.check_keys(parallelism_keys());
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
    read_degrees_json(par, f.degrees);
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

}  // namespace meshsim::torchtitan

namespace meshsim::torchtitan {

Settings settings(const JobFile& f, const preset::Torchtitan& t) {
  const std::string& where = f.where;
  Settings s;
  s.model = f.model ? *f.model : Keyed<std::string>{"llama3-debugmodel", "model (default)"};  // llama3, debugmodel
  const int64_t dp = text::checked_mul(t.dp_replicate, t.dp_shard, "the data-parallel degree");
  if (f.tokens_per_microbatch || f.tokens_per_step || f.pp_microbatches || f.max_context_length) {
    // The token budget (torchtitan's configs since 73aed7f6c): a microbatch is T tokens of packed
    // documents per dp rank, so one sequence of T tokens is what its collectives move.
    s.seq_len = f.tokens_per_microbatch
                    ? *f.tokens_per_microbatch
                    : Keyed<int64_t>{16384, "training.num_tokens_per_microbatch_per_dp_rank (default)"};
    s.per_microbatch = {1, s.seq_len.key};
    s.microbatches = {t.pp > 1 && f.pp_microbatches ? f.pp_microbatches->value : 1,
                      f.pp_microbatches ? f.pp_microbatches->key : "parallelism.num_pp_microbatches (default)"};
    const int64_t per_step = text::checked_mul(text::checked_mul(s.seq_len.value, s.microbatches.value, "tokens per step"), dp,
                                               "tokens per step");
    if (f.tokens_per_step && f.tokens_per_step->value != -1) {
      const int64_t want = f.tokens_per_step->value;
      if (want < 1 || want % per_step != 0) {
        throw InvalidArgument(where + ": " + f.tokens_per_step->key + " = " + std::to_string(want) +
                              " is not a positive multiple of tokens per microbatch x microbatches x data-parallel degree = " +
                              std::to_string(per_step) + " (torchtitan's rule)");
      }
      s.grad_accum_steps = want / per_step;
    }
  } else {
    // Sequences (torchtitan's TOML era and 0.3.0): local_batch_size sequences per dp rank and
    // accumulation step, cut into pipeline microbatches of pipeline_parallel_microbatch_size.
    s.seq_len = f.seq_len ? *f.seq_len : Keyed<int64_t>{2048, "training.seq_len (default)"};
    const Keyed<int64_t> local =
        f.local_batch_size ? *f.local_batch_size : Keyed<int64_t>{8, "training.local_batch_size (default)"};
    if (t.pp > 1) {
      const Keyed<int64_t> size = f.microbatch_size ? *f.microbatch_size
                                                    : Keyed<int64_t>{1, "parallelism.pipeline_parallel_microbatch_size (default)"};
      if (local.value % size.value != 0) {
        throw InvalidArgument(where + ": " + local.key + " = " + std::to_string(local.value) +
                              " is not divisible by parallelism.pipeline_parallel_microbatch_size = " +
                              std::to_string(size.value) + " (torchtitan's rule)");
      }
      s.per_microbatch = size;
      s.microbatches = {local.value / size.value, local.key + " / " + size.key};
    } else {
      s.per_microbatch = local;
      s.microbatches = {1, local.key};
    }
    if (f.global_batch_size && f.global_batch_size->value >= 0) {
      const int64_t want = f.global_batch_size->value, per_step = text::checked_mul(local.value, dp, "sequences per step");
      if (want < 1 || want % per_step != 0) {
        throw InvalidArgument(where + ": " + f.global_batch_size->key + " = " + std::to_string(want) +
                              " is not a positive multiple of local_batch_size x data-parallel degree = " +
                              std::to_string(per_step) + " (torchtitan's rule)");
      }
      s.grad_accum_steps = want / per_step;
    }
  }
  if (t.pp > 1) {
    s.schedule = f.schedule_csv ? f.schedule_csv
                 : f.schedule   ? f.schedule
                                : Keyed<std::string>{"1F1B", "parallelism.pipeline_parallel_schedule (default)"};
  }
  s.reshard_after_forward = f.reshard_after_forward;
  s.activation_checkpoint = f.activation_checkpoint;
  s.loss_chunks = f.loss_chunks;
  s.load_balance = !f.moe_load_balance || f.moe_load_balance->value;
  return s;
}

PipelineSplit pipeline_split(const JobFile& f, int64_t pp, int64_t layers, const std::string& schedule, bool single_stage) {
  const std::string& where = f.where;
  PipelineSplit p;
  for (const auto* v : {&f.first_stage_less_layers, &f.last_stage_less_layers}) {
    if (*v && (*v)->value > layers) {
      throw InvalidArgument(where + ": " + (*v)->key + " = " + std::to_string((*v)->value) + " is more than the model's " +
                            std::to_string(layers) + " layers");
    }
  }
  if (f.first_stage_less_layers) p.first_stage_less_layers = f.first_stage_less_layers->value;
  if (f.last_stage_less_layers) p.last_stage_less_layers = f.last_stage_less_layers->value;
  if (!f.layers_per_stage || pp <= 1 || f.schedule_csv) return p;  // a CSV's rows give the stages
  // torchtitan's pipeline_parallel.py: ceil((layers + first less + last less) / layers per stage)
  // stages, a multiple of pp; one per rank for a single-stage schedule, else two or more.
  const int64_t lps = f.layers_per_stage->value;
  const int64_t effective = layers + p.first_stage_less_layers + p.last_stage_less_layers;  // each <= layers
  const int64_t stages = effective / lps + (effective % lps != 0 ? 1 : 0);
  const std::string why = f.layers_per_stage->key + " = " + std::to_string(lps) + " makes " + std::to_string(stages) +
                          " stages of " + std::to_string(layers) + " layers";
  if (stages % pp != 0) {
    throw InvalidArgument(where + ": " + why + ", not a multiple of pp " + std::to_string(pp) + " (torchtitan's rule)");
  }
  if (single_stage && stages != pp) {
    throw InvalidArgument(where + ": " + why + ": the single-stage schedule " + quote_input(schedule) +
                          " needs exactly 1 stage per rank (torchtitan's rule)");
  }
  if (!single_stage && stages < 2 * pp) {
    throw InvalidArgument(where + ": " + why + ": the multi-stage schedule " + quote_input(schedule) +
                          " needs at least 2 stages per rank (torchtitan's rule)");
  }
  p.stages = Keyed<int64_t>{stages, f.layers_per_stage->key};
  return p;
}

}  // namespace meshsim::torchtitan
