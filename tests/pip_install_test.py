#!/usr/bin/env python3
"""`pip install .` as a Python user runs it: a fresh venv, pip building meshsim from this source
tree (pyproject.toml: scikit-build-core through CMakeLists.txt, in pip's isolated build
environment), then the installed package used from outside the source tree: `import meshsim`
gives every rank's groups, and the `meshsim` tool is on the venv's PATH and runs the main job.

Usage: pip_install_test.py --source DIR --work DIR [--python PY]
The build directory (WORK/build) is kept, so a second run rebuilds only what changed; the venv
(WORK/venv) is made afresh every time.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--python", default=sys.executable, help="the interpreter the venv is made from")
    a = ap.parse_args()
    venv = os.path.join(a.work, "venv")
    shutil.rmtree(venv, ignore_errors=True)
    os.makedirs(a.work, exist_ok=True)
    subprocess.run([a.python, "-m", "venv", venv], check=True, timeout=300)
    py = os.path.join(venv, "bin", "python")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "MESHSIM_", "VIRTUAL_ENV"))}
    t0 = time.monotonic()
    p = subprocess.run([py, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", a.source,
                        "-C", f"build-dir={os.path.join(a.work, 'build')}"],
                       capture_output=True, text=True, env=env, timeout=2400)
    print(f"pip install . took {time.monotonic() - t0:.1f} s (exit {p.returncode})")
    if p.returncode != 0:
        print(p.stdout[-20000:], p.stderr[-20000:], sep="\n")
        return 1

    # Used from an empty directory, so nothing of the source or build tree is on the path.
    cwd = os.path.join(a.work, "elsewhere")
    os.makedirs(cwd, exist_ok=True)
    probe = r"""
import json, os, sys, meshsim
mesh = meshsim.init_device_mesh((2, 3, 4), ("dp", "cp", "tp"))
print(json.dumps({"file": meshsim.__file__, "prefix": sys.prefix,
                  "groups": {d: mesh[d].groups(r) for d in ("dp", "cp", "tp") for r in [0]}}))
"""
    p = subprocess.run([py, "-c", probe], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)
    if p.returncode != 0:
        print("import meshsim failed in the fresh venv:", p.stdout, p.stderr, sep="\n")
        return 1
    got = json.loads(p.stdout.splitlines()[-1])
    if not os.path.realpath(got["file"]).startswith(os.path.realpath(venv)):
        print(f"meshsim was imported from {got['file']}, not from the venv {venv}")
        return 1
    # Brute force: row-major (2, 3, 4); a dim's groups vary that dim with the others fixed.
    shape, strides = (2, 3, 4), (12, 4, 1)
    fails = 0
    for i, d in enumerate(("dp", "cp", "tp")):
        others = [j for j in range(3) if j != i]
        want = []
        for a0 in range(shape[others[0]]):
            for a1 in range(shape[others[1]]):
                base = a0 * strides[others[0]] + a1 * strides[others[1]]
                want.append([base + k * strides[i] for k in range(shape[i])])
        want.sort()
        if sorted(got["groups"][d]) != want:
            print(f"dim {d}: groups {got['groups'][d]} from the installed module, expected {want}")
            fails += 1

    tool = os.path.join(venv, "bin", "meshsim")
    if not os.access(tool, os.X_OK):
        print(f"the meshsim tool is not installed at {tool}")
        return 1
    p = subprocess.run([tool, "run", "--mesh", "dp=2,tp=2"], capture_output=True, text=True, cwd=cwd, env=env,
                       timeout=120)
    if p.returncode != 0 or "OK: every rank's groups match the mesh on every dim" not in p.stdout:
        print(f"{tool} run --mesh dp=2,tp=2 exited {p.returncode}:", p.stdout, p.stderr, sep="\n")
        fails += 1
    # The wheel holds the package and the tool only: no C++ headers, archives or CMake files.
    p = subprocess.run([py, "-m", "pip", "show", "-f", "meshsim"], capture_output=True, text=True, env=env,
                       timeout=120)
    stray = [ln.strip() for ln in p.stdout.splitlines() if ln.strip().endswith((".hpp", ".a", ".cmake"))]
    if stray:
        print("the wheel installed files a Python package should not hold:", *stray[:10], sep="\n  ")
        fails += 1
    if fails == 0:
        print(f"OK: the fresh venv imports meshsim from {got['file']} and runs {tool}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
