// meshsim/creation_plan.hpp — which process-group calls PyTorch's DeviceMesh makes, on every
// rank, in order, for a recipe: the calls each rank must make in the same order (ranks that
// create groups in different orders hang in new_group), which groups a view creates anew and
// which it reuses, and the configurations PyTorch refuses (a backend that cannot split).
//
//   BuiltMeshes built = apply(recipe);
//   CreationPlan plan = creation_plan(recipe, built);   // FailedPrecondition: cannot split
//   for (const CreationBatch& b : plan.batches) ...     // one dim's calls, in order
//
// The rules are PyTorch's DeviceMesh._init_one_process_group and the ops that call it
// (torch/distributed/device_mesh.py at cyyever/pytorch 2ef3b7f058b6a63a0f7255d3624fd80347e1bfac,
// a mirror of pytorch/pytorch main of 2026):
//   - init_device_mesh / DeviceMesh(mesh) create every dim's groups, dim by dim; from_group
//     keeps the groups it is handed; slicing and concatenating create none;
//   - _flatten creates the flattened dim's groups, unless its name was flattened before with
//     the same layout (then it reuses them) or a 1-D mesh is flattened into its own name;
//   - _unflatten of a mesh with groups creates every new dim's groups, even where the same
//     groups exist (PyTorch keeps no cache of groups by layout: those are created twice);
//   - per dim: a dim as large as the world with no backend override reuses the default group
//     (`default`), or, on an accelerator machine whose default backend is gloo, makes
//     new_group(all ranks, group_desc="mesh_default"); with a default group bound to a device
//     (init_process_group(device_id=...)) or torchcomms, on an accelerator, when the dim's
//     backend is unset or the default's, one split_group(parent=default, split_ranks=every
//     group) — refused (FailedPrecondition naming the dim and backend) when that backend cannot
//     split; else new_group(ranks=g) for every group g in order, on every rank
//     (use_local_synchronization=True, on members only, for a "fake" dim under torchcomms).
// meshsim's own transpose, reshape and find_flattened are not PyTorch calls: they create
// nothing (a view they make reuses the cached groups meshsim gives it).
//
// Thread safety: plain values; creation_plan may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshsim/device_mesh.hpp"
#include "meshsim/recipe.hpp"

namespace meshsim {

// CreationBatch is one dim's creation: one call (default, split_group) or one new_group per
// group of the dim, in the dim's group order.
struct CreationBatch {
  enum class Kind { kDefault, kNewGroup, kSplitGroup };
  Kind kind = Kind::kNewGroup;
  std::size_t step = 0;        // the recipe step that creates it (0: the root, k: ops[k-1])
  std::string dim;             // PyTorch's dim name: the mesh's, or "dim_<i>" when unnamed
  std::string group_desc;      // "mesh_<dim>", or "mesh_default"
  std::string backend;         // the groups' backend (the dim's config, else the default's)
  BackendConfig config;        // the dim's config as given
  bool local_sync = false;     // new_group(use_local_synchronization=True): members call it only
  bool via_split = false;      // new_group_use_split_group: each new_group splits the default group
  std::shared_ptr<const GroupRecord> record;  // the dim's groups (record->table()), and their name
  int64_t groups = 0;          // the dim's group count
  // calls is how many calls a rank outside no group makes: 0 (default), 1 (split_group, or one
  // new_group of every rank), or the dim's group count.
  int64_t calls() const;
};

// CreationStep is what one step of the recipe does with groups: how many it creates, how many
// it reuses (each dim's groups, counted per group), and how many of the created ones exist
// already (created by an earlier step: PyTorch makes them a second time).
struct CreationStep {
  std::string op;    // "init_device_mesh", "DeviceMesh", "from_group", "from_logical", "slice", ...
  std::string view;  // the view's name ("root", a `let` name), or "ops[k]"
  int64_t created = 0;
  int64_t reused = 0;
  int64_t created_again = 0;
  bool pytorch = true;  // false: meshsim's own op (transpose, reshape, find_flattened, from_logical)
};

struct CreationPlan {
  CreationOptions options;
  std::string default_backend;  // the default group's backend ("nccl" on an accelerator, else "gloo", unless set)
  bool accelerator = false;     // the mesh's device is an accelerator (not cpu or meta)
  int64_t world = 0;
  std::vector<CreationStep> steps;      // the root, then one per recipe step
  std::vector<CreationBatch> batches;   // every rank's calls, in order
  TorchVersion torch_version = kNewestTorch;  // the root's: how groups are named (group_names.hpp)
  // program is the user's own process-group calls; the batches come before program[mesh_at].
  std::vector<GroupCallSpec> program;
  std::size_t mesh_at = 0;
};

// creation_plan is the plan of `recipe` as `built` (apply(recipe)) made it.
CreationPlan creation_plan(const MeshRecipe& recipe, const BuiltMeshes& built);
// creation_plan of a mesh is the plan of its universe as this process made it: every root,
// flatten and unflatten call on any mesh of its root, in call order (DeviceMesh::creation_events;
// a step per call, "call k"), under `options`, in a world of `world` ranks (0: the root's).
CreationPlan creation_plan(const DeviceMesh& mesh, const CreationOptions& options, int64_t world = 0);

// makes_calls says whether `rank` takes part in `b`'s call for group g (every rank does, except
// for local-synchronization new_groups, where only the group's members call).
bool makes_call(const CreationBatch& b, int64_t group, int64_t rank);

// kind_name: "default", "new_group", "split_group".
std::string_view kind_name(CreationBatch::Kind k);

// can_split says whether a backend's process groups split (ProcessGroupNCCL, ProcessGroupGloo
// and the fake backend do; XCCL, MPI, UCC and others do not).
bool can_split(std::string_view backend);

// creation_order is the plan's batches that make calls (not `default`), in order, with batches
// swap and swap + 1 exchanged (a planted reorder; -1: none).
std::vector<const CreationBatch*> creation_order(const CreationPlan& plan, int64_t swap = -1);

// creation_digest is the plan's creation sequence as a 64-bit digest (kind, dim, description,
// backend, config, the groups' name and count per batch), in O(batches). `swap` exchanges
// batches swap and swap + 1 first (a planted reorder); -1: none.
uint64_t creation_digest(const CreationPlan& plan, int64_t swap = -1);

// creation_plan_json is the plan as rank `me` makes it: {"rank", "options" (bound_device,
// new_group_use_split_group, use_torchcomms, default_backend, accelerator), "steps" (op, view,
// created, reused, created_again, pytorch), "calls"}: one object a call, in order —
// {"call": "new_group", "dim", "view", "ranks", "backend", "group_desc",
// "use_local_synchronization", "new_group_use_split_group"}, {"call": "split_group", ...,
// "parent": "default", "split_ranks"}, {"call": "default", "dim", ...} (the dim is the default
// group: no call). `charge(keys, per_key, overhead)` is called before each part is built, so
// an answer's budget refuses a large plan (ResourceExhausted) before it is listed.
using Charge = std::function<void(int64_t keys, int64_t per_key, int64_t overhead)>;
nlohmann::json creation_plan_json(const CreationPlan& plan, int64_t me, const Charge& charge);

// describe_batch is one batch for a message: "new_group x4 for dim 'dp' of ops[1] (groups
// group[2:4]@default)".
std::string describe_batch(const CreationPlan& plan, const CreationBatch& b);

}  // namespace meshsim
