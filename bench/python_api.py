"""Times `import meshsim`'s bound calls (Layout's algebra, meshsim.run, a mesh with backend
options) in two builds of the module, interleaved on this machine, and prints each row's time
and the candidate's ratio to the baseline (< 1: faster).

    python3 bench/python_api.py --baseline OLD/build/default/python --candidate build/default/python

Each build runs in its own interpreter (one module per process), twice, alternating; a row's
time is the best of its rounds (machines are noisy; the minimum is the least disturbed)."""
import argparse
import json
import os
import subprocess
import sys

ROWS = r'''
import json, time, meshsim
def best(f, n):
    out = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            f()
        out = min(out, (time.perf_counter() - t) / n)
    return out
a = meshsim.Layout("((2,4),8):((32,1),4)")
b = meshsim.Layout("(4,2):(2,1)")
rows = {
    "Layout.size": best(lambda: a.size(), 2000),
    "Layout.coalesce": best(lambda: a.coalesce(), 2000),
    "Layout.complement(1024)": best(lambda: a.complement(1024), 2000),
    "Layout.composition": best(lambda: a.composition(b), 2000),
    "Layout.logical_divide": best(lambda: a.logical_divide(b), 1000),
    "Layout.crd2idx(64)": best(lambda: a.crd2idx(list(range(64))), 500),
    "Layout('text')": best(lambda: meshsim.Layout("((2,4),8):((16,1),2)"), 2000),
    "init_device_mesh+backend_override": best(lambda: meshsim.init_device_mesh(
        (2, 4), ("dp", "tp"), backend_override={"tp": ("gloo", {"timeout": 5})}), 500),
    "run(dp=2,tp=2) threaded": best(lambda: meshsim.run("dp=2,tp=2"), 20),
    "run(dp=64,tp=64) local": best(lambda: meshsim.run("dp=64,tp=64", backend="local"), 5),
}
print(json.dumps(rows))
'''


def measure(path):
    env = dict(os.environ, PYTHONPATH=path)
    out = subprocess.run([sys.executable, "-c", ROWS], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{path}: the rows failed:\n{out.stderr}")
    return json.loads(out.stdout)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--baseline", required=True)
    p.add_argument("--candidate", required=True)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    base, cand = {}, {}
    for _ in range(args.rounds):
        for into, path in ((base, args.baseline), (cand, args.candidate)):
            for k, v in measure(path).items():
                into[k] = min(into.get(k, float("inf")), v)
    print(f"{'row':38} {'baseline':>12} {'candidate':>12} {'ratio':>7}")
    for k in base:
        print(f"{k:38} {base[k] * 1e6:10.2f}us {cand[k] * 1e6:10.2f}us {cand[k] / base[k]:7.3f}")


if __name__ == "__main__":
    main()
