#!/usr/bin/env python3
"""Issue 15's table against the Python reference, measured in one run on one core.

The table's targets are ratios (meshsim >= 100x the Python reference on its own inputs), and
machines differ several-fold, so the reference must be timed on the machine that times meshsim,
in the same run. This runner does that:

  1. imports the reference: PyTorch's vendored pycute (torch.distributed._pycute) or CUTLASS's
     pycute, from the environment or from --pycute-path DIR (a folder holding `pycute/`);
  2. checks that the reference and `meshsim query` give the same answer for each row, so both
     sides time the same operation on the same inputs;
  3. times each row, alternating rounds of the reference (timeit, best of its repeats) and of
     `meshsim_bench --benchmark_filter=Table` (its `ns` counter), pinned to one core when
     `taskset` is there, and reports the best of each with their ratio.

  python3 bench/python_reference.py --build build/default [--rounds 3] [--pycute-path DIR]

Exit status: 0 when every row is >= --target (default 100) times the reference, 1 when a row
is below it, 2 when the reference or the binaries cannot be run (nothing is measured then).
"""
import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import timeit

# name in meshsim_bench, the `meshsim query` request, the reference call (on module `p`).
ROWS = [
    ("Table_Coalesce", {"op": "coalesce", "layout": "(2,4,8):(32,8,1)"},
     lambda p: p.coalesce(p.Layout((2, 4, 8), (32, 8, 1)))),
    ("Table_Complement", {"op": "complement", "layout": "(2,):(4,)", "bound": 8},
     lambda p: p.complement(p.Layout((2,), (4,)), 8)),
    ("Table_Composition", {"op": "composition", "a": "(4,2):(2,1)", "b": "2:1"},
     lambda p: p.composition(p.Layout((4, 2), (2, 1)), p.Layout(2, 1))),
    ("Table_CompositionByTuple", {"op": "composition", "a": "8:1", "b": "(2,2,2):(4,2,1)"},
     lambda p: p.composition(p.Layout(8, 1), p.Layout((2, 2, 2), (4, 2, 1)))),
    ("Table_Crd2Idx", {"op": "crd2idx", "layout": "(2,4,8):(32,8,1)", "coords": [37]},
     lambda p: p.crd2idx(37, (2, 4, 8), (32, 8, 1))),
    ("Table_LogicalDivide", {"op": "logical_divide", "a": "(4,8):(8,1)", "b": "2:1"},
     lambda p: p.logical_divide(p.Layout((4, 8), (8, 1)), p.Layout(2, 1))),
]


def fail(msg):
    print(f"python_reference: {msg}", file=sys.stderr)
    sys.exit(2)


def import_reference(path):
    if path:
        sys.path.insert(0, os.path.abspath(path))
    errors = []
    for name in ("torch.distributed._pycute", "pycute"):
        try:
            return name, importlib.import_module(name)
        except ImportError as e:  # try the next one
            errors.append(f"{name}: {e}")
    fail("no Python reference to measure (" + "; ".join(errors) + "); install PyTorch, or pass "
         "--pycute-path with a folder holding CUTLASS's pycute/")


def as_json(x):
    """A reference value as `meshsim query` writes it (tuples as lists)."""
    if isinstance(x, tuple):
        return [as_json(v) for v in x]
    return x


def reference_answer(p, call):
    r = call(p)
    if isinstance(r, int):
        return [r]
    return {"shape": as_json(r.shape), "stride": as_json(r.stride)}


CPU = 1 if (os.cpu_count() or 1) > 1 else 0


def pinned(cmd):
    return (["taskset", "-c", str(CPU)] + cmd) if shutil.which("taskset") else cmd


def check_answers(p, meshsim):
    lines = []
    for i, (_, req, _) in enumerate(ROWS):
        lines.append(json.dumps(dict(req, id=i, convention="cute")))
    out = subprocess.run([meshsim, "query"], input="\n".join(lines) + "\n", capture_output=True,
                         text=True, check=False)
    answers = [json.loads(l) for l in out.stdout.splitlines() if l.strip()]
    if len(answers) != len(ROWS):
        fail(f"meshsim query answered {len(answers)} of {len(ROWS)} requests: {out.stderr}")
    for (name, _, call), a in zip(ROWS, answers):
        want = reference_answer(p, call)
        if not a.get("ok") or a.get("result") != want:
            fail(f"{name}: meshsim answers {a}, the reference {want}: not the same operation")


def time_reference(p, call, repeat=5, target_s=0.2):
    f = lambda: call(p)  # noqa: E731
    n = 1
    while timeit.timeit(f, number=n) < target_s / 10:
        n *= 2
    return min(timeit.repeat(f, number=n, repeat=repeat)) / n * 1e9


def time_meshsim(bench):
    out = subprocess.run(pinned([bench, "--benchmark_filter=^Table_", "--benchmark_format=json",
                                 "--benchmark_min_time=0.2"]),
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        fail(f"{bench} failed: {out.stderr[-400:]}")
    return {b["name"]: b["ns"] for b in json.loads(out.stdout)["benchmarks"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build/default", help="the build folder (default: %(default)s)")
    ap.add_argument("--pycute-path", help="a folder holding pycute/ (CUTLASS's python/)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (default: %(default)s)")
    ap.add_argument("--target", type=float, default=100.0, help="least ratio (default: %(default)s)")
    args = ap.parse_args()
    if args.rounds < 1:
        fail(f"--rounds {args.rounds} is not >= 1")
    meshsim = os.path.join(args.build, "apps", "meshsim")
    bench = os.path.join(args.build, "bench", "meshsim_bench")
    for exe in (meshsim, bench):
        if not os.access(exe, os.X_OK):
            fail(f"{exe} is not an executable: build first (cmake --build --preset default)")
    name, p = import_reference(args.pycute_path)
    check_answers(p, meshsim)
    try:  # the reference on the core the benchmark is pinned to
        os.sched_setaffinity(0, {CPU})
    except (AttributeError, OSError):
        pass
    best_py = {}
    best_ms = {}
    for _ in range(args.rounds):
        for row, _, call in ROWS:
            t = time_reference(p, call)
            best_py[row] = min(best_py.get(row, t), t)
        for row, t in time_meshsim(bench).items():
            best_ms[row] = min(best_ms.get(row, t), t)
    print(f"reference: {name} ({os.path.dirname(p.__file__)}), Python {sys.version.split()[0]}; "
          f"best of {args.rounds} alternating rounds, one core")
    print(f"{'row':28} {'meshsim ns':>11} {'reference ns':>13} {'ratio':>8}")
    below = 0
    for row, _, _ in ROWS:
        ms, py = best_ms[row], best_py[row]
        ratio = py / ms
        below += ratio < args.target
        print(f"{row:28} {ms:11.1f} {py:13.0f} {ratio:7.0f}x{'' if ratio >= args.target else '  < target'}")
    print(f"{len(ROWS) - below} of {len(ROWS)} rows >= {args.target:g}x the reference")
    return 1 if below else 0


if __name__ == "__main__":
    sys.exit(main())
