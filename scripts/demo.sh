#!/usr/bin/env bash
# The main job: build, then simulate every rank of a dp=2,cp=2,tp=4 mesh over the threaded
# backend with `meshsim run` (each rank checks its groups on every dim against all_gather and
# all_reduce over that dim's communicator). Extra arguments go to `meshsim run`, e.g.
#   scripts/demo.sh --mesh dp=8,cp=8,tp=16          (1024 ranks)
#   scripts/demo.sh --fault stall@3 --timeout 2     (a diagnosed stall, exit 1)
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset default >/dev/null
cmake --build --preset default --target meshsim
if [ "$#" -eq 0 ]; then set -- --mesh dp=2,cp=2,tp=4; fi
exec ./build/default/apps/meshsim run "$@"
