"""A real two-rank pipeline step of PyTorch 2.13 over Gloo, its schedule a CSV run by PyTorch's own
runtime, against meshsim's verdicts on the same CSV (`meshsim step --schedule FILE.csv`).

pytorch/pytorch#172668's schedule (docs/examples/deadlock.csv): rank 0 sends both forwards before
it receives a backward, rank 1 sends its first backward before it receives the second forward.
meshsim says it deadlocks under rendezvous sends and completes under eager ones. PyTorch's
runtime posts a send without waiting on it; on NCCL a rank's sends and receives to one peer run in
stream order, so the receive queued behind an unmatched send never starts (the issue's hang:
rendezvous); Gloo's TCP transport finishes a send before its receive is posted, 4 MiB messages
included, so on CPU the step completes: meshsim's eager verdict. One in which rank 0 receives its
first backward before its second send completes under both, and for real.

Known difference (docs/step.md, "Send semantics"): meshsim, like PyTorch's own simulator
(`_simulate_comms_compute`), blocks a RECV where the schedule puts it; PyTorch's runtime posts it
and waits only at the compute that consumes it (`schedules.py`, `_PipelineScheduleRuntime`:
`fwd_recv_ops` / `bwd_recv_ops` waited before the F / B). A CSV in which both ranks receive
before they send is "not progressing" to both and completes on Gloo.
"""
import os
import subprocess
import sys
import tempfile

import pytest

import meshsim

pytest.importorskip("torch.distributed.pipelining", reason="PyTorch 2.13 (the project's .venv) is the oracle")

JOB = os.path.join(os.path.dirname(__file__), "pipeline_real_job.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEADLOCK = os.path.join(ROOT, "docs", "examples", "deadlock.csv")


def run_real(csv, width=8):
    d = tempfile.mkdtemp(prefix="meshsim-pipe-real-")
    procs = [subprocess.Popen([sys.executable, JOB, d, csv, str(r), str(width)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in range(2)]
    outs = []
    for r, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"rank {r} of the real pipeline did not end in 120 s (its process group's timeout is 8 s)")
        assert p.returncode in (0, 3), err[-3000:]
        outs.append((p.returncode, out.strip()))
    return outs


def meshsim_verdict(csv, semantics):
    r = subprocess.run([os.environ.get("MESHSIM_EXE", "meshsim"), "step", "--schedule", str(csv), "--microbatches", "2",
                        "--send-semantics", semantics, "--format", "json"], capture_output=True, text=True)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    return r.returncode == 0


@pytest.mark.parametrize("width", [8, 1 << 18])
def test_the_issues_csv_completes_on_gloo_as_meshsims_eager_verdict_says(width):
    assert not meshsim_verdict(DEADLOCK, "rendezvous")  # NCCL's stream-ordered p2p: the issue's hang
    assert meshsim_verdict(DEADLOCK, "eager")
    real = run_real(DEADLOCK, width)
    assert all(code == 0 for code, _ in real), real


def test_known_difference_a_receive_waits_where_its_compute_is_in_pytorchs_runtime(tmp_path):
    import contextlib
    import io

    import torch.distributed.pipelining.schedules as sch

    rows = ["0F0,0RECV_B0,0SEND_F0,0B0,0F1,0SEND_F1,0RECV_B1,0B1", "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1"]
    csv = tmp_path / "both_receive.csv"
    csv.write_text("\n".join(rows) + "\n")
    assert not meshsim_verdict(csv, "eager")
    assert not meshsim_verdict(csv, "rendezvous")
    order = {r: [sch._Action.from_str(a) for a in row.split(",")] for r, row in enumerate(rows)}
    with pytest.raises(ValueError, match="not progressing"), contextlib.redirect_stdout(io.StringIO()):
        sch._simulate_comms_compute(order, stage_to_rank=lambda s: s % 2, num_stages=2)
    real = run_real(str(csv))
    assert all(code == 0 for code, _ in real), real  # the runtime waits on RECV_B0 only at B0


def test_the_same_compute_with_rank_0_receiving_first_completes_for_real_and_passes_meshsim(tmp_path):
    # Rank 0 posts its first backward's receive before its second forward's send.
    csv = tmp_path / "ordered.csv"
    csv.write_text("0F0,0SEND_F0,0F1,0RECV_B0,0SEND_F1,0B0,0RECV_B1,0B1\n"
                   "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n")
    assert meshsim_verdict(csv, "rendezvous")
    real = run_real(str(csv))
    assert all(code == 0 for code, _ in real), real
