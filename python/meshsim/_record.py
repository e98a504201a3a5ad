"""meshsim record's runner: a Python program run once per rank over PyTorch's `fake` backend, each
rank's process groups and collectives written as a Flight Recorder dump.

One interpreter imports torch (and what --preload names), then forks one process per rank, --jobs
at a time. Each rank sees the environment torchrun gives it (RANK, LOCAL_RANK, WORLD_SIZE, ...),
its `init_process_group` is answered by the `fake` backend whatever it asks for, and a
TorchDispatchMode notes every c10d and functional collective it issues (the group, the sizes and
dtypes of its tensors, the Python frames that issued it). At the rank's end its dump is written
(`trace_rank_<r>` in the output directory, the pickle Flight Recorder writes) with every group its
PyTorch created, under the name PyTorch gave it; `record.json` says how each rank ended.

This file is the `meshsim record` tool's runner (the tool runs it with the program's own Python,
which need not have meshsim installed: it imports nothing of meshsim) and `meshsim.record`'s.
"""
import json
import os
import pickle
import signal
import sys
import time
import traceback

DUMP_PREFIX = "trace_rank_"
FORMAT_VERSION = "2.10"  # the Flight Recorder dump version whose fields these are
MAX_FRAMES = 256

# Imported before the fork (each costs every rank its import otherwise).
_WARM = ("torch._dynamo", "torch.distributed.device_mesh", "torch.distributed.tensor", "torch.distributed._functional_collectives",
         "torch.distributed.fsdp", "torch.distributed.pipelining", "torch.nn.parallel")

# Where PyTorch calls a dispatch mode from (the innermost frames of a recorded op's stack that a
# real job's Flight Recorder does not show).
_MODE_CALL_FILES = (os.path.join("torch", "_dynamo", "eval_frame.py"), os.path.join("torch", "_compile.py"))

_RUNPY_FILE = __import__("runpy").__file__
_OPS_FILE = os.path.join("torch", "_ops.py")

# The rank's own state, set in the child after the fork.
_rank = {"on": False}


def _dtype_name(dt):
    """c10's ScalarType name ("Float", "BFloat16"), as Flight Recorder writes dtypes."""
    import torch
    names = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
             torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
             torch.bool: "Bool", torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble"}
    if dt in names:
        return names[dt]
    s = str(dt).replace("torch.", "")
    return s[:1].upper() + s[1:]


def _tensors(x):
    """The tensors in an argument (a tensor, a list of them, a list of lists), in order."""
    import torch
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        out = []
        for y in x:
            out.extend(_tensors(y))
        return out
    return []


# What each collective is called in a Flight Recorder record, as ProcessGroupNCCL names its work
# ("nccl:" + this; the names PyTorch's analyzer, torch.distributed.flight_recorder, knows).
_C10D_NAMES = {
    "allreduce_": "all_reduce", "allreduce_coalesced_": "allreduce_coalesced", "allgather_": "all_gather",
    "_allgather_base_": "_all_gather_base", "allgather_coalesced_": "ALLGATHER_coalesced",
    "allgather_into_tensor_coalesced_": "all_gather_into_tensor_coalesced", "reduce_scatter_": "reduce_scatter",
    "_reduce_scatter_base_": "_reduce_scatter_base", "reduce_scatter_tensor_coalesced_": "reduce_scatter_tensor_coalesced",
    "broadcast_": "broadcast", "reduce_": "reduce", "gather_": "gather", "scatter_": "scatter", "alltoall_": "all_to_all",
    "alltoall_base_": "all_to_all", "barrier": "barrier", "send": "send", "recv_": "recv", "recv_any_source_": "recv",
}
# Functional collectives (torch.distributed._functional_collectives): their group is an argument.
_FUNCTIONAL_NAMES = {
    "all_reduce": "all_reduce", "all_reduce_": "all_reduce", "all_reduce_coalesced": "allreduce_coalesced",
    "all_reduce_coalesced_": "allreduce_coalesced", "all_gather_into_tensor": "_all_gather_base",
    "all_gather_into_tensor_out": "_all_gather_base", "all_gather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor": "_reduce_scatter_base", "reduce_scatter_tensor_out": "_reduce_scatter_base",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
    "all_to_all_single": "all_to_all", "broadcast": "broadcast", "broadcast_": "broadcast",
}
# The communication libraries whose names a record may carry (PyTorch's analyzer knows these).
_LIBRARIES = ("nccl", "ncclx", "xccl", "gloo", "rccl", "rcclx", "mccl", "hccl")


def _library(asked):
    """The library a record names for the backend the program asked for: nccl for "nccl" or
    "cpu:gloo,cuda:nccl", gloo for "gloo", PyTorch's default (nccl with CUDA, else gloo) for none."""
    import torch
    text = (asked or "").lower()
    for lib in _LIBRARIES:
        if lib in text.replace("ncclx", "").replace("rcclx", "") or text == lib:
            return lib
    if not text or text in ("default", "undefined"):
        return "nccl" if torch.cuda.is_available() else "gloo"
    return "nccl"


class _Rank:
    """One rank's records and groups."""

    def __init__(self, rank, world, out):
        self.rank, self.world, self.out = rank, world, out
        self.entries = []
        self.groups = {}  # name -> pg_config entry, in creation order
        self.seq = {}  # name -> [collective_seq_id, p2p_seq_id, pg_id]
        self.op_id = 0
        self.backend = None  # what the program asked init_process_group for
        self.init_calls = 0
        self.read_back = False
        self.notes = []
        self.runner_file = os.path.abspath(__file__) if "__file__" in globals() else "<meshsim record>"

    def snapshot(self):
        """Every group this rank's PyTorch holds, under the name PyTorch gave it."""
        try:
            from torch.distributed.distributed_c10d import _world
        except Exception:
            return
        import torch.distributed as dist
        for pg, ranks in list(_world.pg_group_ranks.items()):
            if isinstance(pg, dist.ProcessGroup):
                self.group(pg, ranks)

    def group(self, pg, ranks=None):
        name = pg.group_name
        if name in self.groups:
            return name
        if ranks is None:
            from torch.distributed.distributed_c10d import _world
            ranks = _world.pg_group_ranks.get(pg, {})
        members = sorted(int(r) for r in ranks)
        self.groups[name] = {"name": name, "desc": getattr(pg, "group_desc", "undefined"),
                             "ranks": "[" + ", ".join(str(r) for r in members) + "]",
                             "backend": self.backend or "fake"}
        return name

    def frames(self):
        out = []
        after_runner = False
        for f in reversed(traceback.extract_stack()[:-3]):
            if after_runner and f.filename.endswith(_MODE_CALL_FILES):
                continue  # the disable wrapper around the runner's own
            after_runner = f.filename == self.runner_file
            if f.filename == self.runner_file:
                # The runner's own wrapper of an op (torch._dynamo's disable wrapper around it and
                # the op's __call__ it calls), which the program's stack has not.
                while out and (out[-1]["filename"].endswith(_MODE_CALL_FILES) or
                               (out[-1]["name"] == "__call__" and out[-1]["filename"].endswith(_OPS_FILE))):
                    out.pop()
                continue
            if not out and f.filename.endswith(_MODE_CALL_FILES):
                continue  # the mode's own call (torch._dynamo's disable wrapper), not the program's
            if f.filename in ("<frozen runpy>", _RUNPY_FILE):
                continue  # how the runner starts the program (runpy), which `python SCRIPT` has not
            out.append({"name": f.name, "filename": f.filename, "line": f.lineno})
            if len(out) == MAX_FRAMES:
                break
        return out

    def note(self, func, args, kwargs, result):
        import torch
        import torch.distributed as dist
        ns, base = func.namespace, func._schema.name.split("::")[-1]
        if ns == "c10d":
            op = _C10D_NAMES.get(base)
        else:
            op = _FUNCTIONAL_NAMES.get(base)
        if op is None:
            if os.environ.get("MESHSIM_RECORD_DEBUG"):
                sys.stderr.write("meshsim record: not a collective: %s\n" % func)
            return
        schema = func._schema.arguments
        values = list(args) + [kwargs[a.name] for a in schema[len(args):] if a.name in kwargs]
        pg, inputs, outputs, peer = None, [], [], None
        for a, v in zip(schema, values):
            if isinstance(v, torch.ScriptObject):
                try:
                    pg = dist.ProcessGroup.unbox(v)
                except Exception:
                    pass
            elif a.name == "group_name":
                if isinstance(v, str):
                    pg = torch._C._distributed_c10d._resolve_process_group(v)
                else:
                    pg = v
            elif a.name in ("tensors", "tensor"):
                inputs += _tensors(v)
                outputs += _tensors(v)
            elif "output" in a.name and "split" not in a.name:
                outputs += _tensors(v)
            elif "input" in a.name and "split" not in a.name:
                inputs += _tensors(v)
            elif a.name in ("dst", "src", "dstRank", "srcRank") and ns == "c10d":
                peer = int(v)
        if ns != "c10d":
            outputs = _tensors(result)
        if pg is None:
            return
        if op == "barrier":
            inputs, outputs = [], []
        name = self.group(pg)
        desc = self.groups[name]["desc"]
        seq = self.seq.setdefault(name, [0, 0, len(self.seq)])
        me = pg.rank()
        p2p = op in ("send", "recv", "recv_any_source")
        if p2p:
            seq[1] += 1
        else:
            seq[0] += 1
        self.op_id += 1
        prefix = _library(self.backend)
        if op == "barrier" and prefix != "gloo":
            op = "all_reduce_barrier"  # ProcessGroupNCCL's barrier is an all_reduce it names so
        in_sizes, out_sizes = [list(t.shape) for t in inputs], [list(t.shape) for t in outputs]
        if prefix == "gloo" and op == "_all_gather_base" and len(inputs) == 1:
            # ProcessGroupGloo's all-gather into a tensor is an all_gather into its chunks; its
            # record's output is the chunks stacked (the group's size by the input) for c10d's
            # call, one chunk deep for a functional collective's (as Gloo jobs' dumps show).
            op, out_sizes = "all_gather", [[pg.size() if ns == "c10d" else 1] + in_sizes[0]]
        elif prefix == "gloo" and op == "_reduce_scatter_base" and len(inputs) == 1:
            # ProcessGroupGloo reduce-scatters by all-reducing the whole input: its record is that
            # all_reduce, the input its output too.
            op, out_sizes = "all_reduce", [list(in_sizes[0])]
        if op == "send":
            profiling = "%s:send %d->%d" % (prefix, me, peer)
        elif op == "recv":
            profiling = "%s:recv %d<-%d" % (prefix, me, peer)
        else:
            profiling = prefix + ":" + op
        now = time.time_ns()
        self.entries.append({
            "record_id": len(self.entries), "pg_id": seq[2], "process_group": (name, desc),
            "collective_seq_id": seq[0],
            # ProcessGroupGloo counts no point-to-point sequence: its collectives' p2p_seq_id is 0
            "p2p_seq_id": seq[1] if p2p or prefix != "gloo" else 0, "op_id": self.op_id, "profiling_name": profiling,
            "time_created_ns": now, "duration_ms": None,
            "input_sizes": in_sizes, "input_dtypes": [_dtype_name(t.dtype) for t in inputs],
            "output_sizes": out_sizes, "output_dtypes": [_dtype_name(t.dtype) for t in outputs],
            "state": "completed", "time_discovered_started_ns": now, "time_discovered_completed_ns": now,
            "retired": True, "timeout_ms": 600000, "is_p2p": p2p, "frames": self.frames(),
        })

    def dump_object(self, torch_version):
        """The rank's dump so far, as Flight Recorder's _dump_fr_trace gives it."""
        self.snapshot()
        status = {n: {"last_enqueued_collective": s[0], "last_started_collective": s[0], "last_completed_collective": s[0]}
                  for n, s in self.seq.items()}
        return {"version": FORMAT_VERSION, "pg_config": dict(self.groups), "pg_status": status, "entries": list(self.entries),
                "meshsim_record": {"torch": torch_version, "rank": self.rank, "world_size": self.world,
                                   "backend_asked": self.backend, "notes": list(self.notes)}}

    def dump(self, torch_version):
        self.snapshot()
        status = {n: {"last_enqueued_collective": s[0], "last_started_collective": s[0], "last_completed_collective": s[0]}
                  for n, s in self.seq.items()}
        d = {"version": FORMAT_VERSION, "pg_config": self.groups, "pg_status": status, "entries": self.entries,
             "meshsim_record": {"torch": torch_version, "rank": self.rank, "world_size": self.world,
                                "backend_asked": self.backend, "notes": self.notes}}
        path = os.path.join(self.out, DUMP_PREFIX + str(self.rank))
        with open(path + ".tmp", "wb") as f:
            pickle.dump(d, f, protocol=2)
        os.replace(path + ".tmp", path)
        return path


class _Carrier:
    """Point-to-point tensors carried between the recorded ranks, which run apart: what a rank
    sends (c10d's send, from dist.send, isend, batch_isend_irecv and send_object_list alike) is
    written to OUT/p2p/<src>-<dst>-<n> (the n-th send from src to dst), and the matching receive
    fills its tensor from there, so a pipeline's shape inference, its vote and its activations
    arrive as the program sent them. A send never waits. A receive is settled by the next wait
    on a work (every receive posted before it), the rank's next tensor op, or its end, as a
    posted irecv completes by its wait: a batch that receives before it sends does not deadlock
    here unless it would in the program. While a
    rank waits for a peer it says so (OUT/p2p/waiting-<r>), and the runner starts another rank
    beyond --jobs, so a rank waiting on one not yet started does not hold its place. A receive
    from a rank that ended without that send, or of another size than was sent, raises, naming
    both ranks; one from a rank not recorded (--ranks) is not carried."""

    def __init__(self, rank, out, recorded):
        self.rank, self.dir, self.recorded = rank, os.path.join(out, "p2p"), recorded
        self.logs = os.path.join(out, "ranks")
        self.sent, self.received, self.pending = {}, {}, []

    def carries(self, peer):
        return peer in self.recorded and peer != self.rank

    def _path(self, src, dst, n):
        return os.path.join(self.dir, "%d-%d-%d" % (src, dst, n))

    def send(self, dst, tensor):
        n = self.sent.get(dst, 0)
        self.sent[dst] = n + 1
        t = tensor.detach().contiguous().reshape(-1)
        data = t.view(__import__("torch").uint8).numpy().tobytes() if t.numel() else b""
        path = self._path(self.rank, dst, n)
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.replace(path + ".tmp", path)

    def recv(self, src, tensor):
        n = self.received.get(src, 0)
        self.received[src] = n + 1
        self.pending.append((src, n, tensor))

    def _fill(self, src, n, tensor, data):
        import torch
        want = tensor.numel() * tensor.element_size()
        if len(data) != want:
            raise RuntimeError(
                "meshsim record: rank %d receives %d bytes (%s %s) from rank %d as its receive %d from it, but rank %d "
                "sent %d bytes there" % (self.rank, want, _dtype_name(tensor.dtype), list(tensor.shape), src, n, src,
                                         len(data)))
        if want:
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(tensor.dtype).view(tensor.shape)
            tensor.copy_(buf)

    def settle(self):
        """Fills every pending receive, waiting for its send (the rank's deadline bounds it)."""
        pending, self.pending = self.pending, []
        waiting = None
        try:
            for src, n, tensor in pending:
                path, delay = self._path(src, self.rank, n), 0.001
                while not os.path.exists(path):
                    if waiting is None:
                        waiting = os.path.join(self.dir, "waiting-%d" % self.rank)
                        open(waiting, "w").close()
                    if os.path.exists(os.path.join(self.logs, "rank-%d.result" % src)) and not os.path.exists(path):
                        raise RuntimeError(
                            "meshsim record: rank %d waits for its receive %d from rank %d, which rank %d never sent "
                            "(it ended after %s): the program would hang here" % (
                                self.rank, n, src, src, "sending none to it" if n == 0 else "%d sends to it" % n))
                    time.sleep(delay)
                    delay = min(delay * 2, 0.05)
                with open(path, "rb") as f:
                    data = f.read()
                os.unlink(path)  # read once: a long pipeline's activations do not pile up
                self._fill(src, n, tensor, data)
        finally:
            if waiting is not None:
                try:
                    os.unlink(waiting)
                except OSError:
                    pass


def _install(torch_module_names):
    """Patches made once in the forking interpreter, before the program or --preload import
    anything: init_process_group answered by `fake`, destroy_process_group noting the groups
    first. Each reads the rank's state, set after the fork."""
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the fake backend
    from torch.utils._python_dispatch import TorchDispatchMode

    if _rank.get("recorder") is not None:
        return _rank["recorder"]
    real_init, real_destroy = c10d.init_process_group, c10d.destroy_process_group

    def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, store=None,
                           group_name="", pg_options=None, device_id=None, **kw):
        me = _rank.get("state")
        if me is None:
            return real_init(backend, init_method, timeout, world_size, rank, store, group_name, pg_options, device_id, **kw)
        me.init_calls += 1
        me.backend = str(backend) if backend is not None else None
        if world_size not in (-1, None) and int(world_size) != me.world:
            me.notes.append("init_process_group(world_size=%s) beside WORLD_SIZE=%d" % (world_size, me.world))
        if rank not in (-1, None) and int(rank) != me.rank:
            me.notes.append("init_process_group(rank=%s) beside RANK=%d" % (rank, me.rank))
        if device_id is not None:
            me.notes.append("device_id=%s not bound (the fake backend stands in for every device)" % (device_id,))
        args = {"backend": "fake", "store": FakeStore(), "rank": int(rank) if rank not in (-1, None) else me.rank,
                "world_size": int(world_size) if world_size not in (-1, None) else me.world}
        if timeout is not None:
            args["timeout"] = timeout
        if group_name:
            args["group_name"] = group_name
        out = real_init(**args)
        me.snapshot()
        return out

    def destroy_process_group(group=None):
        me = _rank.get("state")
        if me is not None:
            me.snapshot()
        return real_destroy(group)

    for mod in (dist, c10d):
        mod.init_process_group = init_process_group
        mod.destroy_process_group = destroy_process_group

    # Collectives of Python objects send their pickles' sizes first: over the fake backend a
    # receiver would read another rank's size as garbage (and try to allocate it). The receiving
    # side stops, naming the call; the sending side goes on (its records are what it issued).
    def object_collective(name, fn, receives):
        def guarded(*args, **kwargs):
            me = _rank.get("state")
            if me is not None and receives(*args, **kwargs):
                raise RuntimeError(
                    "meshsim record: torch.distributed.%s on rank %d receives Python objects other ranks send, which the "
                    "fake backend does not carry (the ranks run apart; only point-to-point sends between recorded "
                    "ranks are carried, and none under --fake-tensors): not recordable (an all_gather_object of sizes, "
                    "a recv_object_list from any rank or from one not recorded)" % (name, me.rank))
            return fn(*args, **kwargs)
        guarded.__name__ = guarded.__qualname__ = name
        guarded.__doc__ = fn.__doc__
        return guarded

    def me_rank():
        return dist.get_rank() if dist.is_initialized() else -1

    def is_not(key, pos):
        def check(*args, **kwargs):
            v = kwargs.get(key, args[pos] if len(args) > pos else 0)
            group = kwargs.get("group")
            gkey = {"src": "group_src", "dst": "group_dst"}.get(key)
            if v is None and gkey and kwargs.get(gkey) is not None and group is not None:
                v = dist.get_global_rank(group, kwargs[gkey])
            return (0 if v is None else v) != me_rank()
        return check

    def recv_not_carried(*args, **kwargs):
        carrier = _rank.get("carrier")
        src = kwargs.get("src", args[1] if len(args) > 1 else None)
        if src is None and kwargs.get("group_src") is not None and kwargs.get("group") is not None:
            src = dist.get_global_rank(kwargs["group"], kwargs["group_src"])
        return carrier is None or src is None or not carrier.carries(int(src))

    receiving = {
        "recv_object_list": recv_not_carried,
        "all_gather_object": lambda *a, **k: dist.get_world_size(k.get("group", a[2] if len(a) > 2 else None)) > 1,
        "broadcast_object_list": is_not("src", 1),
        "scatter_object_list": is_not("src", 2),
        "gather_object": lambda *a, **k: not is_not("dst", 2)(*a, **k),
    }
    for name, receives in receiving.items():
        fn = getattr(c10d, name, None)
        if fn is None:
            continue
        wrapped = object_collective(name, fn, receives)
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is fn:
            setattr(dist, name, wrapped)

    # A program that dumps Flight Recorder itself (torch._C._distributed_c10d._dump_fr_trace,
    # as a job's own timeout handler or test does) gets the rank's records so far.
    import torch._C._distributed_c10d as c10d_c
    real_dump, real_dump_json = getattr(c10d_c, "_dump_fr_trace", None), getattr(c10d_c, "_dump_fr_trace_json", None)

    def dump_fr_trace(includeCollectives=True, includeStackTraces=True, onlyActive=False):
        me = _rank.get("state")
        if me is None:
            return real_dump(includeCollectives, includeStackTraces, onlyActive)
        d = me.dump_object(str(torch.__version__))
        if not includeCollectives:
            d["entries"] = []
        elif not includeStackTraces:
            d["entries"] = [dict(e, frames=[]) for e in d["entries"]]
        return pickle.dumps(d, protocol=2)

    def dump_fr_trace_json(includeCollectives=True, onlyActive=False):
        me = _rank.get("state")
        if me is None:
            return real_dump_json(includeCollectives, onlyActive)
        d = me.dump_object(str(torch.__version__))
        if not includeCollectives:
            d["entries"] = []
        return json.dumps(d)

    if real_dump is not None:
        c10d_c._dump_fr_trace = dump_fr_trace
    if real_dump_json is not None:
        c10d_c._dump_fr_trace_json = dump_fr_trace_json

    def global_peer(pg, local):
        """The global rank of `pg`'s group rank `local` (c10d's send and recv name their peer so)."""
        from torch.distributed.distributed_c10d import _world
        name = pg.group_name
        for p, ranks in list(_world.pg_group_ranks.items()):
            if getattr(p, "group_name", None) == name:
                for g, l in ranks.items():
                    if l == local:
                        return int(g)
        return int(local)

    def carry(carrier, func, args):
        """A c10d send's tensors written for its peer, a receive's noted to be filled."""
        base = func._schema.name
        tensors, peer = args[0], int(args[2])
        pg = dist.ProcessGroup.unbox(args[1]) if isinstance(args[1], torch.ScriptObject) else args[1]
        g = global_peer(pg, peer)
        if not carrier.carries(g):
            return
        for t in tensors:
            if base == "c10d::send":
                carrier.send(g, t)
            else:
                carrier.recv(g, t)

    p2p_ops = ("c10d::send", "c10d::recv_")

    # A receive completes by its work's wait (dist.recv and recv_object_list wait inside; a
    # batch_isend_irecv's works are waited by the program): the carrier's pending receives are
    # settled there, and before the next tensor op (a wait not called), and at the rank's end.
    import torch._C._distributed_c10d as c10d_works
    for cls in (getattr(c10d_works, "FakeWork", None), getattr(c10d_works, "Work", None)):
        real_wait = getattr(cls, "wait", None) if cls is not None else None
        if real_wait is None:
            continue

        def wait(self, *args, _real=real_wait, **kwargs):
            carrier = _rank.get("carrier")
            if carrier is not None and carrier.pending:
                carrier.settle()
            return _real(self, *args, **kwargs)
        wait.__doc__ = real_wait.__doc__
        cls.wait = wait

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            ns = func.namespace
            carrier = _rank.get("carrier")
            if carrier is not None and carrier.pending and not (ns == "c10d" and func._schema.name in p2p_ops):
                carrier.settle()  # a tensor op after receives: they complete first
            if ns != "c10d" and ns != "_c10d_functional" and ns != "_c10d_functional_autograd":
                return func(*args, **kwargs)
            _rank["handling"] = _rank.get("handling", 0) + 1  # the op's own call is not noted twice
            try:
                result = func(*args, **kwargs)
                if carrier is not None and ns == "c10d" and func._schema.name in p2p_ops:
                    carry(carrier, func, args)
            finally:
                _rank["handling"] -= 1
            me = _rank.get("state")
            if me is not None:
                try:
                    me.note(func, args, kwargs, result)
                except Exception as e:  # noqa: BLE001 - the program goes on; the record says what it missed
                    me.notes.append("%s not recorded: %s: %s" % (func, type(e).__name__, e))
            return result

    # Under --fake-tensors, DeviceMesh's bookkeeping (its rank map, read with .tolist()) is made
    # of real tensors: its methods and properties run with FakeTensorMode set aside, as PyTorch's
    # FSDP2 memory tracker builds its mesh outside the mode.
    import torch.distributed.device_mesh as dm
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    def real_tensors(fn):
        def run(*args, **kwargs):
            if not _rank.get("fake_tensors") or torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is None:
                return fn(*args, **kwargs)
            with unset_fake_temporarily():
                return fn(*args, **kwargs)
        run.__name__, run.__qualname__, run.__doc__ = fn.__name__, getattr(fn, "__qualname__", fn.__name__), fn.__doc__
        run.__wrapped__ = fn
        return run

    mesh_class = getattr(dm, "DeviceMesh", None)
    if isinstance(mesh_class, type):
        for name, value in list(vars(mesh_class).items()):
            if name.startswith("__") and name != "__init__" and name != "__getitem__":
                continue
            if isinstance(value, (staticmethod, classmethod)):
                setattr(mesh_class, name, type(value)(real_tensors(value.__func__)))
            elif isinstance(value, property):
                setattr(mesh_class, name, property(real_tensors(value.fget) if value.fget else None,
                                                   real_tensors(value.fset) if value.fset else None,
                                                   value.fdel, value.__doc__))
            elif callable(value) and not isinstance(value, type):
                setattr(mesh_class, name, real_tensors(value))
    for holder in (dm, dist):
        if getattr(holder, "init_device_mesh", None) is not None:
            holder.init_device_mesh = real_tensors(dm.init_device_mesh.__wrapped__ if hasattr(dm.init_device_mesh, "__wrapped__")
                                                   else dm.init_device_mesh)

    # A collective issued inside another op's dispatch (DTensor redistributing its inputs within
    # an aten op's __torch_dispatch__, where the mode stack is popped) never reaches the mode:
    # those are noted where Python calls the op (torch.ops.c10d / _c10d_functional), when the
    # mode is not on the stack to see them.
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    def wrap(overload, call):
        def recorded(*args, **kwargs):
            me = _rank.get("state")
            if me is None or _rank.get("handling") or any(isinstance(m, Recorder) for m in _get_current_dispatch_mode_stack()):
                return call(*args, **kwargs)
            result = call(*args, **kwargs)
            try:
                me.note(overload, args, kwargs, result)
            except Exception as e:  # noqa: BLE001 - the program goes on; the record says what it missed
                me.notes.append("%s not recorded: %s: %s" % (overload, type(e).__name__, e))
            return result
        return recorded

    for qualified in torch._C._dispatch_get_all_op_names():
        ns, _, name = qualified.partition("::")
        if ns not in ("c10d", "_c10d_functional", "_c10d_functional_autograd"):
            continue
        try:
            packet = getattr(getattr(torch.ops, ns), name)
        except (AttributeError, RuntimeError):
            continue
        for overload_name in packet.overloads():
            overload = getattr(packet, overload_name)
            overload._op = wrap(overload, overload._op)
        if "default" in packet.overloads():
            packet._op = wrap(packet.default, packet._op)

    def read_back(t):
        me = _rank.get("state")
        if me is not None and not me.read_back:
            lib = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
            stack = [f for f in traceback.extract_stack()[:-2] if f.filename != me.runner_file and "<frozen" not in f.filename]
            frame = next((f for f in reversed(stack) if not os.path.abspath(f.filename).startswith(lib)), stack[-1] if stack else None)
            me.read_back = True
            me.notes.append("--fake-tensors: values read back from tensors (.item() and the like) are answered 1 "
                            "(True, 1.0): first at %s" % ("%s:%d in %s" % (frame.filename, frame.lineno, frame.name) if frame else "?"))
        if t.dtype == torch.bool:
            return True
        return 1.0 if t.dtype.is_floating_point or t.dtype.is_complex else 1

    # A value read back from a FakeTensor (.item(), int(t), a seed broadcast, a token count) has
    # none: under --fake-tensors 1 (True, 1.0) stands in, said once in the record's notes. It is
    # answered in FakeTensorMode's own table, so DTensor's ops (inside whose dispatch the mode
    # stack is popped) get the same answer.
    try:
        from torch._subclasses import fake_impls
        table = fake_impls.op_implementations_dict
        for op in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default):
            real_impl = table.get(op)
            if real_impl is None:
                continue

            def answered(fake_mode, func, arg, _real=real_impl):
                if not _rank.get("fake_tensors") or fake_mode.shape_env is not None:
                    return _real(fake_mode, func, arg)
                return read_back(arg)
            table[op] = answered
    except (ImportError, AttributeError):
        pass

    _rank["recorder"] = Recorder
    return Recorder


def _env_for(rank, world, per_node, master_port):
    node, local = divmod(rank, per_node)
    nodes = (world + per_node - 1) // per_node
    local_world = min(per_node, world - node * per_node)
    return {
        "RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(node), "GROUP_WORLD_SIZE": str(nodes), "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world),
        "ROLE_NAME": "default", "NODE_RANK": str(node), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "meshsim-record",
        "TORCHELASTIC_USE_AGENT_STORE": "False", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }


def _where(tb_exc):
    """The innermost frame of a traceback outside torch and this runner: 'file.py:12 in f'."""
    here = os.path.abspath(__file__) if "__file__" in globals() else ""
    import torch
    lib = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    best = inner = None
    for f in tb_exc.stack:
        if f.filename == here or "<frozen runpy>" in f.filename or f.filename.endswith("runpy.py"):
            continue
        inner = f
        if not os.path.abspath(f.filename).startswith(lib):
            best = f
    best = best or inner
    if best is None:
        return ""
    return "%s:%d in %s" % (best.filename, best.lineno, best.name)


def _run_rank(rank, opts, recorder, torch_version, target):
    """The child: the rank's environment, its outputs, the program, its dump. Never returns."""
    out = opts["out"]
    logs = os.path.join(out, "ranks")
    fd_out = os.open(os.path.join(logs, "rank-%d.out" % rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    fd_err = os.open(os.path.join(logs, "rank-%d.err" % rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd_out, 1)
    os.dup2(fd_err, 2)
    os.close(fd_out)
    os.close(fd_err)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    # The rank's own streams on those descriptors (the forking interpreter's may be something
    # else: pytest's capture, a notebook's).
    sys.stdin = open(0, "r", closefd=False)
    sys.stdout = open(1, "w", buffering=1, closefd=False, encoding="utf-8", errors="backslashreplace")
    sys.stderr = open(2, "w", buffering=1, closefd=False, encoding="utf-8", errors="backslashreplace")
    os.environ.update(_env_for(rank, opts["world"], opts["per_node"], opts["master_port"]))
    state = _Rank(rank, opts["world"], out)
    _rank["state"] = state
    # Point-to-point tensors between recorded ranks are carried (real tensors only: a FakeTensor
    # has no bytes to send).
    _rank["carrier"] = None if opts.get("fake_tensors") else _Carrier(rank, out, opts["recorded"])
    result = {"rank": rank, "status": "ok", "exit_code": 0}
    stopping = {"now": False}

    def on_term(signum, frame):
        stopping["now"] = True
        raise KeyboardInterrupt("meshsim record: past the rank's deadline")

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    code = 0
    try:
        import torch
        torch.set_num_threads(1)
        if opts.get("fake_tensors"):
            # Every tensor the program makes is a FakeTensor (shapes, dtypes, devices; no
            # storage): a model's size costs neither memory nor compute. The recorder is entered
            # last, on top, so it sees each collective before FakeTensorMode answers it.
            from torch._subclasses.fake_tensor import FakeTensorMode
            _rank["fake_tensors"] = True
            with FakeTensorMode(allow_non_fake_inputs=True), recorder():
                target()
        else:
            with recorder():
                target()
        if _rank["carrier"] is not None:
            _rank["carrier"].settle()  # receives the program posted and never read
    except SystemExit as e:
        c = e.code
        if c is None or c == 0:
            code = 0
        elif isinstance(c, int):
            code = c & 0xFF or 1
            result.update(status="exit", exit_code=code, error="exited with status %d (SystemExit)" % c)
        else:
            code = 1
            sys.stderr.write(str(c) + "\n")
            result.update(status="exit", exit_code=1, error="exited: %s" % (str(c)[:300],))
    except BaseException as e:  # noqa: B902 - a rank's every ending is a finding
        te = traceback.TracebackException.from_exception(e)
        sys.stderr.write("".join(te.format()))
        code = 1
        if stopping["now"]:
            result.update(status="timeout", exit_code=code, error="ran past its deadline", where=_where(te))
        else:
            msg = "".join(te.format_exception_only()).strip().splitlines()
            result.update(status="raised", exit_code=code, error=(msg[-1] if msg else type(e).__name__)[:500], where=_where(te))
    try:
        import atexit
        atexit._run_exitfuncs()
    except BaseException:  # noqa: B902
        pass
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _rank["state"] = None
    result["init_calls"] = state.init_calls
    result["records"] = len(state.entries)
    result["groups"] = len(state.groups)
    result["backend_asked"] = state.backend
    result["notes"] = state.notes
    try:
        if state.init_calls:
            result["dump"] = os.path.basename(state.dump(torch_version))
    except BaseException as e:  # noqa: B902
        result.update(status="raised", exit_code=1, error="its dump could not be written: %r" % (e,))
        code = 1
    try:
        with open(os.path.join(logs, "rank-%d.result" % rank), "w") as f:
            json.dump(result, f)
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _program(argv):
    """The callable that runs `argv` (SCRIPT ARGS..., -m MODULE ARGS..., or -c CODE ARGS...) as
    `python argv` would, as __main__."""
    import runpy
    if not argv:
        raise ValueError("no program: give SCRIPT [ARGS...] or -m MODULE [ARGS...]")
    if argv[0] == "-m":
        if len(argv) < 2:
            raise ValueError("-m names no module")

        def target():
            sys.argv = [argv[1]] + list(argv[2:])
            sys.path.insert(0, os.getcwd())
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return target
    if argv[0] == "-c":
        if len(argv) < 2:
            raise ValueError("-c gives no code")

        def target():
            sys.argv = ["-c"] + list(argv[2:])
            sys.path.insert(0, "")
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
        return target
    script = argv[0]
    if not os.path.isfile(script):
        raise ValueError("program '%s' is not a file" % script)

    def target():
        sys.argv = list(argv)
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        runpy.run_path(script, run_name="__main__")
    return target


def record(target, world, ranks, jobs, out, timeout, per_node, preload=(), master_port=29500, on_rank=None,
           fake_tensors=False):
    """Runs `target` (a callable) once per rank in `ranks`, forked from this interpreter, `jobs` at
    a time, each with `timeout` seconds; writes the dumps and record.json into `out`; returns
    record.json's object. `on_rank(result)` is called as each rank ends."""
    import importlib
    import torch
    recorder = _install(())
    # What a distributed program's first collective imports lazily (torch._dynamo behind every
    # c10d call's compile guard, DeviceMesh, DTensor, FSDP2): imported once here, not per rank.
    for m in _WARM:
        try:
            importlib.import_module(m)
        except Exception:  # noqa: BLE001 - a module this PyTorch lacks is imported by no rank either
            pass
    for m in preload:
        importlib.import_module(m)
    os.makedirs(os.path.join(out, "ranks"), exist_ok=True)
    os.makedirs(os.path.join(out, "p2p"), exist_ok=True)
    opts = {"out": out, "world": world, "per_node": per_node, "master_port": master_port, "fake_tensors": fake_tensors,
            "recorded": frozenset(ranks)}
    torch_version = str(torch.__version__)
    pending = list(ranks)
    running = {}  # pid -> (rank, started, deadline, terminated_at)
    results = {}
    started_all = time.monotonic()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        while pending or running:
            # A rank waiting for a peer's send (p2p/waiting-<r>) does not hold one of the --jobs places.
            while pending and sum(1 for r in running.values()
                                  if not os.path.exists(os.path.join(out, "p2p", "waiting-%d" % r[0]))) < jobs:
                rank = pending.pop(0)
                pid = os.fork()
                if pid == 0:
                    try:
                        _run_rank(rank, opts, recorder, torch_version, target)
                    finally:
                        os._exit(70)
                now = time.monotonic()
                running[pid] = [rank, now, now + timeout, None]
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                now = time.monotonic()
                for p, r in running.items():
                    if r[3] is None and now > r[2]:
                        os.kill(p, signal.SIGTERM)
                        r[3] = now
                    elif r[3] is not None and now > r[3] + 5:
                        os.kill(p, signal.SIGKILL)
                time.sleep(0.005)
                continue
            if pid not in running:
                continue
            rank, t0, deadline, term = running.pop(pid)
            res = _collect(out, rank, status, time.monotonic() - t0, term is not None, timeout)
            results[rank] = res
            if on_rank:
                on_rank(res)
    except BaseException:
        for p in running:
            try:
                os.kill(p, signal.SIGKILL)
                os.waitpid(p, 0)
            except OSError:
                pass
        raise
    summary = {"torch": torch_version, "python": sys.version.split()[0], "world_size": world, "ranks_recorded": list(ranks),
               "jobs": jobs, "timeout_s": timeout, "nproc_per_node": per_node, "seconds": time.monotonic() - started_all,
               "dump_prefix": DUMP_PREFIX, "ranks": [results[r] for r in sorted(results)]}
    with open(os.path.join(out, "record.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def _collect(out, rank, status, seconds, terminated, timeout):
    """How a rank ended: its own report, else what its exit status says."""
    path = os.path.join(out, "ranks", "rank-%d.result" % rank)
    res = None
    try:
        with open(path) as f:
            res = json.load(f)
    except (OSError, ValueError):
        res = None
    if res is None:
        res = {"rank": rank, "records": 0, "groups": 0, "init_calls": 0}
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            if terminated:
                res.update(status="timeout", exit_code=-sig, error="ran past its deadline of %g s and was killed" % timeout)
            else:
                try:
                    signame = signal.Signals(sig).name
                except ValueError:
                    signame = str(sig)
                res.update(status="signal", exit_code=-sig, error="killed by %s" % signame)
        else:
            code = os.WEXITSTATUS(status)
            res.update(status="exit", exit_code=code, error="exited with status %d before its end was noted (os._exit)" % code)
        dump = os.path.join(out, DUMP_PREFIX + str(rank))
        if os.path.exists(dump):
            res["dump"] = os.path.basename(dump)
    elif terminated and res.get("status") == "ok":
        res.update(status="timeout", error="ran past its deadline of %g s" % timeout)
    if res.get("status") == "timeout":
        res["error"] = "ran past its deadline of %g s" % timeout + (" (at %s)" % res["where"] if res.get("where") else "")
    res["seconds"] = round(seconds, 3)
    res["stdout"] = os.path.join("ranks", "rank-%d.out" % rank)
    res["stderr"] = os.path.join("ranks", "rank-%d.err" % rank)
    return res


def _parse_ranks(text, world):
    out = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise ValueError("--ranks '%s': an empty item" % text)
        lo, _, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi) if hi else int(lo)
        except ValueError:
            raise ValueError("--ranks '%s': '%s' is not a rank or a range a-b" % (text, part)) from None
        if a < 0 or b >= world or a > b:
            raise ValueError("--ranks '%s': '%s' is not within ranks 0-%d" % (text, part, world - 1))
        out.update(range(a, b + 1))
    return sorted(out)


def main(argv):
    """The tool's entry: --world N --out DIR --jobs J --timeout S --per-node K [--ranks SET]
    [--preload M]... -- PROGRAM ARGS... Exit 0 when every rank was run (what each did is in
    record.json), 2 on a usage error, 3 when the program could not be started."""
    opts = {"ranks": None, "preload": [], "jobs": os.cpu_count() or 1, "timeout": 300.0, "per_node": None, "fake_tensors": False}
    i = 0
    while i < len(argv) and argv[i] != "--":
        k = argv[i]
        if k == "--fake-tensors":
            opts["fake_tensors"] = True
            i += 1
            continue
        if i + 1 >= len(argv):
            sys.stderr.write("meshsim record runner: %s needs a value\n" % k)
            return 2
        v = argv[i + 1]
        if k == "--world":
            opts["world"] = int(v)
        elif k == "--out":
            opts["out"] = v
        elif k == "--jobs":
            opts["jobs"] = int(v)
        elif k == "--timeout":
            opts["timeout"] = float(v)
        elif k == "--per-node":
            opts["per_node"] = int(v)
        elif k == "--ranks":
            opts["ranks"] = v
        elif k == "--preload":
            opts["preload"].append(v)
        else:
            sys.stderr.write("meshsim record runner: unknown option %s\n" % k)
            return 2
        i += 2
    program = argv[i + 1:]
    world = opts["world"]
    ranks = _parse_ranks(opts["ranks"], world) if opts["ranks"] else list(range(world))
    try:
        target = _program(program)
    except ValueError as e:
        sys.stderr.write("meshsim record: %s\n" % e)
        return 3
    try:
        import torch  # noqa: F401
        import torch.distributed  # noqa: F401
    except ImportError as e:
        sys.stderr.write("meshsim record: this Python (%s) cannot import torch: %s\n" % (sys.executable, e))
        return 3
    try:
        record(target, world, ranks, opts["jobs"], opts["out"], opts["timeout"], opts["per_node"] or world, opts["preload"],
               fake_tensors=opts["fake_tensors"])
    except ImportError as e:
        sys.stderr.write("meshsim record: --preload: %s\n" % e)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
