#!/usr/bin/env bash
# Installs what meshsim's build and tests need (idempotent, non-interactive):
#  1. Debian's packages, named one by one below (apt-get only for those missing).
#  2. The project's Python environment, .venv: a venv on a Python 3.11 (the CPU wheel of PyTorch
#     2.13.0 on this kind of machine's disk is for 3.11) holding requirements.txt, every package
#     pinned: torch==2.13.0, torchtitan, megatron-core, pytest, hypothesis. Reinstalled only
#     when requirements.txt changes. The build finds it (CMakeLists.txt): the Python module is
#     built for its interpreter and the `python` label runs there.
#  2b. .venv-torch214: the same pins with torch==2.14.1 instead (MESHSIM_NO_TORCH214=1 leaves it out).
#  3. Where the CUDA toolkit has no nccl.h: NCCL's headers and library from PyPI's nvidia-nccl
#     wheel for the toolkit's CUDA major, into .venv (the `nccl` preset looks there).
# MESHSIM_NO_LAUNCHERS=1 leaves out the launchers (python3-torch, MPI, Slurm); MESHSIM_NO_VENV=1
# leaves out .venv (the tests that need torch 2.13 then skip, saying why); MESHSIM_PYTHON names
# the Python 3.11 to build .venv on.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "install-deps: $*"; }

# -- 1. Debian's packages ---------------------------------------------------------------------
# protobuf-compiler is for the tests only: they decode `meshsim step --chakra` files with protoc.
# python3-pytest and python3-hypothesis: the module's suite under the sanitizers, in Debian's own
# interpreter. python3-venv: `python3 -m venv` with Debian's Python.
pkgs=(g++ cmake ninja-build libgtest-dev librapidcheck-dev libgloo-dev libboost-dev libbenchmark-dev
      libcli11-dev nlohmann-json3-dev rapidjson-dev libtomlplusplus-dev
      libxml2-utils librsvg2-bin protobuf-compiler
      pybind11-dev python3-dev python3-venv python3-pytest python3-hypothesis)
# The launchers the `launchers` tests run for real: torchrun and torch.distributed.TCPStore of
# Debian's python3-torch (1.13 on Debian 12; the 2.13 ones come from .venv), mpirun (openmpi-bin),
# mpiexec.mpich (mpich), srun with slurmctld and slurmd (slurm-wlm; the test starts a one-node
# cluster of its own as root). A package the image's Debian does not have is left out, saying so.
if [ "${MESHSIM_NO_LAUNCHERS:-0}" != 1 ]; then pkgs+=(python3 python3-torch openmpi-bin mpich slurm-wlm); fi
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
missing=()
for p in "${pkgs[@]}"; do installed "$p" || missing+=("$p"); done
if ((${#missing[@]})); then
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
  available=()
  for p in "${missing[@]}"; do
    if apt-cache show "$p" >/dev/null 2>&1; then available+=("$p"); else
      say "Debian $(. /etc/os-release; echo "${VERSION_ID:-?}") has no package '$p': left out (docs/testing.md says what skips)"
    fi
  done
  if ((${#available[@]})); then
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${available[@]}"
  fi
fi

# -- 2. The project's Python environment ------------------------------------------------------
[ "${MESHSIM_NO_VENV:-0}" = 1 ] && { say "MESHSIM_NO_VENV=1: .venv left out"; exit 0; }
is311() { "$1" -c 'import sys, venv; sys.exit(sys.version_info[:2] != (3, 11))' >/dev/null 2>&1; }
py=""
for c in ${MESHSIM_PYTHON:-} python3.11 python3 /usr/bin/python3.11; do
  if command -v "$c" >/dev/null 2>&1 && is311 "$c"; then py=$(command -v "$c"); break; fi
done
if [ -z "$py" ]; then
  say "no Python 3.11 found (tried ${MESHSIM_PYTHON:-} python3.11 python3 /usr/bin/python3.11): .venv left out;" \
      "the torch 2.13 tests will skip, saying so (set MESHSIM_PYTHON to a Python 3.11)"
  exit 0
fi
# Which NCCL wheel, if any: the toolkit's CUDA major, only where the toolkit lacks nccl.h.
nccl=""
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
if [ -x "$nvcc" ] && [ ! -f "$(dirname "$(dirname "$(readlink -f "$nvcc")")")/include/nccl.h" ]; then
  major=$("$nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
  nccl=$(sed -n "s/^# nccl: \(nvidia-nccl-cu${major}==.*\)/\1/p" requirements.txt)
  [ -n "$nccl" ] || say "CUDA ${major:-?} has no nvidia-nccl line in requirements.txt: the nccl preset needs NCCL_HOME"
fi
# make_venv DIR TORCH_PIN CHECK: a venv on $py holding requirements.txt with torch pinned to
# TORCH_PIN (the other pins as they are), rebuilt only when requirements.txt, the interpreter or
# the pin changes (DIR/.meshsim-installed).
make_venv() {
  local dir=$1 torch_pin=$2 release=$3 extra=${4:-}
  local stamp="$dir/.meshsim-installed"
  local want
  want="$("$py" -c 'import sys; print(sys.version)') $(sha256sum requirements.txt | cut -c1-64) ${torch_pin} ${extra}"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$dir/bin/python" ]; then
    say "$dir is up to date ($("$dir/bin/python" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null))"
    return 0
  fi
  local start=$SECONDS
  say "creating $dir on $py ($("$py" --version)) with $torch_pin"
  if [ -d "$dir" ] && ! is311 "$dir/bin/python"; then rm -rf "$dir"; fi
  "$py" -m venv "$dir"
  local pip=("$dir/bin/python" -m pip --disable-pip-version-check install -q --no-input)
  "${pip[@]}" "$torch_pin" -r <(grep -v '^torch==' requirements.txt)
  [ -z "$extra" ] || "${pip[@]}" "$extra"
  local check
  check=$("$dir/bin/python" -c "import torch, torchtitan, megatron.core; assert torch.__version__.split('+')[0] == '$release', torch.__version__" 2>&1) ||
    { echo "$check"; say "$dir does not import torch $release, torchtitan and megatron.core"; exit 1; }
  echo "$want" > "$stamp"
  say "$dir ready in $((SECONDS - start)) s: $("$dir/bin/python" -c 'import torch; print("torch", torch.__version__)')${extra:+, $extra}"
}
# .venv: torch 2.13.0 (the CPU wheel on this kind of machine's disk), the project's main environment.
make_venv .venv "$(grep '^torch==' requirements.txt)" 2.13.0 "$nccl"
# .venv-torch214: the same pins beside torch 2.14.1 (the CUDA build on the machine's local
# mirror, ~5.5 GB, runs on the CPU), for the torch214 tests (docs/testing.md). Every other pin of
# requirements.txt installs beside it. MESHSIM_NO_TORCH214=1 leaves it out (those tests skip,
# saying so).
if [ "${MESHSIM_NO_TORCH214:-0}" = 1 ]; then
  say "MESHSIM_NO_TORCH214=1: .venv-torch214 left out"
else
  make_venv .venv-torch214 "torch==2.14.1" 2.14.1
fi
