#include "meshsim/recipe.hpp"
#include "meshsim/text_file.hpp"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <set>
#include <sstream>

#include "meshsim/error.hpp"
#include "meshsim/json_codec.hpp"

namespace meshsim {

namespace {

using Json = nlohmann::json;
using json::check_keys;
using json::find;
using json::need;
using json::need_object;
using json::to_names;
using json::to_str;

const Json* present(const Json& obj, std::string_view key) {
  const Json* j = find(obj, key);
  return j && !j->is_null() ? j : nullptr;
}

MeshNames optional_names(const Json& obj, std::string_view key) {
  const Json* j = present(obj, key);
  if (!j) return std::nullopt;
  return to_names(*j, key);
}

// read_nested flattens a rectangular nested list of ints into shape + row-major values.
void read_nested(const Json& j, std::size_t depth, std::vector<int64_t>& shape,
                 std::vector<int64_t>& values) {
  if (!j.is_array()) {
    if (depth != shape.size()) {
      throw InvalidArgument("'mesh' is not rectangular: a rank at depth " + std::to_string(depth) +
                            " where the mesh has " + std::to_string(shape.size()) + " dims");
    }
    values.push_back(json::to_int(j, "mesh"));
    return;
  }
  if (j.empty()) throw InvalidArgument("'mesh' has an empty list (mesh sizes must be >= 1)");
  if (depth >= static_cast<std::size_t>(kMaxMeshDims)) {
    throw InvalidArgument("'mesh' nests deeper than " + std::to_string(kMaxMeshDims) + " dims");
  }
  if (depth == shape.size()) {
    if (!values.empty()) {
      throw InvalidArgument("'mesh' is not rectangular: a list at depth " + std::to_string(depth) +
                            " where the mesh holds ranks");
    }
    shape.push_back(static_cast<int64_t>(j.size()));
  } else if (shape[depth] != static_cast<int64_t>(j.size())) {
    throw InvalidArgument("'mesh' is not rectangular: a list of " + std::to_string(j.size()) +
                          " at depth " + std::to_string(depth) + " where the others have " +
                          std::to_string(shape[depth]));
  }
  for (const Json& e : j) read_nested(e, depth + 1, shape, values);
}

BackendConfig config_from_json(const Json& v, std::string_view where) {
  BackendConfig c;
  if (v.is_string()) {
    c.backend = v.get<std::string>();
    return c;
  }
  if (!v.is_object()) {
    throw InvalidArgument(std::string(where) + " must be a backend name, an object or null, got " +
                          json::short_dump(v));
  }
  check_keys(v, {"backend", "timeout_ms", "options"}, where);
  if (const Json* b = present(v, "backend")) c.backend = to_str(*b, "backend");
  auto set_timeout = [&](const Json& t) {
    const int64_t ms = json::to_int(t, "timeout_ms");
    if (ms < 0) throw InvalidArgument("timeout_ms " + std::to_string(ms) + " is negative");
    c.timeout = std::chrono::milliseconds(ms);
  };
  if (const Json* t = present(v, "timeout_ms")) set_timeout(*t);
  // PyTorch's Options object: string keys, scalar values; timeout_ms sets the group's timeout,
  // every other key is kept as given (unknown keys are not rejected).
  if (const Json* o = present(v, "options")) {
    if (!o->is_object()) throw InvalidArgument(std::string(where) + ": 'options' must be an object of key -> scalar");
    if (o->size() > 256) throw InvalidArgument(std::string(where) + ": 'options' holds over 256 keys");
    for (const auto& [k, val] : o->items()) {
      if (k == "timeout_ms") {
        set_timeout(val);
      } else if (val.is_boolean()) {
        c.extras[k] = val.get<bool>();
      } else if (val.is_number_integer()) {
        c.extras[k] = json::to_int(val, "options." + k);
      } else if (val.is_number_float()) {
        c.extras[k] = val.get<double>();
      } else if (val.is_string()) {
        c.extras[k] = val.get<std::string>();
      } else {
        throw InvalidArgument(std::string(where) + ": option " + quote_input(k) + " must be a boolean, number or string, got " +
                              json::short_dump(val));
      }
    }
  }
  return c;
}

std::vector<DimOverride> overrides_from_json(const Json& j) {
  if (!j.is_object()) throw InvalidArgument("'backend_override' must be an object of dim -> backend");
  std::vector<DimOverride> out;
  for (const auto& [k, v] : j.items()) {
    DimOverride o{k, std::nullopt};
    if (!v.is_null()) o.config = config_from_json(v, "backend_override value for dim " + k);
    out.push_back(std::move(o));
  }
  return out;
}

RootSpec root_from_json(const Json& build) {
  need_object(build, "'build'");
  if (build.size() != 1) {
    throw InvalidArgument(
        "'build' must hold exactly one of 'init_device_mesh', 'DeviceMesh', 'from_group' or "
        "'from_logical'");
  }
  RootSpec r;
  const std::string kind = build.begin().key();
  const Json& body = build.begin().value();
  need_object(body, "'" + kind + "'");
  if (kind == "init_device_mesh" || kind == "from_logical") {
    r.kind = kind == "init_device_mesh" ? RootSpec::Kind::kInit : RootSpec::Kind::kLogical;
    check_keys(body, {"mesh_shape", "mesh_dim_names", "device_type", "backend_override", "_init_backend", "default_backend", "bound_device",
                      "new_group_use_split_group", "use_torchcomms", "torch_version"}, kind);
    r.shape = json::to_int_list(need(body, "mesh_shape", kind), "mesh_shape");
  } else if (kind == "DeviceMesh") {
    r.kind = RootSpec::Kind::kRanks;
    check_keys(body, {"mesh", "mesh_dim_names", "device_type", "backend_override", "_init_backend", "default_backend", "bound_device",
                      "new_group_use_split_group", "use_torchcomms", "torch_version"}, kind);
    const Json& mesh = need(body, "mesh", kind);
    if (!mesh.is_array()) throw InvalidArgument("'mesh' must be a (nested) list of ranks");
    read_nested(mesh, 0, r.shape, r.ranks);
  } else if (kind == "from_group") {
    r.kind = RootSpec::Kind::kGroup;
    check_keys(body, {"group", "groups", "mesh", "mesh_dim_names", "device_type", "backend_override", "_init_backend",
                      "default_backend", "bound_device", "new_group_use_split_group", "use_torchcomms", "torch_version"}, kind);
    // PyTorch's from_group(group | [groups], device_type, mesh=None, mesh_dim_names=None).
    if (body.contains("group") == body.contains("groups")) {
      throw InvalidArgument("'from_group' takes exactly one of 'group' (one group's ranks) or 'groups' (a list)");
    }
    // A group is its ranks, or {"ranks": [...], "name": "...", "backend": ...}: a ProcessGroup
    // handed with its own name and options, which the mesh keeps.
    auto read_group = [&r](const Json& g, const std::string& where) {
      if (!g.is_object()) {
        r.groups.push_back(json::to_int_list(g, where));
        r.group_names.emplace_back();
        r.group_descs.emplace_back();
        r.group_configs.emplace_back();
        return;
      }
      check_keys(g, {"ranks", "name", "desc", "backend"}, where);
      r.groups.push_back(json::to_int_list(need(g, "ranks", where), where + ".ranks"));
      std::optional<std::string> name;
      if (const Json* n = present(g, "name")) name = to_str(*n, where + ".name");
      r.group_names.push_back(std::move(name));
      std::optional<std::string> desc;
      if (const Json* d = present(g, "desc")) desc = to_str(*d, where + ".desc");
      r.group_descs.push_back(std::move(desc));
      std::optional<BackendConfig> config;
      if (const Json* b = present(g, "backend")) config = config_from_json(*b, where + ".backend");
      r.group_configs.push_back(std::move(config));
    };
    if (const Json* one = find(body, "group")) {
      read_group(*one, "group");
      r.ranks = r.groups.front();
      r.shape = {static_cast<int64_t>(r.ranks.size())};
    } else {
      const Json& list = body.at("groups");
      if (!list.is_array()) throw InvalidArgument("'groups' must be a list of groups (lists of ranks)");
      if (list.size() > static_cast<std::size_t>(kMaxMeshDims)) {
        throw InvalidArgument("'groups' lists " + std::to_string(list.size()) + " groups, over the limit of " +
                              std::to_string(kMaxMeshDims) + " dims");
      }
      for (std::size_t i = 0; i < list.size(); ++i) read_group(list[i], "groups[" + std::to_string(i) + "]");
      r.group_list = true;
    }
    if (const Json* m = present(body, "mesh")) {
      if (!m->is_array()) throw InvalidArgument("'mesh' must be a (nested) list of ranks");
      MeshArray a;
      read_nested(*m, 0, a.shape, a.values);
      r.mesh_arg = std::move(a);
      if (r.group_list) {
        r.shape = r.mesh_arg->shape;
        r.ranks = r.mesh_arg->values;
      }
    }
  } else {
    throw InvalidArgument("'build' must hold 'init_device_mesh', 'DeviceMesh', 'from_group' or "
                          "'from_logical', got " + quote_input(kind));
  }
  r.names = optional_names(body, "mesh_dim_names");
  // from_logical (meshsim's own; pytorch/pytorch#178550 proposed it, unmerged) builds on 'meta',
  // without process groups.
  if (r.kind == RootSpec::Kind::kLogical) r.device_type = "meta";
  if (const Json* dt = find(body, "device_type")) r.device_type = to_str(*dt, "device_type");
  if (const Json* bo = present(body, "backend_override")) r.backend_override = overrides_from_json(*bo);
  if (const Json* ib = present(body, "_init_backend")) {
    if (!ib->is_boolean()) throw InvalidArgument("'_init_backend' must be a boolean, got " + json::short_dump(*ib));
    r.init_backend = ib->get<bool>();
  }
  if (r.kind == RootSpec::Kind::kLogical && r.init_backend.value_or(false)) {
    throw InvalidArgument("from_logical builds no process groups: '_init_backend' cannot be true");
  }
  if (const Json* db = present(body, "default_backend")) r.default_backend = to_str(*db, "default_backend");
  if (const Json* tv = present(body, "torch_version")) r.torch_version = parse_torch_version(to_str(*tv, "torch_version"));
  // How PyTorch's world was set up decides how DeviceMesh creates its groups (the creation plan).
  for (auto [key, field] : {std::pair{"bound_device", &r.creation.bound_device},
                            std::pair{"new_group_use_split_group", &r.creation.new_group_use_split_group},
                            std::pair{"use_torchcomms", &r.creation.use_torchcomms}}) {
    if (const Json* b = present(body, key)) {
      if (!b->is_boolean()) throw InvalidArgument("'" + std::string(key) + "' must be a boolean, got " + json::short_dump(*b));
      *field = b->get<bool>();
    }
  }
  return r;
}

StepSpec step_from_json(const Json& s, std::size_t index) {
  const std::string where = "ops[" + std::to_string(index) + "]";
  need_object(s, where);
  check_keys(s, {"slice", "flatten", "unflatten", "concatenate", "transpose", "reshape", "find_flattened", "on", "let",
                 "backend"}, where);
  int kinds = 0;
  for (const char* k : {"slice", "flatten", "unflatten", "concatenate", "transpose", "reshape", "find_flattened"}) {
    kinds += s.contains(k);
  }
  if (kinds != 1) {
    throw InvalidArgument(where + " must hold exactly one of slice, flatten, unflatten, concatenate, transpose, reshape, "
                                  "find_flattened");
  }
  StepSpec st;
  if (const Json* on = present(s, "on")) st.on = to_str(*on, "on");
  if (const Json* let = present(s, "let")) {
    st.let = to_str(*let, "let");
    if (*st.let == "root" || *st.let == "_last") {
      throw InvalidArgument("'let' cannot rebind the reserved handle " + quote_input(*st.let));
    }
  }
  if (s.contains("backend") && !s.contains("flatten")) {
    throw InvalidArgument(where + ": 'backend' applies to a flatten step only");
  }
  if (const Json* j = find(s, "slice")) {
    st.kind = StepSpec::Kind::kSlice;
    st.names = j->is_string() ? std::vector<std::string>{j->get<std::string>()} : to_names(*j, "slice");
  } else if (const Json* ff = find(s, "find_flattened")) {
    st.kind = StepSpec::Kind::kFindFlattened;
    st.names = ff->is_string() ? std::vector<std::string>{ff->get<std::string>()} : to_names(*ff, "find_flattened");
  } else if (const Json* f = find(s, "flatten")) {
    st.kind = StepSpec::Kind::kFlatten;
    if (!f->is_null()) st.flatten_name = to_str(*f, "flatten");
    if (const Json* b = present(s, "backend")) st.flatten_config = config_from_json(*b, "'backend'");
  } else if (const Json* u = find(s, "unflatten")) {
    st.kind = StepSpec::Kind::kUnflatten;
    need_object(*u, "'unflatten'");
    check_keys(*u, {"dim", "sizes", "names", "backend_override"}, "unflatten");
    const Json& dim = need(*u, "dim", "unflatten");
    if (dim.is_string()) {
      st.dim_name = dim.get<std::string>();
    } else {
      st.dim_index = json::to_int(dim, "dim");
    }
    st.sizes = json::to_int_list(need(*u, "sizes", "unflatten"), "sizes");
    st.names = to_names(need(*u, "names", "unflatten"), "names");
    if (const Json* bo = present(*u, "backend_override")) st.backend_override = overrides_from_json(*bo);
  } else if (const Json* t = find(s, "transpose")) {
    st.kind = StepSpec::Kind::kTranspose;
    if (!t->is_array() || t->empty()) throw InvalidArgument("'transpose' must be a non-empty list of dim names or indices");
    if ((*t)[0].is_string()) {
      st.names = to_names(*t, "transpose");
    } else {
      for (const Json& d : *t) {
        const int64_t v = json::to_int(d, "transpose");
        if (v < 0 || v > kMaxMeshDims) throw OutOfRange("transpose: dim " + std::to_string(v) + " is out of range");
        st.order.push_back(static_cast<int>(v));
      }
    }
  } else if (const Json* r = find(s, "reshape")) {
    st.kind = StepSpec::Kind::kReshape;
    need_object(*r, "'reshape'");
    check_keys(*r, {"sizes", "names"}, "reshape");
    st.sizes = json::to_int_list(need(*r, "sizes", "reshape"), "sizes");
    st.names = to_names(need(*r, "names", "reshape"), "names");
  } else {
    st.kind = StepSpec::Kind::kConcatenate;
    const Json& list = s.at("concatenate");
    if (!list.is_array()) throw InvalidArgument("'concatenate' must be a list of handles");
    for (const Json& h : list) st.handles.push_back(to_str(h, "handle"));
  }
  return st;
}


// ---- apply ----

BackendConfig override_config(const DimOverride& o) { return o.config.value_or(BackendConfig{}); }

struct Handles {
  std::optional<DeviceMesh> root;
  std::optional<DeviceMesh> last;
  std::map<std::string, DeviceMesh> named;

  const DeviceMesh& get(const std::string& name) const {
    if (name == "root") return *root;
    if (name == "_last") return *last;
    auto it = named.find(name);
    if (it == named.end()) throw NotFound("unknown mesh handle " + quote_input(name));
    return it->second;
  }
};

DeviceMesh build_root(const RootSpec& r, int64_t world, std::optional<int64_t> rank) {
  RootOptions opts;
  opts.device_type = r.device_type;
  opts.init_backend = r.init_backend.value_or(r.kind != RootSpec::Kind::kLogical);
  opts.default_backend = r.default_backend;
  opts.torch_version = r.torch_version;
  if (world > 0 && r.kind != RootSpec::Kind::kLogical) opts.world_size = world;
  if (!r.backend_override.empty()) {
    opts.backend_override =
        resolve_backend_override(r.backend_override, r.names, static_cast<int>(r.shape.size()));
  }
  if (r.kind == RootSpec::Kind::kGroup) {
    // A handed group's own backend is its dim's config; naming one in backend_override too is
    // two answers to one question.
    for (std::size_t d = 0; d < r.group_configs.size() && d < r.shape.size(); ++d) {
      if (!r.group_configs[d]) continue;
      if (opts.backend_override.empty()) opts.backend_override.resize(r.shape.size());
      if (opts.backend_override[d] != BackendConfig{}) {
        throw InvalidArgument("from_group: group " + std::to_string(d) + " carries its own backend and "
                              "backend_override names its dim too");
      }
      opts.backend_override[d] = *r.group_configs[d];
    }
    if (std::any_of(r.group_names.begin(), r.group_names.end(), [](const auto& n) { return n.has_value(); })) {
      opts.group_names = r.group_names;
      opts.group_names.resize(r.shape.size());
    }
    if (std::any_of(r.group_descs.begin(), r.group_descs.end(), [](const auto& n) { return n.has_value(); })) {
      opts.group_descs = r.group_descs;
      opts.group_descs.resize(r.shape.size());
    }
  }
  switch (r.kind) {
    case RootSpec::Kind::kInit:
    case RootSpec::Kind::kLogical:
      return DeviceMesh::init(r.shape, r.names, opts);
    case RootSpec::Kind::kRanks:
      return DeviceMesh::from_ranks(r.shape, r.ranks, r.names, opts);
    case RootSpec::Kind::kGroup:
      return DeviceMesh::from_group(r.groups, r.group_list, r.mesh_arg, r.names, rank, opts);
  }
  throw Internal("unknown root kind");
}

// names_text lists names for a message: "['dp', 'cp']", each quoted clipped, at most 8 then a count.
std::string names_text(const std::vector<std::string>& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size() && i < 8; ++i) out += (i ? ", " : "") + quote_input(v[i]);
  if (v.size() > 8) out += ", ... (" + std::to_string(v.size()) + " in all)";
  return out + "]";
}

DeviceMesh apply_step(const StepSpec& s, const Handles& h) {
  const DeviceMesh& src = h.get(s.on);
  switch (s.kind) {
    case StepSpec::Kind::kSlice:
      return src.slice(s.names);
    case StepSpec::Kind::kFindFlattened: {
      std::optional<DeviceMesh> found = src.find_flattened(s.names);
      if (!found) {
        throw NotFound("find_flattened: no flattened mesh holds the dims " + names_text(s.names) + " of " + src.to_string() +
                       " (flatten them first; flattened names: " + names_text(src.flattened_names()) + ")");
      }
      return *found;
    }
    case StepSpec::Kind::kFlatten:
      return src.flatten(s.flatten_name, s.flatten_config);
    case StepSpec::Kind::kTranspose:
      return s.names.empty() ? src.transpose(std::span<const int>(s.order)) : src.transpose(std::span<const std::string>(s.names));
    case StepSpec::Kind::kReshape:
      return src.reshape(s.sizes, s.names);
    case StepSpec::Kind::kUnflatten: {
      // Overrides name the new dims; they are the configs of those dims.
      std::vector<BackendConfig> inner;
      if (!s.backend_override.empty()) {
        inner = resolve_backend_override(s.backend_override, MeshNames(s.names), static_cast<int>(s.sizes.size()));
      }
      return s.dim_name ? src.unflatten(*s.dim_name, s.sizes, s.names, std::move(inner))
                        : src.unflatten(s.dim_index, s.sizes, s.names, std::move(inner));
    }
    case StepSpec::Kind::kConcatenate: {
      std::vector<DeviceMesh> meshes;
      for (const std::string& name : s.handles) meshes.push_back(h.get(name));
      return DeviceMesh::concatenate(meshes);
    }
  }
  throw Internal("unknown step kind");
}

void check_rank_view(const std::optional<int64_t>& rank, const DeviceMesh& m) {
  if (rank && !m.is_root() && m.copies() > 1 && !m.contains(*rank)) {
    throw FailedPrecondition(
        "In order to get the mesh Tensor of a DeviceMesh it needs to either have all its original "
        "dimensions (e.g., no slicing) or it needs to contain the local rank: rank " +
        std::to_string(*rank) + " is not in " + m.to_string());
  }
}

}  // namespace

std::vector<BackendConfig> resolve_backend_override(const std::vector<DimOverride>& entries,
                                                    const MeshNames& names, int ndim) {
  if (names && static_cast<int>(names->size()) != ndim) {
    throw InvalidArgument("mesh_dim_names has " + std::to_string(names->size()) +
                          " names but the mesh has " + std::to_string(ndim) + " dims");
  }
  std::map<std::string, const DimOverride*> left;
  for (const DimOverride& e : entries) left.emplace(e.key, &e);
  std::vector<BackendConfig> out(static_cast<std::size_t>(ndim));
  for (int d = 0; d < ndim; ++d) {
    const std::string idx = std::to_string(d);
    const DimOverride* val = nullptr;
    if (names && left.count((*names)[static_cast<std::size_t>(d)])) {
      const std::string& name = (*names)[static_cast<std::size_t>(d)];
      if (left.count(idx)) {
        throw InvalidArgument("Found redundant dim index " + idx + " and name " + name +
                              " in backend_override");
      }
      val = left[name];
      left.erase(name);
    } else if (left.count(idx)) {
      val = left[idx];
      left.erase(idx);
    }
    if (val) out[static_cast<std::size_t>(d)] = override_config(*val);
  }
  if (!left.empty()) {
    std::string got;
    for (const auto& [k, _] : left) {
      const bool index = !k.empty() && std::all_of(k.begin(), k.end(), ::isdigit);
      got += (got.empty() ? "" : ", ") + (index ? k : "'" + k + "'");
    }
    std::string valid = "None";
    if (names) {
      valid = "(";
      for (std::size_t i = 0; i < names->size(); ++i) valid += (i ? ", '" : "'") + (*names)[i] + "'";
      valid += names->size() == 1 ? ",)" : ")";
    }
    throw InvalidArgument("Found invalid keys in backend_override: got [" + got +
                          "], expected integers in range [0, " + std::to_string(ndim) +
                          ") or one of " + valid);
  }
  return out;
}

BackendConfig backend_config_from_json(const Json& v, std::string_view where) {
  return v.is_null() ? BackendConfig{} : config_from_json(v, where);
}

std::vector<BackendConfig> backend_override_from_json(const Json& j, const MeshNames& names, int ndim) {
  return resolve_backend_override(overrides_from_json(j), names, ndim);
}

DeviceMesh with_new_dim_configs(const DeviceMesh& out, int first, const std::vector<BackendConfig>& inner) {
  std::vector<BackendConfig> all;
  for (int d = 0; d < out.ndim(); ++d) {
    const bool is_new = d >= first && d < first + static_cast<int>(inner.size());
    all.push_back(is_new ? inner[static_cast<std::size_t>(d - first)] : out.backend_config(d));
  }
  return out.with_backend_configs(std::move(all));
}

namespace {

// read_ranks is a list of ranks of the user's program: integers in [0, world) without repeats
// (PyTorch refuses the rest in new_group and split_group; 2.14 refuses a non-integer first, in
// its own words).
std::vector<int64_t> read_ranks(const Json& j, const std::string& where, int64_t world, TorchVersion v) {
  if (!j.is_array()) throw InvalidArgument(where + " must be a list of ranks, got " + json::short_dump(j));
  for (const Json& x : j) {
    if (!x.is_number_integer()) {
      throw InvalidArgument(where + (v == TorchVersion::k2_13 ? " must hold integers" : ": ranks must be a sequence of integers") +
                            ", got " + json::short_dump(x));
    }
  }
  std::vector<int64_t> ranks = json::to_int_list(j, where);
  std::vector<int64_t> seen = ranks;
  std::sort(seen.begin(), seen.end());
  for (std::size_t i = 0; i < seen.size(); ++i) {
    if (seen[i] < 0 || (world > 0 && seen[i] >= world)) {
      throw OutOfRange(where + ": Rank " + std::to_string(seen[i]) + " is out of range. Valid ranks are 0 to " +
                       std::to_string(world - 1) + " (world_size=" + std::to_string(world) + ")");
    }
    if (i > 0 && seen[i] == seen[i - 1]) {
      throw InvalidArgument(where + ": ranks list must not contain duplicate entries, got " + json::short_dump(j));
    }
  }
  return ranks;
}

}  // namespace

GroupProgram process_groups_from_json(const nlohmann::json& pg, int64_t world, TorchVersion v) {
  GroupProgram r;
  const std::string top = "'process_groups'";
  if (!pg.is_array()) throw InvalidArgument(top + " must be a list of calls, got " + json::short_dump(pg));
  if (pg.size() > kMaxGroupCalls) {
    throw ResourceExhausted(top + " holds " + std::to_string(pg.size()) + " calls, over the limit of " +
                            std::to_string(kMaxGroupCalls));
  }
  if (world < 1) throw InvalidArgument(top + " needs the program's world_size");
  bool marker = false;
  for (std::size_t i = 0; i < pg.size(); ++i) {
    const Json& c = pg[i];
    const std::string where = "process_groups[" + std::to_string(i) + "]";
    if (c.is_string() && c.get<std::string>() == "mesh") {
      if (marker) throw InvalidArgument(where + ": \"mesh\" (where the mesh's own calls go) is given twice");
      marker = true;
      r.mesh_at = r.calls.size();
      continue;
    }
    need_object(c, where);
    if (c.size() != 1 || !(c.contains("new_group") || c.contains("split_group"))) {
      throw InvalidArgument(where + " must be \"mesh\" or hold exactly one of 'new_group' or 'split_group', got " +
                            json::short_dump(c));
    }
    GroupCallSpec call;
    const bool split = c.contains("split_group");
    const Json& body = c.begin().value();
    need_object(body, where);
    if (const Json* d = present(body, "group_desc")) call.group_desc = to_str(*d, "group_desc");
    if (split) {
      call.kind = GroupCallSpec::Kind::kSplitGroup;
      check_keys(body, {"split_ranks", "group_desc"}, where + ".split_group");
      const Json& rows = need(body, "split_ranks", where + ".split_group");
      if (!rows.is_array() || rows.empty()) {
        throw InvalidArgument(where + ": split_ranks must be a non-empty list of groups, got " + json::short_dump(rows));
      }
      std::vector<int64_t> all;
      for (std::size_t k = 0; k < rows.size(); ++k) {
        const std::string w = where + ".split_ranks[" + std::to_string(k) + "]";
        std::vector<int64_t> row = read_ranks(rows[k], w, world, v);
        if (row.empty()) throw InvalidArgument(w + ": the split group cannot be empty");
        all.insert(all.end(), row.begin(), row.end());
        call.split_ranks.push_back(std::move(row));
      }
      std::sort(all.begin(), all.end());
      if (std::adjacent_find(all.begin(), all.end()) != all.end()) {
        throw InvalidArgument(where + ": rank " + std::to_string(*std::adjacent_find(all.begin(), all.end())) +
                              " is in two of split_ranks' groups (each rank splits into one)");
      }
    } else {
      check_keys(body, {"ranks", "use_local_synchronization", "group_desc"}, where + ".new_group");
      if (const Json* rk = present(body, "ranks")) call.ranks = read_ranks(*rk, where + ".ranks", world, v);
      if (const Json* ls = present(body, "use_local_synchronization")) {
        if (!ls->is_boolean()) {
          throw InvalidArgument("'use_local_synchronization' must be a boolean, got " + json::short_dump(*ls));
        }
        call.local_sync = ls->get<bool>();
      }
      if (call.local_sync && !call.ranks) {
        // Every rank, hashed: the name joins the whole world's ranks.
        if (world > kMaxWorldForHashedWorld) {
          throw ResourceExhausted(where + ": a use_local_synchronization new_group of every rank hashes the world's " +
                                  std::to_string(world) + " ranks, over the limit of " +
                                  std::to_string(kMaxWorldForHashedWorld) + "; give its ranks");
        }
        call.ranks.emplace(static_cast<std::size_t>(world));
        for (int64_t k = 0; k < world; ++k) (*call.ranks)[static_cast<std::size_t>(k)] = k;
      }
    }
    r.calls.push_back(std::move(call));
  }
  return r;
}

MeshRecipe recipe_from_json(const Json& req) {
  need_object(req, "program");
  MeshRecipe r;
  const Json& build = need(req, "build", "mesh.program");
  r.root = root_from_json(build);
  if (const Json* w = present(req, "world_size")) {
    r.world_size = json::to_int(*w, "world_size");
    if (r.world_size < 1) {
      throw InvalidArgument("world_size " + std::to_string(r.world_size) + " is not >= 1");
    }
  } else if (r.root.kind != RootSpec::Kind::kLogical) {
    need(req, "world_size", "mesh.program");
  }
  if (const Json* rk = present(req, "rank")) {
    r.rank = json::to_int(*rk, "rank");
    const int64_t world = r.world_size > 0 ? r.world_size : INT64_MAX;
    if (*r.rank < 0 || *r.rank >= world) {
      throw OutOfRange("rank " + std::to_string(*r.rank) + " is out of range [0, " +
                       std::to_string(r.world_size) + ")");
    }
  }
  if (const Json* ops = present(req, "ops")) {
    if (!ops->is_array()) throw InvalidArgument("'ops' must be a list of steps");
    if (ops->size() > static_cast<std::size_t>(kMaxRecipeSteps)) {
      throw ResourceExhausted("'ops' holds " + std::to_string(ops->size()) +
                              " steps, over the limit of " + std::to_string(kMaxRecipeSteps));
    }
    for (std::size_t i = 0; i < ops->size(); ++i) r.steps.push_back(step_from_json((*ops)[i], i));
  }
  if (const Json* res = present(req, "result")) r.result = to_str(*res, "handle");
  if (const Json* pg = present(req, "process_groups")) {
    GroupProgram g = process_groups_from_json(*pg, r.world_size, r.root.torch_version);
    r.process_groups = std::move(g.calls);
    r.mesh_at = g.mesh_at;
  }
  return r;
}

RecipeBuilder RecipeBuilder::over_world(int64_t world) {
  RecipeBuilder b;
  b.r_.world_size = world;
  b.r_.root.kind = RootSpec::Kind::kInit;
  b.r_.root.shape = {world};
  b.r_.root.names = std::vector<std::string>{"world"};
  return b;
}

RecipeBuilder& RecipeBuilder::unflatten(std::string on, std::string dim, std::vector<int64_t> sizes,
                                        std::vector<std::string> names) {
  StepSpec s;
  s.kind = StepSpec::Kind::kUnflatten;
  s.on = std::move(on);
  s.dim_name = std::move(dim);
  s.sizes = std::move(sizes);
  s.names = std::move(names);
  r_.steps.push_back(std::move(s));
  return *this;
}

RecipeBuilder& RecipeBuilder::slice(std::string on, std::vector<std::string> names) {
  StepSpec s;
  s.kind = StepSpec::Kind::kSlice;
  s.on = std::move(on);
  s.names = std::move(names);
  r_.steps.push_back(std::move(s));
  return *this;
}

RecipeBuilder& RecipeBuilder::flatten(std::string on, std::string name) {
  StepSpec s;
  s.kind = StepSpec::Kind::kFlatten;
  s.on = std::move(on);
  s.flatten_name = std::move(name);
  r_.steps.push_back(std::move(s));
  return *this;
}

RecipeBuilder& RecipeBuilder::let(std::string name) {
  if (r_.steps.empty()) throw InvalidArgument("RecipeBuilder::let(" + quote_input(name) + "): no step to name yet");
  r_.steps.back().let = std::move(name);
  return *this;
}

RecipeBuilder& RecipeBuilder::result(std::string handle) {
  r_.result = std::move(handle);
  return *this;
}

std::vector<View> views(const MeshRecipe& recipe) {
  std::vector<View> out{{"root", 0}};
  for (std::size_t k = 0; k < recipe.steps.size(); ++k) {
    if (recipe.steps[k].let) out.push_back({*recipe.steps[k].let, k + 1});
  }
  return out;
}

std::vector<std::string> shown_warnings(const std::vector<std::string>& all) {
  if (all.size() <= kShownWarnings) return all;
  std::vector<std::string> out(all.begin(), all.begin() + kShownWarnings);
  out.push_back("... and " + std::to_string(all.size() - kShownWarnings) + " more warnings");
  return out;
}

BuiltMeshes apply(const MeshRecipe& recipe, const std::optional<DeviceMesh>& shared_root) {
  // A view is known by its name: one name, one view (a second binding would leave two views of
  // one name in every report, and a lookup by name would find only the last).
  std::set<std::string> bound;
  for (std::size_t k = 0; k < recipe.steps.size(); ++k) {
    const std::optional<std::string>& let = recipe.steps[k].let;
    if (!let) continue;
    if (let->empty()) throw InvalidArgument("ops[" + std::to_string(k) + "]: 'let' names no view (an empty name)");
    if (!bound.insert(*let).second) {
      throw InvalidArgument("ops[" + std::to_string(k) + "]: 'let' binds " + quote_input(*let) +
                          " a second time (each view has one name; give this one another)");
    }
  }
  Handles h;
  h.root = shared_root ? *shared_root : build_root(recipe.root, recipe.world_size, recipe.rank);
  h.last = h.root;
  std::vector<DeviceMesh> meshes;
  meshes.reserve(recipe.steps.size());
  std::vector<std::string> warnings;
  for (std::size_t k = 0; k < recipe.steps.size(); ++k) {
    const StepSpec& s = recipe.steps[k];
    if (s.kind == StepSpec::Kind::kSlice) {
      for (const std::string& name : h.get(s.on).flattened_from_root(s.names)) {
        warnings.push_back("ops[" + std::to_string(k) + "]: " + flattened_slice_warning(name));
      }
    }
    DeviceMesh m = apply_step(s, h);
    check_rank_view(recipe.rank, m);
    if (s.let) h.named.insert_or_assign(*s.let, m);
    h.last = m;
    meshes.push_back(std::move(m));
  }
  DeviceMesh result = recipe.result ? h.get(*recipe.result) : *h.last;
  return BuiltMeshes{*h.root, std::move(meshes), std::move(h.named), std::move(result), std::move(warnings)};
}

}  // namespace meshsim
