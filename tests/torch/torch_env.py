"""Which PyTorch a `tests/torch` file runs against, and which release meshsim is asked to model.

ctest runs every file twice (python/CMakeLists.txt): `torch:NAME` in .venv (PyTorch 2.13.0) and
`torch214:NAME` in .venv-torch214 (2.14.1), with MESHSIM_TORCH_VERSION naming the release that
environment must hold. `check()` fails a run whose torch is not that release (a venv rebuilt with
the wrong wheel would otherwise pass as the other version); `MODEL` is the version string meshsim's
`torch_version` option takes for it ("2.13" or "2.14"), so meshsim answers as the PyTorch beside it.
"""
import os

RELEASE = os.environ.get("MESHSIM_TORCH_VERSION", "2.13.0")
MODEL = ".".join(RELEASE.split(".")[:2])


def running():
    import torch
    return torch.__version__.split("+")[0]


def check():
    found = running()
    assert found == RELEASE, f"this run is for PyTorch {RELEASE} (MESHSIM_TORCH_VERSION), the interpreter has {found}"


def at_least(version):
    """Whether the PyTorch under test is `version` ("2.14") or newer."""
    return tuple(int(x) for x in MODEL.split(".")) >= tuple(int(x) for x in version.split("."))
