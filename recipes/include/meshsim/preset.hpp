// meshsim/preset.hpp — the meshes the frameworks build, as a recipe of named views over the 1-D
// world mesh, so `meshsim show --preset ...` and `meshsim run --preset ...` check exactly them.
//
//   torchtitan (ParallelDims.build_mesh, newest version): every view is its own row-major
//   unflatten of the world 0..W-1 (the last name varies fastest); degree-1 dims stay.
//     dataloading  pp, batch, cp, tp                 (batch = dp_replicate * dp_shard)
//     loss         loss_mesh                         (dataloading["batch", "cp"] flattened)
//     dense        pp, dp_replicate, dp_shard, cp, tp           (spmd_backend spmd_types)
//                  pp, dp_replicate, fsdp, tp  (fsdp = dp_shard * cp; partial_dtensor)
//     spmd_dense_for_fwdbwd   dp, cp, tp of the view pp, dp, cp, tp  (spmd_types only)
//     sparse       pp, dp_replicate, efsdp, ep       (efsdp = dp_shard * cp * tp / ep)
//     spmd_sparse_for_fwdbwd  dp_replicate, efsdp, ep of sparse (spmd_types, ep > 1)
//   World = pp * dp_replicate * dp_shard * cp * tp; dp_shard = -1 is inferred from the world
//   size; ep must divide dp_shard * cp * tp; etp is accepted only as 1 (torchtitan removed it).
//
//   Megatron-core (initialize_model_parallel's two RankGenerators): in the order string the
//   first name varies fastest, so a view's dims are the order's names reversed.
//     dense   the order's tp, cp, dp, pp (ep is 1 here); dp = W / (tp * cp * pp)
//     dp_cp   Megatron's data-parallel-with-cp group: dense["dp", "cp"] flattened
//     mp      Megatron's model-parallel group (tp-pp): dense["tp", "pp"] flattened
//     expert  the order's etp, ep, edp, pp (cp is 1 here); edp = W / (etp * ep * pp)
//
//   MeshRecipe r = preset::recipe("megatron:tp=2,pp=2,ep=2,order=tp-cp-ep-dp-pp", 16);
//
// Errors (InvalidArgument, OverflowError) start with "--preset FRAMEWORK:" and name the key and
// the value or rule (the framework's own rule where it has one).
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "meshsim/recipe.hpp"

namespace meshsim::preset {

// Torchtitan holds the `[parallelism]` degrees as torchtitan names them (short keys in the
// preset: pp, dp_replicate, dp_shard, cp, tp, ep, etp, spmd_backend).
struct Torchtitan {
  int64_t pp = 1, dp_replicate = 1, dp_shard = -1, cp = 1, tp = 1, ep = 1;
  std::string spmd_backend = "spmd_types";  // or "partial_dtensor"
};

// Megatron holds initialize_model_parallel's sizes (keys tp, pp, cp, ep, etp, dp, order); etp
// defaults to tp, dp is inferred from the world size when not given.
struct Megatron {
  int64_t tp = 1, pp = 1, cp = 1, ep = 1;
  std::optional<int64_t> etp, dp;
  std::string order = "tp-cp-ep-dp-pp";
};

// recipe decodes "torchtitan:KEY=V,...", "torchtitan:FILE.toml" (the job's TOML file, its
// [parallelism] table) or "megatron:KEY=V,..." and builds its recipe; `world_size` is
// --world-size (default: the product of the degrees).
MeshRecipe recipe(const std::string& spec, std::optional<int64_t> world_size);

MeshRecipe torchtitan_recipe(const Torchtitan& t, std::optional<int64_t> world_size);
MeshRecipe megatron_recipe(const Megatron& m, std::optional<int64_t> world_size);
// megatron_views: Megatron-core's dense and expert views as megatron_recipe unflattens the world
// 0..W-1 into them (row-major, the first name slowest; dense: the order's tp, cp, dp, pp reversed,
// expert: its etp, ep, edp, pp), after every check of the sizes and the order. What the recipe
// and `meshsim step` both lay Megatron's ranks out by.
struct ViewShape {
  std::vector<std::string> names;
  std::vector<int64_t> sizes;
};
struct MegatronViews {
  int64_t world = 0;
  ViewShape dense, expert;
};
MegatronViews megatron_views(const Megatron& m, std::optional<int64_t> world_size);
// torchtitan_views: torchtitan's degrees after its checks (dp_shard=-1 resolved from the world
// size; the product equal to the world; ep dividing dp_shard x cp x tp) and the two views its
// ParallelDims unflattens the world into, row-major: dense (pp, dp_replicate, dp_shard, cp, tp)
// and sparse (pp, dp_replicate, efsdp, ep), dp_shard x cp x tp cut with ep the faster. What
// torchtitan_recipe builds from and `meshsim step` lays torchtitan's ranks out by.
struct TorchtitanViews {
  int64_t world = 0;
  Torchtitan degrees;
  ViewShape dense, sparse;
};
TorchtitanViews torchtitan_views(Torchtitan t, std::optional<int64_t> world_size);

// megatron_spec decodes "megatron:KEY=V,..." into its sizes (dp may stay unset);
// InvalidArgument for another framework.
Megatron megatron_spec(const std::string& spec);

// torchtitan_spec decodes "torchtitan:KEY=V,..." or "torchtitan:FILE" (a job file, TOML or
// torchtitan's saved JSON, read whole by torchtitan_job.hpp) into its degrees (dp_shard may stay
// -1); InvalidArgument for another framework.
Torchtitan torchtitan_spec(const std::string& spec);

// TomlTable is one table of a TOML file, its scalar keys by kind.
struct TomlTable {
  std::map<std::string, int64_t> integers;
  std::map<std::string, double> floats;
  std::map<std::string, bool> booleans;
  std::map<std::string, std::string> strings;
};
// read_toml_table reads `table` of a TOML file under the guards every TOML input has (1 MiB, 64
// dotted parts); nullopt when the file has no such table. A file that cannot be read names
// `what` (the flag) and the path; ParseError for a file that is not TOML, InvalidArgument for a
// table that is not one or a key holding an array, a table or a date; those messages start with
// `where`.
std::optional<TomlTable> read_toml_table(const std::string& path, const std::string& table, const std::string& what,
                                         const std::string& where);
// did_you_mean is " (did you mean 'K'?)" for the known name K nearest `name`, when it is near
// (at most a third of its letters differ), else "".
std::string did_you_mean(const std::string& name, const std::vector<std::string>& known);

}  // namespace meshsim::preset
