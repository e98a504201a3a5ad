// meshsim/device_mesh.hpp — PyTorch's DeviceMesh bookkeeping as layouts over a shared rank map.
//
// A root mesh owns a Universe: the device type, the rank map (the root's global ranks in
// row-major order, e.g. 2048..4095), the flatten registry and the group cache. Every mesh derived
// from it (slice, flatten, unflatten, concatenate) is a layout over rank-map positions plus names
// plus a pointer to that universe: O(ndim) time and memory whatever the world size. Only the
// answers that are lists of ranks (a group, a mesh array, all groups of a dim) cost their size.
//
//   DeviceMesh mesh = DeviceMesh::init({2, 2, 4}, {{"dp", "cp", "tp"}});
//   DeviceMesh dp_tp = mesh.slice({"dp", "tp"});         // non-contiguous slice: (2,4):(8,1)
//   DeviceMesh dp_cp = mesh.slice({"dp", "cp"}).flatten(); // "dp_cp", registered on the root
//   mesh.group_of(5, mesh.dim_index("tp"))               // {4, 5, 6, 7}
//   mesh.coordinate(5)                                    // {0, 1, 1}
//   DeviceMesh ep = mesh.slice("tp").unflatten(0, {2, 2}, {"ep", "ep_tp"});
//
// Semantics follow PyTorch's DeviceMesh over `_MeshLayout` (slicing order and overlap rules,
// flatten registry, unflatten recipe, concatenate) with these deliberate differences:
//  - identity: ==/hash are (universe, canonical layout, names, device type); independently built
//    roots are different universes; `equivalent` compares content across universes;
//  - local rank = coordinate along the dim (groups keep mesh order, never sorted);
//  - validation up front: ranks unique and >= 0 (and < world size when known), names unique
//    (also after unflatten and concatenate), sizes >= 1, every mesh tiles the rank map;
//  - the group cache is keyed on (canonical dim layout, BackendConfig), so groups realised once
//    are reused by flatten, unflatten and concatenate.
//
// Thread safety: DeviceMesh is an immutable value; all const members may be called from many
// threads. The universe's flatten registry and group cache are guarded by a mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "meshsim/backend_config.hpp"
#include "meshsim/group_record.hpp"
#include "meshsim/layout.hpp"
#include "meshsim/mesh_layout.hpp"
#include "meshsim/torch_version.hpp"

namespace meshsim {

// Universe is the state every mesh derived from one root shares: the rank map, the flatten
// registry and the group cache (device_mesh.cpp; reached through DeviceMesh only).
class Universe;

// kMaxMeshDims bounds a mesh's dims (real meshes have a handful; the bound keeps hostile
// programs from turning name and mode checks quadratic). More is InvalidArgument.
inline constexpr int kMaxMeshDims = 256;

// MeshArray is a row-major N-d array of global ranks.
using MeshArray = RemappedTensor;

// RootOptions configure a root mesh: the device type (letters only, PyTorch's rule), the world
// size when known (the mesh must fit in it and every rank must be below it), and per-dim backend
// configs (empty, or one per dim).
struct RootOptions {
  std::string device_type = "cpu";         // letters only
  std::optional<int64_t> world_size;       // unset: the rank map's largest rank + 1 is allowed
  std::vector<BackendConfig> backend_override;  // empty, or one per dim
  // init_backend is PyTorch's _init_backend: false builds the mesh without process groups
  // (from_group meshes, and meshsim's own from_logical), so get_group fails as PyTorch's does.
  bool init_backend = true;
  // default_backend is init_process_group's choice: the backend of every group whose config
  // names none ("" = the run's own backend).
  std::string default_backend;
  // group_names are the names of the groups a root was handed (from_group: PyTorch keeps the
  // ProcessGroups it is given, and get_group hands back the same groups): empty, or one per dim
  // (nullopt: the dim's groups are named by their members and config, as every other group).
  // A name must be non-empty and at most kMaxGroupNameBytes; two dims handed the same name
  // must be the same groups.
  std::vector<std::optional<std::string>> group_names;
  // group_descs are the handed groups' descriptions (PyTorch's group_desc, which a ProcessGroup
  // keeps; new_group's default is "undefined", what a from_group dim without one says): empty,
  // or one per dim, each at most kMaxGroupNameBytes. Only a from_group root takes them.
  std::vector<std::optional<std::string>> group_descs;
  // torch_version is the PyTorch release the mesh answers as where releases differ
  // (torch_version.hpp): refusals' words, the creation plan's names and non-member results.
  TorchVersion torch_version = kNewestTorch;
};

// kMaxGroupNameBytes bounds a handed group's name.
inline constexpr std::size_t kMaxGroupNameBytes = 256;

// GroupHandle is what PyTorch's get_group(dim) hands a rank: its group along the dim and how the
// group is made. The record is the universe's cached group (its name is the cache identity);
// asking again is a cache hit.
struct GroupHandle {
  std::vector<int64_t> ranks;  // the rank's group, in mesh order
  // pg_ranks: the ranks of the process group PyTorch hands out, in group-rank order: ascending
  // (new_group sorts them), the world for a dim as large as the world (its default group).
  std::vector<int64_t> pg_ranks;
  std::string backend;         // the config's backend, else the world's default ("" = the run's)
  BackendConfig config;        // as configured: timeout and options travel with the group
  std::string group_desc;      // PyTorch's description: "mesh_" + the dim's name ("mesh_dp_cp")
  // name: a handed group's own (from_group), else the record's: named by its members and config.
  std::string name;
  std::shared_ptr<const GroupRecord> record;
};

// DeviceMesh is an immutable value: a layout over the root's rank-map positions, dim names and
// per-dim backend configs, plus a shared Universe. Copies are cheap; all methods are const and
// safe to call from several threads (the shared group cache is internally locked).
class DeviceMesh {
 public:
  // init is init_device_mesh: a row-major layout of `shape` over the identity rank map 0..n-1.
  static DeviceMesh init(std::span<const int64_t> shape, MeshNames names = std::nullopt,
                         RootOptions options = {});
  static DeviceMesh init(std::initializer_list<int64_t> shape, MeshNames names = std::nullopt,
                         RootOptions options = {});
  // from_ranks is DeviceMesh(mesh): `ranks` are the global ranks of an array of `shape`, in
  // row-major order (any distinct non-negative integers).
  static DeviceMesh from_ranks(std::span<const int64_t> shape, std::span<const int64_t> ranks,
                               MeshNames names = std::nullopt, RootOptions options = {});
  // from_group is a 1-D mesh over an existing group's ranks, in the group's order.
  static DeviceMesh from_group(std::span<const int64_t> group_ranks, MeshNames names = std::nullopt,
                               RootOptions options = {});
  // from_group with PyTorch's whole signature: from_group(group | [groups], device_type, mesh,
  // mesh_dim_names). One group (`is_list` false): the mesh is its ranks; a `mesh` given must
  // equal them (a 2-D mesh is InvalidArgument "Invalid mesh [[0, 1], [2, 3]] for ProcessGroup
  // with ranks [0, 1, 2, 3]"). A list: PyTorch's "Expects at least one ProcessGroup to be
  // passed", "Must pass mesh if passing multiple ProcessGroups", "Must pass mesh_dim_names if
  // passing multiple ProcessGroups", "Expects mesh with ndim equal to number of ProcessGroups
  // ..."; then from_groups as `rank` (default: the one rank every group holds), which also
  // checks what PyTorch skips (each group is rank's group along its dim).
  static DeviceMesh from_group(std::span<const std::vector<int64_t>> groups, bool is_list,
                               const std::optional<MeshArray>& mesh, MeshNames names,
                               std::optional<int64_t> rank, RootOptions options = {});
  // from_groups builds the mesh of `shape`/`ranks` from one group per dim as seen by `rank`
  // and checks what PyTorch skips: each group must hold exactly the ranks of rank's group along
  // that dim (in any order).
  static DeviceMesh from_groups(std::span<const std::vector<int64_t>> groups,
                                std::span<const int64_t> shape, std::span<const int64_t> ranks,
                                std::vector<std::string> names, int64_t rank,
                                RootOptions options = {});

  // slice selects dims by name, in the mesh's stride order (PyTorch's rule); non-contiguous
  // selections are allowed, overlapping ones are not. On the root, flattened names are valid too.
  DeviceMesh slice(std::span<const std::string> names) const;
  DeviceMesh slice(std::initializer_list<std::string> names) const;
  DeviceMesh slice(std::string_view name) const;
  // flattened_from_root lists the names of `names` that a slice would take from the root's
  // flatten registry (names this root has only as flattened dims): what PyTorch warns about
  // since 2.10 ("Slicing a flattened dim from root mesh will be deprecated", #164993). Empty
  // on a mesh that is not a root (there such names are refused).
  std::vector<std::string> flattened_from_root(std::span<const std::string> names) const;
  // find_flattened is the safe replacement for that slice: the flattened mesh registered on the
  // root whose layout is the flattening of `dims` of this mesh (compared as canonical layouts,
  // never by size: two flattened dims of equal size and other ranks are told apart), the first
  // registered when several names hold it; nullopt when none was flattened. `dims` follow
  // slice's rules (names of this mesh, stride order; errors as slice's).
  std::optional<DeviceMesh> find_flattened(std::span<const std::string> dims) const;
  // flatten merges every dim into one named dim (default: names joined by "_"), registered on
  // the root: the same name with the same layout returns an equal mesh, another layout throws.
  DeviceMesh flatten(std::optional<std::string> name = std::nullopt,
                     std::optional<BackendConfig> config = std::nullopt) const;
  // unflatten splits dim into `sizes` (row-major) named `names`; dim by index or by name.
  DeviceMesh unflatten(int64_t dim, std::span<const int64_t> sizes,
                       std::span<const std::string> names) const;
  DeviceMesh unflatten(std::string_view dim, std::span<const int64_t> sizes,
                       std::span<const std::string> names) const;
  // unflatten with the new dims' backend configs (PyTorch's backend_override of _unflatten):
  // empty, or one per new dim.
  DeviceMesh unflatten(int64_t dim, std::span<const int64_t> sizes, std::span<const std::string> names,
                       std::vector<BackendConfig> new_configs) const;
  DeviceMesh unflatten(std::string_view dim, std::span<const int64_t> sizes, std::span<const std::string> names,
                       std::vector<BackendConfig> new_configs) const;
  // creation_events is the universe's log of group-making operations, in call order
  // (ResourceExhausted once it passed kMaxCreationEvents); event_mesh is an event's mesh.
  std::vector<GroupCreationEvent> creation_events() const;
  // creation_log_digest is the creation log as a digest, read in place (no copy): what this
  // universe's ops did, in order; stable within a process only (layout hashes).
  uint64_t creation_log_digest() const;
  DeviceMesh event_mesh(const GroupCreationEvent& e) const;
  // with_backend_configs is this mesh with one backend config per dim (empty: the defaults);
  // identity is unchanged (configs are not part of ==), group records follow the new configs.
  DeviceMesh with_backend_configs(std::vector<BackendConfig> configs) const;
  // concatenate joins the dims of meshes of one universe; they must not overlap.
  static DeviceMesh concatenate(std::span<const DeviceMesh> meshes);
  // transpose is the same ranks with the dims permuted (`order` lists the old dims in their new
  // positions, by index or by name): PyTorch's slice refuses names out of stride order, this
  // is how that view is asked for; flattening a transposed mesh gives the column-major orders
  // Megatron's RankGenerator uses. InvalidArgument unless `order` is a permutation.
  DeviceMesh transpose(std::span<const int> order) const;
  DeviceMesh transpose(std::span<const std::string> order) const;
  // reshape is flatten + unflatten in one call, without registering a flattened name: the mesh's
  // ranks in row-major order, regrouped into `sizes` named `names`.
  DeviceMesh reshape(std::span<const int64_t> sizes, std::span<const std::string> names) const;

  // device_type is the root's device ("cpu", "cuda", ...); names are the dim names, if any.
  const std::string& device_type() const;
  const MeshNames& names() const { return names_; }
  // dim_name is the name of dim i, or its index as text for an unnamed mesh.
  std::string dim_name(int dim) const;
  // dim_index finds a dim by name; NotFound otherwise.
  int dim_index(std::string_view name) const;
  // ndim is the number of dims; shape their sizes; size() the number of ranks of one copy;
  // size(dim) the size of one dim.
  int ndim() const { return layout_.rank(); }
  std::vector<int64_t> shape() const;
  int64_t size() const;
  int64_t size(int dim) const;
  // layout is the layout as PyTorch builds it (its int vs tuple forms); canonical_layout has
  // every dim coalesced and is what identity uses.
  const Layout& layout() const { return layout_; }
  const Layout& canonical_layout() const { return canonical_; }
  // is_root is true for a mesh built by a constructor (not derived); root() is that mesh;
  // world_size is the world given to the root, if any.
  bool is_root() const { return is_root_; }
  DeviceMesh root() const;
  std::optional<int64_t> world_size() const;
  // rank_map is the root's global ranks in row-major order (materialised on request).
  std::vector<int64_t> rank_map() const;
  // rank_map_size is the number of entries of the rank map, without materialising it.
  int64_t rank_map_size() const;
  // copies is how many disjoint copies of this mesh tile the rank map (1 for the root).
  int64_t copies() const;
  // contains is whether `rank` is in the root's rank map (so in exactly one copy of this mesh).
  bool contains(int64_t rank) const;

  // coordinate of `rank` in the copy that holds it; nullopt when the rank is outside the root.
  std::optional<std::vector<int64_t>> coordinate(int64_t rank) const;
  // local_rank of `rank` along dim = its coordinate there (meshsim: never a sorted-group rank).
  std::optional<int64_t> local_rank(int64_t rank, int dim) const;
  // mesh_for is the mesh array as seen by `rank`: the copy holding it; with one copy, that copy
  // for every rank (PyTorch's rule); nullopt when several copies exist and none holds it.
  std::optional<MeshArray> mesh_for(int64_t rank) const;
  // mesh_values is values [first, first + count) of mesh_for(rank).values (row-major, clipped
  // to size()), computed alone: a summary of a huge mesh costs what it lists.
  std::optional<std::vector<int64_t>> mesh_values(int64_t rank, int64_t first, int64_t count) const;
  // group_of is the group of `rank` along dim, in mesh order; nullopt when outside the root.
  std::optional<std::vector<int64_t>> group_of(int64_t rank, int dim) const;
  // groups are every group of dim in complement order (PyTorch's creation order).
  std::vector<std::vector<int64_t>> groups(int dim) const;
  // group_table is groups(dim) in one buffer (one allocation however many groups: prefer it
  // for large worlds).
  GroupTable group_table(int dim) const;
  // group_table_prefix is the first min(max_groups, all) groups of group_table(dim), each cut to
  // its first min(max_members, size(dim)) ranks.
  GroupTable group_table_prefix(int dim, int64_t max_groups, int64_t max_members = INT64_MAX) const;
  // backend_config is dim's configured backend (default when none was set).
  const BackendConfig& backend_config(int dim) const;
  // group_record is the universe's cached record for dim under `config` (dim's own config when
  // omitted), created on first use.
  std::shared_ptr<const GroupRecord> group_record(int dim) const;
  std::shared_ptr<const GroupRecord> group_record(int dim, const BackendConfig& config) const;
  // get_group is PyTorch's get_group for `rank`: by dim index, by name (a dim of this mesh or a
  // name flattened on the root), or none on a 1-D mesh; with PyTorch's errors: FailedPrecondition
  // "DeviceMesh process groups not initialized!" (a mesh built with init_backend false) and
  // "... `mesh_dim` needs to be specified when device_mesh.ndim > 1 ..." (no dim on ndim > 1),
  // NotFound "Mesh dimension 'x' does not exist." / FailedPrecondition "No `mesh_dim_names`
  // found." for names, OutOfRange for an index, FailedPrecondition for a rank not in the mesh.
  GroupHandle get_group(int64_t rank) const;
  GroupHandle get_group(int64_t rank, int dim) const;
  GroupHandle get_group(int64_t rank, std::string_view dim) const;
  // get_all_groups is get_group of every dim, in order.
  std::vector<GroupHandle> get_all_groups(int64_t rank) const;
  // init_backend and default_backend are the root's (RootOptions).
  bool init_backend() const;
  const std::string& default_backend() const;
  // torch_version is the root's (RootOptions).
  TorchVersion torch_version() const;
  // cache_stats are the universe's group-cache counters (shared by every mesh of the root).
  CacheStats cache_stats() const;
  // flattened_names are the names registered on the root by flatten, in registration order;
  // flattened pairs each with its layout.
  std::vector<std::string> flattened_names() const;
  std::vector<std::pair<std::string, Layout>> flattened() const;
  // rank_map_start is the first rank when the rank map is the run start, start+1, ...
  // (init_device_mesh and contiguous explicit meshes), stored in O(1).
  std::optional<int64_t> rank_map_start() const;

  // universe_id identifies the universe (unique within the process).
  uint64_t universe_id() const;
  // universe is the shared state (opaque outside core).
  const std::shared_ptr<const Universe>& universe() const;
  // hash agrees with ==: it covers the universe, the names and the canonical layout.
  std::size_t hash() const { return hash_; }
  // == is identity as PyTorch defines it: the same universe (root), names and canonical layout;
  // backend configs and the layout's written form do not count.
  friend bool operator==(const DeviceMesh& a, const DeviceMesh& b);
  friend bool operator!=(const DeviceMesh& a, const DeviceMesh& b) { return !(a == b); }
  // equivalent compares content across universes: device type, names, canonical layout, and
  // the root rank map.
  friend bool equivalent(const DeviceMesh& a, const DeviceMesh& b);

  // to_string is PyTorch's repr: DeviceMesh((dp=2, tp=4), 'cpu', stride=(4, 1)).
  std::string to_string() const;

  // from_layout rebuilds a mesh of `root`'s universe from a layout and names, validated like a
  // derived mesh (serialization uses it).
  static DeviceMesh from_layout(const DeviceMesh& root, const Layout& layout, MeshNames names);

 private:
  DeviceMesh(std::shared_ptr<const Universe> u, Layout layout, MeshNames names, bool is_root,
             std::vector<BackendConfig> configs);
  // With the canonical layout already known (slice and flatten derive it from their parts').
  DeviceMesh(std::shared_ptr<const Universe> u, Layout layout, Layout canonical, MeshNames names,
             bool is_root, std::vector<BackendConfig> configs);
  static DeviceMesh make_root(const char* what, std::span<const int64_t> shape,
                              const std::span<const int64_t>* ranks, MeshNames names,
                              RootOptions options);
  struct Digits;
  Digits digits_of(int64_t position) const;

  std::shared_ptr<const Universe> u_;
  Layout layout_;
  Layout canonical_;
  MeshNames names_;
  std::vector<BackendConfig> configs_;  // empty, or one per dim
  bool is_root_ = false;
  std::size_t hash_ = 0;
};

// flattened_slice_warning is the one wording of the warning for slicing `name`, a flattened
// dim, from the root mesh (DeviceMesh::flattened_from_root), which PyTorch deprecates.
std::string flattened_slice_warning(const std::string& name);

}  // namespace meshsim

template <>
struct std::hash<meshsim::DeviceMesh> {
  std::size_t operator()(const meshsim::DeviceMesh& m) const noexcept { return m.hash(); }
};
