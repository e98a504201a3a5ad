#include "meshsim/mesh_program.hpp"

#include <algorithm>
#include <chrono>
#include <set>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "meshsim/creation_plan.hpp"
#include "meshsim/json_codec.hpp"
#include "meshsim/recipe.hpp"
#include "meshsim/error.hpp"

namespace meshsim::query {

namespace {

using Json = nlohmann::json;
using json::find;
using json::need;
using json::need_object;
using json::to_names;

// Program is a decoded and applied request: the world it runs in, the rank it runs as, and the
// meshes its recipe made.
struct Program {
  MeshRecipe recipe;
  int64_t world = 0;
  std::optional<int64_t> rank;
  BuiltMeshes built;
  int64_t budget = kDefaultMaxAnswerElements;  // elements the answer may hold
  int64_t budget_left = budget;                  // of which still unused
};

Program run(const Json& req, int64_t max_elements = kDefaultMaxAnswerElements,
            const std::optional<DeviceMesh>& shared_root = std::nullopt) {
  MeshRecipe recipe = recipe_from_json(req);
  BuiltMeshes built = meshsim::apply(recipe, shared_root);
  int64_t world = recipe.world_size;
  if (world == 0) world = built.root.rank_map_size();
  std::optional<int64_t> rank = recipe.rank;
  return Program{std::move(recipe), world, rank, std::move(built), max_elements, max_elements};
}

// budget charges `keys` entries of `per_key` values each, plus `overhead` per entry (the key,
// a handle's fields), to the answer's one element budget, before anything is built. Sizes near
// 2^63 are compared without forming a sum or product that may overflow, and named as given.
void budget(Program& p, int64_t keys, int64_t per_key, const char* field, int64_t overhead = 1) {
  const int64_t per = per_key > INT64_MAX - overhead ? INT64_MAX : per_key + overhead;
  if (keys > p.budget_left / per) {
    throw ResourceExhausted("'" + std::string(field) + "' would list " + std::to_string(keys) +
                            " x " + std::to_string(per_key) + " values, over what is left of the "
                            "answer's budget of " + std::to_string(p.budget) +
                            " elements (ask for fewer fields with 'want', or raise the budget "
                            "with --max-elements)");
  }
  p.budget_left -= keys * per;
}

Json opt_list(const std::optional<std::vector<int64_t>>& v) { return v ? Json(*v) : Json(nullptr); }

// per_rank lists the ranks a per-rank map describes: every world rank for a root, the root's
// rank map (ascending) for a derived mesh.
std::vector<int64_t> per_rank_keys(Program& p, const DeviceMesh& m, int64_t per_key,
                                   const char* field) {
  if (m.is_root()) {
    budget(p, p.world, per_key, field);
    std::vector<int64_t> out(static_cast<std::size_t>(p.world));
    for (int64_t r = 0; r < p.world; ++r) out[static_cast<std::size_t>(r)] = r;
    return out;
  }
  budget(p, m.rank_map_size(), per_key, field);
  std::vector<int64_t> out = m.rank_map();
  std::sort(out.begin(), out.end());
  return out;
}

const std::vector<std::string>& all_fields() {
  static const std::vector<std::string> f{
      "mesh_dim_names",     "layout",         "shape",     "ndim",       "size",
      "rank_map",           "mesh_by_rank",   "coordinate_by_rank",      "groups_by_dim",
      "local_rank_by_rank", "backend_by_dim", "coordinate", "local_rank", "my_groups"};
  return f;
}

// options_json is a config's options object: its extras, as given.
Json options_json(const BackendConfig& c) {
  Json out = Json::object();
  for (const auto& [k, v] : c.extras) std::visit([&](const auto& x) { out[k] = x; }, v);
  return out;
}

// handle_json is one GroupHandle: the rank's group, its backend, config, description and the
// cache identity of its record.
Json handle_json(const GroupHandle& h) {
  return Json{{"ranks", h.ranks},
              {"pg_ranks", h.pg_ranks},
              {"backend", h.backend.empty() ? Json(nullptr) : Json(h.backend)},
              {"timeout_ms", h.config.timeout.count()},
              {"config", h.config.to_string()},
              {"options", options_json(h.config)},
              {"group_desc", h.group_desc},
              {"name", h.name}};
}

// creation_plan_json is the recipe's creation plan as `me` makes it, charged to the budget.
Json creation_plan_of(Program& p, int64_t me) {
  return creation_plan_json(creation_plan(p.recipe, p.built), me, [&p](int64_t keys, int64_t per_key, int64_t overhead) {
    budget(p, keys, per_key, "creation_plan", overhead);
  });
}

Json field(Program& p, const DeviceMesh& m, const std::string& name) {
  const int64_t me = p.rank.value_or(0);
  if (name == "creation_plan") return creation_plan_of(p, me);
  if (name == "device_type") return Json(m.device_type());
  if (name == "warnings") {
    budget(p, static_cast<int64_t>(p.built.warnings.size()), 1, "warnings");
    return Json(p.built.warnings);
  }
  if (name == "get_group_by_view") {
    // get_group of the root, then of every handle bound by `let` (by name): the cache counts
    // each, so a following cache_stats shows which views reused another's groups.
    std::vector<std::pair<std::string, const DeviceMesh*>> views{{"root", &p.built.root}};
    for (const auto& [h, mesh] : p.built.handles) views.emplace_back(h, &mesh);
    Json out = Json::object();
    for (const auto& [h, mesh] : views) {
      budget(p, mesh->ndim(), mesh->size(), "get_group_by_view", 7);
      Json dims = Json::object();
      for (int d = 0; d < mesh->ndim(); ++d) dims[mesh->dim_name(d)] = handle_json(mesh->get_group(me, d));
      out[h] = std::move(dims);
    }
    return out;
  }
  if (name == "get_group" || name == "get_all_groups") {
    // get_group: the rank's handle for every dim by name (on a root, its flattened names too);
    // get_all_groups: the list PyTorch's get_all_groups returns. PyTorch's errors where its
    // call fails (no process groups, a rank outside the mesh).
    std::vector<std::string> extra;
    if (name == "get_group" && m.is_root()) {
      for (const std::string& f : m.flattened_names()) {
        if (!m.names() || std::find(m.names()->begin(), m.names()->end(), f) == m.names()->end()) extra.push_back(f);
      }
    }
    budget(p, m.ndim() + static_cast<int64_t>(extra.size()), m.size(), name.c_str(), 7);
    if (name == "get_all_groups") {
      Json out = Json::array();
      for (const GroupHandle& h : m.get_all_groups(me)) out.push_back(handle_json(h));
      return out;
    }
    Json out = Json::object();
    for (int d = 0; d < m.ndim(); ++d) out[m.dim_name(d)] = handle_json(m.get_group(me, d));
    for (const std::string& f : extra) out[f] = handle_json(m.get_group(me, std::string_view(f)));
    return out;
  }
  if (name == "mesh_dim_names") return m.names() ? Json(*m.names()) : Json(nullptr);
  if (name == "layout") return json::from_layout(m.layout());
  if (name == "shape") return Json(m.shape());
  if (name == "ndim") return Json(m.ndim());
  if (name == "size") return Json(m.size());
  if (name == "rank_map") {
    budget(p, m.rank_map_size(), 0, "rank_map");
    return Json(m.rank_map());
  }
  if (name == "mesh_by_rank") {
    Json out = Json::object();
    for (int64_t r : per_rank_keys(p, m, m.size(), "mesh_by_rank")) {
      auto a = m.mesh_for(r);
      out[std::to_string(r)] = a ? nested(*a) : Json(nullptr);
    }
    return out;
  }
  if (name == "coordinate_by_rank" || name == "local_rank_by_rank") {
    Json out = Json::object();
    for (int64_t r : per_rank_keys(p, m, m.ndim(), name.c_str())) {
      out[std::to_string(r)] = opt_list(m.coordinate(r));
    }
    return out;
  }
  if (name == "groups_by_dim") {
    budget(p, m.rank_map_size(), m.ndim(), "groups_by_dim");
    Json out = Json::object();
    for (int d = 0; d < m.ndim(); ++d) out[m.dim_name(d)] = Json(m.groups(d));
    return out;
  }
  if (name == "coordinate" || name == "local_rank") return opt_list(m.coordinate(me));
  if (name == "backend_by_dim") {
    Json out = Json::object();
    for (int d = 0; d < m.ndim(); ++d) out[m.dim_name(d)] = m.backend_config(d).to_string();
    return out;
  }
  if (name == "get_local_rank") {
    if (m.ndim() > 1) {
      throw FailedPrecondition("Optional kwarg `mesh_dim` needs to be specified when "
                               "device_mesh.ndim > 1.");
    }
    return m.local_rank(me, 0) ? Json(*m.local_rank(me, 0)) : Json(nullptr);
  }
  if (name == "root") {
    DeviceMesh r = m.root();
    return Json{{"mesh_dim_names", r.names() ? Json(*r.names()) : Json(nullptr)},
                {"layout", json::from_layout(r.layout())},
                {"shape", r.shape()}};
  }
  if (name == "root_dim_index") {
    // Each dim's index among the root's names (PyTorch's get_root_mesh_dim); null when the dim
    // is not a root dim (a flattened or unflattened one).
    Json out = Json::object();
    const DeviceMesh root = m.root();
    const MeshNames& rn = root.names();
    for (int d = 0; d < m.ndim(); ++d) {
      Json idx = nullptr;
      if (rn && m.names()) {
        auto it = std::find(rn->begin(), rn->end(), (*m.names())[static_cast<std::size_t>(d)]);
        if (it != rn->end()) idx = it - rn->begin();
      }
      out[m.dim_name(d)] = idx;
    }
    return out;
  }
  if (name == "flattened") {
    Json out = Json::array();
    for (const auto& [n, l] : m.flattened()) out.push_back(Json{{"name", n}, {"layout", json::from_layout(l)}});
    return out;
  }
  if (name == "cache_stats") {
    const CacheStats c = m.cache_stats();
    return Json{{"hits", c.hits}, {"misses", c.misses}, {"size", c.size}};
  }
  if (name == "my_groups") {
    for (int d = 0; d < m.ndim(); ++d) budget(p, 1, m.size(d), "my_groups");
    Json out = Json::object();
    for (int d = 0; d < m.ndim(); ++d) out[m.dim_name(d)] = opt_list(m.group_of(me, d));
    return out;
  }
  throw InvalidArgument("unknown result field " + quote_input(name) + "; known fields: mesh_dim_names, "
                        "layout, shape, ndim, size, rank_map, mesh_by_rank, coordinate_by_rank, "
                        "groups_by_dim, local_rank_by_rank, backend_by_dim, coordinate, local_rank, my_groups, "
                        "get_local_rank, root, root_dim_index, flattened, cache_stats, device_type, get_group, "
                        "get_all_groups, warnings, creation_plan");
}

}  // namespace

Json nested(const MeshArray& a) {
  std::size_t pos = 0;
  auto rec = [&](auto&& self, std::size_t dim) -> Json {
    Json arr = Json::array();
    for (int64_t i = 0; i < a.shape[dim]; ++i) {
      if (dim + 1 == a.shape.size()) {
        arr.push_back(a.values[pos++]);
      } else {
        arr.push_back(self(self, dim + 1));
      }
    }
    return arr;
  };
  return rec(rec, 0);
}

DeviceMesh build_mesh_program(const Json& request) {
  Program p = run(request);
  return p.built.result;
}

Json describe(const MeshRecipe& recipe, const BuiltMeshes& built, const std::vector<std::string>& want,
              int64_t max_elements) {
  int64_t world = recipe.world_size;
  if (world == 0) world = built.root.rank_map_size();
  Program p{recipe, world, recipe.rank, built, max_elements, max_elements};
  Json out = Json::object();
  for (const std::string& f : want) out[f] = field(p, built.result, f);
  return out;
}

Json run_mesh_program(const Json& request, int64_t max_elements) {
  Program p = run(request, max_elements);
  DeviceMesh m = p.built.result;
  std::vector<std::string> want;
  if (const Json* w = find(request, "want"); w && !w->is_null()) {
    want = to_names(*w, "want");
    std::set<std::string> seen;
    for (const std::string& f : want) {
      if (!seen.insert(f).second) throw InvalidArgument("'want' names the field " + quote_input(f) + " twice");
    }
  } else {
    want.assign(all_fields().begin(), all_fields().end() - 4);  // PyTorch's fields
  }
  Json out = Json::object();
  for (const std::string& f : want) out[f] = field(p, m, f);
  return out;
}

Json run_mesh_equal(const Json& request) {
  const Json& a = need_object(need(request, "a", "mesh.equal"), "'a'");
  const Json& b = need_object(need(request, "b", "mesh.equal"), "'b'");
  bool same_root = false;
  if (const Json* s = find(request, "same_root"); s && !s->is_null()) {
    if (!s->is_boolean()) throw InvalidArgument("'same_root' must be a boolean");
    same_root = s->get<bool>();
  }
  Program pa = run(a);
  DeviceMesh ma = pa.built.result;
  Json b_req = b;
  if (same_root) {
    if (!b_req.contains("world_size")) b_req["world_size"] = pa.world;
  }
  Program pb = same_root ? run(b_req, kDefaultMaxAnswerElements, pa.built.root) : run(b_req);
  DeviceMesh mb = pb.built.result;
  return Json{{"equal", ma == mb},
              {"hash_equal", ma.hash() == mb.hash()},
              {"equivalent", equivalent(ma, mb)}};
}

}  // namespace meshsim::query
