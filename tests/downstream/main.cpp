// A downstream project: the algebra and the README's DeviceMesh example, through the installed
// package.
#include <meshsim/algebra.hpp>
#include <meshsim/device_mesh.hpp>
#include <meshsim/error.hpp>
#include <meshsim/mesh_json.hpp>

int main() {
  meshsim::Layout r = meshsim::complement(meshsim::parse_layout("(2,2):(4,1)"), 16);
  if (r != meshsim::parse_layout("(2,2):(8,2)")) return 1;
  try {
    meshsim::parse_layout("(2,2):(1)");
    return 2;
  } catch (const meshsim::InvalidArgument&) {
  }
  using namespace meshsim;
  using Names = std::vector<std::string>;
  DeviceMesh mesh = DeviceMesh::init({2, 2, 2}, Names{"dp", "cp", "tp"}, {.world_size = 8});
  DeviceMesh dp_tp = mesh.slice({"dp", "tp"});
  if (dp_tp.mesh_for(2)->values != std::vector<int64_t>{2, 3, 6, 7}) return 3;
  mesh.slice({"dp", "cp"}).flatten();
  if (mesh.slice({"dp_cp", "tp"}).groups(0) !=
      std::vector<std::vector<int64_t>>{{0, 2, 4, 6}, {1, 3, 5, 7}}) {
    return 4;
  }
  if (mesh.coordinate(5) != std::vector<int64_t>{1, 0, 1}) return 5;
  if (mesh.group_of(5, mesh.dim_index("tp")) != std::vector<int64_t>{4, 5}) return 6;
  DeviceMesh ep = DeviceMesh::init({8}, Names{"world"})
                      .unflatten(0, std::vector<int64_t>{2, 2, 2}, Names{"dp", "ep", "ep_tp"});
  if (ep.group_record(0)->rows().size() != 4) return 7;
  DeviceMesh back = load_mesh(save_mesh(dp_tp));
  if (back == dp_tp || !equivalent(back, dp_tp)) return 8;
  return 0;
}
