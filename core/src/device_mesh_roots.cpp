#include "meshsim/device_mesh.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "meshsim/algebra.hpp"
#include "meshsim/error.hpp"
#include "checked_math.hpp"
#include "device_mesh_parts.hpp"
#include "flat_modes.hpp"
#include "rank_map.hpp"
#include "universe.hpp"

namespace meshsim {

using namespace mesh_detail;

namespace {
// handed_groups checks a root's handed group names (one per dim, or none) and pairs each with
// its dim's canonical layout and config.
// Not inlined: its locals (layouts, configs) would enlarge make_root's frame on every rank
// thread's stack, though most roots are handed no names.
// Every dim of a from_group root is a handed group (its description kept, "undefined" when none
// is given, as new_group's default); another root may be handed names only.
[[gnu::noinline]] std::vector<Universe::HandedGroup> handed_groups(const std::vector<std::optional<std::string>>& names,
                                                 const std::vector<std::optional<std::string>>& descs,
                                                 const Layout& layout, const std::vector<BackendConfig>& configs,
                                                 const MeshNames& dim_names, bool from_group) {
  std::vector<Universe::HandedGroup> out;
  if (names.empty() && descs.empty() && !from_group) return out;
  if (!descs.empty() && !from_group) {
    throw InvalidArgument("group descriptions are those of the groups a from_group root is handed");
  }
  for (const auto* v : {&names, &descs}) {
    if (!v->empty() && static_cast<int>(v->size()) != layout.rank()) {
      throw InvalidArgument("from_group: " + std::to_string(v->size()) + (v == &names ? " group names" : " group descriptions") +
                            " for a mesh of " + std::to_string(layout.rank()) + " dims (one per dim, or none)");
    }
  }
  const Layout canonical = canonical_of(layout);
  for (int d = 0; d < layout.rank(); ++d) {
    const std::size_t k = static_cast<std::size_t>(d);
    const std::optional<std::string> n = names.empty() ? std::nullopt : names[k];
    const std::optional<std::string> desc = descs.empty() ? std::nullopt : descs[k];
    if (!n && !from_group) continue;
    const std::string dim = dim_names ? quote_input((*dim_names)[k]) : std::to_string(d);
    if (n && (n->empty() || n->size() > kMaxGroupNameBytes)) {
      throw InvalidArgument("from_group: the group name of dim " + dim + " must hold 1 to " +
                            std::to_string(kMaxGroupNameBytes) + " bytes, got " + std::to_string(n->size()));
    }
    if (desc && desc->size() > kMaxGroupNameBytes) {
      throw InvalidArgument("from_group: the group description of dim " + dim + " must hold at most " +
                            std::to_string(kMaxGroupNameBytes) + " bytes, got " + std::to_string(desc->size()));
    }
    Universe::HandedGroup h{canonical[d], configs.empty() ? BackendConfig{} : configs[k], n,
                            desc.value_or("undefined"),
                            dim_names ? std::optional<std::string>((*dim_names)[k]) : std::nullopt};
    for (const Universe::HandedGroup& o : out) {
      if (h.name && o.name == h.name && (o.canonical != h.canonical || o.config != h.config)) {
        throw InvalidArgument("from_group: the name " + quote_input(*h.name) + " is handed for two different groups "
                              "(dim " + dim + " and an earlier dim): one name, one group");
      }
    }
    out.push_back(std::move(h));
  }
  return out;
}
}  // namespace

// make_root is the one way a root is built (init_device_mesh and DeviceMesh(mesh)): names,
// device, a row-major layout of `shape`, the world, the configs, then the rank map — the
// identity run when `ranks` is null, else the given ranks, checked.
DeviceMesh DeviceMesh::make_root(const char* what, std::span<const int64_t> shape,
                                 const std::span<const int64_t>* ranks, MeshNames names,
                                 RootOptions options) {
  check_root_names(names, shape.size());
  check_device_type(options.device_type);
  Layout layout = row_major(shape, what);
  const int64_t n = meshsim::size(layout);
  if (ranks && n != static_cast<int64_t>(ranks->size())) {
    throw InvalidArgument(std::string(what) + ": shape " + int_list(shape) + " holds " +
                          std::to_string(n) + " ranks but " + std::to_string(ranks->size()) +
                          " were given");
  }
  check_world(options.world_size, n);
  auto configs = checked_configs(std::move(options.backend_override), layout.rank());
  RankMap map = ranks ? RankMap::explicit_ranks(*ranks, options.world_size) : RankMap::affine(0, n);
  const bool handed_root = std::string_view(what) == "from_group";
  std::vector<Universe::HandedGroup> handed =
      handed_groups(options.group_names, options.group_descs, layout, configs, names, handed_root);
  auto u = std::make_shared<const Universe>(options.device_type, options.world_size, std::move(map),
                                            layout, names, configs, options.init_backend,
                                            std::move(options.default_backend), std::move(handed),
                                            options.torch_version);
  u->record(GroupCreationEvent::Op::kRoot, what, options.init_backend && !handed_root, 0,
            options.init_backend && !handed_root ? layout.rank() : 0, layout, names, configs);
  return DeviceMesh(std::move(u), layout, std::move(names), true, configs);
}

DeviceMesh DeviceMesh::init(std::span<const int64_t> shape, MeshNames names, RootOptions options) {
  return make_root("init_device_mesh", shape, nullptr, std::move(names), std::move(options));
}

DeviceMesh DeviceMesh::init(std::initializer_list<int64_t> shape, MeshNames names,
                            RootOptions options) {
  return init(std::span<const int64_t>(shape.begin(), shape.size()), std::move(names),
              std::move(options));
}

DeviceMesh DeviceMesh::from_ranks(std::span<const int64_t> shape, std::span<const int64_t> ranks,
                                  MeshNames names, RootOptions options) {
  return make_root("DeviceMesh", shape, &ranks, std::move(names), std::move(options));
}

DeviceMesh DeviceMesh::from_group(std::span<const int64_t> group_ranks, MeshNames names,
                                  RootOptions options) {
  if (group_ranks.empty()) {
    throw InvalidArgument("from_group: Expects at least one ProcessGroup to be passed (the group "
                          "has no ranks)");
  }
  const int64_t n = static_cast<int64_t>(group_ranks.size());
  return make_root("from_group", std::span<const int64_t>(&n, 1), &group_ranks, std::move(names), std::move(options));
}

namespace {
// nested_text is a mesh argument as Python prints a nested list: [[0, 1], [2, 3]].
std::string nested_text(const MeshArray& m) {
  std::size_t pos = 0;
  auto rec = [&](auto&& self, std::size_t dim) -> std::string {
    std::string out = "[";
    for (int64_t i = 0; i < m.shape[dim]; ++i) {
      if (i) out += ", ";
      out += dim + 1 == m.shape.size() ? std::to_string(m.values[pos++]) : self(self, dim + 1);
    }
    return out + "]";
  };
  return m.shape.empty() ? "[]" : rec(rec, 0);
}
std::string py_ints(std::span<const int64_t> v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}
}  // namespace

DeviceMesh DeviceMesh::from_group(std::span<const std::vector<int64_t>> groups, bool is_list,
                                  const std::optional<MeshArray>& mesh, MeshNames names,
                                  std::optional<int64_t> rank, RootOptions options) {
  if (!is_list) {
    if (groups.size() != 1) throw InvalidArgument("from_group: one group, or a list of groups");
    const std::vector<int64_t>& g = groups.front();
    if (mesh && (mesh->shape.size() != 1 || mesh->values != g)) {
      throw InvalidArgument("Invalid mesh " + nested_text(*mesh) + " for ProcessGroup with ranks " + py_ints(g));
    }
    return from_group(g, std::move(names), std::move(options));
  }
  if (groups.empty()) throw InvalidArgument("Expects at least one ProcessGroup to be passed");
  if (!mesh) throw InvalidArgument("Must pass mesh if passing multiple ProcessGroups");
  if (!names) throw InvalidArgument("Must pass mesh_dim_names if passing multiple ProcessGroups");
  if (mesh->shape.size() != groups.size()) {
    throw InvalidArgument("Expects mesh with ndim equal to number of ProcessGroups but got mesh " +
                          nested_text(*mesh) + " and " + std::to_string(groups.size()) + " ProcessGroups");
  }
  if (!rank) {
    // The rank whose groups these are: the one rank every group holds.
    std::vector<int64_t> common = groups.front();
    std::sort(common.begin(), common.end());
    for (const std::vector<int64_t>& g : groups) {
      std::vector<int64_t> sorted = g, keep;
      std::sort(sorted.begin(), sorted.end());
      std::set_intersection(common.begin(), common.end(), sorted.begin(), sorted.end(), std::back_inserter(keep));
      common = std::move(keep);
    }
    if (common.size() != 1) {
      throw InvalidArgument("from_group: the " + std::to_string(groups.size()) + " groups share " +
                            std::to_string(common.size()) + " ranks, not exactly one; give the rank whose groups they are");
    }
    rank = common.front();
  }
  return from_groups(groups, mesh->shape, mesh->values, *names, *rank, std::move(options));
}

DeviceMesh DeviceMesh::from_groups(std::span<const std::vector<int64_t>> groups,
                                   std::span<const int64_t> shape, std::span<const int64_t> ranks,
                                   std::vector<std::string> names, int64_t rank,
                                   RootOptions options) {
  if (groups.empty()) throw InvalidArgument("from_groups: Expects at least one ProcessGroup");
  if (shape.size() != groups.size()) {
    throw InvalidArgument("from_groups: Expects mesh with ndim equal to number of ProcessGroups "
                          "but got a mesh of shape " + int_list(shape) + " and " +
                          std::to_string(groups.size()) + " ProcessGroups");
  }
  DeviceMesh mesh = make_root("from_group", shape, &ranks, std::move(names), std::move(options));
  if (!mesh.contains(rank)) {
    throw InvalidArgument("from_groups: rank " + std::to_string(rank) +
                          " is not in the mesh, so its groups cannot be checked");
  }
  for (int d = 0; d < mesh.ndim(); ++d) {
    std::vector<int64_t> want = *mesh.group_of(rank, d);
    std::vector<int64_t> got = groups[static_cast<std::size_t>(d)];
    std::sort(want.begin(), want.end());
    std::sort(got.begin(), got.end());
    if (want != got) {
      throw InvalidArgument("from_groups: the group given for dim " + mesh.dim_name(d) + " is " +
                            int_list(groups[static_cast<std::size_t>(d)]) + " but rank " +
                            std::to_string(rank) + "'s group along that dim in the mesh is " +
                            int_list(*mesh.group_of(rank, d)));
    }
  }
  return mesh;
}

DeviceMesh DeviceMesh::from_layout(const DeviceMesh& root, const Layout& layout, MeshNames names) {
  if (!root.is_root()) throw InvalidArgument("from_layout: the first argument must be a root mesh");
  std::vector<BackendConfig> configs;
  if (layout == root.layout_ && names == root.names_) return root;
  return DeviceMesh(root.u_, layout, std::move(names), false, configs);
}

}  // namespace meshsim
