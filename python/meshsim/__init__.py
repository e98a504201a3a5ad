"""meshsim: PyTorch's DeviceMesh bookkeeping and the CuTe layout algebra under it, computed
exactly by meshsim's C++ library, for tests that need an oracle or a simulator.

    >>> import meshsim
    >>> mesh = meshsim.init_device_mesh((2, 2, 4), ("dp", "cp", "tp"))
    >>> mesh["dp", "tp"].groups(0)[:2]
    [[0, 8], [1, 9]]
"""
import functools as _functools
from collections.abc import Mapping as _Mapping
import json as _json
import operator as _operator
import os as _os

from . import errors
from ._meshsim import DeviceMesh, GroupTable, concatenate, equivalent, load, save
from . import _meshsim
from .errors import *  # noqa: F401,F403 - the error classes are part of the API

__all__ = [
    "DeviceMesh", "GroupTable", "Layout", "init_device_mesh", "concatenate", "equivalent", "save", "load",
    "preset", "recipe", "run", "backends", "query", "errors", "step", "trace_check",
    "record", "RecordResult",
] + errors.__all__


def init_device_mesh(shape, mesh_dim_names=None, device_type="cpu", world_size=None, *, backend_override=None,
                     default_backend=None, torch_version=None):
    """PyTorch's init_device_mesh: a row-major mesh of `shape` over ranks 0..n-1.

    backend_override is PyTorch's: {dim index or name: backend}, a backend being a name
    ("gloo"), a (name, options) tuple, an options dict ({"timeout_ms": 600000, ...}) or a dict
    {"backend": ..., "timeout_ms": ..., "options": {...}}. default_backend is the backend
    init_process_group chose (the one every group without an override uses). get_group hands
    both back. torch_version ("2.13", "2.14"; default the newest modelled) is the PyTorch release
    the mesh answers as where releases differ (refusals' words, the creation plan's group names)."""
    shape = _listed(shape, "shape")
    names = None if mesh_dim_names is None else _names(mesh_dim_names, "mesh_dim_names")
    if world_size is not None:
        world_size = _int(world_size, "world_size")
    if backend_override is None and default_backend is None and torch_version is None:
        return DeviceMesh.init(shape, names, device_type, world_size)
    body = {"mesh_shape": shape, "device_type": device_type}
    return _build("init_device_mesh", body, names, backend_override, default_backend,
                  world_size if world_size is not None else _product(shape), torch_version=torch_version)


def _from_ranks(shape, ranks, mesh_dim_names=None, *, device_type="cpu", backend_override=None,
                default_backend=None, world_size=None, torch_version=None):
    """PyTorch's DeviceMesh(device_type, mesh): `ranks` are the global ranks of an array of
    `shape`, row-major (any distinct non-negative integers)."""
    names = None if mesh_dim_names is None else _names(mesh_dim_names, "mesh_dim_names")
    shape, ranks = _listed(shape, "shape"), _listed(ranks, "ranks")
    if (backend_override is None and default_backend is None and device_type == "cpu" and world_size is None
            and torch_version is None) or _product(shape) != len(ranks):
        return DeviceMesh._from_ranks(shape, ranks, names)  # (a shape that does not hold the ranks raises)
    ranks = [_int(r, "ranks") for r in ranks]
    body = {"mesh": _nest(list(shape), ranks), "device_type": device_type}
    return _build("DeviceMesh", body, names, backend_override, default_backend,
                  world_size if world_size is not None else max(ranks, default=-1) + 1, torch_version=torch_version)


def _from_group(group, device_type="cpu", mesh=None, mesh_dim_names=None, *, rank=None, backend_override=None,
                default_backend=None, world_size=None, torch_version=None):
    """PyTorch's DeviceMesh.from_group(group | [groups], device_type, mesh, mesh_dim_names): a
    group is a list of ranks. One group gives a 1-D mesh over its ranks; a list of groups (one
    per dim, as `rank` sees them; default: the one rank they all hold) needs `mesh` and
    `mesh_dim_names`, and each group must be `rank`'s group along its dim. A group may also be
    a dict {"ranks": [...], "name": "...", "desc": "...", "backend": ...}: a ProcessGroup with its
    own name and description (get_group hands it back under both, as PyTorch keeps the groups it
    is given; a group without a desc says "undefined", new_group's default) and backend."""
    if isinstance(group, _Mapping):
        group = dict(group)
    else:
        group = _listed(group, "group")
    named = isinstance(group, dict) or (isinstance(group, list) and any(isinstance(g, _Mapping) for g in group))
    is_list = not isinstance(group, dict) and (len(group) == 0 or all(isinstance(g, (list, tuple, _Mapping))
                                                                        for g in group))
    names = None if mesh_dim_names is None else _names(mesh_dim_names, "mesh_dim_names")
    if not named and not is_list and mesh is None and rank is None and backend_override is None \
            and default_backend is None and device_type == "cpu" and world_size is None and torch_version is None:
        return DeviceMesh._from_group(group, names)
    body = {"device_type": device_type}
    if is_list:
        body["groups"] = [_group_json(g) for g in group]
    else:
        body["group"] = _group_json(group)
    if mesh is not None:
        body["mesh"] = mesh
    if world_size is None:
        every = [r for g in body.get("groups", [body.get("group", [])]) for r in (g["ranks"] if isinstance(g, dict) else g)]
        world_size = max(every + _flat(mesh), default=-1) + 1
    return _build("from_group", body, names, backend_override, default_backend, world_size, rank, torch_version)


def _group_json(g):
    """One handed group as the recipe spells it: its ranks, or {"ranks", "name", "desc", "backend"}."""
    if not isinstance(g, _Mapping):
        return [_int(r, "group") for r in _listed(g, "group")]
    unknown = set(g) - {"ranks", "name", "desc", "backend"}
    if unknown:
        raise errors.InvalidArgument("a group's keys are ranks, name, desc and backend, got "
                                     + repr(sorted(map(str, unknown)))[:200])
    if "ranks" not in g:
        raise errors.InvalidArgument("a group given as a dict needs its 'ranks'")
    out = {"ranks": [_int(r, "group") for r in _listed(g["ranks"], "ranks")]}
    if g.get("name") is not None:
        out["name"] = _names([g["name"]], "group name")[0]
    if g.get("desc") is not None:
        out["desc"] = _str(g["desc"], "group desc")
    if g.get("backend") is not None:
        out["backend"] = _backend_json(g["backend"])
    return out


def _flatten(self, name=None, backend_override=None):
    """PyTorch's _flatten: every dim merged into one named dim (default: the names joined by
    "_"), registered on the root; backend_override is one backend for the new dim's groups."""
    if name is not None:
        name = _names([name], "name")[0]
    return self._flatten_impl(name, None if backend_override is None else _backend_json(backend_override))


def _unflatten(self, dim, sizes, names, backend_override=None):
    """PyTorch's _unflatten: dim (index or name) split row-major into `sizes` named `names`;
    backend_override ({new dim index or name: backend}) configures the new dims' groups."""
    override = None
    if backend_override is not None:
        override = _overrides_json(backend_override)
    return self._unflatten_impl(dim, _listed(sizes, "sizes"), _names(names, "names"), override)


_INF = float("inf")


def _int(value, what):
    """An integer argument: an int or an object with __index__ (numpy's integers), never a float,
    a bool or a numeric string, which int() would truncate or parse; beyond int64 is
    OverflowError naming it."""
    if isinstance(value, bool) or isinstance(value, (float, str, bytes)):
        raise errors.ArgumentTypeError(what + " must be an integer, got " + repr(value)[:200])
    try:
        v = _operator.index(value)
    except TypeError:
        raise errors.ArgumentTypeError(what + " must be an integer, got " + repr(value)[:200]) from None
    if not -2 ** 63 <= v < 2 ** 63:
        raise errors.OverflowError(what + " " + str(v)[:200] + " does not fit in a 64-bit signed integer")
    return v


def _seconds(value):
    """A timeout in seconds: an int or a float (a string or a bool is ArgumentTypeError)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise errors.ArgumentTypeError("timeout must be a number of seconds, got " + repr(value)[:200])
    return float(value)


def _bool(value, what):
    """A flag: True or False (numpy's bool too), never a string ("false" is truthy) or a number."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise errors.ArgumentTypeError(what + " must be True or False, got " + repr(value)[:200])


def _str(value, what):
    """A text argument: a str, nothing str() would make one of."""
    if not isinstance(value, str):
        raise errors.ArgumentTypeError(what + " must be a string, got " + repr(value)[:200])
    return value


def _path(value, what):
    """A file or directory: a str, bytes or an os.PathLike, handed on as the file system's bytes
    (os.fsencode), so a name that is not UTF-8 (b"j\\xff.json", or the str os.fsdecode makes of
    it) reaches the file as the tool's argv would."""
    if not isinstance(value, (str, bytes, _os.PathLike)):
        raise errors.ArgumentTypeError(what + " must be a path (str, bytes or os.PathLike), got " + repr(value)[:200])
    return _os.fsencode(value)


def _names(value, what):
    """A list of dim names: each a str (a bytes name, or any other type, is ArgumentTypeError)."""
    out = _listed(value, what)
    for n in out:
        if not isinstance(n, str):
            raise errors.ArgumentTypeError(what + " holds names (str), got " + repr(n)[:200])
        try:
            n.encode("utf-8")
        except UnicodeEncodeError:
            raise errors.InvalidArgument(what + ": " + ascii(n)[:200] + " is not UTF-8 text") from None
    return out


def _listed(value, what):
    """A sequence argument as a list; a string or a non-iterable is ArgumentTypeError naming it."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise errors.ArgumentTypeError(what + " must be a sequence, got " + repr(value)[:200])
    return list(value)


def _dumps(value, what):
    """JSON text of what Python hands meshsim's readers, which judge it; what JSON cannot say is
    refused here with meshsim's errors (a value JSON has no form for, nesting Python cannot walk)."""
    try:
        return _json.dumps(value, allow_nan=False)
    except RecursionError:
        raise errors.ParseError(what + " nests deeper than Python can encode") from None
    except TypeError as e:
        raise errors.ArgumentTypeError(what + ": " + str(e)) from None
    except ValueError:  # NaN or infinity, which JSON has no form for
        bad = next((v for v in _leaves(value) if isinstance(v, float) and v != v or v in (_INF, -_INF)), "a value")
        raise errors.InvalidArgument(what + ": " + repr(bad) + " has no JSON form (NaN and infinity have none)") from None


def _leaves(value, depth=0):
    if depth < 8 and isinstance(value, (list, tuple)):
        for v in value:
            yield from _leaves(v, depth + 1)
    elif depth < 8 and isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v, depth + 1)
    else:
        yield value


def _typed_arguments(fn, qualname):
    """fn with the binding's argument errors as meshsim's: an int beyond int64 is OverflowError
    naming it; any other argument of the wrong type is ArgumentTypeError (also a TypeError), with
    the accepted signatures and the call as the binding lists them."""
    @_functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TypeError as e:
            if isinstance(e, errors.Error) or "incompatible function arguments" not in str(e):
                raise
            for v in _leaves((args, kwargs)):
                if isinstance(v, int) and not isinstance(v, bool) and not -2 ** 63 <= v < 2 ** 63:
                    raise errors.OverflowError(f"{qualname}: {v} does not fit in a 64-bit signed integer") from None
            raise errors.ArgumentTypeError(f"{qualname}: {e}") from None
        except RuntimeError as e:  # pybind11's cast_error: an element of the wrong type
            if isinstance(e, errors.Error) or not str(e).startswith("Unable to cast"):
                raise
            raise errors.ArgumentTypeError(f"{qualname}: an argument holds a value of the wrong type ({e})") from None
    return call


for _name in ("__getitem__", "_flatten_impl", "_unflatten_impl", "transpose", "reshape", "size", "mesh_for",
              "get_coordinate", "get_local_rank", "groups", "group_table", "group_of", "get_group", "get_all_groups",
              "find_flattened", "creation_plan"):
    setattr(DeviceMesh, _name, _typed_arguments(DeviceMesh.__dict__[_name],
                                                "DeviceMesh." + _name.replace("_impl", "").strip("_")))
for _name in ("init", "_from_ranks", "_from_group", "from_logical"):
    setattr(DeviceMesh, _name, staticmethod(_typed_arguments(getattr(DeviceMesh, _name), "DeviceMesh." + _name.strip("_"))))
for _name in ("run", "run_flags", "preset_views", "recipe_views", "recipe_file_views", "query"):
    setattr(_meshsim, _name, _typed_arguments(getattr(_meshsim, _name), "meshsim." + _name))
concatenate = _typed_arguments(concatenate, "meshsim.concatenate")
equivalent = _typed_arguments(equivalent, "meshsim.equivalent")
save = _typed_arguments(save, "meshsim.save")
load = _typed_arguments(load, "meshsim.load")
DeviceMesh.from_ranks = staticmethod(_from_ranks)
DeviceMesh.from_group = staticmethod(_from_group)
DeviceMesh.flatten = _flatten
DeviceMesh.unflatten = _unflatten


def _build(kind, body, names, backend_override, default_backend, world_size, rank=None, torch_version=None):
    # Builds with options go through meshsim's recipe reader, PyTorch's checks and errors included.
    if names is not None:
        body["mesh_dim_names"] = names
    if backend_override is not None:
        body["backend_override"] = _overrides_json(backend_override)
    if default_backend is not None:
        body["default_backend"] = default_backend
    if torch_version is not None:
        if not isinstance(torch_version, str):
            raise errors.ArgumentTypeError("torch_version is a release as text ('2.14'), got " + repr(torch_version))
        body["torch_version"] = torch_version
    program = {"world_size": max(_int(world_size, "world_size"), 1), "build": {kind: body}}
    if rank is not None:
        program["rank"] = _int(rank, "rank")
    return _meshsim.recipe_views(program, "the build")[0][1]


def _overrides_json(backend_override):
    if not isinstance(backend_override, _Mapping):
        raise errors.ArgumentTypeError("backend_override is a dict of dim index or name -> backend, got "
                                       + repr(backend_override))
    return {_override_key(k): _backend_json(v) for k, v in backend_override.items()}


def _override_key(k):
    if isinstance(k, bool) or not isinstance(k, (int, str)):
        raise errors.ArgumentTypeError("backend_override keys are dim indices or names, got " + repr(k))
    return str(k)


def _backend_json(v):
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, tuple) and len(v) == 2:
        name, options = v
        return {"backend": name, "options": dict(options)}
    if isinstance(v, dict):
        if set(v) <= {"backend", "timeout_ms", "options"}:
            return dict(v)
        return {"options": dict(v)}  # a bare options object, PyTorch's Options
    raise errors.InvalidArgument("a backend_override value is a name, (name, options), an options dict or "
                                 "None, got " + repr(v))


def _product(shape):
    n = 1
    for s in shape:
        n *= _int(s, "shape")
    return n


def _nest(shape, values):
    if len(shape) <= 1:
        return list(values)
    step = len(values) // shape[0] if shape[0] else 0
    return [_nest(shape[1:], values[i * step:(i + 1) * step]) for i in range(shape[0])]


def _flat(x):
    if x is None:
        return []
    if isinstance(x, (list, tuple)):
        return [r for e in x for r in _flat(e)]
    return [_int(x, "mesh")]


def query(request):
    """Answer one `meshsim query` request (a dict); returns the result, raises the error."""
    answer = _json.loads(_meshsim.query(_dumps(request, "the request")))
    if not answer.get("ok"):
        err = answer["error"]
        raise getattr(errors, err["type"], errors.Error)(err["message"])
    return answer["result"]


def preset(spec, world_size=None):
    """A framework's meshes (`meshsim show --preset`): {view name: DeviceMesh}, in order."""
    return dict(_meshsim.preset_views(spec, world_size))


def recipe(program):
    """The views of a mesh.program recipe (a dict, or the path of a JSON file, read as `meshsim
    run --recipe` reads it: its size and nesting limits, its errors): {name: DeviceMesh}."""
    if isinstance(program, (str, bytes, _os.PathLike)):
        return dict(_meshsim.recipe_file_views(_os.fsdecode(program)))
    return dict(_meshsim.recipe_views(program, "the recipe"))


def backends():
    """The backends meshsim.run (and `meshsim run --backend`) takes, in order: each a dict with
    name, description, lockstep (every rank at once in one thread: local), spans_processes and
    max_ranks (ranks one process runs at most)."""
    return _meshsim.engines()


def run(job=None, *, recipe=None, preset=None, world_size=None, backend="threaded", faults=(), timeout=30.0,
        max_elements=None):
    """`meshsim run --format json` in this process: every rank of the mesh checks its groups over
    the backend. Give the job as a mesh "dp=2,tp=4", a recipe file path (recipe=), a preset spec
    (preset=), or as `meshsim run`'s flags list, e.g. ["--mesh", "dp=2,tp=2", "--slice", "tp",
    "--backend", "gloo", "--fault", "stall@1"], which then stands alone. Returns the report as a
    dict (its "ok" says whether the run passed; "exit_status" is the tool's exit code); bad input
    raises. The report lists every group of every dim; one that would hold more than
    max_elements (default 2^21, `meshsim query`'s budget) is refused up front with
    ResourceExhausted. The GIL is released while the ranks run; Ctrl-C aborts them and raises
    KeyboardInterrupt within about a second."""
    if isinstance(job, (list, tuple)):
        if recipe is not None or preset is not None or world_size is not None or backend != "threaded" \
                or tuple(faults) or timeout != 30.0 or max_elements is not None:
            raise errors.InvalidArgument("meshsim.run(flags): give every option in the flags list, not as keywords")
        status, report = _meshsim.run_flags([str(f) for f in job])
    else:
        status, report = _meshsim.run(job or "", _os.fspath(recipe) if recipe else "", preset or "", world_size,
                                    backend, _listed(faults, "faults"), _seconds(timeout),
                                    None if max_elements is None else _int(max_elements, "max_elements"))
    report["exit_status"] = status
    return report


def step(preset=None, model=None, *, seq_len=None, local_batch_size=None, microbatches=None, schedule=None,
         stages=None, send_semantics="rendezvous", gpus_per_host=None, rank=0, ranks=None, faults=(),
         reshard_after_forward=None, log_metrics=True, world_size=None, trace=False,
         activation_checkpoint=None, lowering="runtime", job=None, megatron_args=None, loss_chunks=None,
         load_balance=True):
    """`meshsim step --preset ... --format json` in this process: every rank's program of one
    torchtitan or Megatron-core training step, checked (every group's members agree; the step
    progresses under rendezvous or eager sends) and counted per dim and per link. `preset` is
    "torchtitan:pp=4,...", "torchtitan:FILE.toml" or "megatron:tp=2,pp=4,dp=4,..." (`stages` > pp:
    Megatron's interleaved schedule; fault "no-parity@R" turns off its even/odd rule); `model` a
    built-in name ("llama3-8b") or a .toml path; `schedule`
    "GPipe", "1F1B" (default), "Interleaved1F1B" or a CSV path; `job` a torchtitan job file (a .toml, or
    the .json torchtitan 0.3.0 saves) read whole, instead of `preset` (the other arguments override
    it; the report's "notes" say which); `megatron_args` Megatron-LM's own flags as one string (or
    "@FILE"; with `world_size`); `loss_chunks` torchtitan 0.3.0's loss.num_chunks (ChunkedLossWrapper; None: the loss whole);
    `local_batch_size` is sequences per rank and microbatch; `ranks` "all", a "0,3,8-15" string
    or a list of ranks (simulated exactly); `lowering` "runtime" (what PyTorch's multi-stage runtime
    runs, with UNSHARD/RESHARD/REDUCE_GRAD) or "add_send_recv"; `faults` like ["skip@5", "wrong-peer@3"]. Returns the
    report as a dict ("ok", "diagnosis", "world_size", "rank", "by_dim", "by_link", ...; with
    trace=True also "trace", Chrome/Perfetto trace JSON of the traced ranks); bad input raises."""
    if ranks is not None and not isinstance(ranks, str):
        ranks = ",".join(str(_int(r, "ranks")) for r in _listed(ranks, "ranks"))
    opt = lambda v, what: None if v is None else _int(v, what)  # noqa: E731
    faults = _listed(faults, "faults")
    for f in faults:
        _str(f, "faults")
    return _meshsim.step(preset=_str(preset, "preset") if preset is not None else None,
                         model=_path(model, "model") if model is not None else None, seq_len=opt(seq_len, "seq_len"),
                         local_batch_size=opt(local_batch_size, "local_batch_size"),
                         microbatches=opt(microbatches, "microbatches"),
                         schedule=_path(schedule, "schedule") if schedule is not None else None,
                         stages=opt(stages, "stages"), send_semantics=_str(send_semantics, "send_semantics"),
                         gpus_per_host=opt(gpus_per_host, "gpus_per_host"), rank=_int(rank, "rank"), ranks=ranks,
                         faults=faults,
                         reshard_after_forward=(_str(reshard_after_forward, "reshard_after_forward")
                                                if reshard_after_forward is not None else None),
                         log_metrics=_bool(log_metrics, "log_metrics"), world_size=opt(world_size, "world_size"),
                         trace=_bool(trace, "trace"),
                         activation_checkpoint=(_str(activation_checkpoint, "activation_checkpoint")
                                                if activation_checkpoint is not None else None),
                         lowering=_str(lowering, "lowering"), job=_path(job, "job") if job is not None else None,
                         megatron_args=_str(megatron_args, "megatron_args") if megatron_args is not None else None,
                         loss_chunks=opt(loss_chunks, "loss_chunks"), load_balance=_bool(load_balance, "load_balance"))


def trace_check(dir, *, prefix=None, jobs=None):
    """`meshsim trace check DIR --format json` in this process: every rank's PyTorch Flight Recorder
    dump in `dir` (pickle or JSON; `prefix` the text before each file's rank, default the one all
    files share) read and checked across ranks, the files read and decoded on `jobs` threads
    (default: one per core; the report is the same for any number). Returns the report as a dict
    ("ok", "dumps", "groups", "records", "problems" [{"kind", "ranks", "message", ...}],
    "culprits" [{"rank", "why"}], "notes", ...); unreadable or malformed dumps raise, naming the
    file."""
    if jobs is not None:
        jobs = _int(jobs, "jobs")
        if not 1 <= jobs <= 4096:
            raise errors.InvalidArgument("trace_check: jobs " + str(jobs) + " is out of range [1, 4096]")
    return _meshsim.trace_check(_path(dir, "dir"), None if prefix is None else _str(prefix, "prefix"), jobs or 0)


class RecordResult:
    """What meshsim.record found: `ok`, `dir` (the dumps and each rank's output), `ranks` (each
    rank's ending: {"rank", "status" ("ok", "raised", "exit", "signal", "timeout"), "error",
    "where", "records", "groups", "init_calls", "stdout", "stderr", ...}), `dumps` (rank -> the
    pickled Flight Recorder dump's object, as PyTorch's pickle.load reads it), `check` (the
    cross-rank check's report, as trace_check returns it; None when no rank called
    init_process_group), `findings` (one line per rank that did not end well), `torch` (the
    release recorded) and `text` (the report as the tool prints it)."""

    def __init__(self, summary, dir, check, findings, text):
        self.summary, self.dir, self.check, self.findings, self.text = summary, dir, check, findings, text
        self.ranks = summary["ranks"]
        self.torch = summary["torch"]
        self.ok = not findings and check is not None and check["ok"]
        self._dumps = None

    @property
    def dumps(self):
        if self._dumps is None:
            import pickle
            self._dumps = {}
            for r in self.ranks:
                if r.get("dump"):
                    with open(_os.path.join(self.dir, r["dump"]), "rb") as f:
                        self._dumps[r["rank"]] = pickle.load(f)
        return self._dumps

    def __repr__(self):
        return "<meshsim.RecordResult %s: %d ranks, torch %s, %s>" % ("ok" if self.ok else "FAILED", len(self.ranks),
                                                                      self.torch, self.dir)


def _rank_finding(r, dir):
    why = r.get("error") or ""
    if r.get("status") == "ok" and not r.get("init_calls"):
        why = "never called init_process_group (it ended with status 0)"
    where = r.get("where")
    line = "rank %d: %s" % (r["rank"], why[:400])
    if where and r.get("status") != "timeout":
        line += " at " + where[:200]
    return line + " (after %.1f s, %d records; its stderr: %s)" % (r.get("seconds", 0.0), r.get("records", 0),
                                                                    _os.path.join(dir, r.get("stderr", "")))


def record(program, world_size, *, ranks=None, jobs=None, out=None, timeout=300.0, nproc_per_node=None, preload=(),
           fake_tensors=False, check=True):
    """`meshsim record` in Python: `program` run once per rank of `world_size` over PyTorch's fake
    backend, each rank a process forked from this interpreter (torch already imported), with the
    environment torchrun gives it (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
    MASTER_ADDR/PORT); its init_process_group is answered by `fake` whatever backend it asks for.
    `program` is a callable (run as each rank; it calls init_process_group itself) or an argv
    list (["train.py", "--steps", "1"], ["-m", "pkg.train"], a leading "python..." word dropped).
    Each rank's process groups (under the names its PyTorch gave them) and collectives are written
    as a Flight Recorder dump into `out` (a new or empty directory; default a new one under
    $TMPDIR) and checked across ranks. `ranks` records only those ("0-3,7" or a list), `jobs`
    ranks run at once (default: the machine's cores), each within `timeout` seconds;
    `fake_tensors` runs the program under PyTorch's FakeTensorMode (shapes without storage).
    Returns a RecordResult; when `check` and a rank did not end well or the check found
    problems, raises meshsim.CheckFailed with the report (its `.result` the RecordResult)."""
    import tempfile
    from . import _record
    world = _int(world_size, "world_size")
    if not 1 <= world <= 1 << 16:
        raise errors.InvalidArgument("world_size %d is out of range [1, 65536]" % world)
    if ranks is None:
        chosen = list(range(world))
    elif isinstance(ranks, str):
        try:
            chosen = _record._parse_ranks(ranks, world)
        except ValueError as e:
            raise errors.InvalidArgument(str(e).replace("--ranks", "ranks")) from None
    else:
        chosen = sorted({_int(r, "ranks") for r in _listed(ranks, "ranks")})
        if not chosen or chosen[0] < 0 or chosen[-1] >= world:
            raise errors.InvalidArgument("ranks %s are not within 0-%d (world_size %d)" % (chosen[:8], world - 1, world))
    jobs = (_os.cpu_count() or 1) if jobs is None else _int(jobs, "jobs")
    if not 1 <= jobs <= 4096:
        raise errors.InvalidArgument("jobs %d is out of range [1, 4096]" % jobs)
    timeout = _seconds(timeout)
    if not 0 < timeout <= 1e6:
        raise errors.InvalidArgument("timeout %r is not a number of seconds in (0, 1e6]" % timeout)
    per_node = world if nproc_per_node is None else _int(nproc_per_node, "nproc_per_node")
    if not 1 <= per_node <= world:
        raise errors.InvalidArgument("nproc_per_node %d is not in [1, world_size %d]" % (per_node, world))
    preload = [_str(m, "preload") for m in _listed(preload, "preload")]
    if callable(program):
        target = program
        shown = getattr(program, "__qualname__", repr(program))
    else:
        argv = [_str(a, "program") for a in _listed(program, "program")]
        if argv and _os.path.basename(argv[0]).startswith("python"):
            argv = argv[1:]
        try:
            target = _record._program(argv)
        except ValueError as e:
            raise errors.InvalidArgument("program: " + str(e)) from None
        shown = " ".join(argv)
    if out is None:
        out = tempfile.mkdtemp(prefix="meshsim-record-")
    else:
        out = _os.fsdecode(_path(out, "out"))
        if _os.path.exists(out) and (not _os.path.isdir(out) or _os.listdir(out)):
            raise errors.InvalidArgument("out '%s' is not a new or empty directory (its dumps would mix with what is there)" % out)
    summary = _record.record(target, world, chosen, jobs, out, timeout, per_node, preload,
                             fake_tensors=_bool(fake_tensors, "fake_tensors"))
    findings = [_rank_finding(r, out) for r in summary["ranks"]
                if r.get("status") != "ok" or not r.get("init_calls")]
    report = None
    if any(r.get("init_calls") for r in summary["ranks"]):
        report = _meshsim.trace_check(_os.fsencode(out), _record.DUMP_PREFIX, 0, False)  # fake: no data moved
        if len(chosen) < world:
            kept = []
            for p in report["problems"]:
                if p["kind"] == "missing-dump":
                    p["ranks"] = [r for r in p["ranks"] if r in set(chosen)]
                    if not p["ranks"]:
                        continue
                kept.append(p)
            report["problems"] = kept
            report["ok"] = not kept
            report["notes"].insert(0, "%d ranks were not recorded (ranks=): what they issue is not known, and not checked"
                                   % (world - len(chosen)))
    lines = ["meshsim record: %d of %d ranks of %s on torch %s, %d at a time, in %.1f s; dumps in '%s'"
             % (len(chosen), world, shown[:200], summary["torch"], jobs, summary["seconds"], out)]
    lines += ["FAILED " + f for f in findings]
    if report is None:
        lines.append("FAILED: no rank called init_process_group: nothing distributed was recorded")
    else:
        lines += ["FAILED %s: %s" % (p["kind"], p["message"]) for p in report["problems"]]
        lines += ["culprit: rank %d: %s" % (c["rank"], c["why"]) for c in report["culprits"]]
        lines += ["note: " + n for n in report["notes"]]
    result = RecordResult(summary, out, report, findings, "")
    if result.ok:
        lines.append("OK")
    else:
        n = len(report["problems"]) if report else 0
        lines.append("FAILED: %d problems, %d ranks did not end as the program should" % (n, len(findings)))
    result.text = "\n".join(lines) + "\n"
    if check and not result.ok:
        raise errors.CheckFailed(result.text, result)
    return result


def _convention(name):
    """The convention's name: "torch" or "cute" (anything else is refused, as the query refuses it)."""
    if name is None:
        return "torch"
    if not isinstance(name, str):
        raise errors.InvalidArgument("'convention' must be \"torch\" or \"cute\"")
    return name  # the C++ reader refuses any other name


def _layout(other):
    if not isinstance(other, Layout):
        raise errors.ArgumentTypeError("expected a meshsim.Layout, got " + repr(other)[:200])
    return other


def _made(pair):
    """A Layout from the C++ answer (shape, stride): already valid, adopted as is."""
    out = Layout.__new__(Layout)
    out.shape, out.stride = pair
    return out


class Layout:
    """A CuTe layout shape:stride. Layout("(2,2):(4,1)") or Layout((2, 2), (4, 1)).
    Every operation takes convention="torch" (PyTorch's _pycute, the default) or "cute"."""

    def __init__(self, shape, stride=None):
        if stride is None:
            if not isinstance(shape, str):
                raise errors.InvalidArgument("Layout(text) or Layout(shape, stride)")
            self.shape, self.stride = _parse_text(shape)
        else:
            self.shape, self.stride = _tupled(shape), _tupled(stride)

    # Each op is the C++ function itself (meshsim/algebra.hpp), on (shape, stride).
    def _pair(self):
        return (self.shape, self.stride)

    def size(self, convention="torch"):
        return _meshsim.layout_size(self._pair(), _convention(convention))

    def cosize(self, convention="torch"):
        return _meshsim.layout_cosize(self._pair(), _convention(convention))

    def coalesce(self, convention="torch"):
        return _made(_meshsim.coalesce(self._pair(), _convention(convention)))

    def filter(self, convention="torch"):
        return _made(_meshsim.filter(self._pair(), _convention(convention)))

    def complement(self, bound=None, convention="torch"):
        return _made(_meshsim.complement(self._pair(), None if bound is None else _int(bound, "bound"),
                                         _convention(convention)))

    def composition(self, other, convention="torch"):
        return _made(_meshsim.composition(self._pair(), _layout(other)._pair(), _convention(convention)))

    def logical_divide(self, other, convention="torch"):
        return _made(_meshsim.logical_divide(self._pair(), _layout(other)._pair(), _convention(convention)))

    def logical_product(self, other, convention="torch"):
        return _made(_meshsim.logical_product(self._pair(), _layout(other)._pair(), _convention(convention)))

    def right_inverse(self, convention="torch"):
        return _made(_meshsim.right_inverse(self._pair(), _convention(convention)))

    def left_inverse(self, convention="torch"):
        return _made(_meshsim.left_inverse(self._pair(), _convention(convention)))

    def crd2idx(self, coords, convention="torch"):
        return _meshsim.crd2idx(self._pair(), _listed(coords, "coords"), _convention(convention))

    def idx2crd(self, indices, convention="torch"):
        return _meshsim.idx2crd(self._pair(), _listed(indices, "indices"), _convention(convention))

    # PyTorch's layout checks (torch convention; meshsim/mesh_layout.hpp).
    def check_orthogonal(self):
        """_FlatLayout.check_orthogonal (newer PyTorch): the coalesced modes, sorted by stride,
        nest (each stride a multiple of the next mode's stride x size). Stricter than
        check_non_overlap: Layout("(3,2):(2,3)") is injective but not orthogonal."""
        return _meshsim.mesh_check_orthogonal(self._pair())

    def check_non_overlap(self):
        """_MeshLayout.check_non_overlap: the layout maps its coordinates to distinct ranks."""
        return _meshsim.mesh_check_non_overlap(self._pair())

    def __eq__(self, other):
        return isinstance(other, Layout) and (self.shape, self.stride) == (other.shape, other.stride)

    def __hash__(self):
        return hash((_hashable(self.shape), _hashable(self.stride)))

    def __str__(self):
        return _text(self.shape) + ":" + _text(self.stride)

    def __repr__(self):
        return "Layout(" + repr(str(self)) + ")"


def _tupled(x):
    return [_tupled(e) for e in x] if isinstance(x, (list, tuple)) else _int(x, "a layout's shape and stride")


def _hashable(x):
    return tuple(_hashable(e) for e in x) if isinstance(x, list) else x


def _text(x):
    if isinstance(x, list):
        return "(" + ",".join(_text(e) for e in x) + ("," if len(x) == 1 else "") + ")"
    return str(x)


def _parse_text(text):
    # meshsim's reader (parse_layout): its limits and typed errors.
    shape_text, sep, stride_text = text.partition(":")
    if not sep:
        raise errors.ParseError("layout " + repr(text) + " is not shape:stride")
    return _meshsim.parse_layout(text)
