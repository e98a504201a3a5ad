#include "mesh_program.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "json_codec.hpp"
#include "meshsim/error.hpp"

namespace meshsim::query {

namespace {

using Json = nlohmann::json;

const Json* find(const Json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

const Json& need(const Json& obj, const char* key, std::string_view where) {
  const Json* j = find(obj, key);
  if (!j) throw InvalidArgument(std::string(where) + ": missing field '" + key + "'");
  return *j;
}

const Json& need_object(const Json& j, std::string_view where) {
  if (!j.is_object()) throw InvalidArgument(std::string(where) + " must be an object, got " + j.dump());
  return j;
}

std::string to_str(const Json& j, std::string_view field) {
  if (!j.is_string()) {
    throw InvalidArgument("'" + std::string(field) + "' must be a string, got " + j.dump());
  }
  return j.get<std::string>();
}

std::vector<std::string> to_names(const Json& j, std::string_view field) {
  if (!j.is_array()) {
    throw InvalidArgument("'" + std::string(field) + "' must be a list of strings, got " + j.dump());
  }
  std::vector<std::string> out;
  for (const Json& e : j) out.push_back(to_str(e, field));
  return out;
}

MeshNames to_optional_names(const Json* j, std::string_view field) {
  if (!j || j->is_null()) return std::nullopt;
  return to_names(*j, field);
}

void check_keys(const Json& obj, std::initializer_list<const char*> allowed, std::string_view where) {
  for (const auto& [k, _] : obj.items()) {
    if (std::none_of(allowed.begin(), allowed.end(), [&](const char* a) { return k == a; })) {
      throw InvalidArgument(std::string(where) + ": unknown field '" + k + "'");
    }
  }
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

// backend_override normalises PyTorch's per-dim override dict: keys are a dim name or a dim
// index (a decimal string in JSON); values a backend name, {"backend"?, "timeout_ms"?} or null.
std::vector<BackendConfig> backend_override(const Json& j, const MeshNames& names, int ndim) {
  if (!j.is_object()) throw InvalidArgument("'backend_override' must be an object of dim -> backend");
  std::map<std::string, const Json*> left;
  for (const auto& [k, v] : j.items()) left.emplace(k, &v);
  std::vector<BackendConfig> out(static_cast<std::size_t>(ndim));
  for (int d = 0; d < ndim; ++d) {
    const std::string idx = std::to_string(d);
    const Json* val = nullptr;
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
    if (!val || val->is_null()) continue;
    BackendConfig& c = out[static_cast<std::size_t>(d)];
    if (val->is_string()) {
      c.backend = val->get<std::string>();
    } else if (val->is_object()) {
      check_keys(*val, {"backend", "timeout_ms"}, "backend_override value");
      if (const Json* b = find(*val, "backend"); b && !b->is_null()) c.backend = to_str(*b, "backend");
      if (const Json* t = find(*val, "timeout_ms"); t && !t->is_null()) {
        const int64_t ms = json::to_int(*t, "timeout_ms");
        if (ms < 0) throw InvalidArgument("timeout_ms " + std::to_string(ms) + " is negative");
        c.timeout = std::chrono::milliseconds(ms);
      }
    } else {
      throw InvalidArgument("backend_override value for dim " + idx +
                            " must be a backend name, an object or null, got " + val->dump());
    }
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

struct Program {
  int64_t world = 0;
  std::optional<int64_t> rank;  // explicit: run as this rank
  std::optional<DeviceMesh> root;
  std::map<std::string, DeviceMesh> handles;
  std::optional<DeviceMesh> last;
};

DeviceMesh build_root(const Json& build, int64_t world) {
  need_object(build, "'build'");
  if (build.size() != 1) {
    throw InvalidArgument("'build' must hold exactly one of 'init_device_mesh' or 'DeviceMesh'");
  }
  RootOptions opts;
  opts.world_size = world;
  if (const Json* init = find(build, "init_device_mesh")) {
    need_object(*init, "'init_device_mesh'");
    check_keys(*init, {"mesh_shape", "mesh_dim_names", "device_type", "backend_override"},
               "init_device_mesh");
    if (const Json* dt = find(*init, "device_type")) opts.device_type = to_str(*dt, "device_type");
    std::vector<int64_t> shape = json::to_int_list(need(*init, "mesh_shape", "init_device_mesh"),
                                                   "mesh_shape");
    MeshNames names = to_optional_names(find(*init, "mesh_dim_names"), "mesh_dim_names");
    if (const Json* bo = find(*init, "backend_override"); bo && !bo->is_null()) {
      opts.backend_override = backend_override(*bo, names, static_cast<int>(shape.size()));
    }
    return DeviceMesh::init(shape, std::move(names), opts);
  }
  if (const Json* dm = find(build, "DeviceMesh")) {
    need_object(*dm, "'DeviceMesh'");
    check_keys(*dm, {"mesh", "mesh_dim_names", "device_type", "backend_override"}, "DeviceMesh");
    if (const Json* dt = find(*dm, "device_type")) opts.device_type = to_str(*dt, "device_type");
    const Json& mesh = need(*dm, "mesh", "DeviceMesh");
    if (!mesh.is_array()) throw InvalidArgument("'mesh' must be a (nested) list of ranks");
    std::vector<int64_t> shape;
    std::vector<int64_t> values;
    read_nested(mesh, 0, shape, values);
    MeshNames names = to_optional_names(find(*dm, "mesh_dim_names"), "mesh_dim_names");
    if (const Json* bo = find(*dm, "backend_override"); bo && !bo->is_null()) {
      opts.backend_override = backend_override(*bo, names, static_cast<int>(shape.size()));
    }
    return DeviceMesh::from_ranks(shape, values, std::move(names), opts);
  }
  throw InvalidArgument("'build' must hold 'init_device_mesh' or 'DeviceMesh', got " + build.dump());
}

const DeviceMesh& handle(const Program& p, const Json& h) {
  const std::string name = to_str(h, "handle");
  if (name == "root") return *p.root;
  if (name == "_last") return *p.last;
  auto it = p.handles.find(name);
  if (it == p.handles.end()) throw NotFound("unknown mesh handle '" + name + "'");
  return it->second;
}

void check_rank_view(const Program& p, const DeviceMesh& m) {
  if (p.rank && !m.is_root() && m.copies() > 1 && !m.contains(*p.rank)) {
    throw FailedPrecondition(
        "In order to get the mesh Tensor of a DeviceMesh it needs to either have all its original "
        "dimensions (e.g., no slicing) or it needs to contain the local rank: rank " +
        std::to_string(*p.rank) + " is not in " + m.to_string());
  }
}

DeviceMesh step(const Program& p, const Json& s, std::size_t index) {
  const std::string where = "ops[" + std::to_string(index) + "]";
  need_object(s, where);
  check_keys(s, {"slice", "flatten", "unflatten", "concatenate", "on", "let"}, where);
  int kinds = 0;
  for (const char* k : {"slice", "flatten", "unflatten", "concatenate"}) kinds += s.contains(k);
  if (kinds != 1) {
    throw InvalidArgument(where + " must hold exactly one of slice, flatten, unflatten, concatenate");
  }
  const Json* on = find(s, "on");
  const DeviceMesh& src = on && !on->is_null() ? handle(p, *on) : *p.root;
  if (const Json* j = find(s, "slice")) {
    if (j->is_string()) return src.slice(j->get<std::string>());
    std::vector<std::string> names = to_names(*j, "slice");
    return src.slice(names);
  }
  if (const Json* j = find(s, "flatten")) {
    return src.flatten(j->is_null() ? std::nullopt : std::optional(to_str(*j, "flatten")));
  }
  if (const Json* j = find(s, "unflatten")) {
    need_object(*j, "'unflatten'");
    check_keys(*j, {"dim", "sizes", "names"}, "unflatten");
    const Json& dim = need(*j, "dim", "unflatten");
    std::vector<int64_t> sizes = json::to_int_list(need(*j, "sizes", "unflatten"), "sizes");
    std::vector<std::string> names = to_names(need(*j, "names", "unflatten"), "names");
    if (dim.is_string()) return src.unflatten(dim.get<std::string>(), sizes, names);
    return src.unflatten(json::to_int(dim, "dim"), sizes, names);
  }
  const Json& list = s.at("concatenate");
  if (!list.is_array()) throw InvalidArgument("'concatenate' must be a list of handles");
  std::vector<DeviceMesh> meshes;
  for (const Json& h : list) meshes.push_back(handle(p, h));
  return DeviceMesh::concatenate(meshes);
}

Program run(const Json& req, std::optional<DeviceMesh> shared_root = std::nullopt) {
  need_object(req, "program");
  Program p;
  p.world = json::to_int(need(req, "world_size", "mesh.program"), "world_size");
  if (p.world < 1) throw InvalidArgument("world_size " + std::to_string(p.world) + " is not >= 1");
  if (const Json* r = find(req, "rank"); r && !r->is_null()) {
    p.rank = json::to_int(*r, "rank");
    if (*p.rank < 0 || *p.rank >= p.world) {
      throw OutOfRange("rank " + std::to_string(*p.rank) + " is out of range [0, " +
                       std::to_string(p.world) + ")");
    }
  }
  p.root = shared_root ? *shared_root : build_root(need(req, "build", "mesh.program"), p.world);
  p.last = p.root;
  if (const Json* ops = find(req, "ops"); ops && !ops->is_null()) {
    if (!ops->is_array()) throw InvalidArgument("'ops' must be a list of steps");
    for (std::size_t i = 0; i < ops->size(); ++i) {
      const Json& s = (*ops)[i];
      DeviceMesh m = step(p, s, i);
      check_rank_view(p, m);
      if (const Json* let = find(s, "let"); let && !let->is_null()) {
        const std::string name = to_str(*let, "let");
        if (name == "root" || name == "_last") {
          throw InvalidArgument("'let' cannot rebind the reserved handle '" + name + "'");
        }
        p.handles.insert_or_assign(name, m);
      }
      p.last = m;
    }
  }
  return p;
}

DeviceMesh result_of(const Program& p, const Json& req) {
  const Json* r = find(req, "result");
  return r && !r->is_null() ? handle(p, *r) : *p.last;
}

void budget(int64_t keys, int64_t per_key, const char* field) {
  int64_t total = 0;
  if (__builtin_mul_overflow(keys, per_key, &total) || total > kMaxEnumeration) {
    throw ResourceExhausted("'" + std::string(field) + "' would list " + std::to_string(keys) +
                            " ranks x " + std::to_string(per_key) +
                            " values, over the limit of " + std::to_string(kMaxEnumeration) +
                            " (ask for fewer fields with 'want')");
  }
}

Json opt_list(const std::optional<std::vector<int64_t>>& v) { return v ? Json(*v) : Json(nullptr); }

// per_rank lists the ranks a per-rank map describes: every world rank for a root, the root's
// rank map (ascending) for a derived mesh.
std::vector<int64_t> per_rank_keys(const Program& p, const DeviceMesh& m, int64_t per_key,
                                   const char* field) {
  if (m.is_root()) {
    budget(p.world, per_key, field);
    std::vector<int64_t> out(static_cast<std::size_t>(p.world));
    for (int64_t r = 0; r < p.world; ++r) out[static_cast<std::size_t>(r)] = r;
    return out;
  }
  budget(m.rank_map_size(), per_key, field);
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

Json field(const Program& p, const DeviceMesh& m, const std::string& name) {
  const int64_t me = p.rank.value_or(0);
  if (name == "mesh_dim_names") return m.names() ? Json(*m.names()) : Json(nullptr);
  if (name == "layout") return json::from_layout(m.layout());
  if (name == "shape") return Json(m.shape());
  if (name == "ndim") return Json(m.ndim());
  if (name == "size") return Json(m.size());
  if (name == "rank_map") return Json(m.rank_map());
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
    budget(m.rank_map_size(), m.ndim(), "groups_by_dim");
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
  if (name == "my_groups") {
    Json out = Json::object();
    for (int d = 0; d < m.ndim(); ++d) out[m.dim_name(d)] = opt_list(m.group_of(me, d));
    return out;
  }
  throw InvalidArgument("unknown result field '" + name + "'; known fields: mesh_dim_names, "
                        "layout, shape, ndim, size, rank_map, mesh_by_rank, coordinate_by_rank, "
                        "groups_by_dim, local_rank_by_rank, backend_by_dim, coordinate, local_rank, my_groups");
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
  return result_of(p, request);
}

Json run_mesh_program(const Json& request) {
  Program p = run(request);
  DeviceMesh m = result_of(p, request);
  std::vector<std::string> want;
  if (const Json* w = find(request, "want"); w && !w->is_null()) {
    want = to_names(*w, "want");
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
  DeviceMesh ma = result_of(pa, a);
  Json b_req = b;
  if (same_root) {
    if (!b_req.contains("world_size")) b_req["world_size"] = pa.world;
  }
  Program pb = same_root ? run(b_req, pa.root) : run(b_req);
  DeviceMesh mb = result_of(pb, b_req);
  return Json{{"equal", ma == mb},
              {"hash_equal", ma.hash() == mb.hash()},
              {"equivalent", equivalent(ma, mb)}};
}

}  // namespace meshsim::query
