#include "meshsim/mesh_json.hpp"

#include <optional>
#include <utility>
#include <vector>

#include "meshsim/json_codec.hpp"
#include "meshsim/error.hpp"

namespace meshsim {

namespace {

using json::Json;

constexpr int kMaxJsonDepth = 16;  // the format nests 4 levels

Json names_json(const MeshNames& n) { return n ? Json(*n) : Json(nullptr); }

// MeshDocument is a decoded document, before anything is built.
struct MeshDocument {
  RootOptions options;
  std::vector<int64_t> shape;
  MeshNames root_names;
  std::optional<int64_t> start;      // a run start, start+1, ...
  std::vector<int64_t> rank_map;     // else the explicit map
  std::vector<std::pair<std::string, std::string>> flattened;  // name, layout text
  std::string layout;
  MeshNames names;
};

MeshNames names_or_null(const Json& j, std::string_view field) {
  if (j.is_null()) return std::nullopt;
  return json::to_names(j, field);
}

const Json& field(const Json& obj, std::string_view key, std::string_view where) {
  return json::need(json::need_object(obj, where), key, where);
}

// decode reads every field with the shared readers. The document is text that was saved, so
// anything that does not fit its schema (a wrong type, a missing field) is a ParseError; an
// integer past int64 stays an OverflowError, as everywhere else.
MeshDocument decode(const Json& doc) {
  try {
    MeshDocument d;
    if (json::to_str(field(doc, "format", "document"), "format") != "meshsim.DeviceMesh") {
      throw ParseError("document format is not \"meshsim.DeviceMesh\"");
    }
    const int64_t version = json::to_int(field(doc, "version", "document"), "version");
    if (version != kMeshJsonVersion) {
      throw ParseError("mesh document version " + std::to_string(version) + " is not supported (" +
                       std::to_string(kMeshJsonVersion) + " is)");
    }
    d.options.device_type = json::to_str(field(doc, "device_type", "document"), "device_type");
    const Json& world = field(doc, "world_size", "document");
    if (!world.is_null()) d.options.world_size = json::to_int(world, "world_size");
    const Json& root = field(doc, "root", "document");
    d.shape = json::to_int_list(field(root, "shape", "root"), "root.shape");
    d.root_names = names_or_null(field(root, "names", "root"), "root.names");
    const Json& rm = field(root, "rank_map", "root");
    if (rm.is_object()) {
      d.start = json::to_int(field(rm, "start", "root.rank_map"), "root.rank_map.start");
    } else {
      d.rank_map = json::to_int_list(rm, "root.rank_map");
    }
    const Json& flat = field(doc, "flattened", "document");
    if (!flat.is_array()) throw ParseError("flattened: expected a list");
    for (const Json& f : flat) {
      d.flattened.emplace_back(json::to_str(field(f, "name", "flattened entry"), "flattened.name"),
                               json::to_str(field(f, "layout", "flattened entry"), "flattened.layout"));
    }
    const Json& mesh = field(doc, "mesh", "document");
    d.layout = json::to_str(field(mesh, "layout", "mesh"), "mesh.layout");
    d.names = names_or_null(field(mesh, "names", "mesh"), "mesh.names");
    return d;
  } catch (const ParseError&) {
    throw;
  } catch (const InvalidArgument& e) {
    throw ParseError(std::string("mesh document: ") + e.what());
  }
}

DeviceMesh build_root(const MeshDocument& d) {
  if (!d.start) return DeviceMesh::from_ranks(d.shape, d.rank_map, d.root_names, d.options);
  const int64_t start = *d.start;
  if (start == 0) return DeviceMesh::init(d.shape, d.root_names, d.options);
  // A shifted run: validate it like an explicit map without materialising it twice.
  if (start < 0) throw ParseError("root.rank_map.start " + std::to_string(start) + " is negative");
  RootOptions probe_opts;
  probe_opts.device_type = d.options.device_type;
  const int64_t n = DeviceMesh::init(d.shape, d.root_names, probe_opts).size();
  if (n > kMaxEnumeration) {
    throw ResourceExhausted("root.rank_map: a shifted run of " + std::to_string(n) +
                            " ranks exceeds the limit of " + std::to_string(kMaxEnumeration));
  }
  if (start > INT64_MAX - (n - 1)) {
    throw OverflowError("root.rank_map: the run from start " + std::to_string(start) + " of " +
                        std::to_string(n) + " ranks passes int64");
  }
  std::vector<int64_t> ranks(static_cast<std::size_t>(n));
  for (int64_t p = 0; p < n; ++p) ranks[static_cast<std::size_t>(p)] = start + p;
  return DeviceMesh::from_ranks(d.shape, ranks, d.root_names, d.options);
}

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
  if (json::max_nesting(text) > kMaxJsonDepth) {
    throw ParseError("mesh document nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  Json doc = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) throw ParseError("mesh document is not valid JSON (malformed or truncated)");
  const MeshDocument d = decode(doc);
  const DeviceMesh root = build_root(d);
  for (const auto& [name, text_layout] : d.flattened) {
    const Layout layout = parse_layout(text_layout);
    DeviceMesh carrier = DeviceMesh::from_layout(root, layout, std::vector<std::string>{name + "#"});
    if (carrier.flatten(name).layout() != layout) {
      throw ParseError("flattened '" + name + "': layout " + to_string(layout) +
                       " is not a flattened layout");
    }
  }
  return DeviceMesh::from_layout(root, parse_layout(d.layout), d.names);
}

}  // namespace meshsim
