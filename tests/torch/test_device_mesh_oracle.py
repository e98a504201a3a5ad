"""meshsim's DeviceMesh against PyTorch 2.13's own, for every rank of the world.

Random mesh programs from `meshsim.testing` (a root mesh: init_device_mesh or a permuted rank map;
then up to 3 of slice, flatten, unflatten and concatenate) are run through `import meshsim` once
and through PyTorch's real `torch.distributed.device_mesh.DeviceMesh` once per rank: each rank its
own process group over the `fake` backend with a `FakeStore` (one process, the ranks in turn, the
default group destroyed between them). For every rank and every dim of the final mesh: the group's
line through the rank in mesh order, the process group's ranks (`get_process_group_ranks(mesh.
get_group(dim))`, ascending: new_group sorts them), its description, the rank's coordinate,
the mesh the rank sees, the dim names and the mesh's repr must be equal. MESHSIM_TORCH_EXAMPLES programs (200;
5,000 for a long run), MESHSIM_TORCH_SEED for fresh ones; a failure prints the shrunk program as
a `meshsim query` request and as the PyTorch calls that ran.
Each rank's group-creation calls are recorded too (DeviceMesh's new_group / split_group wrapped,
then called through) and compared in order with `mesh.creation_plan(rank=r)`: the call, its
ranks as passed, its description: on the CPU path (no bound device: every group by new_group on
every rank), and with the default group bound to a device (split_group per dim; the
availability checks patched, see recorded_bound_calls), and with root backend overrides (to a
second backend registered over the fake group).
Refusals and warnings: one hostile call after a random program, the exception's class and first
sentence and the warnings compared (test_refusals_and_warnings_are_pytorchs).
`from_group` too: every rank makes each dim's groups with new_group (with a group_desc or
without) and hands its own to DeviceMesh.from_group (a list with `mesh`, or one group for a 1-D
mesh), then the program runs on it; meshsim is handed the same groups' ranks, names and
descriptions. Handed groups keep their names and descriptions in both, in every view that slices
them out; groups the mesh makes are compared by members and description.
meshsim's `transpose` has no PyTorch counterpart (PyTorch refuses a slice out of dim order), so
programs that use it are left out here.
"""
import os
import warnings

import pytest

torch = pytest.importorskip("torch", reason="PyTorch 2.13 (the project's .venv) is the oracle")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

import meshsim  # noqa: E402
from meshsim.testing import meshes, transformed  # noqa: E402

EXAMPLES = int(os.environ.get("MESHSIM_TORCH_EXAMPLES", "200")) or 5000
SEED = int(os.environ.get("MESHSIM_TORCH_SEED", "55"))


def torch_program(root, steps):
    """The PyTorch calls that replay `steps` on `root`, as text (for the failure message)."""
    shape, names = tuple(root.shape), tuple(root.mesh_dim_names)
    if root.rank_map == list(range(len(root.rank_map))):
        lines = [f"root = init_device_mesh('cpu', {shape}, mesh_dim_names={names})"]
    else:
        lines = [f"root = DeviceMesh('cpu', torch.tensor({root.rank_map}).reshape({shape}), mesh_dim_names={names})"]
    for s in steps:
        if "slice" in s:
            lines.append(f"{s['let']} = {s['on']}[{tuple(s['slice'])}]")
        elif "flatten" in s:
            lines.append(f"{s['let']} = {s['on']}._flatten({s['flatten']!r})")
        elif "unflatten" in s:
            u = s["unflatten"]
            lines.append(f"{s['let']} = {s['on']}._unflatten({u['dim']!r}, {tuple(u['sizes'])}, {tuple(u['names'])})")
        elif "concatenate" in s:
            lines.append(f"{s['let']} = DeviceMesh._concatenate([{', '.join(s['concatenate'])}])")
    return "\n".join(lines)


def replay(mesh, steps, pytorch=False):
    """`steps` (meshsim.testing's mesh.program ops) applied to a root: meshsim's, or with
    PyTorch's spelling of each op (`pytorch`)."""
    env = {"root": mesh}
    last = mesh
    for s in steps:
        on = env.get(s.get("on"))
        if "slice" in s:
            m = on[tuple(s["slice"])]
        elif "flatten" in s:
            m = on._flatten(s["flatten"]) if pytorch else on.flatten(s["flatten"])
        elif "unflatten" in s:
            u = s["unflatten"]
            m = (on._unflatten(u["dim"], tuple(u["sizes"]), tuple(u["names"])) if pytorch
                 else on.unflatten(u["dim"], u["sizes"], u["names"]))
        else:
            parts = [env[x] for x in s["concatenate"]]
            m = DeviceMesh._concatenate(parts) if pytorch else meshsim.concatenate(parts)
        env[s["let"]] = last = m
    return last


def replay_torch(mesh, steps):
    return replay(mesh, steps, pytorch=True)


def meshsim_request(root, steps, rank=0):
    """The program as a `meshsim query` request (echo '...' | meshsim query): what a failure
    prints, to replay meshsim's side alone."""
    import json
    world = len(root.rank_map)
    names = list(root.mesh_dim_names)
    if root.rank_map == list(range(world)):
        build = {"init_device_mesh": {"mesh_shape": list(root.shape), "mesh_dim_names": names}}
    else:
        build = {"DeviceMesh": {"mesh": torch.tensor(root.rank_map).reshape(tuple(root.shape)).tolist(),
                                "mesh_dim_names": names}}
    return json.dumps({"op": "mesh.program", "world_size": world, "rank": rank, "build": build, "ops": steps,
                       "want": ["groups_by_dim", "coordinate", "get_group"]})


def run_torch(root, steps, rank):
    """The final mesh as PyTorch builds it on `rank`: what the rank sees of it."""
    world = len(root.rank_map)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        shape, names = tuple(root.shape), tuple(root.mesh_dim_names)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if root.rank_map == list(range(world)):
                env = {"root": init_device_mesh("cpu", shape, mesh_dim_names=names)}
            else:
                env = {"root": DeviceMesh("cpu", torch.tensor(root.rank_map).reshape(shape), mesh_dim_names=names)}
            last = replay_torch(env["root"], steps)
            coord = tuple(last.get_coordinate())
            seen = {"mesh": last.mesh.tolist(), "names": tuple(last.mesh_dim_names), "coordinate": coord,
                    "repr": repr(last)}
            for d, n in enumerate(last.mesh_dim_names):
                g = last.get_group(n)
                # The rank's group in mesh order (its line of the mesh tensor along d), and the
                # process group PyTorch hands out (its ranks in group-rank order).
                line = last.mesh[tuple(slice(None) if k == d else c for k, c in enumerate(coord))].tolist()
                seen[n] = (line, dist.get_process_group_ranks(g), g.group_desc)
        return seen
    finally:
        dist.destroy_process_group()


def run_meshsim(mesh, rank):
    seen = {"mesh": mesh.mesh_for(rank), "names": tuple(mesh.mesh_dim_names), "coordinate": tuple(mesh.get_coordinate(rank)),
            "repr": repr(mesh)}
    for n in mesh.mesh_dim_names:
        g = mesh.get_group(n, rank=rank)
        seen[n] = (g["ranks"], g["pg_ranks"], g["group_desc"])
    return seen


@st.composite
def programs(draw):
    root = draw(meshes(max_dims=3, max_size=4, permuted=True))
    mesh, steps = draw(transformed(root, max_steps=3))
    hypothesis.assume(not any("transpose" in s for s in steps))
    return root, mesh, steps


@seed(SEED)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=False)
@given(programs())
def test_every_rank_sees_the_mesh_pytorch_builds(program):
    root, mesh, steps = program
    for rank in range(len(root.rank_map)):
        try:
            theirs = run_torch(root, steps, rank)
        except Exception as e:  # noqa: BLE001 - any refusal of PyTorch's is a difference to show
            pytest.fail(f"PyTorch refuses on rank {rank}: {type(e).__name__}: {e}\n"
                        f"meshsim: echo '{meshsim_request(root, steps, rank)}' | meshsim query\n"
                        f"PyTorch:\n{torch_program(root, steps)}")
        mine = run_meshsim(mesh, rank)
        assert mine == theirs, (f"rank {rank}\nmeshsim: {mine}\nPyTorch: {theirs}\n"
                                f"meshsim: echo '{meshsim_request(root, steps, rank)}' | meshsim query\n"
                                f"PyTorch:\n{torch_program(root, steps)}")


def recorded_calls(root, steps, rank):
    """The new_group / split_group calls PyTorch's DeviceMesh makes on `rank` for the program:
    recorded, then called through."""
    import torch.distributed.device_mesh as dm
    calls = []
    real_new, real_split = dm.new_group, dm.split_group

    def new_group(*args, **kw):
        calls.append(("new_group", list(kw.get("ranks") or []), kw.get("group_desc"),
                      bool(kw.get("use_local_synchronization"))))
        return real_new(*args, **kw)

    def split_group(*args, **kw):
        calls.append(("split_group", [list(r) for r in kw.get("split_ranks") or []], kw.get("group_desc"), False))
        return real_split(*args, **kw)

    dm.new_group, dm.split_group = new_group, split_group
    try:
        run_torch(root, steps, rank)
    finally:
        dm.new_group, dm.split_group = real_new, real_split
    return calls


def planned_calls(mesh, rank, **options):
    """meshsim's creation plan for `rank` (creation_plan's options), as the recorders spell calls."""
    out = []
    for c in mesh.creation_plan(rank=rank, **options)["calls"]:
        if c["call"] == "new_group":
            out.append(("new_group", c["ranks"], c["group_desc"], c["use_local_synchronization"]))
        elif c["call"] == "split_group":
            out.append(("split_group", c["split_ranks"], c["group_desc"], False))
    return out


@seed(SEED + 1)
@settings(max_examples=max(20, EXAMPLES // 4), deadline=None, suppress_health_check=list(HealthCheck))
@given(programs())
def test_each_ranks_group_creation_calls_are_the_creation_plan(program):
    # No device bound (a CPU machine): PyTorch makes every group with new_group on every rank, in
    # the order of the dims and of their lines; meshsim's creation_plan says the same calls.
    root, mesh, steps = program
    for rank in range(len(root.rank_map)):
        theirs = recorded_calls(root, steps, rank)
        mine = planned_calls(mesh, rank)
        assert mine == theirs, (f"rank {rank}\nmeshsim: {mine}\nPyTorch: {theirs}\n"
                                f"meshsim steps: {steps}\nPyTorch:\n{torch_program(root, steps)}")


# --- from_group: the groups a user made, handed to DeviceMesh -----------------------------------

@st.composite
def handed_programs(draw):
    root = draw(meshes(max_dims=3, max_size=4, permuted=True))
    _, steps = draw(transformed(root, max_steps=2))
    hypothesis.assume(not any("transpose" in s for s in steps))
    one = root.ndim == 1 and draw(st.booleans())  # from_group(group): no mesh argument
    descs = [draw(st.sampled_from([None, f"hand_{d}"])) for d in range(root.ndim)]
    return root, steps, one, descs


def from_group_snippet(root, steps, one, descs):
    shape, names = tuple(root.shape), tuple(root.mesh_dim_names)
    lines = ["groups = {(d, tuple(row)): new_group(row, group_desc=desc) for d, desc in enumerate("
             f"{descs}) for row in <dim d's rows>}}"]
    if one:
        lines.append(f"root = DeviceMesh.from_group(<the rank's group>, 'cpu', mesh_dim_names={names})")
    else:
        lines.append(f"root = DeviceMesh.from_group(<the rank's groups>, 'cpu', mesh=torch.tensor({root.rank_map})"
                     f".reshape({shape}), mesh_dim_names={names})")
    return "\n".join(lines + torch_program(root, steps).splitlines()[1:])


def run_handed(root, steps, one, descs, rank):
    """(PyTorch's view, meshsim's view, the handed names) of the final mesh on `rank`."""
    world = len(root.rank_map)
    shape, names = tuple(root.shape), tuple(root.mesh_dim_names)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        made = {}
        for d in range(root.ndim):
            for row in root.groups(d):
                made[(d, tuple(row))] = dist.new_group(ranks=row, group_desc=descs[d])
        mine = [made[(d, tuple(root.group_of(rank, d)))] for d in range(root.ndim)]
        handed = [{"ranks": dist.get_process_group_ranks(g), "name": g.group_name} for g in mine]
        for h, desc in zip(handed, descs):
            if desc is not None:
                h["desc"] = desc
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if one:
                theirs_root = DeviceMesh.from_group(mine[0], "cpu", mesh_dim_names=names)
                mine_root = meshsim.DeviceMesh.from_group(handed[0], mesh_dim_names=list(names))
            else:
                theirs_root = DeviceMesh.from_group(mine, "cpu", mesh=torch.tensor(root.rank_map).reshape(shape),
                                                    mesh_dim_names=names)
                nested = torch.tensor(root.rank_map).reshape(shape).tolist()
                mine_root = meshsim.DeviceMesh.from_group(handed, mesh=nested, mesh_dim_names=list(names), rank=rank)
            theirs_mesh = replay_torch(theirs_root, steps)
            mine_mesh = replay(mine_root, steps)
            coord = tuple(theirs_mesh.get_coordinate())
            theirs = {"mesh": theirs_mesh.mesh.tolist(), "names": tuple(theirs_mesh.mesh_dim_names), "coordinate": coord,
                      "repr": repr(theirs_mesh)}
            for d, n in enumerate(theirs_mesh.mesh_dim_names):
                g = theirs_mesh.get_group(n)
                line = theirs_mesh.mesh[tuple(slice(None) if k == d else c for k, c in enumerate(coord))].tolist()
                theirs[n] = (line, dist.get_process_group_ranks(g), g.group_desc, g.group_name)
        mine = {"mesh": mine_mesh.mesh_for(rank), "names": tuple(mine_mesh.mesh_dim_names),
                "coordinate": tuple(mine_mesh.get_coordinate(rank)), "repr": repr(mine_mesh)}
        for n in mine_mesh.mesh_dim_names:
            g = mine_mesh.get_group(n, rank=rank)
            mine[n] = (g["ranks"], g["pg_ranks"], g["group_desc"], g["name"])
        return theirs, mine, {h["name"] for h in handed}
    finally:
        dist.destroy_process_group()


@seed(SEED + 2)
@settings(max_examples=max(20, EXAMPLES // 4), deadline=None, suppress_health_check=list(HealthCheck))
@given(handed_programs())
def test_from_group_keeps_the_groups_it_is_handed_on_every_rank(program):
    # The groups are made by new_group (with a group_desc or without: "undefined") and handed to
    # from_group by the rank that holds them; meshsim is handed their ranks, PyTorch's names and
    # descriptions. A group PyTorch hands back is a handed one exactly when meshsim's is, under
    # the same name; the others are named by each in its own way (docs/device-mesh.md), so only
    # their members and descriptions are compared.
    root, steps, one, descs = program
    for rank in range(len(root.rank_map)):
        try:
            theirs, mine, handed = run_handed(root, steps, one, descs, rank)
        except Exception as e:  # noqa: BLE001 - any refusal of either is a difference to show
            pytest.fail(f"rank {rank}: {type(e).__name__}: {e}\nmeshsim steps: {steps}\n"
                        f"PyTorch:\n{from_group_snippet(root, steps, one, descs)}")
        for view in (theirs, mine):
            for n in view["names"]:
                line, pg, desc, name = view[n]
                view[n] = (line, pg, desc, name if name in handed else "(made by the mesh)")
        assert mine == theirs, (f"rank {rank}\nmeshsim: {mine}\nPyTorch: {theirs}\nmeshsim steps: {steps}\n"
                                f"PyTorch:\n{from_group_snippet(root, steps, one, descs)}")


# --- refusals and warnings ---------------------------------------------------------------------

def _message(e):
    """An exception's text as its first argument says it (PyTorch passes several to some)."""
    text = e.args[0] if e.args and isinstance(e.args[0], str) else str(e)
    return " ".join(text.split()).rstrip(". ")


def _outcome(fn):
    """("ok", None, warnings) or ("raises", exception, warnings) of fn()."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn()
            out = ("ok", None)
        except Exception as e:  # noqa: BLE001 - what each raises is what is compared
            out = ("raises", e)
    return out + ([(w.category, str(w.message)) for w in caught],)


# PyTorch 2.13 accepts what meshsim refuses, deliberately (docs/device-mesh.md, "validation"):
# an unflatten whose new names repeat a name the mesh keeps or each other, a concatenate that
# repeats a name (size-1 dims do not overlap), a slice that names a size-1 dim twice.
def _deliberate(kind, mesh_names, arg):
    if kind == "unflatten":
        kept = [n for n in mesh_names if n != (arg[0] if isinstance(arg[0], str) else
                                                 mesh_names[arg[0]] if 0 <= arg[0] < len(mesh_names) else None)]
        new = list(arg[2])
        return len(set(new)) < len(new) or any(n in kept for n in new)
    if kind == "concatenate":
        return len(set(arg[0]) | set(arg[1])) < len(arg[0]) + len(arg[1])
    if kind in ("slice", "slice_root"):
        return len(set(arg)) < len(arg)  # the same size-1 dim twice
    return False


# Where PyTorch's error is Python's own (an index into a tuple), its class is compared, not its text.
def _generic(e):
    return isinstance(e, IndexError) and _message(e).endswith("index out of range")


@st.composite
def hostile_calls(draw):
    """A random root, a random valid program on it, then one call that may break a rule."""
    root = draw(meshes(max_dims=3, max_size=4, permuted=False))
    _, steps = draw(transformed(root, max_steps=2))
    hypothesis.assume(not any("transpose" in s for s in steps))
    names = list(root.mesh_dim_names)
    pool = names + ["zz", "f2", "f3", "f4", "u2", "u3"]  # what transformed() names its flatten and unflatten dims
    kind = draw(st.sampled_from(["slice", "slice_root", "flatten", "unflatten", "get_group", "concatenate",
                                 "size", "local_rank"]))
    if kind in ("slice", "slice_root"):
        arg = tuple(draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3)))
    elif kind == "flatten":
        arg = draw(st.sampled_from(pool + [None]))
    elif kind == "unflatten":
        arg = (draw(st.sampled_from(pool + [0, 1, 5, -1])), tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))),
               None)
        arg = (arg[0], arg[1], tuple(draw(st.lists(st.sampled_from(pool + ["n1", "n2", "n3"]), min_size=len(arg[1]),
                                                   max_size=len(arg[1])))))
    elif kind == "get_group":
        arg = draw(st.sampled_from(pool + [None, 0, 1, 7]))
    elif kind == "concatenate":
        arg = tuple(tuple(draw(st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True))) for _ in range(2))
    elif kind == "size":
        arg = draw(st.sampled_from([None, 0, 1, 2, 5]))
    else:
        arg = draw(st.sampled_from([None, 0, 1] + names[:1]))
    return root, steps, kind, arg


def hostile(kind, arg, mesh, root, is_torch):
    """The call, on the program's last mesh (or its root), in PyTorch's or meshsim's spelling."""
    if kind == "slice":
        return lambda: mesh[arg]
    if kind == "slice_root":
        return lambda: root[arg]
    if kind == "flatten":
        return (lambda: mesh._flatten(arg)) if is_torch else (lambda: mesh.flatten(arg))
    if kind == "unflatten":
        return (lambda: mesh._unflatten(*arg)) if is_torch else (lambda: mesh.unflatten(arg[0], list(arg[1]), list(arg[2])))
    if kind == "get_group":
        return (lambda: mesh.get_group(arg)) if is_torch else (lambda: mesh.get_group(arg, rank=0))
    if kind == "concatenate":
        if is_torch:
            return lambda: DeviceMesh._concatenate([root[arg[0]], root[arg[1]]])
        return lambda: meshsim.concatenate([root[arg[0]], root[arg[1]]])
    if kind == "size":
        return lambda: mesh.size(arg)
    return (lambda: mesh.get_local_rank(arg)) if is_torch else (lambda: mesh.get_local_rank(arg, 0))


@seed(SEED + 3)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(hostile_calls())
def test_refusals_and_warnings_are_pytorchs(call):
    # Rank 0 of the world runs the program, then one call that may break one of DeviceMesh's
    # rules; both must accept it, or both refuse it with an exception of PyTorch's class (meshsim's
    # errors derive from the built-ins) whose text holds PyTorch's first sentence; the warnings
    # (the deprecated slice of a flattened dim from the root) are PyTorch's, word for word inside
    # meshsim's (which adds what to do instead).
    root, steps, kind, arg = call
    world = len(root.rank_map)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t_root = init_device_mesh("cpu", tuple(root.shape), mesh_dim_names=tuple(root.mesh_dim_names))
            t_mesh = replay_torch(t_root, steps)
        theirs = _outcome(hostile(kind, arg, t_mesh, t_root, True))
    finally:
        dist.destroy_process_group()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m_root = meshsim.init_device_mesh(list(root.shape), list(root.mesh_dim_names))
        m_mesh = replay(m_root, steps)
    mine = _outcome(hostile(kind, arg, m_mesh, m_root, False))
    where = (f"\ncall: {kind} {arg!r} on {t_mesh!r}\nmeshsim: echo '{meshsim_request(root, steps)}' | meshsim query"
             f"\nPyTorch:\n{torch_program(root, steps)}"
             f"\nPyTorch: {theirs[:2]} {theirs[2]}\nmeshsim: {mine[:2]} {mine[2]}")
    if kind == "unflatten" and isinstance(arg[0], int) and arg[0] < 0:
        # PyTorch does not normalise a negative dim: it goes on with a wrong layout and fails
        # later, if at all (docs/device-mesh.md); meshsim refuses it at once.
        assert isinstance(mine[1], meshsim.InvalidArgument), where
        return
    if theirs[0] == "ok" and mine[0] == "raises" and _deliberate(kind, list(t_mesh.mesh_dim_names), arg):
        return
    assert mine[0] == theirs[0], where
    if theirs[0] == "raises":
        assert isinstance(mine[1], type(theirs[1])), where
        assert _generic(theirs[1]) or _message(theirs[1]) in " ".join(str(mine[1]).split()), where
    assert [c for c, _ in mine[2]] == [c for c, _ in theirs[2]], where
    for (_, m), (_, t) in zip(mine[2], theirs[2]):
        assert " ".join(t.split()) in " ".join(m.split()), where


# --- a bound device: split_group ----------------------------------------------------------------

def recorded_bound_calls(root, steps, rank):
    """The calls DeviceMesh makes on `rank` when the default group is bound to a device.

    A CPU machine has no accelerator, so three things are patched, and only these: the default
    group's bound_device_id (init_process_group(device_id=...) refuses a CPU device),
    torch.accelerator.is_available (True) and current_accelerator (the CPU device), so that
    DeviceMesh takes its split_group path. The `fake` backend cannot split, so a recorded
    split_group is carried out as the new_group of the rank's row (what the split hands the
    rank); every call is recorded before it is carried out."""
    import torch.distributed.device_mesh as dm
    calls = []
    real_new, real_split = dm.new_group, dm.split_group
    real_available, real_current = torch.accelerator.is_available, torch.accelerator.current_accelerator

    def unbound_new(*args, **kw):
        # c10d would bind the new group to the (CPU) device too, which it refuses.
        default = dist.distributed_c10d._get_default_group()
        default.bound_device_id = None
        try:
            return real_new(*args, **kw)
        finally:
            default.bound_device_id = torch.device("cpu", 0)

    def new_group(*args, **kw):
        calls.append(("new_group", list(kw.get("ranks") or []), kw.get("group_desc"),
                      bool(kw.get("use_local_synchronization"))))
        return unbound_new(*args, **kw)

    def split_group(*args, **kw):
        rows = [list(r) for r in kw.get("split_ranks") or []]
        calls.append(("split_group", rows, kw.get("group_desc"), False))
        mine = next((r for r in rows if rank in r), None)
        return None if mine is None else unbound_new(ranks=mine, group_desc=kw.get("group_desc"))

    world = len(root.rank_map)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    dm.new_group, dm.split_group = new_group, split_group
    torch.accelerator.is_available = lambda: True
    torch.accelerator.current_accelerator = lambda *a, **k: torch.device("cpu")
    try:
        dist.distributed_c10d._get_default_group().bound_device_id = torch.device("cpu", 0)
        shape, names = tuple(root.shape), tuple(root.mesh_dim_names)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if root.rank_map == list(range(world)):
                t_root = init_device_mesh("cpu", shape, mesh_dim_names=names)
            else:
                t_root = DeviceMesh("cpu", torch.tensor(root.rank_map).reshape(shape), mesh_dim_names=names)
            replay_torch(t_root, steps)
    finally:
        dm.new_group, dm.split_group = real_new, real_split
        torch.accelerator.is_available, torch.accelerator.current_accelerator = real_available, real_current
        dist.destroy_process_group()
    return calls


@seed(SEED + 4)
@settings(max_examples=max(20, EXAMPLES // 4), deadline=None, suppress_health_check=list(HealthCheck))
@given(programs())
def test_with_a_bound_device_each_ranks_calls_are_the_creation_plans_split_groups(program):
    # meshsim's plan for an accelerator's mesh (device "cuda": torch.accelerator is available)
    # whose default group is bound to it: one split_group per dim with every row, new_group
    # nowhere; a dim as large as the world reuses the default group.
    root, _, steps = program
    shape, names = list(root.shape), list(root.mesh_dim_names)
    world = len(root.rank_map)
    if root.rank_map == list(range(world)):
        m_root = meshsim.init_device_mesh(shape, names, device_type="cuda")
    else:
        m_root = meshsim._from_ranks(shape, root.rank_map, names, device_type="cuda", world_size=world)
    mesh = replay(m_root, steps)
    for rank in range(world):
        theirs = recorded_bound_calls(root, steps, rank)
        mine = planned_calls(mesh, rank, bound_device=True)
        assert mine == theirs, (f"rank {rank}\nmeshsim: {mine}\nPyTorch: {theirs}\nmeshsim steps: {steps}\n"
                                f"PyTorch (default group bound, accelerator patched available):\n"
                                f"{torch_program(root, steps)}")


# --- backend overrides ----------------------------------------------------------------------------

def _other_backend():
    """A second backend name over the fake process group, so an override is seen (registered once)."""
    from torch.testing._internal.distributed import fake_pg
    if "other" not in dist.Backend.backend_list:
        dist.Backend.register_backend("other", fake_pg._create_fake_pg, extended_api=True, devices=["cpu"])
    return "other"


@st.composite
def overridden_programs(draw):
    root, mesh, steps = draw(programs())
    keys = draw(st.lists(st.integers(0, root.ndim - 1), unique=True, max_size=root.ndim))
    override = {(root.mesh_dim_names[d] if draw(st.booleans()) else d): "other" for d in keys}
    return root, steps, override


@seed(SEED + 5)
@settings(max_examples=max(20, EXAMPLES // 4), deadline=None, suppress_health_check=list(HealthCheck))
@given(overridden_programs())
def test_backend_overrides_reach_the_calls_and_the_groups(program):
    # backend_override on the root (dims by name or index) to a second registered backend: each
    # rank's new_group calls carry it (a world-sized dim overridden is made, not the default
    # group), and every dim of the final mesh hands out a group of the backend PyTorch's has.
    root, steps, override = program
    backend = _other_backend()
    world = len(root.rank_map)
    shape, names = list(root.shape), list(root.mesh_dim_names)
    if root.rank_map == list(range(world)):
        m_root = meshsim.init_device_mesh(shape, names, backend_override=override, default_backend="fake")
    else:
        m_root = meshsim._from_ranks(shape, root.rank_map, names, backend_override=override, default_backend="fake",
                                     world_size=world)
    mesh = replay(m_root, steps)
    import torch.distributed.device_mesh as dm
    real_new = dm.new_group
    for rank in range(world):
        calls = []

        def new_group(*args, **kw):
            calls.append((list(kw.get("ranks") or []), kw.get("backend") or "fake", kw.get("group_desc")))
            return real_new(*args, **kw)

        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
        dm.new_group = new_group
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # init_device_mesh consumes the dict it is given (a copy each time); DeviceMesh takes
                # one (backend, options) per dim.
                if root.rank_map == list(range(world)):
                    t_root = init_device_mesh("cpu", tuple(shape), mesh_dim_names=tuple(names),
                                              backend_override=dict(override))
                else:
                    per_dim = tuple((backend, None) if (d in override or names[d] in override) else (None, None)
                                    for d in range(len(names)))
                    t_root = DeviceMesh("cpu", torch.tensor(root.rank_map).reshape(shape), mesh_dim_names=tuple(names),
                                        backend_override=per_dim)
                last = replay_torch(t_root, steps)
            theirs_groups = {n: (dist.get_backend(last.get_group(n)), last.get_group(n).group_desc)
                             for n in last.mesh_dim_names}
        finally:
            dm.new_group = real_new
            dist.destroy_process_group()
        mine = [(c["ranks"], c["backend"], c["group_desc"]) for c in mesh.creation_plan(rank=rank)["calls"]
                if c["call"] == "new_group"]
        mine_groups = {n: (mesh.get_group(n, rank=rank)["backend"], mesh.get_group(n, rank=rank)["group_desc"])
                       for n in mesh.mesh_dim_names}
        where = (f"rank {rank}, backend_override={override}\nmeshsim steps: {steps}\n"
                 f"PyTorch:\n{torch_program(root, steps)}")
        assert mine == calls, f"{where}\nmeshsim: {mine}\nPyTorch: {calls}"
        assert mine_groups == theirs_groups, f"{where}\nmeshsim: {mine_groups}\nPyTorch: {theirs_groups}"


def test_known_difference_unflatten_back_to_a_handed_dim():
    # docs/device-mesh.md, "group names": a from_group root's (dp, tp) flattened and unflattened
    # back into (dp, tp) over the same members. PyTorch makes new groups for the unflattened dims
    # (_create_unflatten_mesh calls _init_process_groups); meshsim keeps one group per members,
    # config and name, so they are the handed groups, their names kept. Both sides asserted, so a
    # change in either shows here.
    rank, rows = 1, {0: [[0, 2], [1, 3]], 1: [[0, 1], [2, 3]]}
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=4)
    try:
        made = {(d, tuple(r)): dist.new_group(ranks=r) for d in (0, 1) for r in rows[d]}
        groups = [made[(0, (1, 3))], made[(1, (0, 1))]]
        names = {"dp": groups[0].group_name, "tp": groups[1].group_name}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = DeviceMesh.from_group(groups, "cpu", mesh=torch.arange(4).reshape(2, 2), mesh_dim_names=("dp", "tp"))
            theirs = theirs._flatten("dp_tp")._unflatten(0, (2, 2), ("dp", "tp"))
        handed = [{"ranks": dist.get_process_group_ranks(g), "name": g.group_name} for g in groups]
        mine = meshsim.DeviceMesh.from_group(handed, mesh=[[0, 1], [2, 3]], mesh_dim_names=["dp", "tp"], rank=rank)
        mine = mine.flatten("dp_tp").unflatten(0, [2, 2], ["dp", "tp"])
        for n in ("dp", "tp"):
            assert dist.get_process_group_ranks(theirs.get_group(n)) == mine.get_group(n, rank=rank)["pg_ranks"]
            assert theirs.get_group(n).group_name != names[n]
            assert mine.get_group(n, rank=rank)["name"] == names[n]
    finally:
        dist.destroy_process_group()


# --- where releases differ ----------------------------------------------------------------------

def test_concatenating_meshes_of_two_roots_is_refused_in_this_releases_words():
    # Meshes sliced from roots with different rank maps: PyTorch's RuntimeError, worded as the
    # release under test words it ("device meshs" on 2.13, "device meshes" on 2.14), and meshsim
    # asked to answer as that release says the same.
    import torch_env
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        a = init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"))
        b = DeviceMesh("cpu", torch.tensor([[0, 2], [1, 3]]), mesh_dim_names=("c", "d"))
        theirs = _outcome(lambda: DeviceMesh._concatenate([a["a"], b["d"]]))
    finally:
        dist.destroy_process_group()
    ma = meshsim.init_device_mesh((2, 2), ("a", "b"), torch_version=torch_env.MODEL)
    mb = meshsim.DeviceMesh.from_ranks((2, 2), [0, 2, 1, 3], ("c", "d"), torch_version=torch_env.MODEL)
    mine = _outcome(lambda: meshsim.concatenate([ma["a"], mb["d"]]))
    assert theirs[0] == mine[0] == "raises", (theirs, mine)
    assert isinstance(theirs[1], RuntimeError) and isinstance(mine[1], RuntimeError), (theirs, mine)
    words = "device meshs" if torch_env.MODEL == "2.13" else "device meshes"
    assert words in _message(theirs[1]), theirs
    assert _message(theirs[1]) in " ".join(str(mine[1]).split()), (theirs, mine)


def test_the_environment_is_the_release_this_run_is_for():
    import torch_env
    torch_env.check()
