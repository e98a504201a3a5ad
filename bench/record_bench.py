"""Ranks recorded per second by `meshsim record` (ranks forked from one interpreter that imported
torch) against one cold process per rank, started as torchrun starts them (a fresh interpreter
each, importing torch, then running the program as that rank), in the same run, alternating.

    .venv/bin/python bench/record_bench.py --exe build/default/apps/meshsim [--world 8] [--rounds 3]

The program: init_process_group, a 2 x (world/2) DeviceMesh, four collectives. The cold side
runs each rank through the same runner (`--ranks R --jobs 1`), one process at a time, as many
at once as the record's --jobs (the machine's cores). A row's time is the best of its rounds."""
import argparse
import os
import subprocess
import sys
import tempfile
import time

PROGRAM = """
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
dist.init_process_group("nccl")
w = dist.get_world_size()
m = init_device_mesh("cpu", (2, w // 2), mesh_dim_names=("dp", "tp"))
t = torch.ones(1024)
dist.all_reduce(t)
dist.all_reduce(t, group=m["tp"].get_group())
dist.all_gather_into_tensor(torch.empty(1024 * (w // 2)), t, group=m["tp"].get_group())
dist.barrier()
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exe", required=True)
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    jobs = os.cpu_count() or 1
    work = tempfile.mkdtemp(prefix="meshsim-record-bench-")
    prog = os.path.join(work, "prog.py")
    with open(prog, "w") as f:
        f.write(PROGRAM)
    runner = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "meshsim", "_record.py")
    forked = cold = float("inf")
    for k in range(a.rounds):
        out = os.path.join(work, "f%d" % k)
        t = time.perf_counter()
        subprocess.run([a.exe, "record", "-n", str(a.world), "--jobs", str(jobs), "--out", out, "--", sys.executable, prog],
                       check=True, capture_output=True)
        forked = min(forked, time.perf_counter() - t)
        t = time.perf_counter()
        running = []
        for r in range(a.world):
            out = os.path.join(work, "c%d_%d" % (k, r))
            running.append(subprocess.Popen([sys.executable, runner, "--world", str(a.world), "--ranks", str(r), "--jobs", "1",
                                             "--out", out, "--", prog], stdout=subprocess.DEVNULL))
            if len(running) == jobs:
                assert running.pop(0).wait() == 0
        for p in running:
            assert p.wait() == 0
        cold = min(cold, time.perf_counter() - t)
    print("world %d, %d at a time, best of %d rounds" % (a.world, jobs, a.rounds))
    print("meshsim record (forked):       %6.2f s  %6.2f ranks/s" % (forked, a.world / forked))
    print("cold process per rank:         %6.2f s  %6.2f ranks/s" % (cold, a.world / cold))
    print("ratio (cold / forked):         %6.2f" % (cold / forked))


if __name__ == "__main__":
    main()
