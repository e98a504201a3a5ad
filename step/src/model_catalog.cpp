// The model catalog (torchtitan's llama3 and deepseek_v3 flavors), a [model] table read from a
// TOML file, the model's checks and its parameter count.
#include <string>
#include <vector>

#include "meshsim/error.hpp"
#include "meshsim/preset.hpp"
#include "meshsim/step_program.hpp"
#include "step_internal.hpp"

namespace meshsim::step {

using namespace detail;

namespace {

int64_t ffn_hidden(int64_t dim, int64_t multiple_of, double multiplier) {
  auto hidden = static_cast<int64_t>(2 * 4 * dim / 3);
  if (multiplier > 0) hidden = static_cast<int64_t>(multiplier * static_cast<double>(hidden));
  return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

Model deepseek(const char* name, int64_t layers, int64_t dim, int64_t dense_ffn, int64_t heads, int64_t vocab,
               int64_t q_lora, int64_t experts, int64_t top_k, int64_t moe_ffn, int64_t shared, int64_t dense_layers) {
  return Model{.name = name, .layers = layers, .dim = dim, .ffn_dim = dense_ffn, .heads = heads, .kv_heads = heads,
               .vocab = vocab, .q_lora_rank = q_lora, .kv_lora_rank = 512, .qk_nope_head_dim = 128,
               .qk_rope_head_dim = 64, .v_head_dim = 128, .experts = experts, .top_k = top_k, .moe_ffn_dim = moe_ffn,
               .shared_experts = shared, .dense_layers = dense_layers};
}

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

}  // namespace

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
    attention = m.q_lora_rank == 0 ? checked_mul(m.dim, checked_mul(m.heads, qk, w), w)
                                   : checked_add(checked_add(checked_mul(m.dim, m.q_lora_rank, w), m.q_lora_rank, w),
                                         checked_mul(m.q_lora_rank, checked_mul(m.heads, qk, w), w), w);
    attention = checked_add(attention, checked_mul(m.dim, m.kv_lora_rank + m.qk_rope_head_dim, w), w);
    attention = checked_add(attention, m.kv_lora_rank, w);
    attention = checked_add(attention, checked_mul(m.kv_lora_rank, checked_mul(m.heads, m.qk_nope_head_dim + m.v_head_dim, w), w), w);
    attention = checked_add(attention, checked_mul(checked_mul(m.heads, m.v_head_dim, w), m.dim, w), w);
  } else {
    const int64_t hd = m.dim / m.heads;
    attention = checked_add(checked_mul(m.dim, (m.heads + 2 * m.kv_heads) * hd, w), checked_mul(m.heads * hd, m.dim, w), w);
  }
  attention = checked_add(attention, 2 * m.dim, w);  // the two norms
  const int64_t dense = checked_mul(checked_mul(m.dim, m.ffn_dim, w), 3, w);
  int64_t moe = 0;
  if (m.experts > 0) {
    moe = checked_mul(m.experts, m.dim, w);                                                      // the router's gate
    moe = checked_add(moe, checked_mul(checked_mul(m.experts, checked_mul(m.moe_ffn_dim, m.dim, w), w), 3, w), w);        // routed experts
    moe = checked_add(moe, checked_mul(checked_mul(m.dim, checked_mul(m.moe_ffn_dim, m.shared_experts, w), w), 3, w), w);  // shared experts
  }
  const int64_t dense_layers = m.experts > 0 ? m.dense_layers : m.layers;
  int64_t total = checked_add(checked_mul(checked_add(attention, dense, w), dense_layers, w),
                      checked_mul(checked_add(attention, moe, w), m.layers - dense_layers, w), w);
  total = checked_add(total, checked_mul(m.vocab, m.dim, w), w);  // embeddings
  total = checked_add(total, m.dim, w);                    // norm
  if (!m.weight_tying) total = checked_add(total, checked_mul(m.vocab, m.dim, w), w);
  return total;
}

int64_t job_parameter_count(const Job& job) {
  const Model& m = job.model;
  int64_t total = parameter_count(m);
  if (job.framework != Framework::kMegatron || mla(m)) return total;
  const std::string w = "model " + m.name + "'s biases";
  const int64_t qkv = (m.heads + 2 * m.kv_heads) * (m.dim / m.heads);
  int64_t layer = 0;
  if (job.megatron_bias_linear) layer = checked_add(checked_add(qkv, 2 * m.dim, w), checked_mul(2, m.ffn_dim, w), w);
  else if (job.megatron_qkv_bias) layer = qkv;
  if (job.megatron_layernorm) layer = checked_add(layer, 2 * m.dim, w);  // the two norms' biases
  total = checked_add(total, checked_mul(layer, m.layers, w), w);
  return job.megatron_layernorm ? checked_add(total, m.dim, w) : total;  // the final norm's
}

}  // namespace meshsim::step
