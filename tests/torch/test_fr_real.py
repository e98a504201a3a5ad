"""`meshsim trace check` on Flight Recorder dumps that PyTorch 2.13 itself wrote: a 4-rank job on
the Gloo backend (CPU; tests/torch/fr_real_job.py), one process per rank, each dumping its own
buffer with torch._C._distributed_c10d._dump_fr_trace().

What these dumps hold that the generated ones do not (docs/traces.md, "Dumps PyTorch wrote"):
their pg_config names one group '' (Gloo registers a group before it is named: the entry is the
last group registered) while their records name '0', '1', '2'; their records never leave
"scheduled" (Gloo has no events to query) and are marked `retired` once done, a timed-out one
too. meshsim checks them (the default group over every rank, the others over the ranks whose
records name them, each said in a note; a retired record counts as completed); PyTorch's own
analyzer stops on them with a KeyError.
"""
import os
import random
import subprocess
import sys
import tempfile

import pytest

import meshsim

builder = pytest.importorskip("torch.distributed.flight_recorder.components.builder",
                              reason="PyTorch 2.13 (the project's .venv) is the oracle")
from torch.distributed.flight_recorder.components.config_manager import JobConfig  # noqa: E402
from torch.distributed.flight_recorder.components.loader import read_dir  # noqa: E402

JOB = os.path.join(os.path.dirname(__file__), "fr_real_job.py")
RNG = random.Random(int(os.environ.get("MESHSIM_TORCH_SEED", "13")))
WORLD = 4


def run_job(skip=None, plant="--skip"):
    d = tempfile.mkdtemp(prefix="meshsim-fr-real-")
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE="2000")
    extra = [plant, str(skip)] if skip is not None else []
    procs = [subprocess.Popen([sys.executable, JOB, d, str(WORLD), str(r), *extra], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for r in range(WORLD)]
    for r, p in enumerate(procs):
        try:
            _, err = p.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"rank {r} of the Gloo job did not finish in 90 s")
        assert p.returncode == 0, err[-2000:]
    os.remove(os.path.join(d, "store"))
    dumped = [r for r in range(WORLD) if not (plant == "--absent" and r == skip)]
    assert sorted(os.listdir(d)) == [f"rank_{r}" for r in dumped]
    return d


def test_a_healthy_gloo_jobs_own_dumps_pass():
    d = run_job()
    r = meshsim.trace_check(d)
    assert r["ok"], r["problems"]
    assert r["collectives_checked"] == 2 * 3 * 2 + 3, r  # per step: each pair's all_reduce and all_gather, the world's all_reduce
    assert any("no pg_config lists it" in n for n in r["notes"]), r["notes"]


def test_pytorchs_analyzer_stops_on_its_own_gloo_dumps():
    d = run_job()
    args = JobConfig().parse_args([d, "-p", "rank_"])
    details, version = read_dir(args)
    with pytest.raises(KeyError):
        builder.build_db(details, args, version)


def test_a_rank_that_leaves_out_its_pairs_collectives_is_named():
    skip = RNG.randrange(WORLD)
    peer = skip ^ 1
    d = run_job(skip)
    r = meshsim.trace_check(d)
    assert not r["ok"]
    never = [(p["ranks"], p["group_ranks"]) for p in r["problems"] if p["kind"] == "never-issued"]
    # The pair's all_reduce of the last step: issued by the peer (it timed out in it), never by
    # the skipping rank; then the peer never issued the world's last all_reduce.
    pair = f"{min(skip, peer)}-{max(skip, peer)}"
    assert ([skip], pair) in never, r["problems"]
    assert ([peer], "0-3") in never, r["problems"]


def test_a_dtype_mismatch_between_a_pair_is_named():
    rank = RNG.randrange(WORLD)
    d = run_job(rank, "--dtype")
    r = meshsim.trace_check(d)
    assert not r["ok"]
    pair = f"{min(rank, rank ^ 1)}-{max(rank, rank ^ 1)}"
    # The pair's last all_reduce: four doubles on one side, eight floats on the other (Gloo moved
    # the same 32 bytes and both completed). Two ranks have no majority: both are named.
    assert [(p["kind"], p["group_ranks"]) for p in r["problems"]] == [("dtype", pair)], r["problems"]
    assert "Double" in r["problems"][0]["message"] and "Float" in r["problems"][0]["message"]
    assert sorted(c["rank"] for c in r["culprits"]) == sorted([rank, rank ^ 1]), r["culprits"]


def test_a_rank_that_never_starts_is_named_by_its_missing_dump():
    rank = RNG.randrange(WORLD)
    d = run_job(rank, "--absent")
    r = meshsim.trace_check(d)
    assert not r["ok"]
    # First the rank without a dump; then its pair's peer, which timed out waiting on it in their
    # pair's first all_reduce and so never issued the world's. Gloo retires a timed-out record as
    # done, so no wait leads to a culprit (docs/traces.md, "Dumps PyTorch wrote").
    assert r["problems"][0]["kind"] == "missing-dump" and r["problems"][0]["ranks"] == [rank], r["problems"]
    never = [(p["ranks"], p["group_ranks"]) for p in r["problems"] if p["kind"] == "never-issued"]
    assert never == [([rank ^ 1], f"0-{WORLD - 1}")], r["problems"]
