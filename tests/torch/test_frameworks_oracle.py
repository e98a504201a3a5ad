"""`meshsim.preset("torchtitan:...")` against torchtitan's own ParallelDims (the torchtitan of the
project's .venv, 0.3.0 from PyPI), for every rank.

For random parallel degrees (pp, dp_replicate, dp_shard, cp, tp, ep; worlds up to 64 ranks;
MESHSIM_TORCH_SEED picks them), torchtitan's `ParallelDims.build_mesh()` runs once per rank, each
rank its own process group over the `fake` backend with a `FakeStore`, and every one-dimensional
mesh it keeps (`get_all_one_dimensional_meshes()`: pp, batch, loss, dp_replicate, fsdp or dp, cp,
tp, ep, efsdp as enabled) must hold the same ranks, in the same order, as the dim of that name in
meshsim's preset views seen from that rank. Degrees torchtitan refuses (its _validate, or build_mesh failing) must be
refused by meshsim's preset, and the other way round.

Megatron-core (megatron-core 0.16.1 of the .venv; 0.17+ needs Python 3.12) the same way:
`parallel_state.initialize_model_parallel` per rank over the fake backend (no Gloo groups), and
its tensor, pipeline, data (with and without context parallel), context, model, expert, expert
tensor and expert data groups equal to the dims of `meshsim.preset("megatron:...")` (as sets of
ranks: new_group sorts them), refusals alike.
"""
import logging
import os
import random
import warnings

import pytest

pytest.importorskip("torch", reason="PyTorch 2.13 (the project's .venv) is the oracle")
titan = pytest.importorskip("torchtitan.distributed", reason="torchtitan (the project's .venv) is the oracle")

import torch.distributed as dist  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

import meshsim  # noqa: E402

RNG = random.Random(int(os.environ.get("MESHSIM_TORCH_SEED", "56")))
COUNT = int(os.environ.get("MESHSIM_TORCH_EXAMPLES", "200")) // 8 or 600


def configs():
    out = []
    while len(out) < COUNT:
        d = {k: RNG.choice([1, 1, 2, 4]) for k in ("pp", "dp_replicate", "dp_shard", "cp", "tp")}
        world = d["pp"] * d["dp_replicate"] * d["dp_shard"] * d["cp"] * d["tp"]
        if world > 64 or world < 2:
            continue
        d["ep"] = RNG.choice([1, 2, 4, 8])
        out.append(d)
    return out


def preset_text(d):
    return "torchtitan:" + ",".join(f"{k}={v}" for k, v in d.items() if v != 1 or k == "pp")


def titan_meshes(d, world, rank):
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pd = titan.ParallelDims(**d, world_size=world)
            pd.build_mesh()
            return {n: m.mesh.tolist() for n, m in pd.get_all_one_dimensional_meshes().items()}
    finally:
        dist.destroy_process_group()


def meshsim_line(views, name, rank):
    for view in views.values():
        names = view.mesh_dim_names or ()
        if name in names:
            return view.group_of(rank, name)
        if len(names) == 1 and name == names[0].removesuffix("_mesh"):
            return view.group_of(rank, 0)
    return None


@pytest.mark.parametrize("d", configs(), ids=preset_text)
def test_every_one_dimensional_mesh_is_torchtitans(d):
    logging.disable(logging.CRITICAL)
    world = d["pp"] * d["dp_replicate"] * d["dp_shard"] * d["cp"] * d["tp"]
    try:
        titan_meshes(d, world, 0)  # its _validate, then build_mesh (0.3.0 checks ep there)
        refused = None
    except Exception as e:  # noqa: BLE001 - whatever torchtitan raises is its refusal
        refused = e
    try:
        views = meshsim.preset(preset_text(d), world_size=world)
    except meshsim.Error as e:
        assert refused is not None, f"meshsim refuses what torchtitan takes: {e}"
        print(f"\n  [{preset_text(d)}] refused by both: {type(refused).__name__}: {str(refused)[:100]}")
        return
    assert refused is None, f"torchtitan refuses ({type(refused).__name__}: {refused}) what meshsim takes"
    for rank in range(world):
        theirs = titan_meshes(d, world, rank)
        assert theirs, d
        for name, line in theirs.items():
            assert meshsim_line(views, name, rank) == line, (name, rank, line, {k: v.mesh_dim_names for k, v in views.items()})
    print(f"\n  [{preset_text(d)}] {world} ranks x {len(theirs)} meshes ({', '.join(theirs)}) equal")


def megatron_configs():
    rng = random.Random(RNG.random())
    out = []
    while len(out) < COUNT:
        d = {k: rng.choice([1, 1, 2, 4]) for k in ("tp", "pp", "cp", "dp")}
        world = d["tp"] * d["pp"] * d["cp"] * d["dp"]
        if world > 64 or world < 2:
            continue
        d["ep"] = rng.choice([1, 1, 2, 4])
        d["etp"] = rng.choice([None, 1, 2])
        out.append(d)
    return out


def megatron_text(d):
    return "megatron:" + ",".join(f"{k}={v}" for k, v in d.items() if v is not None)


def megatron_groups(ps, d, world, rank):
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ps.initialize_model_parallel(tensor_model_parallel_size=d["tp"], pipeline_model_parallel_size=d["pp"],
                                         context_parallel_size=d["cp"], expert_model_parallel_size=d["ep"],
                                         expert_tensor_parallel_size=d["etp"], create_gloo_process_groups=False)
            r = dist.get_process_group_ranks
            return {"tp": r(ps.get_tensor_model_parallel_group()), "pp": r(ps.get_pipeline_model_parallel_group()),
                    "dp": r(ps.get_data_parallel_group()), "cp": r(ps.get_context_parallel_group()),
                    "dp_cp": r(ps.get_data_parallel_group(with_context_parallel=True)),
                    "mp": r(ps.get_model_parallel_group()), "ep": r(ps.get_expert_model_parallel_group()),
                    "etp": r(ps.get_expert_tensor_parallel_group()), "edp": r(ps.get_expert_data_parallel_group())}
    finally:
        ps.destroy_model_parallel()
        dist.destroy_process_group()


@pytest.mark.parametrize("d", megatron_configs(), ids=megatron_text)
def test_every_group_is_megatron_cores(d):
    ps = pytest.importorskip("megatron.core.parallel_state", reason="megatron-core (the project's .venv) is the oracle")
    logging.disable(logging.CRITICAL)
    world = d["tp"] * d["pp"] * d["cp"] * d["dp"]
    try:
        megatron_groups(ps, d, world, 0)
        refused = None
    except Exception as e:  # noqa: BLE001 - whatever Megatron raises is its refusal
        refused = e
    try:
        views = meshsim.preset(megatron_text(d), world_size=world)
    except meshsim.Error as e:
        assert refused is not None, f"meshsim refuses what Megatron takes: {e}"
        print(f"\n  [{megatron_text(d)}] refused by both: {type(refused).__name__}: {str(refused)[:100]}")
        return
    assert refused is None, f"Megatron refuses ({type(refused).__name__}: {refused}) what meshsim takes"
    for rank in range(world):
        theirs = megatron_groups(ps, d, world, rank)
        for name, ranks in theirs.items():
            mine = meshsim_line(views, name, rank)
            assert mine is not None and sorted(mine) == ranks, (name, rank, ranks, mine)
    print(f"\n  [{megatron_text(d)}] {world} ranks x {len(theirs)} groups equal")
