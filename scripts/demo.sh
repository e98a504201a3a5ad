#!/usr/bin/env bash
# The main job until the simulator lands: build, show a dp=2,cp=2,tp=2 mesh (its mesh array,
# groups and coordinates), then answer layout and DeviceMesh questions through `meshsim query`.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset default >/dev/null
cmake --build --preset default --target meshsim
./build/default/apps/meshsim show --mesh dp=2,cp=2,tp=2 --slice dp,tp --rank 6
echo
./build/default/apps/meshsim query <<'JSONL'
{"id": "dp groups of a 2x4 mesh", "op": "mesh_global_ranks", "layout": {"shape": 2, "stride": 4}, "world_size": 8}
{"id": "flatten dp,tp of 2x2x2", "op": "mesh_flatten", "layout": {"shape": [2, 2], "stride": [4, 1]}}
{"id": "unflatten 8 into 2x2x2", "op": "mesh_unflatten", "layout": "8:1", "dim": 0, "sizes": [2, 2, 2]}
{"id": "torch complement", "op": "complement_bound", "layout": "(2,2):(4,1)", "bound": 16}
{"id": "pycute truncates this; meshsim refuses", "op": "composition", "convention": "cute", "a": "(3,4):(1,5)", "b": "4:1"}
{"id": "ranks 8..15: slice tp", "op": "mesh.program", "world_size": 16, "build": {"DeviceMesh": {"mesh": [[8, 9, 10, 11], [12, 13, 14, 15]], "mesh_dim_names": ["dp", "tp"]}}, "ops": [{"slice": "tp"}], "want": ["groups_by_dim", "coordinate_by_rank"]}
{"id": "cp,dp is out of stride order", "op": "mesh.program", "world_size": 8, "build": {"init_device_mesh": {"mesh_shape": [2, 2, 2], "mesh_dim_names": ["dp", "cp", "tp"]}}, "ops": [{"slice": ["cp", "dp"]}]}
{"id": "malformed", "op": "size", "layout": {"shape": [2, 2], "stride": [1]}}
JSONL
