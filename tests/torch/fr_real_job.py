"""A small job on PyTorch's Gloo backend (CPU) that dumps its own Flight Recorder buffer: the dumps
tests/torch/test_fr_real.py reads with `meshsim trace check` and with PyTorch's analyzer.

  fr_real_job.py OUT WORLD RANK [--skip R | --dtype R | --absent R]
  (run by the test: one process per rank, a FileStore)

Every rank: pairs (0,1), (2,3), ... are a "tp" group made with new_group; per step an all_reduce
on its pair, an all_gather on the pair, an all_reduce on the world. --skip R: rank R leaves out
its pair's collectives of the last step; --dtype R: rank R's pair all_reduce of the last step is
four float64 where its peer's is eight float32 (the same bytes: Gloo aborts a receiver of more); --absent R: rank R joins the
group, then dies before its first step and leaves no dump. The job's 3 s timeout ends every
wait, and every other rank dumps what it recorded (TORCH_FR_BUFFER_SIZE set by the caller).
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    out, world, rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    plant = sys.argv[4] if len(sys.argv) > 5 else ""
    planted = int(sys.argv[5]) if len(sys.argv) > 5 else -1
    skip = planted if plant == "--skip" else -1
    store = dist.FileStore(os.path.join(out, "store"), world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=3))
    pairs = [dist.new_group([2 * k, 2 * k + 1]) for k in range(world // 2)]
    mine = pairs[rank // 2]
    x = torch.ones(8)
    # Every rank has made every group before the absent one leaves (a store count, which the
    # Flight Recorder does not record): its peers must meet it gone in the step, not in new_group.
    store.add("groups_made", 1)
    if plant == "--absent" and rank == planted:
        deadline = time.monotonic() + 30
        while store.add("groups_made", 0) < world and time.monotonic() < deadline:
            time.sleep(0.01)
        os._exit(0)  # joined, then gone before its first step: no dump
    try:
        for step in range(3):
            if plant == "--dtype" and rank == planted and step == 2:
                dist.all_reduce(torch.ones(4, dtype=torch.float64), group=mine)  # the same 32 bytes: Gloo moves them
                parts = [torch.empty(8) for _ in range(2)]
                dist.all_gather(parts, x, group=mine)
            elif not (rank == skip and step == 2):
                dist.all_reduce(x, group=mine)
                parts = [torch.empty(8) for _ in range(2)]
                dist.all_gather(parts, x, group=mine)
            dist.all_reduce(x)
    except RuntimeError:
        pass  # a peer left something out: the wait timed out
    time.sleep(0.5)  # the last records retire (Gloo retires them after the caller's wait returns)
    with open(os.path.join(out, f"rank_{rank}"), "wb") as f:
        f.write(torch._C._distributed_c10d._dump_fr_trace())
    os._exit(0)  # no destroy_process_group: a peer may still wait


if __name__ == "__main__":
    main()
