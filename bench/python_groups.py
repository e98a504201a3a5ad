#!/usr/bin/env python3
"""The Python module's bench rows: the groups of one dim of a 2^20-rank mesh through
`import meshsim`, against the same groups computed from PyTorch's rule (the dim's rows of the
mesh tensor: swap the dim last and reshape to (-1, size), as DeviceMesh builds its groups), timed
in one run on one machine; the answers are compared first, so both sides compute the same thing.

  - lists: mesh.groups(dim) (a list of lists) against the rule in pure Python;
  - buffers: mesh.group_table(dim) (one int64 buffer, zero-copy through memoryview/numpy)
    against the rule on a torch tensor (torch.arange(n).view(shape).swapdims(dim, -1)
    .reshape(-1, size), contiguous), when torch is importable;
  - lists from torch: the torch rule followed by .tolist(), against mesh.groups(dim).

  PYTHONPATH=build/default/python python3 bench/python_groups.py [--repeat 5]
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


def row(what, name, ours, theirs, their_name):
    print(f"{what:<8} groups({name!r}): meshsim {ours * 1e3:8.1f} ms, {their_name} {theirs * 1e3:8.1f} ms, "
          f"ratio {theirs / ours:5.1f}x")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    shape, names = (64, 16, 8, 128), ("dp", "cp", "pp", "tp")  # 2^20 ranks
    n = 1
    for s in shape:
        n *= s
    try:
        import torch
    except ImportError:
        torch = None
        print("torch is not importable: the buffer rows are skipped")
    mesh = meshsim.init_device_mesh(shape, names)
    print(f"mesh {shape} {names}, {n} ranks, best of {args.repeat}")
    for name in ("tp", "dp"):
        dim = names.index(name)
        t_lists, got = best(lambda: mesh.groups(name), args.repeat)
        t_python, want = best(lambda: pure_python_groups(shape, dim), args.repeat)
        if sorted(got) != sorted(want):
            raise SystemExit(f"groups({name!r}) differ between meshsim and the pure-Python rule")
        row("lists", name, t_lists, t_python, "pure Python")
        if torch is None:
            continue

        def torch_rule():
            return torch.arange(n).view(shape).swapdims(dim, -1).reshape(-1, shape[dim]).contiguous()

        t_table, table = best(lambda: mesh.group_table(name), args.repeat)
        t_torch, tensor = best(torch_rule, args.repeat)
        if memoryview(table).tolist() != got or sorted(tensor.tolist()) != sorted(got):
            raise SystemExit(f"group_table({name!r}) differs from groups() or from the torch rule")
        row("buffers", name, t_table, t_torch, "torch tensor")
        t_torch_lists, _ = best(lambda: torch_rule().tolist(), args.repeat)
        row("lists", name, t_lists, t_torch_lists, "torch .tolist()")


if __name__ == "__main__":
    main()
