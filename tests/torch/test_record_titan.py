"""torchtitan 0.3.0's own Trainer recorded by `meshsim record`: every rank of the job that
`torch:step_real` runs over Gloo under torchrun, here forked from one interpreter over the fake
backend (tests/torch/step_real_job.py as it is: its own Flight Recorder dumps, taken with
torch._C._distributed_c10d._dump_fr_trace after the second step, are the record's). The record's
cross-rank check must pass, and every rank's records of the steady step must be the step
`meshsim step --job` plans from the config the job saved (`trace check --against`), as the Gloo
job's are in torch:step_real.

Layouts: FSDP with TP on 4 ranks, HSDP with TP on 8, and the deepseek_v3 debug model with FSDP,
TP and EP under full activation checkpointing on 4 by default; FSDP alone, deepseek_v3 with FSDP
and EP, and HSDP with TP on 16 ranks with MESHSIM_LONG=1. An MoE's token exchanges record the
sizes each rank's own routing gives (the fake backend hands a rank its own counts back): every
rank's records still equal the plan (whose routed all-to-alls take any bytes), and the record's
check leaves those all-to-alls' totals out, saying so. The pipeline layouts: PyTorch's schedules
infer the stages' shapes by exchanging Python objects (recv_object_list) and send activations and
gradients between the stages; the record carries every point-to-point send between recorded
ranks (the fake backend carries none), so on 2.13 Interleaved1F1B and ZBVZeroBubble on 4 ranks
(and 1F1B with TP on 8 under MESHSIM_LONG=1) record the planned step on every rank. PyTorch 2.14
refuses dynamic shape inference on a fake group before any exchange (_warmup_p2p in
pipelining/schedules.py decides locally when the group's backend is "fake"), in its own words:
asserted as it is.
"""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="the PyTorch of this environment runs the ranks")
pytest.importorskip("torchtitan", reason="torchtitan's own Trainer is the program recorded")

import test_step_real as real  # noqa: E402  (its layouts, its job, its plan check)
import torch_env  # noqa: E402

LONG = bool(os.environ.get("MESHSIM_LONG"))
V214 = torch_env.at_least("2.14")
PIPELINE = [k for k in real.LAYOUTS if k.startswith("pp")]
LAYOUTS = {k: v for k, v in real.LAYOUTS.items() if not (V214 and k.startswith("pp"))}
LAYOUTS["hsdp2x4_tp2"] = (16, ["--parallelism.data_parallel_replicate_degree", "2",
                               "--parallelism.data_parallel_shard_degree", "4", "--parallelism.tensor_parallel_degree", "2"])
DEFAULT = ["fsdp2_tp2", "hsdp2x2_tp2", "moe_fsdp2_tp2_ep2_full_ac", "pp2_fsdp2_interleaved", "pp2_fsdp2_zbv"]


@pytest.mark.parametrize("name", [n for n in LAYOUTS if LONG or n in DEFAULT])
def test_every_recorded_rank_of_torchtitans_trainer_is_the_planned_step(tmp_path, name):
    n, flags = LAYOUTS[name]
    job, rec = tmp_path / "job", tmp_path / "rec"
    job.mkdir()
    cmd = [real.MESHSIM, "record", "-n", str(n), "--out", str(rec), "--timeout", "600", "--", sys.executable, real.JOB,
           str(job), *real.COMMON, *flags]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL)
    print(p.stdout[-3000:])
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    summary = json.loads((rec / "record.json").read_text())
    assert [r["status"] for r in summary["ranks"]] == ["ok"] * n
    r = real.against(str(job))
    problems = r["problems"]
    if name.startswith("moe"):
        # The job's own dumps, checked as any dumps are: the fake backend hands each rank its own
        # all-to-all input back, so the token exchanges' totals are no peer's (the record's own
        # check leaves them out, saying so: asserted above by its exit status).
        assert "all_to_all collectives' totals over their groups not compared" in p.stdout, p.stdout[-2000:]
        problems = [x for x in problems if not (x["kind"] == "size" and "all_to_all" in x["message"])]
    assert not problems and r["plan"]["ok"], (problems, r["plan"]["divergences"][:4])
    assert r["plan"]["ranks_compared"] == n and r["plan"]["records_compared"] >= n * 20, r["plan"]


@pytest.mark.skipif(not V214, reason="PyTorch 2.13 runs a pipeline over the fake backend (recorded above); 2.14 refuses")
def test_pytorch_2_14_refuses_a_pipelines_dynamic_shape_inference_on_a_fake_group_in_its_own_words(tmp_path):
    n, flags = real.LAYOUTS["pp2_fsdp2_interleaved"]
    job, rec = tmp_path / "job", tmp_path / "rec"
    job.mkdir()
    cmd = [real.MESHSIM, "record", "-n", str(n), "--out", str(rec), "--timeout", "600", "--", sys.executable, real.JOB,
           str(job), *real.COMMON, *flags]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL)
    assert p.returncode == 1, (p.stdout + p.stderr)[-4000:]
    lines = [x for x in p.stdout.splitlines() if x.startswith("FAILED rank ")]
    assert len(lines) == n and all("dynamic shape inference, which is not supported with a fake process group" in x
                                   for x in lines), p.stdout[-3000:]
