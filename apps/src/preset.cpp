#include "meshsim/preset.hpp"

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <toml++/toml.h>
#include <vector>

#include "meshsim/cli_common.hpp"
#include "meshsim/error.hpp"

namespace meshsim::preset {

namespace {

const std::string kTitan = "--preset torchtitan: ";
const std::string kMegatron = "--preset megatron: ";

int64_t mul(int64_t a, int64_t b, const std::string& what) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) throw OverflowError(what + " overflows int64");
  return out;
}

// Items are KEY=VALUE pairs as given, each key once.
std::map<std::string, std::string> items(const std::string& body, const std::string& where,
                                         const std::set<std::string>& known) {
  std::map<std::string, std::string> out;
  if (body.empty()) return out;  // every key at its default
  for (const std::string& kv : cli::split(body, ',')) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos) throw InvalidArgument(where + quote_input(kv) + " is not KEY=VALUE");
    const std::string key = kv.substr(0, eq);
    if (!known.count(key)) {
      std::string list;
      for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
      throw InvalidArgument(where + "unknown key " + quote_input(key) + " (known: " + list + ")");
    }
    if (!out.emplace(key, kv.substr(eq + 1)).second) {
      throw InvalidArgument(where + "key " + quote_input(key) + " is given twice");
    }
  }
  return out;
}

int64_t degree(const std::map<std::string, std::string>& kv, const std::string& key, int64_t fallback,
               const std::string& where) {
  const auto it = kv.find(key);
  return it == kv.end() ? fallback : cli::parse_int(it->second, where + key);
}

void check_at_least_one(int64_t v, const std::string& key, const std::string& where) {
  if (v < 1) throw InvalidArgument(where + key + "=" + std::to_string(v) + " is not >= 1");
}

StepSpec unflatten_world(const std::string& let, std::vector<int64_t> sizes, std::vector<std::string> names) {
  StepSpec s;
  s.kind = StepSpec::Kind::kUnflatten;
  s.on = "root";
  s.let = let;
  s.dim_name = "world";
  s.sizes = std::move(sizes);
  s.names = std::move(names);
  return s;
}

StepSpec slice(const std::string& on, std::vector<std::string> names, std::optional<std::string> let = {}) {
  StepSpec s;
  s.kind = StepSpec::Kind::kSlice;
  s.on = on;
  s.let = std::move(let);
  s.names = std::move(names);
  return s;
}

StepSpec flatten(const std::string& name, const std::string& let) {
  StepSpec s;
  s.kind = StepSpec::Kind::kFlatten;
  s.on = "_last";
  s.flatten_name = name;
  s.let = let;
  return s;
}

MeshRecipe world_recipe(int64_t world) {
  MeshRecipe r;
  r.world_size = world;
  r.root.kind = RootSpec::Kind::kInit;
  r.root.shape = {world};
  r.root.names = std::vector<std::string>{"world"};
  r.result = "dense";
  return r;
}

Torchtitan torchtitan_from_items(const std::string& body) {
  const auto kv = items(body, kTitan, {"pp", "dp_replicate", "dp_shard", "cp", "tp", "ep", "etp", "spmd_backend"});
  Torchtitan t;
  t.pp = degree(kv, "pp", 1, kTitan);
  t.dp_replicate = degree(kv, "dp_replicate", 1, kTitan);
  t.dp_shard = degree(kv, "dp_shard", -1, kTitan);
  t.cp = degree(kv, "cp", 1, kTitan);
  t.tp = degree(kv, "tp", 1, kTitan);
  t.ep = degree(kv, "ep", 1, kTitan);
  if (const int64_t etp = degree(kv, "etp", 1, kTitan); etp != 1) {
    throw InvalidArgument(kTitan + "etp=" + std::to_string(etp) +
                          ": torchtitan removed expert tensor parallelism; only etp=1 is accepted");
  }
  if (auto it = kv.find("spmd_backend"); it != kv.end()) t.spmd_backend = it->second;
  return t;
}

// order_tokens splits Megatron's order string: known names, each once; a name left out is
// appended (RankGenerator's rule), which the caller checks has size 1.
std::vector<std::string> order_tokens(const std::string& order) {
  static const std::set<std::string> known{"tp", "cp", "ep", "dp", "pp"};
  std::vector<std::string> out;
  for (const std::string& t : cli::split(order, '-')) {
    if (!known.count(t)) {
      throw InvalidArgument(kMegatron + "order=" + quote_input(order) + ": " + quote_input(t) +
                            " is not one of tp, cp, ep, dp, pp");
    }
    if (std::find(out.begin(), out.end(), t) != out.end()) {
      throw InvalidArgument(kMegatron + "order=" + quote_input(order) + " names " + t + " twice");
    }
    out.push_back(t);
  }
  return out;
}

// Generator is one of Megatron's RankGenerators: its sizes in order-string order (first fastest).
struct Generator {
  std::vector<std::string> tokens;
  std::vector<int64_t> sizes;
  int64_t stride_of(const std::string& token) const {
    int64_t s = 1;
    for (std::size_t i = 0; tokens[i] != token; ++i) s *= sizes[i];
    return s;
  }
};

Generator generator(const std::string& order, const std::map<std::string, int64_t>& size_of) {
  Generator g;
  g.tokens = order_tokens(order);
  for (const auto& [name, size] : size_of) {
    if (std::find(g.tokens.begin(), g.tokens.end(), name) != g.tokens.end()) continue;
    if (size != 1) {
      throw InvalidArgument(kMegatron + "the size of (" + name + ") is (" + std::to_string(size) +
                            "), but you haven't specified the order (" + order + ")");
    }
    g.tokens.push_back(name);
  }
  for (const std::string& t : g.tokens) g.sizes.push_back(size_of.at(t));
  return g;
}

// view_dims are a generator's dims as a mesh spells them: the order reversed (the first name
// varies fastest, a mesh's last dim does), without `drop` (the generator's size-1 name), renamed.
void view_dims(const Generator& g, const std::string& drop, const std::map<std::string, std::string>& rename,
               std::vector<int64_t>& sizes, std::vector<std::string>& names) {
  for (std::size_t i = g.tokens.size(); i-- > 0;) {
    if (g.tokens[i] == drop) continue;
    sizes.push_back(g.sizes[i]);
    auto it = rename.find(g.tokens[i]);
    names.push_back(it == rename.end() ? g.tokens[i] : it->second);
  }
}

// in_mesh_order keeps `want` in the order `names` has them.
std::vector<std::string> in_mesh_order(const std::vector<std::string>& names, std::set<std::string> want) {
  std::vector<std::string> out;
  for (const std::string& n : names) {
    if (want.count(n)) out.push_back(n);
  }
  return out;
}

Megatron megatron_from_items(const std::string& body) {
  const auto kv = items(body, kMegatron, {"tp", "pp", "cp", "ep", "etp", "dp", "order"});
  Megatron m;
  m.tp = degree(kv, "tp", 1, kMegatron);
  m.pp = degree(kv, "pp", 1, kMegatron);
  m.cp = degree(kv, "cp", 1, kMegatron);
  m.ep = degree(kv, "ep", 1, kMegatron);
  if (kv.count("etp")) m.etp = degree(kv, "etp", 1, kMegatron);
  if (kv.count("dp")) m.dp = degree(kv, "dp", 1, kMegatron);
  if (auto it = kv.find("order"); it != kv.end()) m.order = it->second;
  return m;
}

std::string read_bounded(const std::string& path, const std::string& where) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument(where + quote_input(path) + " cannot be read");
  std::string text;
  char buf[65536];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    text.append(buf, static_cast<std::size_t>(in.gcount()));
    if (text.size() > kMaxRecipeFileBytes) {
      throw ResourceExhausted(where + quote_input(path) + " is over " + std::to_string(kMaxRecipeFileBytes) + " bytes");
    }
  }
  return text;
}

}  // namespace

MeshRecipe torchtitan_recipe(Torchtitan t, std::optional<int64_t> world_size) {
  for (const auto& [key, v] : {std::pair<const char*, int64_t>{"pp", t.pp}, {"dp_replicate", t.dp_replicate},
                               {"cp", t.cp}, {"tp", t.tp}, {"ep", t.ep}}) {
    check_at_least_one(v, key, kTitan);
  }
  if (t.dp_shard != -1) check_at_least_one(t.dp_shard, "dp_shard", kTitan);
  if (t.spmd_backend != "spmd_types" && t.spmd_backend != "partial_dtensor") {
    throw InvalidArgument(kTitan + "spmd_backend=" + quote_input(t.spmd_backend) +
                          " is not spmd_types or partial_dtensor");
  }
  const std::string factors = "pp * dp_replicate * cp * tp";
  const int64_t others = mul(mul(mul(t.pp, t.dp_replicate, kTitan + factors), t.cp, kTitan + factors), t.tp,
                             kTitan + factors);
  if (world_size && *world_size < 1) {
    throw InvalidArgument("--world-size " + std::to_string(*world_size) + " is not >= 1");
  }
  if (t.dp_shard == -1) {
    if (!world_size) {
      throw InvalidArgument(kTitan + "dp_shard=-1 (the default) is inferred from the world size: give "
                            "--world-size or dp_shard");
    }
    t.dp_shard = *world_size / others;
    if (t.dp_shard < 1) {
      throw InvalidArgument(kTitan + "dp_shard inferred as " + std::to_string(t.dp_shard) + ": the world size " +
                            std::to_string(*world_size) + " is smaller than " + factors + " = " +
                            std::to_string(others));
    }
  }
  const int64_t product = mul(others, t.dp_shard, kTitan + "the product of the degrees");
  const int64_t world = world_size.value_or(product);
  if (product != world) {
    throw InvalidArgument(kTitan + "invalid parallel dims: dp_replicate(" + std::to_string(t.dp_replicate) +
                          ") * dp_shard(" + std::to_string(t.dp_shard) + ") * cp(" + std::to_string(t.cp) +
                          ") * tp(" + std::to_string(t.tp) + ") * pp(" + std::to_string(t.pp) +
                          ") != WORLD_SIZE(" + std::to_string(world) + ")");
  }
  const int64_t sparse_region = t.dp_shard * t.cp * t.tp;
  if (sparse_region % t.ep != 0) {
    throw InvalidArgument(kTitan + "ep=" + std::to_string(t.ep) + " must divide dp_shard * cp * tp (" +
                          std::to_string(sparse_region) + ")");
  }
  const int64_t batch = t.dp_replicate * t.dp_shard;
  MeshRecipe r = world_recipe(world);
  r.steps.push_back(unflatten_world("dataloading", {t.pp, batch, t.cp, t.tp}, {"pp", "batch", "cp", "tp"}));
  r.steps.push_back(slice("dataloading", {"batch", "cp"}));
  r.steps.push_back(flatten("loss_mesh", "loss"));
  if (t.spmd_backend == "spmd_types") {
    r.steps.push_back(unflatten_world("dense", {t.pp, t.dp_replicate, t.dp_shard, t.cp, t.tp},
                                      {"pp", "dp_replicate", "dp_shard", "cp", "tp"}));
    StepSpec fwdbwd = unflatten_world("", {t.pp, batch, t.cp, t.tp}, {"pp", "dp", "cp", "tp"});
    fwdbwd.let.reset();  // torchtitan keeps only its dp, cp, tp slice
    r.steps.push_back(std::move(fwdbwd));
    r.steps.push_back(slice("_last", {"dp", "cp", "tp"}, "spmd_dense_for_fwdbwd"));
  } else {
    r.steps.push_back(unflatten_world("dense", {t.pp, t.dp_replicate, t.dp_shard * t.cp, t.tp},
                                      {"pp", "dp_replicate", "fsdp", "tp"}));
  }
  r.steps.push_back(unflatten_world("sparse", {t.pp, t.dp_replicate, sparse_region / t.ep, t.ep},
                                    {"pp", "dp_replicate", "efsdp", "ep"}));
  if (t.spmd_backend == "spmd_types" && t.ep > 1) {
    r.steps.push_back(slice("sparse", {"dp_replicate", "efsdp", "ep"}, "spmd_sparse_for_fwdbwd"));
  }
  return r;
}

MeshRecipe megatron_recipe(const Megatron& m, std::optional<int64_t> world_size) {
  const int64_t etp = m.etp.value_or(m.tp);
  for (const auto& [key, v] : {std::pair<const char*, int64_t>{"tp", m.tp}, {"pp", m.pp}, {"cp", m.cp},
                               {"ep", m.ep}, {"etp", etp}}) {
    check_at_least_one(v, key, kMegatron);
  }
  if (m.dp) check_at_least_one(*m.dp, "dp", kMegatron);
  if (world_size && *world_size < 1) {
    throw InvalidArgument("--world-size " + std::to_string(*world_size) + " is not >= 1");
  }
  const int64_t model = mul(mul(m.tp, m.pp, kMegatron + "tp * pp * cp"), m.cp, kMegatron + "tp * pp * cp");
  if (!world_size && !m.dp) {
    throw InvalidArgument(kMegatron + "dp is inferred from the world size: give --world-size or dp");
  }
  const int64_t world = world_size ? *world_size : mul(model, *m.dp, kMegatron + "tp * pp * cp * dp");
  if (world % model != 0) {
    throw InvalidArgument(kMegatron + "world_size (" + std::to_string(world) + ") is not divisible by tp * pp * cp (" +
                          std::to_string(model) + ")");
  }
  const int64_t dp = world / model;
  if (m.dp && *m.dp != dp) {
    throw InvalidArgument(kMegatron + "dp=" + std::to_string(*m.dp) + " but the world size " + std::to_string(world) +
                          " / (tp * pp * cp) is " + std::to_string(dp));
  }
  const int64_t expert_model = mul(mul(etp, m.ep, kMegatron + "etp * ep * pp"), m.pp, kMegatron + "etp * ep * pp");
  if (world % expert_model != 0) {
    throw InvalidArgument(kMegatron + "world_size (" + std::to_string(world) +
                          ") is not divisible by expert_tensor_model_pipeline_parallel size etp * ep * pp (" +
                          std::to_string(expert_model) + ")");
  }
  const int64_t edp = world / expert_model;
  const Generator dense = generator(m.order, {{"tp", m.tp}, {"cp", m.cp}, {"ep", 1}, {"dp", dp}, {"pp", m.pp}});
  const Generator expert = generator(m.order, {{"tp", etp}, {"cp", 1}, {"ep", m.ep}, {"dp", edp}, {"pp", m.pp}});
  const bool pp_last = m.order.size() >= 2 && m.order.compare(m.order.size() - 2, 2, "pp") == 0;
  if (!pp_last && m.pp != 1 && edp != dp) {
    throw InvalidArgument(kMegatron + "order=" + m.order + ": when not using pp-last rank ordering, the data parallel "
                          "size of the attention and moe layers must be the same (dp " + std::to_string(dp) +
                          ", expert dp " + std::to_string(edp) + ")");
  }
  // Equal pp groups: with pp > 1 the group holding rank 0 is {0, s, 2s, ...}, so the strides agree.
  if (m.pp > 1 && dense.stride_of("pp") != expert.stride_of("pp")) {
    throw InvalidArgument(kMegatron + "order=" + m.order + ": pipeline parallel groups are expected to be the same "
                          "for the non-expert and expert parts (pp stride " + std::to_string(dense.stride_of("pp")) +
                          " vs " + std::to_string(expert.stride_of("pp")) + ")");
  }
  MeshRecipe r = world_recipe(world);
  std::vector<int64_t> sizes;
  std::vector<std::string> names;
  view_dims(dense, "ep", {}, sizes, names);
  r.steps.push_back(unflatten_world("dense", sizes, names));
  r.steps.push_back(slice("dense", in_mesh_order(names, {"dp", "cp"})));
  r.steps.push_back(flatten("dp_cp", "dp_cp"));
  r.steps.push_back(slice("dense", in_mesh_order(names, {"tp", "pp"})));
  r.steps.push_back(flatten("mp", "mp"));
  sizes.clear();
  names.clear();
  view_dims(expert, "cp", {{"tp", "etp"}, {"dp", "edp"}}, sizes, names);
  r.steps.push_back(unflatten_world("expert", sizes, names));
  return r;
}

Torchtitan torchtitan_from_toml(const std::string& path) {
  const std::string where = kTitan + quote_input(path);
  const std::string text = read_bounded(path, kTitan);
  toml::table doc;
  try {
    doc = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    throw ParseError(where + " is not TOML: " + std::string(e.description()) + " at line " +
                     std::to_string(e.source().begin.line) + ", column " + std::to_string(e.source().begin.column));
  }
  Torchtitan t;
  const toml::node_view<toml::node> section = doc["parallelism"];
  if (!section) return t;
  if (!section.is_table()) throw InvalidArgument(where + ": 'parallelism' is not a table");
  auto read = [&](const char* key, int64_t& into) {
    const toml::node_view<toml::node> v = section[key];
    if (!v) return;
    if (!v.is_integer()) throw InvalidArgument(where + ": parallelism." + key + " is not an integer");
    into = v.as_integer()->get();
  };
  read("data_parallel_replicate_degree", t.dp_replicate);
  read("data_parallel_shard_degree", t.dp_shard);
  read("context_parallel_degree", t.cp);
  read("tensor_parallel_degree", t.tp);
  read("pipeline_parallel_degree", t.pp);
  read("expert_parallel_degree", t.ep);
  int64_t etp = 1;
  read("expert_tensor_parallel_degree", etp);
  if (etp != 1) {
    throw InvalidArgument(where + ": parallelism.expert_tensor_parallel_degree=" + std::to_string(etp) +
                          ": torchtitan removed expert tensor parallelism; only 1 is accepted");
  }
  if (const toml::node_view<toml::node> b = section["spmd_backend"]) {
    if (!b.is_string()) throw InvalidArgument(where + ": parallelism.spmd_backend is not a string");
    t.spmd_backend = b.as_string()->get();
  }
  return t;
}

MeshRecipe recipe(const std::string& spec, std::optional<int64_t> world_size) {
  const auto colon = spec.find(':');
  const std::string framework = spec.substr(0, colon);
  const std::string body = colon == std::string::npos ? "" : spec.substr(colon + 1);
  if (framework == "torchtitan") {
    if (!body.empty() && body.find('=') == std::string::npos) {
      return torchtitan_recipe(torchtitan_from_toml(body), world_size);
    }
    return torchtitan_recipe(torchtitan_from_items(body), world_size);
  }
  if (framework == "megatron") return megatron_recipe(megatron_from_items(body), world_size);
  throw InvalidArgument("--preset " + quote_input(spec) +
                        ": expected torchtitan:KEY=V,..., torchtitan:FILE.toml or megatron:KEY=V,...");
}

}  // namespace meshsim::preset
