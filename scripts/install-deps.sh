#!/usr/bin/env bash
# Installs meshsim's build dependencies from Debian's packages (idempotent, non-interactive).
# protobuf-compiler is for the tests only: they decode `meshsim step --chakra` files with protoc.
set -euo pipefail
pkgs=(g++ cmake ninja-build libgtest-dev librapidcheck-dev libgloo-dev libboost-dev libbenchmark-dev
      libcli11-dev nlohmann-json3-dev rapidjson-dev libtomlplusplus-dev
      libxml2-utils librsvg2-bin protobuf-compiler
      pybind11-dev python3-dev python3-pytest python3-hypothesis)
# The launchers the `launchers` tests run for real: torchrun and torch.distributed.TCPStore
# (python3-torch), mpirun (openmpi-bin), mpiexec.mpich (mpich), srun with slurmctld and slurmd
# (slurm-wlm; the test starts a one-node cluster of its own as root). MESHSIM_NO_LAUNCHERS=1
# leaves them out (those tests then skip, saying why).
if [ "${MESHSIM_NO_LAUNCHERS:-0}" != 1 ]; then pkgs+=(python3 python3-torch openmpi-bin mpich slurm-wlm); fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
