// mesh_program.hpp — the `mesh.program` and `mesh.equal` query ops: build a DeviceMesh, apply a
// chain of slice / flatten / unflatten / concatenate steps, and describe the result.
//
//   {"op": "mesh.program", "world_size": 8,
//    "build": {"init_device_mesh": {"mesh_shape": [2, 4], "mesh_dim_names": ["dp", "tp"]}},
//    "ops": [{"slice": "tp"}], "want": ["groups_by_dim"]}
//   -> {"groups_by_dim": {"tp": [[0, 1, 2, 3], [4, 5, 6, 7]]}}
//
// Fields: mesh_dim_names, layout, shape, ndim, size, rank_map, mesh_by_rank,
// coordinate_by_rank, groups_by_dim, local_rank_by_rank (the default set), and the rank-scoped
// coordinate, local_rank, my_groups (for `rank`, default 0). Per-rank maps list every world rank
// for a root and every rank of the root's rank map for a derived mesh. With an explicit `rank`,
// the program runs as that rank: a derived mesh with several copies that does not hold it is an
// error, as in PyTorch. Answers larger than kMaxEnumeration elements are ResourceExhausted.
//
// Thread safety: every function is safe from any thread (no process-wide state).
#pragma once

#include <nlohmann/json.hpp>

#include "meshsim/device_mesh.hpp"
#include "meshsim/recipe.hpp"

namespace meshsim::query {

// kDefaultMaxAnswerElements is the default budget of one answer, in elements (ranks, values and
// per-rank keys): a larger answer is ResourceExhausted naming the size it would have had. The
// budget is passed with every request (meshsim query --max-elements); nothing is process-wide.
inline constexpr int64_t kDefaultMaxAnswerElements = int64_t{1} << 21;

// run_mesh_program answers a mesh.program request (the request object itself) within
// max_elements.
nlohmann::json run_mesh_program(const nlohmann::json& request, int64_t max_elements = kDefaultMaxAnswerElements);
// describe answers the `want` fields of a built recipe's result (what `meshsim show --format
// json` prints), within max_elements.
nlohmann::json describe(const MeshRecipe& recipe, const BuiltMeshes& built, const std::vector<std::string>& want,
                        int64_t max_elements = kDefaultMaxAnswerElements);
// run_mesh_equal answers {"a": program, "b": program, "same_root"?: bool}.
nlohmann::json run_mesh_equal(const nlohmann::json& request);
// build_mesh_program runs a program's build and ops and returns the result mesh (for tools).
DeviceMesh build_mesh_program(const nlohmann::json& request);
// nested turns a row-major array into nested JSON lists.
nlohmann::json nested(const MeshArray& a);

}  // namespace meshsim::query
