#include "meshsim/mesh_json.hpp"

#include <nlohmann/json.hpp>

#include "meshsim/detail/json_depth.hpp"
#include "meshsim/error.hpp"

namespace meshsim {

namespace {

using Json = nlohmann::json;

constexpr int kMaxJsonDepth = 16;  // the format nests 4 levels

const Json& at(const Json& obj, const char* key, const char* where) {
  if (!obj.is_object()) throw ParseError(std::string(where) + " must be a JSON object");
  auto it = obj.find(key);
  if (it == obj.end()) throw ParseError(std::string(where) + ": missing field '" + key + "'");
  return *it;
}

int64_t to_int(const Json& j, const char* what) {
  if (j.is_number_unsigned() && j.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    throw ParseError(std::string(what) + ": " + j.dump() + " does not fit in int64");
  }
  if (!j.is_number_integer()) throw ParseError(std::string(what) + ": expected an integer, got " + j.dump());
  return j.get<int64_t>();
}

std::vector<int64_t> to_ints(const Json& j, const char* what) {
  if (!j.is_array()) throw ParseError(std::string(what) + ": expected a list of integers");
  std::vector<int64_t> out;
  out.reserve(j.size());
  for (const Json& e : j) out.push_back(to_int(e, what));
  return out;
}

MeshNames to_names(const Json& j, const char* what) {
  if (j.is_null()) return std::nullopt;
  if (!j.is_array()) throw ParseError(std::string(what) + ": expected a list of names or null");
  std::vector<std::string> out;
  for (const Json& e : j) {
    if (!e.is_string()) throw ParseError(std::string(what) + ": names must be strings");
    out.push_back(e.get<std::string>());
  }
  return out;
}

std::string to_text(const Json& j, const char* what) {
  if (!j.is_string()) throw ParseError(std::string(what) + ": expected a string");
  return j.get<std::string>();
}

Json names_json(const MeshNames& n) { return n ? Json(*n) : Json(nullptr); }

}  // namespace

std::string save_mesh(const DeviceMesh& mesh) {
  DeviceMesh root = mesh.root();
  Json rank_map;
  if (auto start = root.rank_map_start()) {
    rank_map = Json{{"start", *start}};
  } else {
    rank_map = root.rank_map();
  }
  Json flattened = Json::array();
  for (const auto& [name, layout] : mesh.flattened()) {
    flattened.push_back(Json{{"name", name}, {"layout", to_string(layout)}});
  }
  Json doc = {
      {"format", "meshsim.DeviceMesh"},
      {"version", kMeshJsonVersion},
      {"device_type", mesh.device_type()},
      {"world_size", mesh.world_size() ? Json(*mesh.world_size()) : Json(nullptr)},
      {"root", {{"shape", root.shape()}, {"names", names_json(root.names())}, {"rank_map", rank_map}}},
      {"flattened", flattened},
      {"mesh", {{"layout", to_string(mesh.layout())}, {"names", names_json(mesh.names())}}}};
  return doc.dump();
}

DeviceMesh load_mesh(std::string_view text) {
  if (detail::json_depth(text) > kMaxJsonDepth) {
    throw ParseError("mesh document nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  Json doc = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) throw ParseError("mesh document is not valid JSON (malformed or truncated)");
  if (to_text(at(doc, "format", "document"), "format") != "meshsim.DeviceMesh") {
    throw ParseError("document format is not \"meshsim.DeviceMesh\"");
  }
  const int64_t version = to_int(at(doc, "version", "document"), "version");
  if (version != kMeshJsonVersion) {
    throw ParseError("mesh document version " + std::to_string(version) + " is not supported (" +
                     std::to_string(kMeshJsonVersion) + " is)");
  }
  RootOptions opts;
  opts.device_type = to_text(at(doc, "device_type", "document"), "device_type");
  const Json& world = at(doc, "world_size", "document");
  if (!world.is_null()) opts.world_size = to_int(world, "world_size");

  const Json& root_j = at(doc, "root", "document");
  std::vector<int64_t> shape = to_ints(at(root_j, "shape", "root"), "root.shape");
  MeshNames root_names = to_names(at(root_j, "names", "root"), "root.names");
  const Json& rm = at(root_j, "rank_map", "root");
  std::optional<DeviceMesh> root;
  if (rm.is_object()) {
    const int64_t start = to_int(at(rm, "start", "root.rank_map"), "root.rank_map.start");
    if (start == 0) {
      root = DeviceMesh::init(shape, root_names, opts);
    } else {
      // A shifted run: validate it like an explicit map without materialising it twice.
      if (start < 0) throw ParseError("root.rank_map.start " + std::to_string(start) + " is negative");
      RootOptions probe_opts;
      probe_opts.device_type = opts.device_type;
      DeviceMesh probe = DeviceMesh::init(shape, root_names, probe_opts);
      const int64_t n = probe.size();
      if (n > kMaxEnumeration) {
        throw ResourceExhausted("root.rank_map: a shifted run of " + std::to_string(n) +
                                " ranks exceeds the limit of " + std::to_string(kMaxEnumeration));
      }
      if (start > INT64_MAX - (n - 1)) {
        throw OverflowError("root.rank_map: the run from start " + std::to_string(start) + " of " +
                            std::to_string(n) + " ranks passes int64");
      }
      std::vector<int64_t> ranks(static_cast<std::size_t>(n));
      for (int64_t p = 0; p < n; ++p) {
        ranks[static_cast<std::size_t>(p)] = start + p;
      }
      root = DeviceMesh::from_ranks(shape, ranks, root_names, opts);
    }
  } else {
    root = DeviceMesh::from_ranks(shape, to_ints(rm, "root.rank_map"), root_names, opts);
  }

  const Json& flat = at(doc, "flattened", "document");
  if (!flat.is_array()) throw ParseError("flattened: expected a list");
  for (const Json& f : flat) {
    const std::string name = to_text(at(f, "name", "flattened entry"), "flattened.name");
    Layout layout = parse_layout(to_text(at(f, "layout", "flattened entry"), "flattened.layout"));
    DeviceMesh carrier = DeviceMesh::from_layout(*root, layout, std::vector<std::string>{name + "#"});
    if (carrier.flatten(name).layout() != layout) {
      throw ParseError("flattened '" + name + "': layout " + to_string(layout) +
                       " is not a flattened layout");
    }
  }
  const Json& mesh_j = at(doc, "mesh", "document");
  Layout layout = parse_layout(to_text(at(mesh_j, "layout", "mesh"), "mesh.layout"));
  return DeviceMesh::from_layout(*root, layout, to_names(at(mesh_j, "names", "mesh"), "mesh.names"));
}

}  // namespace meshsim
