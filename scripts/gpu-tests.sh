#!/usr/bin/env bash
# GPU CI: build with NCCL (the `nccl` preset), then on the GPUs of this machine run
#   - the NCCL backend's tests: the fake-backed logic (label nccl_fake) and every SPMD test's
#     `/nccl` instance (label nccl; a test needing more GPUs than present skips, saying so);
#   - `meshsim run --backend nccl` as rank threads over every GPU, and as one process per GPU
#     under `meshsim launch`.
# Needs the CUDA toolkit with NCCL in /usr/local/cuda and at least one GPU with a driver.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset nccl
cmake --build --preset nccl --target meshsim meshsim_spmd_tests meshsim_nccl_tests
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
echo "== GPUs: ${gpus}"
if [ "${gpus}" -lt 1 ]; then
  echo "no GPU visible (nvidia-smi -L lists none): only the fake-backed tests can run" >&2
fi
ctest --test-dir build/nccl -L "nccl" --output-on-failure
if [ "${gpus}" -ge 1 ]; then
  build/nccl/apps/meshsim run --backend nccl --mesh "tp=${gpus}"
  if [ $((gpus % 2)) -eq 0 ]; then
    build/nccl/apps/meshsim run --backend nccl --mesh "dp=2,tp=$((gpus / 2))" --fault mismatch@1 && exit 1 || true
    build/nccl/apps/meshsim run --backend nccl --mesh "dp=2,tp=$((gpus / 2))"
  fi
  build/nccl/apps/meshsim launch -n "${gpus}" -- build/nccl/apps/meshsim run --backend nccl --mesh "tp=${gpus}"
fi
echo "== GPU tests passed"
