#!/usr/bin/env python3
"""The Python module's bench row: `mesh.groups("tp")` of a 2^20-rank mesh through `import meshsim`
against the same groups computed in pure Python from PyTorch's rule (the dim's rows of the mesh
tensor: swap the dim last and reshape to (-1, size), as test_device_mesh_nd checks), timed in one
run on one machine; the answers are compared first, so both sides compute the same thing.

  PYTHONPATH=build/default/python python3 bench/python_groups.py [--repeat 3]
"""
import argparse
import time

import meshsim


def pure_python_groups(shape, dim):
    """PyTorch's rule on a row-major mesh of ranks 0..n-1: one group per fixed coordinate of the
    other dims, members along `dim` in order."""
    stride = 1
    for s in shape[dim + 1:]:
        stride *= s
    outer = 1
    for s in shape[:dim]:
        outer *= s
    size = shape[dim]
    groups = []
    for o in range(outer):
        base = o * size * stride
        for i in range(stride):
            groups.append([base + i + k * stride for k in range(size)])
    return groups


def best(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    shape, names = (64, 16, 8, 128), ("dp", "cp", "pp", "tp")  # 2^20 ranks
    mesh = meshsim.init_device_mesh(shape, names)
    for name in ("tp", "dp"):
        dim = names.index(name)
        t_meshsim, got = best(lambda: mesh.groups(name), args.repeat)
        t_python, want = best(lambda: pure_python_groups(shape, dim), args.repeat)
        if sorted(got) != sorted(want):
            raise SystemExit(f"groups({name!r}) differ between meshsim and the pure-Python rule")
        print(f"groups({name!r}) of {shape}: meshsim {t_meshsim * 1e3:.1f} ms, pure Python {t_python * 1e3:.1f} ms, "
              f"ratio {t_python / t_meshsim:.1f}x")


if __name__ == "__main__":
    main()
