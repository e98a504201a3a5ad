"""`meshsim step --schedule` against PyTorch 2.13's own `torch.distributed.pipelining.schedules`.

For every schedule meshsim builds, pp 1..8 and the microbatches and stages it allows (a sample
of 1..16; MESHSIM_TORCH_EXAMPLES=0 for all of them):
- the grid meshsim prints is byte-equal to PyTorch's `_format_pipeline_order` of the same
  lowered schedule (read back from `--dump-schedule` with PyTorch's own `_Action.from_str`);
- for GPipe, whose compute order has no idle steps, the lowered schedule is PyTorch's
  `_add_send_recv` of that compute order, action for action; for 1F1B the sends and receives of
  every rank's step, in order and grouped in batches, are what `Schedule1F1B._step_microbatches`
  itself posts (its `_batch_p2p` calls, run over a stand-in stage per rank), and the step's
  deadlock verdict under rendezvous sends is none;
- for the multi-stage ones (Interleaved1F1B, LoopedBFS, InterleavedZeroBubble with 2, 3 and 4
  stages per rank, ZBVZeroBubble), the lowered schedule is what PyTorch's runtime runs, action for
  action: the `pipeline_order_with_comms` that the real schedule class builds in its constructor
  (`_prepare_schedule_with_comms`: UNSHARD/RESHARD with CPython's set order of evictions,
  REDUCE_GRAD, idle steps dropped, then `_add_send_recv`), over stand-in stages that hold only what
  the constructors read (stage_index, num_stages, group_size, group_rank, submod); the class
  computes every rank's order whatever its own rank. Their refusals are PyTorch's, in its words;
  `--lowering add_send_recv` is `_add_send_recv` of the class's compute order as it is;
- 1F1B with fewer microbatches than stages is refused in PyTorch's words;
- under eager sends, the progress verdict is `_simulate_comms_compute`'s, on the built schedules
  and on copies with one action moved one place earlier (a compute before the receive it needs,
  a send before its compute, a receive before another).
PyTorch's simulator takes no UNSHARD/RESHARD/REDUCE_GRAD ("Unsupported action type"): they are
dropped before it runs (they wait for no peer; meshsim's check passes over them likewise).
"""
import os
import random
import subprocess
import tempfile

import pytest

sch = pytest.importorskip("torch.distributed.pipelining.schedules", reason="PyTorch 2.13 (the project's .venv) is the oracle")

MESHSIM = os.environ.get("MESHSIM_EXE") or os.path.join(os.path.dirname(__file__), "..", "..", "build", "default", "apps",
                                                         "meshsim")
EXAMPLES = int(os.environ.get("MESHSIM_TORCH_EXAMPLES", "200"))
RNG = random.Random(int(os.environ.get("MESHSIM_TORCH_SEED", "7")))


def cases():
    out = []
    for pp in range(1, 9):
        for m in range(1, 17):
            out.append(("GPipe", pp, None, m))
            if m >= pp:
                out.append(("1F1B", pp, None, m))
            for v in (2, 3, 4):
                for name in ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble"):
                    out.append((name, pp, v * pp, m))
            out.append(("ZBVZeroBubble", pp, None, m))
    if EXAMPLES and len(out) > EXAMPLES:
        keep = [c for c in out if c[1] == 2 and c[3] <= 4]  # every small one, then a sample
        rest = [c for c in out if c not in keep]
        out = keep + RNG.sample(rest, max(0, EXAMPLES - len(keep)))
    return out


def meshsim_schedule(name, pp, stages, m, *extra):
    d = tempfile.mkdtemp(prefix="meshsim-sched-")
    csv = os.path.join(d, "s.csv")
    cmd = [MESHSIM, "step", "--schedule", name, "--pp", str(pp), "--microbatches", str(m), "--max-rows", "100000",
           "--dump-schedule", csv, *extra]
    if stages:
        cmd += ["--stages", str(stages)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p, csv


def read_lowered(csv):
    order = {}
    with open(csv) as f:
        for rank, line in enumerate(f.read().splitlines()):
            order[rank] = [sch._Action.from_str(a) if a.strip() else None for a in line.split(",")]
    return order


@pytest.mark.parametrize("name,pp,stages,m", cases())
def test_the_grid_is_pytorchs_and_the_single_stage_lowering_is_add_send_recv(name, pp, stages, m):
    p, csv = meshsim_schedule(name, pp, stages, m)
    if p.returncode == 2:
        pytest.skip(f"meshsim refuses it: {p.stderr.strip()[:200]}")  # PyTorch's own refusals, tested below
    assert p.returncode == 0, p.stdout + p.stderr
    lowered = read_lowered(csv)
    grid = p.stdout[:p.stdout.rindex("OK: ")]
    if max(len(a) for a in lowered.values()) < len(lowered):
        # Fewer steps than ranks: PyTorch's formatter indexes a column width per step and fails
        # (IndexError); meshsim prints the grid, each column as wide as its entries.
        with pytest.raises(IndexError):
            sch._format_pipeline_order(lowered)
    else:
        assert grid == sch._format_pipeline_order(lowered), f"{name} pp={pp} m={m}\n{grid}"
    if name == "GPipe":
        compute = {r: [a for a in acts if a.computation_type in (sch.F, sch.B, sch.I, sch.W)]
                   for r, acts in lowered.items()}
        theirs = sch._add_send_recv(compute, stage_to_rank=lambda s: s, num_stages=pp)
        assert {r: [str(a) for a in acts] for r, acts in theirs.items()} == \
               {r: [str(a) for a in acts] for r, acts in lowered.items()}


class _Stage:
    """What Schedule1F1B._step_microbatches asks of its stage: the p2p ops of a microbatch (none
    where the real stage has none: the first stage receives no activation, the last sends none
    and receives no gradient), a forward, a backward."""

    def __init__(self, index, n, log):
        self.stage_index, self.num_stages, self.log = index, n, log
        self.is_first, self.is_last = index == 0, index == n - 1

    def get_fwd_recv_ops(self, i):
        return [] if self.is_first else [f"{self.stage_index}RECV_F{i}"]

    def get_fwd_send_ops(self, i):
        return [] if self.is_last else [f"{self.stage_index}SEND_F{i}"]

    def get_bwd_recv_ops(self, i):
        return [] if self.is_last else [f"{self.stage_index}RECV_B{i}"]

    def get_bwd_send_ops(self, i):
        return [] if self.is_first else [f"{self.stage_index}SEND_B{i}"]

    def forward_one_chunk(self, i, *args, **kwargs):
        self.log.append(f"{self.stage_index}F{i}")

    def backward_one_chunk(self, i, loss=None, last_backward=False):
        self.log.append(f"{self.stage_index}B{i}")

    def perform_reduce_grad(self, *a):
        pass


def pytorchs_1f1b(pp, m, monkeypatch):
    """Every rank's run of PyTorch's own Schedule1F1B._step_microbatches: its computes and each
    _batch_p2p call's ops (a list: posted together)."""
    runs = {}
    monkeypatch.setattr(sch, "_wait_batch_p2p", lambda work: None)
    for r in range(pp):
        log = []
        monkeypatch.setattr(sch, "_batch_p2p", lambda ops, desc=None, log=log: (log.append(list(ops)) if ops else None) or [])
        s = object.__new__(sch.Schedule1F1B)
        s._stage, s._n_microbatches, s._num_stages, s.scale_grads = _Stage(r, pp, log), m, pp, True
        s._check_inputs = lambda a, k, t, l: ([()] * m, [{}] * m)
        s._initialize_stage = s._maybe_compute_loss = s._maybe_get_loss = s._update_losses = lambda *a, **k: None
        sch.Schedule1F1B._step_microbatches(s, [()] * m, [{}] * m, None, None)
        runs[r] = log
    return runs


def meshsim_1f1b_posts(pp, m):
    """Every rank's sends and receives in meshsim's step of a pp-only torchtitan job under 1F1B,
    each run of one batch together (the trace's `batch`)."""
    import meshsim
    report = meshsim.step(f"torchtitan:pp={pp},dp_shard=1", "llama3-debugmodel", seq_len=64, local_batch_size=1,
                          microbatches=m, schedule="1F1B", ranks="all", trace=True, log_metrics=False)
    assert report["ok"], report["diagnosis"]
    trace = report["trace"] if isinstance(report["trace"], dict) else __import__("json").loads(report["trace"])
    posts = {r: [] for r in range(pp)}
    last = {}
    for e in sorted((e for e in trace["traceEvents"] if e.get("ph") == "X"), key=lambda e: (e["tid"], e["ts"])):
        op = e["name"].split(" ")[0]
        if op not in ("send", "recv"):
            continue
        a, r = e["args"], e["tid"]
        text = f"{a['stage']}{op.upper()}_{'F' if a['phase'] == 'fwd' else 'B'}{a['microbatch']}"
        b = a.get("batch", -1)
        if b >= 0 and last.get(r) == b:
            posts[r][-1].append(text)
        else:
            posts[r].append([text])
        last[r] = b
    return posts


@pytest.mark.parametrize("pp,m", [(pp, m) for pp in range(2, 7) for m in sorted({pp, pp + 1, 2 * pp, 16})])
def test_1f1b_posts_what_pytorchs_loop_posts(pp, m, monkeypatch):
    theirs = pytorchs_1f1b(pp, m, monkeypatch)
    mine = meshsim_1f1b_posts(pp, m)
    for r in range(pp):
        assert mine[r] == [x for x in theirs[r] if isinstance(x, list)], f"pp={pp} m={m} rank {r}: {theirs[r]}"
    # Some rank posts a send with a receive in one batch (the steady state) whenever it has one.
    assert any(len(x) == 2 for r in range(pp) for x in mine[r])


def test_1f1b_with_fewer_microbatches_than_stages_is_refused_in_pytorchs_words():
    p, _ = meshsim_schedule("1F1B", 4, None, 2)
    assert p.returncode == 2
    assert "Number of microbatches (2) must be greater than or equal to the number of stages (4)" in p.stderr, p.stderr


class StandInStage:
    # What PyTorch's multi-stage schedule constructors read of a stage (no module, no process group).
    def __init__(self, index, stages, pp):
        self.stage_index = index
        self.num_stages = stages
        self.group_size = pp
        self.group_rank = 0
        self.stage_index_to_group_rank = {}
        self.submod = None


MULTI = {"Interleaved1F1B": "ScheduleInterleaved1F1B", "LoopedBFS": "ScheduleLoopedBFS",
         "InterleavedZeroBubble": "ScheduleInterleavedZeroBubble", "ZBVZeroBubble": "ScheduleZBVZeroBubble"}


def pytorch_schedule(name, pp, stages, m):
    # The real class over rank 0's stand-in stages: it builds every rank's compute order
    # (pipeline_order) and lowers it as its runtime does (pipeline_order_with_comms).
    n = stages or 2 * pp
    local = [0, 2 * pp - 1] if name == "ZBVZeroBubble" else list(range(0, n, pp))
    return getattr(sch, MULTI[name])([StandInStage(i, n, pp) for i in local], m)


@pytest.mark.parametrize("name,pp,stages,m", [c for c in cases() if c[0] in MULTI])
def test_the_multi_stage_lowering_is_pytorchs_runtime(name, pp, stages, m):
    try:
        theirs = pytorch_schedule(name, pp, stages, m)
    except ValueError as e:
        p, _ = meshsim_schedule(name, pp, stages, m)
        assert p.returncode == 2 and str(e) in p.stderr, (str(e), p.stderr)
        return
    p, csv = meshsim_schedule(name, pp, stages, m)
    assert p.returncode == 0, p.stdout + p.stderr
    mine = {r: [str(a) for a in acts] for r, acts in read_lowered(csv).items()}
    assert mine == {r: [str(a) for a in acts] for r, acts in theirs.pipeline_order_with_comms.items()}
    p, csv = meshsim_schedule(name, pp, stages, m, "--lowering", "add_send_recv")
    assert p.returncode == 0, p.stdout + p.stderr
    plain = sch._add_send_recv({r: list(a) for r, a in theirs.pipeline_order.items()},
                               stage_to_rank=lambda s: theirs.stage_index_to_group_rank[s], num_stages=theirs._num_stages)
    mine = {r: [str(a) for a in acts if a is not None] for r, acts in read_lowered(csv).items()}
    assert mine == {r: [str(a) for a in acts] for r, acts in plain.items()}


def test_evictions_follow_cpythons_set_order():
    # 8 stages per rank on 8 ranks: a rank computes stages up to 63, held in a set whose table
    # (8 to 32 slots) puts them out of numeric order; each eviction of several at once and the
    # final RESHARDs come in that order.
    theirs = pytorch_schedule("Interleaved1F1B", 8, 64, 16)
    p, csv = meshsim_schedule("Interleaved1F1B", 8, 64, 16)
    assert p.returncode == 0, p.stderr
    mine = {r: [str(a) for a in acts] for r, acts in read_lowered(csv).items()}
    assert mine == {r: [str(a) for a in acts] for r, acts in theirs.pipeline_order_with_comms.items()}
    tails = [[str(a) for a in acts if a.computation_type == sch.RESHARD] for acts in theirs.pipeline_order_with_comms.values()]
    assert any(t != sorted(t, key=lambda s: int(s[:-len("RESHARD")])) for t in tails), tails


def pytorch_progresses(lowered, pp, stages):
    import contextlib
    import io
    fsdp = (sch.UNSHARD, sch.RESHARD, sch.REDUCE_GRAD)
    order = {r: [a for a in acts if a is not None and a.computation_type not in fsdp] for r, acts in lowered.items()}
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            sch._simulate_comms_compute(order, stage_to_rank=lambda s: s % pp, num_stages=stages)
        return True
    except ValueError as e:
        assert "not progressing" in str(e)
        return False
    except IndexError as e:
        # On no progress the simulator first prints its grid, and PyTorch's formatter fails on a
        # grid of fewer steps than ranks: that failure is its "not progressing".
        import traceback
        assert "_format_pipeline_order" in [f.name for f in traceback.extract_tb(e.__traceback__)], e
        return False


def write_csv(order, path):
    with open(path, "w") as f:
        for r in sorted(order):
            f.write(",".join(str(a) for a in order[r]) + "\n")


MUTATIONS = [(name, pp, v * pp if v else None, m)
             for name, v in (("GPipe", 0), ("1F1B", 0), ("Interleaved1F1B", 2), ("LoopedBFS", 2))
             for pp in (2, 3, 4) for m in (pp, 2 * pp)]


@pytest.mark.parametrize("name,pp,stages,m", MUTATIONS)
def test_eager_progress_verdicts_are_pytorchs_simulator(name, pp, stages, m):
    # The built schedule, then copies with one action moved one place earlier on one rank (a
    # compute before the receive it needs, a send before its compute, a receive before another):
    # meshsim's verdict under eager sends is _simulate_comms_compute's, case by case.
    p, csv = meshsim_schedule(name, pp, stages, m)
    assert p.returncode == 0, p.stderr
    lowered = read_lowered(csv)
    n_stages = stages or pp
    assert pytorch_progresses(lowered, pp, n_stages)
    rng = random.Random(f"{name}-{pp}-{m}")
    tried = disagree = stuck = 0
    for _ in range(12):
        r = rng.randrange(pp)
        acts = [a for a in lowered[r] if a is not None]
        if len(acts) < 2:
            continue
        k = rng.randrange(1, len(acts))
        mutated = {q: [a for a in lowered[q] if a is not None] for q in lowered}
        mutated[r][k - 1], mutated[r][k] = mutated[r][k], mutated[r][k - 1]
        path = csv + f".{tried}.csv"
        write_csv(mutated, path)
        cmd = [MESHSIM, "step", "--schedule", path, "--microbatches", str(m), "--send-semantics", "eager", "--format", "json"]
        if stages:
            cmd += ["--stages", str(stages)]
        q = subprocess.run(cmd, capture_output=True, text=True)
        if q.returncode == 2:
            # The compute order itself broken (a backward before its forward): refused as
            # PyTorch's _validate_schedule refuses it, before any simulation.
            assert "InvalidArgument" in q.stderr, q.stderr
            continue
        assert q.returncode in (0, 1), q.stdout + q.stderr
        theirs = pytorch_progresses(mutated, pp, n_stages)
        tried += 1
        stuck += not theirs
        disagree += (q.returncode == 0) != theirs
        assert (q.returncode == 0) == theirs, (r, k - 1, str(mutated[r][k - 1]), str(mutated[r][k]), q.stdout)
    assert tried > 0
    print(f"\n  [{name} pp={pp} m={m}] {tried} mutations, {stuck} not progressing in both")
