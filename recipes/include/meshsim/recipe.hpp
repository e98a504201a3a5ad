// meshsim/recipe.hpp — one typed mesh recipe: a root, then ordered steps, decoded in full before
// anything is built, and applied by one function. `meshsim show`, `meshsim run` and the
// `mesh.program` query op all go through it.
//
//   MeshRecipe r = recipe_from_flags({.mesh = "dp=2,cp=2,tp=4", .steps = {{"slice", "dp,tp"}}});
//   BuiltMeshes b = apply(r);        // b.root, b.meshes (one per step), b.result
//   MeshRecipe same = recipe_from_json(nlohmann::json::parse(R"({"world_size": 16,
//       "build": {"init_device_mesh": {"mesh_shape": [2,2,4], "mesh_dim_names": ["dp","cp","tp"]}},
//       "ops": [{"slice": ["dp", "tp"]}]})"));
//
// Decoding checks the form of every field (types, integer ranges, sizes >= 1 and their product
// in int64, step kinds, bounded counts); apply checks the semantics (DeviceMesh's own errors).
// Thread safety: a recipe is a value; apply may run concurrently on one recipe (each call builds
// its own universe unless a shared root is given).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "meshsim/backend_config.hpp"
#include "meshsim/device_mesh.hpp"
#include "meshsim/torch_version.hpp"

namespace meshsim {

// kMaxRecipeSteps bounds the steps of one recipe (hostile programs must stay linear).
inline constexpr int kMaxRecipeSteps = 1024;

// DimOverride is one entry of PyTorch's per-dim backend override, keyed as written (a dim name
// or a decimal index); nullopt config means "default" (JSON null). Keys are resolved against the
// mesh's names when the recipe is applied, with PyTorch's redundant/invalid-key errors.
struct DimOverride {
  std::string key;
  std::optional<BackendConfig> config;
};

// CreationOptions are how PyTorch's world was set up, which decides how DeviceMesh creates its
// groups (creation_plan.hpp): bound_device is init_process_group(device_id=...) (the default
// group is bound to a device, so dims are made with one split_group), new_group_use_split_group
// is torch.distributed.config.new_group_use_split_group (TORCH_DIST_NEW_GROUP_USE_SPLIT_GROUP:
// new_group splits the default group), use_torchcomms is torch.distributed.config.use_torchcomms.
struct CreationOptions {
  bool bound_device = false;
  bool new_group_use_split_group = false;
  bool use_torchcomms = false;
  friend bool operator==(const CreationOptions&, const CreationOptions&) = default;
};

// RootSpec is how the root mesh is made.
struct RootSpec {
  enum class Kind {
    kInit,     // init_device_mesh(shape, names): identity rank map 0..n-1
    kRanks,    // DeviceMesh(mesh): explicit global ranks, row-major
    kGroup,    // DeviceMesh.from_group(group): 1-D over a group's ranks
    kLogical,  // a mesh of a shape and names only (PyTorch's from_logical): ranks 0..n-1,
               // no world size and no groups are created for it until asked
  };
  Kind kind = Kind::kInit;
  std::vector<int64_t> shape;
  std::vector<int64_t> ranks;  // kRanks and kGroup (one group)
  // kGroup with a list of groups ("groups"), and the optional "mesh" argument (shape, ranks).
  std::vector<std::vector<int64_t>> groups;
  bool group_list = false;
  // kGroup: each handed group's own name and backend, when given as {"ranks", "name",
  // "backend"} (PyTorch keeps a handed ProcessGroup's name and options); one entry per group.
  std::vector<std::optional<std::string>> group_names;
  std::vector<std::optional<std::string>> group_descs;  // each handed group's "desc", if given
  std::vector<std::optional<BackendConfig>> group_configs;
  std::optional<MeshArray> mesh_arg;
  MeshNames names;
  std::string device_type = "cpu";           // from_logical: "meta" unless given
  std::vector<DimOverride> backend_override;
  std::optional<bool> init_backend;          // PyTorch's _init_backend (from_logical: false)
  std::string default_backend;               // init_process_group's backend ("" = the run's)
  CreationOptions creation;                  // build keys bound_device, new_group_use_split_group, use_torchcomms
  TorchVersion torch_version = kNewestTorch; // build key torch_version: the PyTorch answered as
};

// StepSpec is one transformation. `on` names the input mesh (a handle; "root" or "_last"),
// `let` binds the result to a handle.
struct StepSpec {
  // kFindFlattened binds the mesh flattened from `names` of `on`, found by layout
  // (DeviceMesh::find_flattened); NotFound when none was flattened.
  enum class Kind { kSlice, kFlatten, kUnflatten, kConcatenate, kTranspose, kReshape, kFindFlattened };
  Kind kind = Kind::kSlice;
  std::string on = "root";
  std::optional<std::string> let;
  std::vector<std::string> names;            // slice, transpose, find_flattened: dims; unflatten, reshape: new names
  std::vector<int> order;                    // transpose by indices
  std::optional<std::string> flatten_name;   // flatten
  std::optional<BackendConfig> flatten_config;
  std::optional<std::string> dim_name;       // unflatten by name ...
  int64_t dim_index = 0;                     // ... or by index
  std::vector<int64_t> sizes;                // unflatten, reshape
  std::vector<DimOverride> backend_override; // unflatten: per new dim
  std::vector<std::string> handles;          // concatenate
};

// MeshRecipe is the whole request: world size, the optional rank it runs as, root, steps, and
// the handle of the result (default: the last step's mesh, or the root).
// GroupCallSpec is one process-group call of the user's own program, beside DeviceMesh's
// (the creation plan names every group of both as PyTorch would, rank by rank):
// new_group(ranks, use_local_synchronization=, group_desc=) or split_group(split_ranks=,
// group_desc=) on the default group. Every rank of the world makes the call, except a
// non-member of a local-synchronization new_group, which PyTorch lets skip it.
struct GroupCallSpec {
  enum class Kind { kNewGroup, kSplitGroup };
  Kind kind = Kind::kNewGroup;
  std::optional<std::vector<int64_t>> ranks;      // new_group; nullopt: every rank of the world
  std::vector<std::vector<int64_t>> split_ranks;  // split_group, as given (a group's order kept)
  bool local_sync = false;                        // new_group(use_local_synchronization=True)
  std::optional<std::string> group_desc;          // nullopt: PyTorch's "undefined"
};

// kMaxGroupCalls bounds a program's process_groups.
inline constexpr std::size_t kMaxGroupCalls = 4096;
// kMaxWorldForHashedWorld bounds the world of a use_local_synchronization new_group without ranks.
inline constexpr int64_t kMaxWorldForHashedWorld = int64_t{1} << 22;

// GroupProgram is the user's calls and where the mesh's own calls go among them: before
// calls[mesh_at] (0: the mesh first).
struct GroupProgram {
  std::vector<GroupCallSpec> calls;
  std::size_t mesh_at = 0;
};

// process_groups_from_json reads `process_groups`: a list of {"new_group": {"ranks"?,
// "use_local_synchronization"?, "group_desc"?}}, {"split_group": {"split_ranks", "group_desc"?}}
// and at most one "mesh" (where the mesh's calls go), in a world of `world` ranks; ranks are
// refused as PyTorch `v` refuses them (out of range, repeated, not integers), InvalidArgument or
// OutOfRange naming the call.
GroupProgram process_groups_from_json(const nlohmann::json& pg, int64_t world, TorchVersion v);

struct MeshRecipe {
  int64_t world_size = 0;
  std::optional<int64_t> rank;
  RootSpec root;
  std::vector<StepSpec> steps;
  std::optional<std::string> result;
  // process_groups are the user's own calls (`process_groups` in JSON); the mesh's calls (the
  // root's, then each step's) come before process_groups[mesh_at] (the "mesh" marker; default
  // 0: the mesh first).
  std::vector<GroupCallSpec> process_groups;
  std::size_t mesh_at = 0;
};

// RecipeBuilder assembles a recipe in code, step by step (presets build theirs with it; nothing
// is checked until apply):
//   MeshRecipe r = RecipeBuilder::over_world(8)
//                      .unflatten("root", "world", {2, 4}, {"dp", "tp"}).let("dense")
//                      .slice("dense", {"tp"}).result("dense").take();
class RecipeBuilder {
 public:
  // over_world: a 1-D root of `world` ranks with its one dim named "world" (init_device_mesh).
  static RecipeBuilder over_world(int64_t world);
  // Each step reads the mesh `on` names (a handle, "root" or "_last").
  RecipeBuilder& unflatten(std::string on, std::string dim, std::vector<int64_t> sizes, std::vector<std::string> names);
  RecipeBuilder& slice(std::string on, std::vector<std::string> names);
  RecipeBuilder& flatten(std::string on, std::string name);
  // let binds the last step's mesh to `name`; result names the recipe's result.
  RecipeBuilder& let(std::string name);
  RecipeBuilder& result(std::string handle);
  MeshRecipe take() { return std::move(r_); }

 private:
  MeshRecipe r_;
};

// RecipeFlags are the command-line spelling shared by `meshsim show` and `meshsim run`.
struct RecipeFlags {
  struct Step {
    std::string kind;  // "slice", "flatten", "unflatten"
    std::string arg;   // "dp,tp"; a name or ""; "dim:2,2:a,b"
  };
  std::string mesh;      // "dp=2,cp=2,tp=4"
  std::string shape;     // "2,2,4" (with `names`)
  std::string names;     // "dp,cp,tp"
  std::string rank_map;  // "8..23" or "8,9,10,..."
  std::optional<int64_t> world_size;
  std::optional<int64_t> rank;
  std::vector<Step> steps;  // each applies to the previous result
  // recipe_file: a mesh.program JSON file (world_size, build, ops with on/let, result) that is
  // the whole recipe; only --rank may be given with it.
  std::string recipe_file;
  // preset: a framework's layout (meshsim/preset.hpp), e.g. "megatron:tp=2,pp=2"; only
  // --world-size and --rank may be given with it.
  std::string preset;
};

// recipe_from_json decodes a mesh.program request object (fields world_size, rank, build, ops,
// result; other fields are ignored). ParseError/InvalidArgument/OutOfRange name the field.
MeshRecipe recipe_from_json(const nlohmann::json& program);
// recipe_from_flags decodes the command-line form; errors name the flag and value (with
// --recipe, the file's name and the decoder's error, of the decoder's type).
MeshRecipe recipe_from_flags(const RecipeFlags& flags);
// kMaxRecipeFileBytes bounds a --recipe file.
inline constexpr std::size_t kMaxRecipeFileBytes = std::size_t{16} << 20;

// View is one mesh a recipe names: the root ("root") and every mesh bound by `let`, in recipe
// order; step is its index in BuiltMeshes::meshes + 1 (0: the root).
struct View {
  std::string name;
  std::size_t step = 0;
};
std::vector<View> views(const MeshRecipe& recipe);

// BuiltMeshes are the meshes a recipe makes: the root, one mesh per step in order, the handles
// bound by `let`, the result, and the warnings of its steps ("ops[2]: slicing 'dp_cp' takes a
// flattened dim from the root mesh, ..."; flattened_slice_warning), in step order.
struct BuiltMeshes {
  DeviceMesh root;
  std::vector<DeviceMesh> meshes;
  std::map<std::string, DeviceMesh> handles;
  DeviceMesh result;
  std::vector<std::string> warnings;
};
// kShownWarnings bounds the warnings a tool prints or reports (the rest are counted): a recipe
// of thousands of such slices warns thousands of times.
inline constexpr std::size_t kShownWarnings = 16;
// shown_warnings is the first kShownWarnings of `all`, then "... and N more warnings" if any.
std::vector<std::string> shown_warnings(const std::vector<std::string>& all);

// apply builds the recipe; with `shared_root`, steps start from that root instead of building
// one. With `recipe.rank`, a derived mesh with several copies must hold that rank (PyTorch's
// rule for a rank's view), else FailedPrecondition.
BuiltMeshes apply(const MeshRecipe& recipe, const std::optional<DeviceMesh>& shared_root = {});
// apply_flags is apply for a recipe decoded from `flags`: with --recipe, its errors name the file.
BuiltMeshes apply_flags(const MeshRecipe& recipe, const RecipeFlags& flags);
// recipe_origin is what names a recipe decoded from `flags` in its errors ("--recipe 'f.json'",
// "--preset 'megatron:tp=2'"), or "" for one given inline; apply_in is apply with `origin` (when
// not empty) in front of its errors, each of its own type.
std::string recipe_origin(const RecipeFlags& flags);
BuiltMeshes apply_in(const MeshRecipe& recipe, const std::string& origin);

// resolve_backend_override turns per-dim override entries into one config per dim (empty when
// none is set), with PyTorch's errors for redundant and invalid keys.
std::vector<BackendConfig> resolve_backend_override(const std::vector<DimOverride>& entries,
                                                    const MeshNames& names, int ndim);

// backend_config_from_json reads one backend as recipes spell it: a name, null (the default),
// or {"backend", "timeout_ms", "options"}; errors name `where`.
BackendConfig backend_config_from_json(const nlohmann::json& v, std::string_view where);
// backend_override_from_json reads PyTorch's backend_override object (dim index or name ->
// backend) for a mesh of `names`/`ndim`: one config per dim, with PyTorch's errors.
std::vector<BackendConfig> backend_override_from_json(const nlohmann::json& j, const MeshNames& names, int ndim);
// with_new_dim_configs is `out` (a mesh unflattened at dim `first` into inner.size() new dims)
// with the new dims' configs replaced by `inner` and the other dims' configs kept.
DeviceMesh with_new_dim_configs(const DeviceMesh& out, int first, const std::vector<BackendConfig>& inner);

}  // namespace meshsim
