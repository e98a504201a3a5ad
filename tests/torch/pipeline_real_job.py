"""One step of a two-stage pipeline on PyTorch 2.13's Gloo backend (CPU), its schedule read from a
compute_comms CSV by PyTorch's own runtime (`_PipelineScheduleRuntime._load_csv`): what
tests/torch/test_pipeline_real.py runs, one process per rank, for meshsim's verdict on the CSV.

  pipeline_real_job.py OUT CSV RANK [WIDTH]   (prints "completed" or the error that ended the step;
  exit 0 / 3; each microbatch's activation is 4 x WIDTH floats (8 rows, 2 microbatches), default 8)

The process group's 8 s timeout ends a wait that never returns.
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime
out, csv, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
width = int(sys.argv[4]) if len(sys.argv) > 4 else 8
store = dist.FileStore(os.path.join(out, "store"), 2)
dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=8))


class Scale(torch.nn.Module):
    """One weight per stage: the activation's size is the input's, whatever the width."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))

    def forward(self, x):
        return x * self.w


torch.manual_seed(0)
stage = PipelineStage(Scale(), stage_index=rank, num_stages=2, device=torch.device("cpu"))
sched = _PipelineScheduleRuntime([stage], n_microbatches=2, loss_fn=lambda y, t: ((y - t) ** 2).sum())
sched._load_csv(csv, format="compute_comms")
t0 = time.time()
try:
    if rank == 0:
        sched.step(torch.randn(8, width))
    else:
        sched.step(target=torch.randn(8, width))
    print(f"rank {rank}: completed in {time.time() - t0:.1f} s", flush=True)
    code = 0
except Exception as e:  # noqa: BLE001
    print(f"rank {rank}: {type(e).__name__} after {time.time() - t0:.1f} s: {str(e)[:200]}", flush=True)
    code = 3
os._exit(code)
