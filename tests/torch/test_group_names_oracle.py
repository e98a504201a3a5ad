"""The name PyTorch gives every process group, on every rank, against meshsim's creation plan.

Random programs of 1-6 `new_group` calls (worlds 2-8, 40% with use_local_synchronization, ranks
in any order, sometimes every rank), with or without a DeviceMesh made among them
(init_device_mesh of a random shape of the world: its own new_group calls, named by the same
counter), run by the real PyTorch of this environment once per rank over the `fake` backend (each
rank its own process-group world, as torchrun gives it). For every rank, every call's outcome —
the group's name, or what a non-member gets back (None on 2.13, GroupMember.NON_GROUP_MEMBER on
2.14) — must equal `creation_plan(rank=r, torch_version=..., process_groups=...)`'s, call for call;
and meshsim must report a problem exactly where PyTorch's names diverge: the members of one call
name it differently, or one name means two groups on different ranks. Both outcomes must occur
in the run, so neither side of the comparison passes vacuously.

MESHSIM_TORCH_EXAMPLES sets the number of programs (200), MESHSIM_TORCH_SEED the seed.
"""
import os
import warnings

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch of this environment is the oracle")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import torch.distributed as dist  # noqa: E402
import torch.distributed.device_mesh as dm  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

import meshsim  # noqa: E402
import torch_env  # noqa: E402

EXAMPLES = int(os.environ.get("MESHSIM_TORCH_EXAMPLES", "200")) or 2000
SEED = int(os.environ.get("MESHSIM_TORCH_SEED", "67"))
SEEN = {"diverge": 0, "agree": 0, "non_member": 0}


def outcome(g):
    """What a rank holds after a group call: the group's name, or the non-member's result."""
    if isinstance(g, dist.ProcessGroup):
        return g.group_name
    if g is None:
        return "None"
    assert g == dist.GroupMember.NON_GROUP_MEMBER, g
    return "NON_GROUP_MEMBER"


def run_torch(world, calls, mesh, rank):
    """Each group call's outcome on `rank`, in order (the mesh's new_group calls where it is made)."""
    out = []
    real_new = dm.new_group

    def recording_new(*args, **kw):
        g = real_new(*args, **kw)
        out.append(outcome(g))
        return g

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    dm.new_group = recording_new
    try:
        for c in calls:
            if c == "mesh":
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    init_device_mesh("cpu", tuple(mesh[0]), mesh_dim_names=tuple(mesh[1]))
                continue
            ng = c["new_group"]
            out.append(outcome(dist.new_group(ranks=ng.get("ranks"),
                                              use_local_synchronization=ng.get("use_local_synchronization", False))))
    finally:
        dm.new_group = real_new
        dist.destroy_process_group()
    return out


def run_meshsim(world, calls, mesh, rank):
    """The same outcomes from meshsim's creation plan, and its problems."""
    if mesh is None:
        m, program = meshsim.init_device_mesh((world,), ("w",)), ["mesh"] + list(calls)
    else:
        m, program = meshsim.init_device_mesh(tuple(mesh[0]), tuple(mesh[1])), list(calls)
    plan = m.creation_plan(rank=rank, torch_version=torch_env.MODEL, process_groups=program)
    assert plan["torch_version"] == torch_env.MODEL
    got = [c["group_name"] if c["group_name"] is not None else c["result"] for c in plan["calls"] if c["call"] != "default"]
    return got, plan["problems"]


def members_of(world, calls, mesh):
    """Per recorded call, its groups: [(group id, members)] as every rank records them in order."""
    per_rank = []
    for rank in range(world):
        groups = []
        for i, c in enumerate(calls):
            if c == "mesh":
                shape, names = mesh
                m = meshsim.init_device_mesh(tuple(shape), tuple(names))
                for d, n in enumerate(names):
                    if shape[d] == world:
                        continue  # the default group: no call
                    for j, row in enumerate(m.groups(d)):
                        groups.append(((i, d, j), sorted(row)))
                continue
            ng = c["new_group"]
            ranks = sorted(ng["ranks"]) if ng.get("ranks") is not None else list(range(world))
            groups.append(((i, 0, 0), ranks))
        per_rank.append(groups)
    return per_rank


def diverges(world, calls, mesh, outcomes):
    """Whether PyTorch's names disagree: a group's members name it differently, or one name is
    two groups on different ranks."""
    per_rank = members_of(world, calls, mesh)
    names_of_group, groups_of_name = {}, {}
    for rank in range(world):
        assert len(per_rank[rank]) == len(outcomes[rank]), (rank, per_rank[rank], outcomes[rank])
        for (gid, members), name in zip(per_rank[rank], outcomes[rank]):
            if rank not in members:
                continue
            names_of_group.setdefault(gid, set()).add(name)
            groups_of_name.setdefault(name, set()).add(gid)
    return any(len(v) > 1 for v in names_of_group.values()) or any(len(v) > 1 for v in groups_of_name.values())


@st.composite
def programs(draw):
    world = draw(st.integers(2, 8))
    calls = []
    for _ in range(draw(st.integers(1, 6))):
        ng = {}
        if draw(st.integers(0, 9)) > 0:
            ng["ranks"] = draw(st.lists(st.integers(0, world - 1), min_size=1, max_size=world, unique=True))
        if draw(st.integers(0, 9)) < 4:
            ng["use_local_synchronization"] = True
        calls.append({"new_group": ng})
    mesh = None
    if draw(st.booleans()):
        divisors = [d for d in range(1, world + 1) if world % d == 0]
        first = draw(st.sampled_from(divisors))
        shape = [first, world // first] if first not in (1, world) else [world]
        names = ["a", "b"][:len(shape)]
        mesh = (shape, names)
        calls.insert(draw(st.integers(0, len(calls))), "mesh")
    return world, calls, mesh


def describe(world, calls, mesh):
    lines = [f"world {world}, each rank: init_process_group('fake', ...)"]
    for c in calls:
        if c == "mesh":
            lines.append(f"init_device_mesh('cpu', {tuple(mesh[0])}, mesh_dim_names={tuple(mesh[1])})")
        else:
            ng = c["new_group"]
            lines.append(f"new_group(ranks={ng.get('ranks')}, use_local_synchronization={ng.get('use_local_synchronization', False)})")
    return "\n".join(lines)


@seed(SEED)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=False)
@given(programs())
def test_every_ranks_group_names_are_pytorchs(program):
    world, calls, mesh = program
    outcomes, problems = [], None
    for rank in range(world):
        theirs = run_torch(world, calls, mesh, rank)
        mine, problems = run_meshsim(world, calls, mesh, rank)
        assert mine == theirs, f"rank {rank}\nmeshsim: {mine}\nPyTorch: {theirs}\n{describe(world, calls, mesh)}"
        outcomes.append(theirs)
        SEEN["non_member"] += sum(o in ("None", "NON_GROUP_MEMBER") for o in theirs)
    real = diverges(world, calls, mesh, outcomes)
    assert bool(problems) == real, f"PyTorch's names diverge: {real}; meshsim: {problems}\n{describe(world, calls, mesh)}"
    SEEN["diverge" if real else "agree"] += 1


def test_the_two_call_program_of_the_issue():
    # new_group([0, 1], use_local_synchronization=True), then new_group([0, 1, 2, 3]): 2.13 names
    # the second "1" everywhere; 2.14 "2" on ranks 0-1 and "1" on ranks 2-3.
    calls = [{"new_group": {"ranks": [0, 1], "use_local_synchronization": True}}, {"new_group": {"ranks": [0, 1, 2, 3]}}]
    second = [run_torch(4, calls, None, r)[1] for r in range(4)]
    plan = meshsim.init_device_mesh((4,), ("w",)).creation_plan(torch_version=torch_env.MODEL,
                                                                process_groups=["mesh"] + calls)
    if torch_env.at_least("2.14"):
        assert second == ["2", "2", "1", "1"]
        assert len(plan["problems"]) == 1 and "ranks 0-1 '2', ranks 2-3 '1'" in plan["problems"][0]["message"]
    else:
        assert second == ["1", "1", "1", "1"]
        assert plan["problems"] == []
    first = run_torch(4, calls, None, 3)[0]
    assert first == ("NON_GROUP_MEMBER" if torch_env.at_least("2.14") else "None")


def test_the_environment_is_the_release_this_run_is_for():
    torch_env.check()


def test_zz_both_outcomes_were_compared():
    """Run last: programs whose names diverge and programs whose names agree both came up, and
    non-members' results were compared (none of the checks above passed vacuously)."""
    print(f"group names: {SEEN}")
    if SEEN["agree"] + SEEN["diverge"] < EXAMPLES // 2:
        pytest.skip("run with the whole file: the random programs were deselected")
    assert SEEN["diverge"] > 0 and SEEN["agree"] > 0 and SEEN["non_member"] > 0, SEEN
