// meshsim/mesh_json.hpp — JSON save/load of a DeviceMesh with its root and flatten registry.
//
//   std::string text = save_mesh(mesh.slice({"dp", "tp"}));
//   DeviceMesh back = load_mesh(text);   // a new universe
//   equivalent(back, mesh.slice({"dp", "tp"})) && back != mesh.slice({"dp", "tp"})
//
// The document (version 1) holds the device type, world size, the root's shape, names and
// rank map ({"start": s} for a contiguous run, else the list), the flatten registry (name and
// layout in CuTe text form) and the mesh's layout and names. Group handles and backend configs
// are not stored. Loading validates everything a constructor would (duplicate ranks, names,
// layouts that do not tile the rank map, registry clashes) and reports malformed or truncated
// text as meshsim::ParseError; it never crashes.
#pragma once

#include <string>
#include <string_view>

#include "meshsim/device_mesh.hpp"

namespace meshsim {

// kMeshJsonVersion is the document version save_mesh writes and load_mesh reads.
inline constexpr int kMeshJsonVersion = 1;

std::string save_mesh(const DeviceMesh& mesh);
DeviceMesh load_mesh(std::string_view text);

}  // namespace meshsim
