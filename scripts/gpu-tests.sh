#!/usr/bin/env bash
# GPU CI: build with NCCL (the `nccl` preset), then on the GPUs of this machine run
#   - the NCCL backend's tests: the fake-backed logic (label nccl_fake) and every SPMD test's
#     `/nccl` instance (label nccl; a test needing more GPUs than present skips, saying so);
#   - `meshsim run --backend nccl` as rank threads over every GPU, and as one process per GPU
#     under `meshsim launch`.
# Needs the CUDA toolkit (NCCL from the toolkit, NCCL_HOME, or the nvidia-nccl wheel that
# install-deps.sh puts into .venv where the toolkit has none) and at least one GPU with a driver.
#
# MESHSIM_GPU_PREBUILT=DIR runs the same checks on a GPU machine that cannot build (no package
# registry): DIR holds `meshsim`, `meshsim_nccl_tests` and `meshsim_spmd_tests` built elsewhere
# with the nccl preset, and the test binaries run directly instead of under ctest. The shared
# libraries they need must be on the loader's path (LD_LIBRARY_PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${MESHSIM_GPU_PREBUILT:-}" ]; then
  bin="${MESHSIM_GPU_PREBUILT}"
  meshsim="${bin}/meshsim"
else
  scripts/install-deps.sh
  cmake --preset nccl
  cmake --build --preset nccl --target meshsim meshsim_spmd_tests meshsim_nccl_tests
  meshsim=build/nccl/apps/meshsim
fi
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
echo "== GPUs: ${gpus}"
if [ "${gpus}" -lt 1 ]; then
  echo "no GPU visible (nvidia-smi -L lists none): only the fake-backed tests can run" >&2
fi
if [ -n "${MESHSIM_GPU_PREBUILT:-}" ]; then
  echo "== nccl_fake: the backend's logic over the fake NCCL"
  "${bin}/meshsim_nccl_tests"
  echo "== nccl: every SPMD test's /nccl instance on the real NCCL"
  "${bin}/meshsim_spmd_tests" --gtest_filter='*/nccl'
else
  ctest --test-dir build/nccl -L "nccl" --output-on-failure
fi
if [ "${gpus}" -ge 1 ]; then
  echo "== meshsim run --backend nccl, rank threads over ${gpus} GPU(s)"
  "${meshsim}" run --backend nccl --mesh "tp=${gpus}"
  if [ $((gpus % 2)) -eq 0 ]; then
    "${meshsim}" run --backend nccl --mesh "dp=2,tp=$((gpus / 2))" --fault mismatch@1 && exit 1 || true
    "${meshsim}" run --backend nccl --mesh "dp=2,tp=$((gpus / 2))"
  fi
  echo "== meshsim launch: one process per GPU"
  "${meshsim}" launch -n "${gpus}" -- "${meshsim}" run --backend nccl --mesh "tp=${gpus}"
  if [ "${gpus}" -ge 2 ]; then
    # Planted faults across GPUs and processes: each must end (exit 1 or 2, never a hang or a
    # success) with a diagnostic naming rank 1.
    for fault in stall@1 mismatch@1 throw@1 exit@1; do
      echo "== planted ${fault}, one process per GPU"
      status=0
      out=$(timeout 120 "${meshsim}" launch -n "${gpus}" --timeout 90 -- "${meshsim}" run --backend nccl \
            --mesh "tp=${gpus}" --timeout 10 --fault "${fault}" 2>&1) || status=$?
      echo "${out}" | grep -E "FAILED|launch:" || true
      if [ "${status}" -eq 0 ] || [ "${status}" -eq 124 ]; then echo "${fault}: exit ${status}" >&2; exit 1; fi
      echo "${out}" | grep -q "FAILED rank 1" || { echo "${fault}: rank 1 not named" >&2; exit 1; }
    done
  fi
fi
echo "== GPU tests passed"
