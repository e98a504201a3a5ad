#!/usr/bin/env bash
# The main job until the simulator lands: build, then answer a few layout questions through
# `meshsim query` (JSON Lines in, one answer per line out).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset default >/dev/null
cmake --build --preset default --target meshsim
./build/default/apps/meshsim query <<'JSONL'
{"id": "dp groups of a 2x4 mesh", "op": "mesh_global_ranks", "layout": {"shape": 2, "stride": 4}, "world_size": 8}
{"id": "tp groups of a 2x4 mesh", "op": "mesh_global_ranks", "layout": {"shape": 4, "stride": 1}, "world_size": 8}
{"id": "flatten dp,tp of 2x2x2", "op": "mesh_flatten", "layout": {"shape": [2, 2], "stride": [4, 1]}}
{"id": "unflatten 8 into 2x2x2", "op": "mesh_unflatten", "layout": "8:1", "dim": 0, "sizes": [2, 2, 2]}
{"id": "torch complement", "op": "complement_bound", "layout": "(2,2):(4,1)", "bound": 16}
{"id": "cute complement", "op": "complement_bound", "convention": "cute", "layout": "(2,2):(1,4)", "bound": 16}
{"id": "pycute truncates this; meshsim refuses", "op": "composition", "convention": "cute", "a": "(3,4):(1,5)", "b": "4:1"}
{"id": "malformed", "op": "size", "layout": {"shape": [2, 2], "stride": [1]}}
JSONL
