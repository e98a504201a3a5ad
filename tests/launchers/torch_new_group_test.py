#!/usr/bin/env python3
"""meshsim's creation plan, made by real PyTorch processes.

`meshsim show --creation-plan --format json` lists the process-group calls PyTorch's DeviceMesh
makes; here N processes of the interpreter's torch (Debian's python3-torch, 1.13 on Debian 12,
or .venv's 2.13; gloo) each make exactly those calls, in
that order, with torch.distributed.new_group, and then check every group they are in with real
collectives (all_gather of ranks, all_reduce of ones). The plan must run as written; the same
plan with one rank's first two dims swapped (what `meshsim run --fault reorder@R` plants) must
not: PyTorch names groups by creation order, so the rank joins the wrong groups, and the job
hangs or computes over the wrong ranks. Exit 77 (ctest: skipped) with the reason printed when
torch is not installed.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time
import unittest
from datetime import timedelta

try:
    import torch
    import torch.distributed as dist
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"SKIPPED: torch is not importable by {sys.executable} ({e}); scripts/install-deps.sh installs it")
    sys.exit(77)

ARGS = None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world, port, plan_file, swap):
    """One rank: the plan's calls in order (swapped first two dims with `swap`), then a check of
    every group it is in. Prints OK or what differs; exit 0 only when every group is right."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=8))
    with open(plan_file) as f:
        calls = json.load(f)["creation_plan"]["calls"]
    calls = [c for c in calls if c["call"] != "default"]
    if swap:
        dims = []
        for c in calls:
            if c["dim"] not in dims:
                dims.append(c["dim"])
        first = [c for c in calls if c["dim"] == dims[0]]
        second = [c for c in calls if c["dim"] == dims[1]]
        rest = [c for c in calls if c["dim"] not in dims[:2]]
        calls = second + first + rest
    mine = []
    for c in calls:
        assert c["call"] == "new_group", c  # PyTorch 1.13 has no split_group
        g = dist.new_group(ranks=c["ranks"], backend="gloo")
        if rank in c["ranks"]:
            mine.append((c["dim"], c["ranks"], g))
    for dim, ranks, g in mine:
        got = [torch.zeros(1, dtype=torch.int64) for _ in ranks]
        dist.all_gather(got, torch.tensor([rank]), group=g)
        ones = torch.ones(1, dtype=torch.int64)
        dist.all_reduce(ones, group=g)
        gathered = [int(t.item()) for t in got]
        if gathered != sorted(ranks) or int(ones.item()) != len(ranks):
            print(f"rank {rank}: dim {dim}: group {ranks} gathered {gathered}, all_reduce of ones {int(ones.item())}",
                  flush=True)
            sys.exit(1)
    dist.barrier()
    print(f"rank {rank}: OK, {len(calls)} new_group calls, {len(mine)} groups checked", flush=True)
    # Every rank checked every group it is in (the barrier): leave without the interpreter's
    # teardown, where Debian's torch 1.13 may destroy a Gloo thread still joinable ("terminate
    # called without an active exception", SIGABRT after this rank's OK: seen once in CI), which
    # is not what this test is about.
    os._exit(0)


def plan_file(tmp, *flags):
    path = os.path.join(tmp, "plan.json")
    p = subprocess.run([ARGS.meshsim, "show", "--creation-plan", "--format", "json", *flags], capture_output=True,
                       text=True, timeout=60)
    if p.returncode != 0:
        raise AssertionError(p.stderr)
    with open(path, "w") as f:
        f.write(p.stdout)
    return path, json.loads(p.stdout)


def run_world(world, path, swap_rank=None, timeout=40):
    """Runs `world` worker processes; returns [(exit status or None if killed at the deadline, output)]."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(r), str(world), str(port), path,
                               "1" if r == swap_rank else "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for r in range(world)]
    deadline = time.monotonic() + timeout
    out = []
    for p in procs:
        try:
            text, _ = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            out.append((p.returncode, text))
        except subprocess.TimeoutExpired:
            p.kill()
            text, _ = p.communicate()
            out.append((None, text))
    return out


class CreationPlanOnPyTorch(unittest.TestCase):
    def setUp(self):
        import tempfile
        self.tmp = tempfile.mkdtemp(prefix="meshsim-new-group-")

    def test_the_plan_runs_on_pytorch_and_every_group_is_right(self):
        path, plan = plan_file(self.tmp, "--mesh", "dp=2,cp=2,tp=2", "--flatten", "dp_cp_tp", "--unflatten",
                               "dp_cp_tp:4,2:a,b")
        self.assertEqual(len([c for c in plan["creation_plan"]["calls"] if c["call"] == "new_group"]), 4 + 4 + 4 + 2 + 4)
        results = run_world(8, path)
        for rank, (status, text) in enumerate(results):
            self.assertEqual(status, 0, f"rank {rank}: {text}")
            self.assertIn("OK", text)

    def test_one_rank_that_creates_in_another_order_breaks_the_job(self):
        path, _ = plan_file(self.tmp, "--mesh", "dp=2,tp=2")
        results = run_world(4, path, swap_rank=1, timeout=20)
        good = [r for r, (status, text) in enumerate(results) if status == 0 and "OK" in text]
        # The rank that swapped, or a rank it met in the wrong group, hangs, fails or sees the
        # wrong ranks: the job does not pass.
        self.assertLess(len(good), 4, "every rank passed although rank 1 created its groups in another order:\n" +
                        "\n".join(t for _, t in results))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6] == "1")
    parser = argparse.ArgumentParser()
    parser.add_argument("--meshsim", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)
