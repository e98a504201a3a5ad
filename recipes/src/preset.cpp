#include "meshsim/preset.hpp"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <map>
#include <set>
#include <toml++/toml.h>
#include <vector>

#include "meshsim/text_fields.hpp"
#include "meshsim/error.hpp"
#include "meshsim/text_file.hpp"
#include "meshsim/torchtitan_job.hpp"
#include "toml_file.hpp"

namespace meshsim::preset {

namespace {

const std::string kTitan = "--preset torchtitan: ";
const std::string kMegatron = "--preset megatron: ";
const std::string kTitanFile = "--preset torchtitan:";  // a job file: torchtitan_job.hpp reads it

using text::checked_mul;

constexpr std::size_t kMaxTomlBytes = std::size_t{1} << 20;  // a --model file (a few lines)

// Items are KEY=VALUE pairs as given, each key once.
std::map<std::string, std::string> items(const std::string& body, const std::string& where,
                                         const std::set<std::string>& known) {
  std::map<std::string, std::string> out;
  if (body.empty()) return out;  // every key at its default
  for (const std::string& kv : text::split(body, ',')) {
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
  return it == kv.end() ? fallback : text::parse_int(it->second, where + key);
}

void check_at_least_one(int64_t v, const std::string& key, const std::string& where) {
  if (v < 1) throw InvalidArgument(where + key + "=" + std::to_string(v) + " is not >= 1");
}

// over_world starts a preset's recipe: a 1-D world, unflattened into its views, the result
// the dense view.
RecipeBuilder over_world(int64_t world) {
  RecipeBuilder b = RecipeBuilder::over_world(world);
  b.result("dense");
  return b;
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
  for (const std::string& t : text::split(order, '-')) {
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

// edit_distance is Levenshtein's, for naming the known key nearest a misspelled one.
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      const bool same = std::tolower(static_cast<unsigned char>(a[i - 1])) == std::tolower(static_cast<unsigned char>(b[j - 1]));
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (same ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string did_you_mean(const std::string& name, const std::vector<std::string>& known) {
  std::string best;
  std::size_t best_d = SIZE_MAX;
  for (const std::string& k : known) {
    const std::size_t d = edit_distance(name.substr(0, 256), k);
    if (d < best_d) best_d = d, best = k;
  }
  if (best_d > std::max<std::size_t>(2, best.size() / 3)) return "";
  return " (did you mean '" + best + "'?)";
}

TorchtitanViews torchtitan_views(Torchtitan t, std::optional<int64_t> world_size) {
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
  const int64_t others = checked_mul(checked_mul(checked_mul(t.pp, t.dp_replicate, kTitan + factors), t.cp, kTitan + factors), t.tp,
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
  const int64_t product = checked_mul(others, t.dp_shard, kTitan + "the product of the degrees");
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
  TorchtitanViews v;
  v.world = world;
  v.degrees = t;
  v.dense = {{"pp", "dp_replicate", "dp_shard", "cp", "tp"}, {t.pp, t.dp_replicate, t.dp_shard, t.cp, t.tp}};
  v.sparse = {{"pp", "dp_replicate", "efsdp", "ep"}, {t.pp, t.dp_replicate, sparse_region / t.ep, t.ep}};
  return v;
}

MeshRecipe torchtitan_recipe(const Torchtitan& given, std::optional<int64_t> world_size) {
  const TorchtitanViews v = torchtitan_views(given, world_size);
  const Torchtitan& t = v.degrees;
  const int64_t world = v.world;
  const int64_t batch = t.dp_replicate * t.dp_shard;
  RecipeBuilder r = over_world(world);
  r.unflatten("root", "world", {t.pp, batch, t.cp, t.tp}, {"pp", "batch", "cp", "tp"}).let("dataloading");
  r.slice("dataloading", {"batch", "cp"});
  r.flatten("_last", "loss_mesh").let("loss");
  if (t.spmd_backend == "spmd_types") {
    r.unflatten("root", "world", v.dense.sizes, v.dense.names).let("dense");
    // torchtitan keeps only its dp, cp, tp slice of this one
    r.unflatten("root", "world", {t.pp, batch, t.cp, t.tp}, {"pp", "dp", "cp", "tp"});
    r.slice("_last", {"dp", "cp", "tp"}).let("spmd_dense_for_fwdbwd");
  } else {
    r.unflatten("root", "world", {t.pp, t.dp_replicate, t.dp_shard * t.cp, t.tp}, {"pp", "dp_replicate", "fsdp", "tp"})
        .let("dense");
  }
  r.unflatten("root", "world", v.sparse.sizes, v.sparse.names).let("sparse");
  if (t.spmd_backend == "spmd_types" && t.ep > 1) {
    r.slice("sparse", {"dp_replicate", "efsdp", "ep"}).let("spmd_sparse_for_fwdbwd");
  }
  return r.take();
}

MegatronViews megatron_views(const Megatron& m, std::optional<int64_t> world_size) {
  const int64_t etp = m.etp.value_or(m.tp);
  for (const auto& [key, v] : {std::pair<const char*, int64_t>{"tp", m.tp}, {"pp", m.pp}, {"cp", m.cp},
                               {"ep", m.ep}, {"etp", etp}}) {
    check_at_least_one(v, key, kMegatron);
  }
  if (m.dp) check_at_least_one(*m.dp, "dp", kMegatron);
  if (world_size && *world_size < 1) {
    throw InvalidArgument("--world-size " + std::to_string(*world_size) + " is not >= 1");
  }
  const int64_t model = checked_mul(checked_mul(m.tp, m.pp, kMegatron + "tp * pp * cp"), m.cp, kMegatron + "tp * pp * cp");
  if (!world_size && !m.dp) {
    throw InvalidArgument(kMegatron + "dp is inferred from the world size: give --world-size or dp");
  }
  const int64_t world = world_size ? *world_size : checked_mul(model, *m.dp, kMegatron + "tp * pp * cp * dp");
  if (world % model != 0) {
    throw InvalidArgument(kMegatron + "world_size (" + std::to_string(world) + ") is not divisible by tp * pp * cp (" +
                          std::to_string(model) + ")");
  }
  const int64_t dp = world / model;
  if (m.dp && *m.dp != dp) {
    throw InvalidArgument(kMegatron + "dp=" + std::to_string(*m.dp) + " but the world size " + std::to_string(world) +
                          " / (tp * pp * cp) is " + std::to_string(dp));
  }
  const int64_t expert_model = checked_mul(checked_mul(etp, m.ep, kMegatron + "etp * ep * pp"), m.pp, kMegatron + "etp * ep * pp");
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
  MegatronViews v;
  v.world = world;
  view_dims(dense, "ep", {}, v.dense.sizes, v.dense.names);
  view_dims(expert, "cp", {{"tp", "etp"}, {"dp", "edp"}}, v.expert.sizes, v.expert.names);
  return v;
}

MeshRecipe megatron_recipe(const Megatron& m, std::optional<int64_t> world_size) {
  const MegatronViews v = megatron_views(m, world_size);
  RecipeBuilder r = over_world(v.world);
  r.unflatten("root", "world", v.dense.sizes, v.dense.names).let("dense");
  r.slice("dense", in_mesh_order(v.dense.names, {"dp", "cp"}));
  r.flatten("_last", "dp_cp").let("dp_cp");
  r.slice("dense", in_mesh_order(v.dense.names, {"tp", "pp"}));
  r.flatten("_last", "mp").let("mp");
  r.unflatten("root", "world", v.expert.sizes, v.expert.names).let("expert");
  return r.take();
}

Megatron megatron_spec(const std::string& spec) {
  const auto colon = spec.find(':');
  if (spec.substr(0, colon) != "megatron") throw InvalidArgument("--preset " + quote_input(spec) + ": expected megatron:KEY=V,...");
  return megatron_from_items(colon == std::string::npos ? "" : spec.substr(colon + 1));
}

Torchtitan torchtitan_spec(const std::string& spec) {
  const auto colon = spec.find(':');
  if (spec.substr(0, colon) != "torchtitan") {
    throw InvalidArgument("--preset " + quote_input(spec) + ": expected torchtitan:KEY=V,... or torchtitan:FILE.toml");
  }
  const std::string body = colon == std::string::npos ? "" : spec.substr(colon + 1);
  if (!body.empty() && body.find('=') == std::string::npos) return torchtitan::read_job_file(body, kTitanFile).degrees;
  return torchtitan_from_items(body);
}

std::optional<TomlTable> read_toml_table(const std::string& path, const std::string& table, const std::string& what,
                                         const std::string& where) {
  toml::table doc = detail::parse_toml_file(path, kMaxTomlBytes, what, where);
  const toml::node_view<toml::node> section = doc[table];
  if (!section) return std::nullopt;
  if (!section.is_table()) throw InvalidArgument(where + ": " + quote_input(table) + " is not a table");
  TomlTable out;
  for (const auto& [key, node] : *section.as_table()) {
    const std::string k(key.str());
    if (const auto* i = node.as_integer()) out.integers[k] = i->get();
    else if (const auto* f = node.as_floating_point()) out.floats[k] = f->get();
    else if (const auto* b = node.as_boolean()) out.booleans[k] = b->get();
    else if (const auto* t = node.as_string()) out.strings[k] = t->get();
    else throw InvalidArgument(where + ": " + table + "." + quote_input(k) + " is not a number, boolean or string");
  }
  return out;
}

MeshRecipe recipe(const std::string& spec, std::optional<int64_t> world_size) {
  const auto colon = spec.find(':');
  const std::string framework = spec.substr(0, colon);
  const std::string body = colon == std::string::npos ? "" : spec.substr(colon + 1);
  if (framework == "torchtitan") {
    if (!body.empty() && body.find('=') == std::string::npos) {
      return torchtitan_recipe(torchtitan::read_job_file(body, kTitanFile).degrees, world_size);
    }
    return torchtitan_recipe(torchtitan_from_items(body), world_size);
  }
  if (framework == "megatron") return megatron_recipe(megatron_from_items(body), world_size);
  throw InvalidArgument("--preset " + quote_input(spec) +
                        ": expected torchtitan:KEY=V,..., torchtitan:FILE.toml or megatron:KEY=V,...");
}

}  // namespace meshsim::preset
