"""`meshsim trace check` against PyTorch 2.13's own Flight Recorder analyzer
(`torch.distributed.flight_recorder`, what `python -m torch.distributed.flight_recorder.fr_trace`
runs), on the same dumps.

The dumps are written by tests/traces/make_fr_dumps.py in c10d's shape, healthy or with one fault
planted at a random rank (MESHSIM_TORCH_SEED picks them; the default is fixed). Where the two
should agree they must: every collective PyTorch's analyzer reports (a mismatch, or ranks not
joining) is one meshsim reports at the same group and sequence id, with the missing ranks among
those meshsim says never issued it, and the planted rank is among meshsim's culprits. Where they
differ, the difference is asserted as it is and docs/traces.md says who is right and why:
- a healthy pipeline of more than 2 stages: PyTorch's analyzer reports its sends and receives as
  errors (it pairs a stage's send with the wrong peer's receive); meshsim passes it;
- a rank whose pg_config lists a wrong member: PyTorch's analyzer reports every collective of
  that group as ranks not joining; meshsim reports the membership once and names the rank;
- healthy coalesced blocks (c10d's records of one sequence id ending in "nccl:coalesced") in a
  group of 3: PyTorch's analyzer reports each block as a rank not joining; meshsim passes them, and
  names the rank whose block lacks an operation where PyTorch's analyzer names others;
- more than 10 mismatches on one group: PyTorch's analyzer stops after its cap (10, then the one
  that crosses it); meshsim reports every one (repeats folded into one problem, counted);
- a rank without a dump: PyTorch's analyzer refuses the directory (unless
  --allow-incomplete-ranks); meshsim reports the missing dump and checks the rest.
- one group carrying both sends/receives and collectives (an all_reduce on the pipeline group):
  PyTorch's analyzer stops with an AssertionError ("can't get dst of non-p2p op"); meshsim
  checks it and names a planted hang's rank.
- batched ring exchanges (each rank's batch_isend_irecv of a send to the next rank and a receive
  from the previous on a context-parallel group, make_fr_dumps.py --ring-exchange): PyTorch's
  analyzer logs a MISMATCH table for every healthy block and reports nothing, so it also reports
  nothing when one rank's send is larger than the receive; meshsim passes the healthy ring and
  names the pair. A rank that leaves out its block: PyTorch's analyzer reports the next
  collective missing every rank of the ring; meshsim names the one rank.
"""
import io
import contextlib
import logging
import os
import random
import re
import subprocess
import sys
import tempfile

import pytest

import meshsim

builder = pytest.importorskip("torch.distributed.flight_recorder.components.builder",
                              reason="PyTorch 2.13 (the project's .venv) is the oracle")
from torch.distributed.flight_recorder.components.config_manager import JobConfig  # noqa: E402
from torch.distributed.flight_recorder.components.loader import read_dir  # noqa: E402

GEN = os.path.join(os.path.dirname(__file__), "..", "traces", "make_fr_dumps.py")
RNG = random.Random(int(os.environ.get("MESHSIM_TORCH_SEED", "13")))


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.extend(record.getMessage().splitlines())


def pytorch_reports(d, *flags):
    """What PyTorch's analyzer reports on dir d: [(kind, desc, seq, missing ranks, culprit)]."""
    handler = _Lines()
    root = logging.getLogger()
    old = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        args = JobConfig().parse_args([d, "-p", "rank_", *flags])
        details, version = read_dir(args)
        with contextlib.redirect_stdout(io.StringIO()):
            builder.build_db(details, args, version)
    finally:
        root.removeHandler(handler)
        root.setLevel(old)
    out, cur = [], None
    for line in handler.lines:
        m = re.match(r"(Not all ranks joining collective,|Collective) sequence number: (\d+)", line)
        if m:
            cur = {"kind": "missing" if m.group(1).startswith("Not") else "error", "seq": int(m.group(2)),
                   "desc": None, "missing": set(), "culprit": None, "op": None}
            out.append(cur)
        elif cur is not None and line.startswith("group info: "):
            cur["desc"] = line.split(":", 2)[2].strip()
        elif cur is not None and line.startswith("collective: "):
            cur["op"] = line[len("collective: "):].strip()
        elif cur is not None and line.startswith("missing ranks: "):
            cur["missing"] = {int(x) for x in re.findall(r"\d+", line)}
        elif cur is not None and line.startswith("error msg: Culprit rank "):
            cur["culprit"] = int(re.findall(r"\d+", line)[0])
    return out


def dumps(pp, plant=None, dp=2, tp=2, steps=3, *extra):
    d = tempfile.mkdtemp(prefix="meshsim-fr-oracle-")
    cmd = [sys.executable, GEN, d, "--pp", str(pp), "--dp", str(dp), "--tp", str(tp), "--steps", str(steps), *extra]
    if plant:
        cmd += ["--plant", plant]
    subprocess.run(cmd, check=True, capture_output=True)
    return d


def meshsim_report(d):
    r = meshsim.trace_check(d)
    at = {(p.get("desc"), p.get("seq")) for p in r["problems"]}
    never = {}
    for p in r["problems"]:
        if p["kind"] == "never-issued":
            never.setdefault((p.get("desc"), p.get("seq")), set()).update(p["ranks"])
    return r, at, never, {c["rank"] for c in r["culprits"]}


def test_a_healthy_two_stage_job_passes_both():
    d = dumps(2)
    assert pytorch_reports(d) == []
    assert meshsim.trace_check(d)["ok"]


# Plants both must catch, each at a random rank of the 8 (pp 2 x dp 2 x tp 2).
AGREED = ["dtype", "size", "type", "hang", "stuckin"]


@pytest.mark.parametrize("kind", AGREED)
def test_what_pytorchs_analyzer_reports_meshsim_reports_at_the_same_collective(kind):
    rank = RNG.randrange(8)
    d = dumps(2, f"{kind}@{rank}")
    theirs = pytorch_reports(d)
    r, at, never, culprits = meshsim_report(d)
    print(f"\n  [{kind}@{rank}] PyTorch: {[(t['kind'], t['desc'], t['seq'], sorted(t['missing'])) for t in theirs]}; "
          f"meshsim: {sorted(at, key=str)}, culprits {sorted(culprits)}")
    assert theirs, f"PyTorch's analyzer reported nothing for {kind}@{rank}"
    assert not r["ok"]
    for t in theirs:
        assert (t["desc"], t["seq"]) in at, (t, r["problems"])
        if t["kind"] == "missing":
            assert t["missing"] <= never.get((t["desc"], t["seq"]), set()), (t, never)
    assert rank in culprits, (rank, r["culprits"])


def test_a_mismatched_pipeline_send_is_caught_by_both_on_the_pipeline_group():
    rank = RNG.choice([0, 1, 2, 3])  # a first-stage rank sends
    d = dumps(2, f"p2psize@{rank}")
    theirs = pytorch_reports(d)
    r, at, _, culprits = meshsim_report(d)
    assert {t["desc"] for t in theirs} == {"mesh_pp"}, theirs
    assert {p.get("desc") for p in r["problems"]} == {"mesh_pp"}, r["problems"]
    assert rank in culprits


def test_known_difference_pipelines_of_three_stages():
    # PyTorch's analyzer reports a healthy 3-stage pipeline's sends and receives as errors (and
    # only those); meshsim passes it. docs/traces.md: meshsim is right.
    d = dumps(3)
    theirs = pytorch_reports(d)
    assert theirs and all(re.match(r"nccl:(send|recv) ", t["op"] or "") for t in theirs), theirs
    assert meshsim.trace_check(d)["ok"]


def test_known_difference_a_wrong_member_in_pg_config():
    # A rank whose pg_config lists a wrong member of its tp group: PyTorch's analyzer reports
    # each of that group's collectives as ranks not joining (it matches records by a group it
    # built from the disagreeing lists); meshsim reports the disagreement once, naming the rank,
    # and matches none of the two groups' records. docs/traces.md: meshsim's is the cause.
    rank = RNG.randrange(8)
    d = dumps(2, f"membership@{rank}")
    theirs = pytorch_reports(d)
    assert theirs and {(t["kind"], t["desc"]) for t in theirs} == {("missing", "mesh_tp")}, theirs
    r, _, _, culprits = meshsim_report(d)
    assert not r["ok"] and {p["kind"] for p in r["problems"]} == {"membership"}, r["problems"]
    assert rank in {x for p in r["problems"] for x in p["ranks"]}


def test_known_difference_healthy_coalesced_blocks_in_a_group_of_three():
    d = dumps(1, None, 3, 1, 3, "--coalesced")
    theirs = pytorch_reports(d)
    assert theirs and {(t["kind"], t["desc"]) for t in theirs} == {("missing", "mesh_dp")}, theirs
    assert meshsim.trace_check(d)["ok"]
    # A block that lacks one of its operations on one rank: meshsim names that rank (and only it)
    # at that block; PyTorch's analyzer reports the healthy blocks around it as well.
    rank = RNG.randrange(3)
    d = dumps(1, f"bundle@{rank}", 3, 1, 3, "--coalesced")
    theirs = pytorch_reports(d)
    r, at, _, culprits = meshsim_report(d)
    assert not r["ok"] and culprits == {rank}, r
    assert [(p.get("desc"), p.get("seq")) for p in r["problems"]] == [("mesh_dp", 2)], r["problems"]
    assert {t["seq"] for t in theirs if t["desc"] == "mesh_dp"} - {2}, theirs


def test_known_difference_more_than_ten_mismatches_on_one_group():
    rank = RNG.randrange(3)
    d = dumps(1, f"dtypeall@{rank}", 1, 3, 14)
    theirs = pytorch_reports(d)
    assert len(theirs) == 11, theirs  # its cap: 10, then stop
    # Its culprit: the planted rank, except when that is the group's last rank: then it blames
    # the other two in turn (rank 0, then 1), meshsim only the planted one.
    assert {t["culprit"] for t in theirs} == ({0, 1} if rank == 2 else {rank}), theirs
    r, _, _, culprits = meshsim_report(d)
    assert culprits == {rank} and len(r["problems"]) == 1, r["problems"]
    assert r["problems"][0]["repeats"] == 13, r["problems"][0]  # 14 all_gathers, every one counted


def test_known_difference_a_rank_without_a_dump():
    rank = RNG.randrange(8)
    d = dumps(2, f"missing@{rank}")
    with pytest.raises(AssertionError, match=re.escape(f"Missing dump files from ranks {{{rank}}}")):
        pytorch_reports(d)
    r, _, _, _ = meshsim_report(d)
    assert not r["ok"] and [(p["kind"], p["ranks"]) for p in r["problems"]] == [("missing-dump", [rank])], r["problems"]


def test_known_difference_a_group_with_sends_and_collectives():
    d = dumps(2, None, 2, 2, 3, "--pp-allreduce")
    with pytest.raises(AssertionError, match="can't get dst of non-p2p op"):
        pytorch_reports(d)
    assert meshsim.trace_check(d)["ok"]
    rank = RNG.randrange(8)
    d = dumps(2, f"hang@{rank}", 2, 2, 3, "--pp-allreduce")
    r, _, _, culprits = meshsim_report(d)
    assert not r["ok"] and culprits == {rank}, r["culprits"]


def test_known_difference_batched_ring_exchanges():
    d = dumps(1, None, 2, 3, 3, "--ring-exchange")
    log = _Lines()
    logging.getLogger().addHandler(log)
    try:
        assert pytorch_reports(d) == []
    finally:
        logging.getLogger().removeHandler(log)
    assert any(line.startswith("MISMATCH") for line in log.lines), log.lines[:20]  # on a healthy ring
    assert meshsim.trace_check(d)["ok"]
    # One rank's send of the ring larger than its next rank's receive: PyTorch's analyzer is silent.
    rank = RNG.randrange(6)
    d = dumps(1, f"ringsize@{rank}", 2, 3, 3, "--ring-exchange")
    assert pytorch_reports(d) == []
    r, _, _, culprits = meshsim_report(d)
    nxt = rank - rank % 3 + (rank + 1) % 3
    assert [(p["kind"], p["desc"]) for p in r["problems"]] == [("p2p", "mesh_cp")], r["problems"]
    assert culprits == {rank, nxt}, r["culprits"]
    # A rank that leaves out its last block: its ring peers wait in theirs; meshsim names it alone.
    rank = RNG.randrange(6)
    d = dumps(1, f"ringskip@{rank}", 2, 3, 3, "--ring-exchange")
    theirs = pytorch_reports(d)
    ring = set(range(rank - rank % 3, rank - rank % 3 + 3))
    assert {x for t in theirs for x in t["missing"]} == ring, theirs
    r, _, _, culprits = meshsim_report(d)
    assert not r["ok"] and culprits == {rank}, r["culprits"]
