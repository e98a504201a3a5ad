"""`meshsim record` and `meshsim.record`: a user's own program run by the real PyTorch of this
environment once per rank over the fake backend, its dumps checked across ranks.

Each program below is written by the test and run as the user would run it (the tool, from the
build tree, with this environment's Python; or meshsim.record from this interpreter). What must
hold, on 2.13.0 and 2.14.1 alike (MESHSIM_TORCH_VERSION names the release the file must find):
a healthy program passes; every fault planted at a rank is named by that rank; the group-name
divergence of a local-sync group followed by a world group is named on 2.14.1 and passes on 2.13;
chained local-sync groups are named on both; PyTorch's own Flight Recorder analyzer reads the
dumps; what each rank saw of torchrun's environment is what torchrun gives it.
"""
import json
import os
import random
import pickle
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch of this environment runs the ranks")

import meshsim  # noqa: E402
import torch_env  # noqa: E402

EXE = os.environ.get("MESHSIM_EXE")
V214 = torch_env.at_least("2.14")


def script(tmp_path, body, name="prog.py"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return str(p)


def tool(*args, timeout=300):
    """The tool as a user runs it: exit status, stdout, stderr."""
    if not EXE:
        pytest.skip("MESHSIM_EXE is not set (ctest sets it)")
    p = subprocess.run([EXE, "record", *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout, p.stderr


HEALTHY = """
import torch, torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch.distributed.device_mesh import init_device_mesh

def main():
    dist.init_process_group("nccl")
    r, w = dist.get_rank(), dist.get_world_size()
    t = torch.ones(8)
    dist.all_reduce(t)
    mesh = init_device_mesh("cpu", (2, w // 2), mesh_dim_names=("dp", "tp"))
    dist.all_gather_into_tensor(torch.empty(8 * (w // 2)), t, group=mesh["tp"].get_group())
    flat = mesh["dp", "tp"]._flatten("dp_tp")
    dist.reduce_scatter_tensor(torch.empty(8 // w), t, group=flat.get_group())
    y = fc.all_reduce(t, "sum", mesh["dp"].get_group())
    ops = [dist.P2POp(dist.isend, t, (r + 1) % w), dist.P2POp(dist.irecv, torch.empty(8), (r - 1) % w)]
    for x in dist.batch_isend_irecv(ops):
        x.wait()
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
"""


def test_a_healthy_program_passes_and_every_rank_records_what_it_issued(tmp_path):
    prog = script(tmp_path, HEALTHY)
    out = tmp_path / "rec"
    code, so, se = tool("-n", "4", "--out", str(out), "--", sys.executable, prog)
    assert code == 0, so + se
    assert so.rstrip().endswith("OK"), so
    assert "torch " + torch.__version__ in so, so
    summary = json.loads((out / "record.json").read_text())
    assert summary["torch"] == torch.__version__
    assert [r["status"] for r in summary["ranks"]] == ["ok"] * 4
    for r in range(4):
        d = pickle.loads((out / f"trace_rank_{r}").read_bytes())
        names = [e["profiling_name"] for e in d["entries"]]
        me = r
        assert names == ["nccl:all_reduce", "nccl:_all_gather_base", "nccl:_reduce_scatter_base", "nccl:all_reduce",
                         f"nccl:send {me}->{(me + 1) % 4}", f"nccl:recv {me}<-{(me - 1) % 4}",
                         "nccl:all_reduce_barrier"], names
        descs = {g["desc"] for g in d["pg_config"].values()}
        assert {"default_pg", "mesh_dp", "mesh_tp"} <= descs, d["pg_config"]
        # The groups are the ones this rank's PyTorch made: tp of rank r is its row.
        tp = [g for g in d["pg_config"].values() if g["desc"] == "mesh_tp"]
        assert tp and tp[0]["ranks"] == str([2 * (r // 2), 2 * (r // 2) + 1]), tp
        ag = d["entries"][1]
        assert ag["input_sizes"] == [[8]] and ag["output_sizes"] == [[16]] and ag["input_dtypes"] == ["Float"], ag
        assert any(f["filename"] == prog and f["name"] == "main" for f in ag["frames"]), ag["frames"][:4]
        assert d["entries"][0]["collective_seq_id"] == 1 and d["entries"][5]["p2p_seq_id"] == 2


def test_pytorchs_own_analyzer_reads_the_dumps(tmp_path):
    builder = pytest.importorskip("torch.distributed.flight_recorder.components.builder")
    from torch.distributed.flight_recorder.components.config_manager import JobConfig
    from torch.distributed.flight_recorder.components.loader import read_dir
    r = meshsim.record(["python", script(tmp_path, HEALTHY)], 4, out=str(tmp_path / "rec"))
    assert r.ok
    args = JobConfig().parse_args([str(tmp_path / "rec"), "-p", "trace_rank_"])
    details, version = read_dir(args)
    assert len(details) == 4 and version == "2.10", (len(details), version)
    builder.build_db(details, args, version)  # raises on what it cannot read


def test_torchruns_environment_is_what_each_rank_sees(tmp_path):
    prog = script(tmp_path, """
        import os, torch.distributed as dist
        keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"]
        print({k: os.environ.get(k) for k in keys})
        dist.init_process_group(backend="cpu:gloo,cuda:nccl", device_id=None)
        dist.all_reduce(__import__("torch").ones(1))
    """)
    out = tmp_path / "rec"
    code, so, se = tool("-n", "6", "--nproc-per-node", "2", "--jobs", "3", "--out", str(out), "--", sys.executable, prog)
    assert code == 0, so + se
    for r in range(6):
        seen = eval((out / "ranks" / f"rank-{r}.out").read_text())
        assert seen == {"RANK": str(r), "LOCAL_RANK": str(r % 2), "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "2",
                        "GROUP_RANK": str(r // 2), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, seen


TWO_CALLS = """
import torch, torch.distributed as dist
dist.init_process_group("nccl")
dist.new_group([0, 1], use_local_synchronization=True)
world = dist.new_group([0, 1, 2, 3])
dist.all_reduce(torch.ones(4), group=world)
dist.destroy_process_group()
"""


def test_a_local_sync_group_then_a_world_group_is_named_on_2_14_and_passes_on_2_13(tmp_path):
    code, so, se = tool("-n", "4", "--out", str(tmp_path / "rec"), "--", sys.executable, script(tmp_path, TWO_CALLS))
    print(so)
    if V214:
        assert code == 1, so + se
        first = next(line for line in so.splitlines() if line.startswith("FAILED "))
        assert first.startswith("FAILED group-name: "), so
        assert "ranks 0-1 as '2', ranks 2-3 as '1'" in first, first
    else:
        assert code == 0, so + se


def test_chained_local_sync_groups_are_named_on_both_releases(tmp_path):
    prog = script(tmp_path, """
        import torch, torch.distributed as dist
        dist.init_process_group("nccl")
        r = dist.get_rank()
        dist.new_group([0, 1], use_local_synchronization=True)
        g = dist.new_group([0, 3], use_local_synchronization=True)
        if r in (0, 3):
            dist.all_reduce(torch.ones(4), group=g)
    """)
    with pytest.raises(meshsim.CheckFailed) as e:
        meshsim.record(["python", prog], 4)
    kinds = [p["kind"] for p in e.value.result.check["problems"]]
    assert kinds[0] == "group-name", e.value.result.text
    assert e.value.result.check["problems"][0]["ranks"] == [0, 3], e.value.result.text


# A fault planted at a random rank of a healthy program: each must be named by its rank.
PLANTED = {
    "skip": (["if r != R:", "    dist.all_reduce(t)", "dist.all_reduce(t)"], "never-issued"),
    "dim-order": (["names = ('tp', 'dp') if r == R else ('dp', 'tp')",
                   "m = init_device_mesh('cpu', (2, 2), mesh_dim_names=names)",
                   "dist.all_reduce(t, group=m['tp'].get_group())"], None),
    "dtype": (["dist.all_reduce(t.to(torch.float16) if r == R else t)"], "dtype"),
}


@pytest.mark.parametrize("fault", sorted(PLANTED))
def test_a_fault_planted_at_a_random_rank_is_named_by_it(tmp_path, fault):
    import random
    rank = random.Random(os.environ.get("MESHSIM_TORCH_SEED", "69") + fault).randrange(4)
    body, kind = PLANTED[fault]
    lines = ["import torch, torch.distributed as dist", "from torch.distributed.device_mesh import init_device_mesh",
             "def main():", "    dist.init_process_group('nccl')", f"    r, R, t = dist.get_rank(), {rank}, torch.ones(4)"]
    lines += ["    " + b for b in body] + ["main()"]
    prog = script(tmp_path, "\n".join(lines) + "\n")
    with pytest.raises(meshsim.CheckFailed) as e:
        meshsim.record(["python", prog], 4)
    res = e.value.result
    print(f"\n  [{fault}@{rank}]\n" + res.text)
    assert not res.findings, res.text
    if kind:
        assert kind in {p["kind"] for p in res.check["problems"]}, res.text
    assert rank in {c["rank"] for c in res.check["culprits"]}, res.text


def test_a_rank_that_never_calls_init_crashes_or_hangs_is_named_and_the_others_still_report(tmp_path):
    prog = script(tmp_path, """
        import os, sys, time, torch, torch.distributed as dist
        r = int(os.environ["RANK"])
        if r == 2:
            sys.exit(0)
        dist.init_process_group("nccl")
        dist.all_reduce(torch.ones(2))
        if r == 1:
            raise ValueError("planted on rank 1")
        if r == 3:
            time.sleep(600)
        dist.all_reduce(torch.ones(2))
    """)
    start = time.monotonic()
    code, so, se = tool("-n", "5", "--timeout", "8", "--out", str(tmp_path / "rec"), "--", sys.executable, prog)
    took = time.monotonic() - start
    print(so)
    assert code == 1, so + se
    assert took < 60, took
    lines = so.splitlines()
    assert any(x.startswith("FAILED rank 1: ValueError: planted on rank 1 at " + prog + ":") for x in lines), so
    assert any(x.startswith("FAILED rank 2: never called init_process_group") for x in lines), so
    assert any(x.startswith("FAILED rank 3: ran past its deadline of 8 s") for x in lines), so
    assert not any(x.startswith("FAILED rank 0") or x.startswith("FAILED rank 4") for x in lines), so
    assert "missing-dump" in so and "rank 2" in so
    # Rank 0's and rank 4's dumps hold both collectives: they still report.
    for r in (0, 4):
        d = pickle.loads((tmp_path / "rec" / f"trace_rank_{r}").read_bytes())
        assert len(d["entries"]) == 2, d["entries"]


CARRIED = """
    import os, torch, torch.distributed as dist
    dist.init_process_group("nccl")
    r, w = dist.get_rank(), dist.get_world_size()
    seed = int(os.environ["SEED"])
    if r == 0:
        # What the last rank sends, received before anything else (under --jobs 1 the last rank
        # starts after rank 0 waits), then a Python object from rank 1.
        t = torch.zeros(3, dtype=torch.float64)
        dist.recv(t, src=w - 1)
        assert t.tolist() == [seed, seed + 1.5, -seed], t
        objs = [None]
        dist.recv_object_list(objs, src=1)
        assert objs[0] == {"shape": [seed, 3], "from": 1}, objs
    elif r == w - 1:
        dist.send(torch.tensor([seed, seed + 1.5, -seed], dtype=torch.float64), dst=0)
    if r == 1:
        dist.send_object_list([{"shape": [seed, 3], "from": 1}], dst=0)
    # A ring of batches over a subgroup of every rank, each receiving first in its batch.
    g = dist.new_group(list(range(w)))
    nxt, prv = (r + 1) % w, (r - 1) % w
    x, y = torch.full((4,), float(r * seed), dtype=torch.bfloat16), torch.empty(4, dtype=torch.bfloat16)
    for q in dist.batch_isend_irecv([dist.P2POp(dist.irecv, y, prv, g), dist.P2POp(dist.isend, x, nxt, g)]):
        q.wait()
    assert y.tolist() == [float(prv * seed)] * 4, (r, y)
    print("rank", r, "received", y.tolist())
"""


def test_point_to_point_tensors_and_objects_arrive_as_sent_whatever_order_the_ranks_run_in(tmp_path):
    # The values depend on a seed the test draws, so no fixed answer could pass.
    seed = random.Random().randrange(2, 100)
    prog = script(tmp_path, CARRIED)
    if not EXE:
        pytest.skip("MESHSIM_EXE is not set (ctest sets it)")
    p = subprocess.run([EXE, "record", "-n", "5", "--jobs", "1", "--timeout", "120", "--out", str(tmp_path / "rec"),
                        "--", sys.executable, prog], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, SEED=str(seed)), stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "send/recv pairs checked" in p.stdout and "OK" in p.stdout, p.stdout
    for r in range(5):
        out = (tmp_path / "rec" / "ranks" / f"rank-{r}.out").read_text()
        assert f"rank {r} received {[float(((r - 1) % 5) * seed)] * 4}" in out, out
    # Nothing is left behind: every carried send was received.
    assert not os.listdir(tmp_path / "rec" / "p2p")


def test_a_receive_never_sent_or_of_another_size_is_named_by_both_ranks(tmp_path):
    never = script(tmp_path, """
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        if dist.get_rank() == 1:
            dist.recv(torch.empty(2), src=0)
    """, "never.py")
    code, so, se = tool("-n", "2", "--timeout", "60", "--out", str(tmp_path / "never"), "--", sys.executable, never)
    assert code == 1, so + se
    assert "FAILED rank 1: RuntimeError: meshsim record: rank 1 waits for its receive 0 from rank 0, which rank 0 never sent" \
        in so, so
    assert "FAILED rank 0" not in so, so
    sizes = script(tmp_path, """
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        if dist.get_rank() == 0:
            dist.send(torch.ones(3), dst=1)
        else:
            dist.recv(torch.empty(2), src=0)
    """, "sizes.py")
    code, so, se = tool("-n", "2", "--timeout", "60", "--out", str(tmp_path / "sizes"), "--", sys.executable, sizes)
    assert code == 1, so + se
    assert "rank 1 receives 8 bytes (Float [2]) from rank 0 as its receive 0 from it, but rank 0 sent 12 bytes" in so, so


def test_a_callable_is_recorded_from_this_interpreter_and_a_subset_of_ranks_is_not_a_problem(tmp_path):
    def program():
        import torch.distributed as dist
        dist.init_process_group("gloo")
        dist.all_reduce(torch.ones(3, dtype=torch.bfloat16))

    r = meshsim.record(program, 8, ranks="1-2,6", jobs=2)
    assert r.ok, r.text
    assert [x["rank"] for x in r.ranks] == [1, 2, 6]
    assert sorted(r.dumps) == [1, 2, 6]
    assert r.dumps[6]["entries"][0]["input_dtypes"] == ["BFloat16"]
    assert r.dumps[6]["entries"][0]["profiling_name"] == "gloo:all_reduce"
    assert "5 ranks were not recorded" in r.text


def test_bad_flags_are_refused_by_name(tmp_path):
    prog = script(tmp_path, "print(1)\n")
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    for args, words in [
        (["-n", "0", "--", sys.executable, prog], "-n 0 is out of range"),
        (["-n", "4", "--", "torchrun", prog], "is not run by a Python interpreter"),
        (["-n", "4", "--ranks", "3-5", "--", sys.executable, prog], "is not within ranks 0-3"),
        (["-n", "4", "--out", str(full), "--", sys.executable, prog], "is not empty"),
        (["-n", "4", "--timeout", "0", "--", sys.executable, prog], "--timeout"),
        (["-n", "4", "--", sys.executable, str(tmp_path / "absent.py")], "could not be started"),
    ]:
        code, so, se = tool(*args)
        assert code == 2 and words in se, (args, code, so, se)
    with pytest.raises(meshsim.ArgumentTypeError):
        meshsim.record(["python", prog], 4.0)
    with pytest.raises(meshsim.InvalidArgument):
        meshsim.record(["python", prog], 4, ranks="9")


def test_a_program_that_never_calls_init_anywhere_is_said_so(tmp_path):
    code, so, se = tool("-n", "2", "--", sys.executable, script(tmp_path, "print('hello')\n"))
    assert code == 1 and "no rank called init_process_group" in so, so + se


def test_collectives_issued_inside_another_ops_dispatch_and_the_programs_own_dumps_are_recorded(tmp_path):
    # DTensor reduces a stack of partial norms inside aten.linalg_vector_norm's dispatch, where
    # the mode stack is popped: the two all_reduces (one per mesh dim) are still recorded, once.
    # The program's own _dump_fr_trace() gets its records so far, in the same format.
    prog = script(tmp_path, """
        import pickle, sys, torch, torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import distribute_tensor, Shard
        dist.init_process_group("nccl")
        m = init_device_mesh("cpu", (2, 2), mesh_dim_names=("fsdp", "tp"))
        g = [distribute_tensor(torch.randn(8, 8), m, [Shard(0), Shard(1)]) for _ in range(3)]
        before = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(g, 2.0)), 2.0)
        assert all(p.is_replicate() for p in norm.placements), norm.placements
        after = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
        print(len(before["entries"]), len(after["entries"]), after["version"])
    """)
    r = meshsim.record(["python", prog], 4, out=str(tmp_path / "rec"))
    assert r.ok, r.text
    for rank in range(4):
        es = r.dumps[rank]["entries"]
        scatters = [e for e in es if e["profiling_name"] == "nccl:scatter"]
        reduces = [(e["process_group"][1], e["input_sizes"]) for e in es if e["profiling_name"] == "nccl:all_reduce"]
        assert len(scatters) == 6, [e["profiling_name"] for e in es]  # 3 tensors x 2 mesh dims, each once
        assert reduces == [("mesh_fsdp", [[3]]), ("mesh_tp", [[3]])], reduces
        seen = (tmp_path / "rec" / "ranks" / f"rank-{rank}.out").read_text().split()
        assert seen == [str(len(es) - 2), str(len(es)), "2.10"], seen


def test_fake_tensors_record_a_model_this_machine_could_not_hold(tmp_path):
    # 64 layers of 8192 x 8192 in fp32: 17 GB of weights (and as much again for their gradients),
    # sharded by FSDP2 over 4 ranks. Under --fake-tensors no rank holds a byte of them: every
    # rank's all-gathers and reduce-scatters are recorded with the real shapes. A value read back
    # (.item()) is answered 1 and noted.
    prog = script(tmp_path, """
        import torch, torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        dist.init_process_group("nccl")
        mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("fsdp",))
        model = torch.nn.Sequential(*[torch.nn.Linear(8192, 8192) for _ in range(64)])
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        loss = model(torch.randn(4, 8192)).sum()
        loss.backward()
        total = torch.tensor(float(loss.item()))
        dist.all_reduce(total)
    """)
    out = tmp_path / "rec"
    code, so, se = tool("-n", "4", "--fake-tensors", "--out", str(out), "--", sys.executable, prog, timeout=600)
    assert code == 0, so + se
    assert "under FakeTensorMode" in so, so
    shard = (8192 * 8192 + 8192) // 4
    for r in range(4):
        d = pickle.loads((out / f"trace_rank_{r}").read_bytes())
        names = [e["profiling_name"] for e in d["entries"]]
        gathers = [e for e in d["entries"] if e["profiling_name"] == "nccl:_all_gather_base"]
        scatters = [e for e in d["entries"] if e["profiling_name"] == "nccl:_reduce_scatter_base"]
        assert len(gathers) >= 64 and len(scatters) == 64, names[:10]
        assert gathers[0]["input_sizes"] == [[shard]] and gathers[0]["output_sizes"] == [[4 * shard]], gathers[0]
        assert names[-1] == "nccl:all_reduce"
        notes = d["meshsim_record"]["notes"]
        assert any("answered 1" in n and prog in n for n in notes), notes
