#!/usr/bin/env python3
"""Writes one PyTorch Flight Recorder dump per rank of a pp x dp x tp job, in the exact shape
c10d's FlightRecorder writes them (torch/csrc/distributed/c10d/FlightRecorderDetail.hpp at
pytorch/pytorch cb41e3a4d13921611dde43bb6aa6cf38d22f7f73: dump() and getCollectiveTrace();
key names and version "2.10" from FlightRecorder.hpp at 911ce84be4781dedb006b619397019e894f94373),
as a pickle (Python's `pickle`, any protocol) or as the JSON form (dump_json()), with faults
planted at chosen ranks. Used by the tests of `meshsim trace check`.

  make_fr_dumps.py OUT --pp 4 --dp 32 --tp 8 --steps 4 --plant hang@517 --plant dtype@300

Each step, every rank issues: a TP all_gather; its pipeline receive (pp rank > 0) and send (pp
rank < pp - 1) on the PP group; a TP reduce_scatter; a DP reduce_scatter; an all_reduce on the
default group. Plants (KIND@RANK):
  hang        the rank stops before the last step's DP reduce_scatter; its DP peers wait in
              that reduce_scatter, everyone else in the default group's all_reduce
  dtype       the second-to-last step's TP all_gather in Float, not BFloat16
  dtypeall    every step's TP all_gather in Float (one mismatch per step, on one group)
  size        the second-to-last step's TP all_gather with a larger input
  type        the second-to-last step's TP all_gather recorded as an all_reduce
  p2psize     the second-to-last step's pipeline send with a larger tensor
  extrarecv   after its last step the rank posts a receive its pipeline peer never meets
  membership  the rank's pg_config lists its TP group with a wrong rank
  missing     no dump is written for the rank
  stuckin     the rank's last DP reduce_scatter stays started (it is stuck inside it) while its DP
              peers completed it; it never issues the world all_reduce that everyone else waits in
  bundle      (with --coalesced) the second-to-last step's coalesced DP block lacks one of its
              two reduce_scatters

--pp-allreduce adds an all_reduce on the PP group after each step's sends and receives (one group
carrying both, as torchtitan's gradient-norm reduction over pp).

--ring-exchange adds, each step after the TP reduce_scatter, a ring exchange on a context-parallel
group of the TP group's ranks (its own group, "mesh_cp"): each rank's batch_isend_irecv of a send
to the next rank of the ring and a receive from the previous, recorded as c10d records a batched
p2p block (each op is_p2p with the block's p2p_seq_id, then an is_p2p "nccl:coalesced" record).
Plants: ringsize (the last step's send of the block larger), ringskip (the rank leaves
out its last step's block: its ring peers wait in theirs, everyone else in the world all_reduce),
ringhalf (the last step's block holds only the send: its ring predecessor's send is never met, so
that rank stops there, its DP peers wait in the DP reduce_scatter, everyone else in the world
all_reduce).

--idle-default-group leaves out the default group's all_reduce; with it, the group's communicator
is never set up, so no dump lists the group (c10d records a group's ranks when it sets up its
communicator): the dumps of a large job as its ranks write them when only the mesh's groups talk
(each dump otherwise lists every rank of the job, 2^32 numbers in 2^16 dumps of 2^16 ranks).

--coalesced issues the DP reduce_scatter as a coalesced block of two (each recorded with the
block's sequence id, then the "nccl:coalesced" record, as c10d records them since 2.7).

--from-trace TRACE.json writes instead the dumps of a job that runs, --steps times, the step
`meshsim step ... --ranks all --trace TRACE.json` planned (groups of up to 16 ranks), after one
barrier on the default group; plants: planop@R (the last step's third all_gather recorded as a
reduce_scatter), planswap@R (the last step's first two adjacent records of different operations
swapped), planhang@R (the rank stops before the last step's tenth record), planrouted@R (every
all-to-all whose bytes follow the routing, as the trace marks them, a third larger in the last
step), plansize@R (the first all-to-all of a fixed size a third larger).

--world-mesh S0,S1,... (with --from-trace) takes a trace of a few ranks, at least one per pp
coordinate (`meshsim step ... --ranks 0,R1,... --trace`), and writes every rank of a world laid
out as that row-major mesh with pp outermost (torchtitan's [pp, dp_shard, tp] order): each rank
runs its pp coordinate's traced program, each event on the group that varies the mesh dims its
traced rank's group varies (found from the trace's members, checked on every traced event), a
send or receive to the rank of its peer's pp coordinate. Any group size then, and 2^16 ranks from
a trace of 8; with --idle-default-group no barrier on, and no listing of, the default group;
--frames N frames a record.
"""
import argparse
import json
import os
import pickle


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--plant", action="append", default=[])
    ap.add_argument("--format", choices=["pickle", "json"], default="pickle")
    ap.add_argument("--protocol", type=int, default=pickle.DEFAULT_PROTOCOL)
    ap.add_argument("--ring", type=int, default=2000, help="entries each rank's ring buffer keeps")
    ap.add_argument("--prefix", default="rank_")
    ap.add_argument("--coalesced", action="store_true")
    ap.add_argument("--pp-allreduce", action="store_true", help="an all_reduce on the PP group after each step's pipeline sends")
    ap.add_argument("--ring-exchange", action="store_true", help="a batched ring exchange on a cp group each step")
    ap.add_argument("--from-trace")
    ap.add_argument("--world-mesh", help="with --from-trace: the world's row-major mesh sizes, pp first (8,1024,8)")
    ap.add_argument("--idle-default-group", action="store_true",
                    help="the default group issues no collective (no loss all_reduce on it): c10d sets up a "
                         "group's communicator, and records its ranks, at its first collective, so no dump lists it")
    ap.add_argument("--frames", type=int, default=1,
                    help="Python frames per record (PyTorch writes the stack where the collective was called, often 20-40)")
    a = ap.parse_args()
    if a.from_trace:
        return from_trace(a)

    plants = {}
    for p in a.plant:
        kind, rank = p.split("@")
        plants.setdefault(int(rank), set()).add(kind)
    world = a.pp * a.dp * a.tp

    def coords(r):
        return r // (a.dp * a.tp), (r // a.tp) % a.dp, r % a.tp

    def rank_of(p, d, t):
        return (p * a.dp + d) * a.tp + t

    def tp_ranks(r):
        p, d, _ = coords(r)
        return [rank_of(p, d, t) for t in range(a.tp)]

    def dp_ranks(r):
        p, _, t = coords(r)
        return [rank_of(p, d, t) for d in range(a.dp)]

    def pp_ranks(r):
        _, d, t = coords(r)
        return [rank_of(p, d, t) for p in range(a.pp)]

    # Group names: the default group "0"; TP groups by new_group (one name per group, the same
    # on every rank); DP groups by split_group (one name shared by all of them); PP groups by
    # new_group after the TP ones.
    tp_names = {}
    pp_names = {}
    cp_names = {}
    n = 1
    for p in range(a.pp):
        for d in range(a.dp):
            tp_names[tuple(tp_ranks(rank_of(p, d, 0)))] = str(n)
            n += 1
    dp_name = str(n)
    n += 1
    for d in range(a.dp):
        for t in range(a.tp):
            pp_names[tuple(pp_ranks(rank_of(0, d, t)))] = str(n)
            n += 1
    if a.ring_exchange:
        for p in range(a.pp):
            for d in range(a.dp):
                cp_names[tuple(tp_ranks(rank_of(p, d, 0)))] = str(n)
                n += 1

    hang = [r for r, k in plants.items() if "hang" in k]
    # ringskip: the skipping rank and its ring peers stop at the last step's ring exchange;
    # ringhalf: the ring predecessor of the rank (whose send it never receives) stops there.
    ring_stopped = {x for r, k in plants.items() if "ringskip" in k for x in tp_ranks(r)}
    for r, k in plants.items():
        if "ringhalf" in k:
            g = tp_ranks(r)
            ring_stopped.add(g[(g.index(r) - 1) % len(g)])
    stuckin = [r for r, k in plants.items() if "stuckin" in k]
    hang_dp_peers = set()
    for h in hang + sorted(ring_stopped):
        hang_dp_peers.update(dp_ranks(h))

    def rs(ranks):
        return "[" + ", ".join(str(x) for x in ranks) + "]"

    # Each record's frames, as c10d's pickler writes a CapturedTraceback: fresh dicts per record
    # whose strings repeat (its pickler shares repeated strings through the memo, as Python's
    # does for these, not the dicts).
    frame_names = [("train_step", "train.py", 42)] + [
        ("forward_%d" % k, "/usr/lib/python3/site-packages/torch/nn/modules/module_%d.py" % k, 100 + k)
        for k in range(1, max(a.frames, 1))]

    def stack():
        return [{"name": n, "filename": f, "line": l} for n, f, l in frame_names[:a.frames]]

    os.makedirs(a.out, exist_ok=True)
    for r in range(world):
        mine = plants.get(r, set())
        if "missing" in mine:
            continue
        p, d, t = coords(r)
        groups = {} if a.idle_default_group else {"0": ("default_pg", list(range(world)))}
        groups |= {
            tp_names[tuple(tp_ranks(r))]: ("mesh_tp", tp_ranks(r)),
            dp_name: ("mesh_dp", dp_ranks(r)),
            pp_names[tuple(pp_ranks(r))]: ("mesh_pp", pp_ranks(r)),
        }
        if a.ring_exchange:
            groups[cp_names[tuple(tp_ranks(r))]] = ("mesh_cp", tp_ranks(r))
        pg_config = {}
        for name, (desc, ranks) in groups.items():
            ranks = list(ranks)
            if "membership" in mine and desc == "mesh_tp":
                ranks[-1] = (ranks[-1] + a.tp) % world
            pg_config[name] = {"name": name, "desc": desc, "ranks": rs(ranks)}
        pg_ids = {name: i for i, name in enumerate(groups)}
        seq = {name: 0 for name in groups}
        p2p = {name: 0 for name in groups}
        op = {name: 0 for name in groups}
        entries = []
        clock = [1_000_000]

        def record(name, profiling, ins, in_dt, outs, out_dt, state="completed", is_p2p=False, same_seq=False,
                   same_p2p=False):
            if is_p2p and not same_p2p:
                p2p[name] += 1
            elif not same_seq:
                seq[name] += 1
            op[name] += 1
            clock[0] += 1000
            done = state == "completed"
            e = {
                "frames": stack(),
                "record_id": len(entries),
                "pg_id": pg_ids[name],
                "process_group": (name, groups[name][0]),
                "thread_name": "pt_main_thread",
                "thread_id": "140000000000000",
                "collective_seq_id": seq[name],
                "p2p_seq_id": p2p[name],
                "op_id": op[name],
                "profiling_name": profiling,
                "time_created_ns": clock[0],
                "input_sizes": ins,
                "input_dtypes": in_dt,
                "output_sizes": outs,
                "output_dtypes": out_dt,
                "state": state,
                "time_discovered_started_ns": clock[0] + 10 if state != "scheduled" else None,
                "time_discovered_completed_ns": clock[0] + 20 if done else None,
                "retired": done,
                "timeout_ms": 600000,
                "is_p2p": is_p2p,
            }
            if done:
                e["duration_ms"] = 0.25
            entries.append(e)

        tp_name = tp_names[tuple(tp_ranks(r))]
        pp_name = pp_names[tuple(pp_ranks(r))]
        for step in range(a.steps):
            last = step == a.steps - 1
            odd = step == a.steps - 2
            # TP all_gather
            name, ins, dt = "nccl:all_gather", [[1024, 512]], "BFloat16"
            outs = [[a.tp * 1024, 512]]
            if (odd and "dtype" in mine) or "dtypeall" in mine:
                dt = "Float"
            if odd and "size" in mine:
                ins = [[2048, 512]]
            if odd and "type" in mine:
                name, outs = "nccl:all_reduce", [[1024, 512]]
            record(tp_name, name, ins, [dt], outs, [dt])
            # pipeline: receive from the previous stage, send to the next
            width = 4096 if odd and "p2psize" in mine else 1024
            if p > 0:
                record(pp_name, f"nccl:recv {p}<-{p - 1}", [], [], [[8, 1024]], ["BFloat16"], is_p2p=True)
            if p < a.pp - 1:
                record(pp_name, f"nccl:send {p}->{p + 1}", [[8, width]], ["BFloat16"], [[8, width]], ["BFloat16"], is_p2p=True)
            if a.pp_allreduce:
                record(pp_name, "nccl:all_reduce", [[1]], ["Float"], [[1]], ["Float"])
            # TP reduce_scatter
            record(tp_name, "nccl:reduce_scatter", [[a.tp * 1024, 512]], ["BFloat16"], [[1024, 512]], ["BFloat16"])
            if a.ring_exchange:
                cp_name = cp_names[tuple(tp_ranks(r))]
                ring_peer_skips = last and r in ring_stopped
                if not (last and "ringskip" in mine):
                    nxt, prv = (t + 1) % a.tp, (t - 1) % a.tp
                    width = 4096 if last and "ringsize" in mine else 2048
                    half = last and "ringhalf" in mine
                    st = "started" if ring_peer_skips else "completed"
                    p2p[cp_name] += 1
                    record(cp_name, f"nccl:send {t}->{nxt}", [[4, width]], ["BFloat16"], [[4, width]], ["BFloat16"],
                           state=st, is_p2p=True, same_p2p=True)
                    if not half:
                        record(cp_name, f"nccl:recv {t}<-{prv}", [[4, 2048]], ["BFloat16"], [[4, 2048]], ["BFloat16"],
                               state=st, is_p2p=True, same_p2p=True)
                    record(cp_name, "nccl:coalesced", [], [], [], [], state=st, is_p2p=True, same_p2p=True)
                if ring_peer_skips:
                    break
            if last and r in hang:
                break
            # DP reduce_scatter (fp32 gradients)
            stuck = (last and r in hang_dp_peers) or (last and r in stuckin)
            st = "started" if stuck else "completed"
            record(dp_name, "nccl:reduce_scatter", [[a.dp * 256]], ["Float"], [[256]], ["Float"], state=st)
            if a.coalesced:
                if not (odd and "bundle" in mine):
                    record(dp_name, "nccl:reduce_scatter", [[a.dp * 128]], ["Float"], [[128]], ["Float"], state=st,
                           same_seq=True)
                record(dp_name, "nccl:coalesced", [], [], [], [], state=st, same_seq=True)
            if stuck:
                break
            # default group all_reduce (the loss)
            if a.idle_default_group:
                continue
            record("0", "nccl:all_reduce", [[1]], ["Float"], [[1]], ["Float"],
                   state="started" if last and (hang or stuckin or ring_stopped) else "completed")
        if "extrarecv" in mine and p > 0:
            record(pp_name, f"nccl:recv {p}<-{p - 1}", [], [], [[8, 1024]], ["BFloat16"], state="scheduled", is_p2p=True)

        entries = entries[-a.ring:]
        status = {str(pg_ids[name]): {"last_enqueued_collective": seq[name], "last_started_collective": seq[name],
                                      "last_completed_collective": seq[name]} for name in groups}
        if a.format == "pickle":
            dump = {"version": "2.10", "pg_config": pg_config, "comm_lib_version": "2.21.5", "pg_status": status,
                    "entries": entries}
            with open(os.path.join(a.out, f"{a.prefix}{r}"), "wb") as f:
                pickle.dump(dump, f, protocol=a.protocol)
        else:
            # dump_json(): process_group as a list, missing times as 0, string statuses, no
            # frames, and no "entries" key when there are none.
            for e in entries:
                e.pop("frames")
                e["process_group"] = list(e["process_group"])
                for k in ("time_discovered_started_ns", "time_discovered_completed_ns"):
                    e[k] = e[k] or 0
            dump = {"version": "2.10", "comm_lib_version": "2.21.5", "pg_config": pg_config,
                    "pg_status": {k: {kk: str(vv) for kk, vv in v.items()} for k, v in status.items()}}
            if entries:
                dump["entries"] = entries
            with open(os.path.join(a.out, f"{a.prefix}{r}.json"), "w") as f:
                json.dump(dump, f)


DTYPES = {"bfloat16": ("BFloat16", 2), "float32": ("Float", 4), "int64": ("Long", 8), "int32": ("Int", 4)}


def parse_members(text):
    """ "fsdp [0, 16, ..., (1024 ranks)]" -> ("fsdp", the first members listed, the group's size) """
    label, rest = text.split(" ", 1)
    body = rest.strip()[1:-1]
    n = None
    if "..." in body:
        body, tail = body.split("...", 1)
        n = int(tail.strip().strip("(),").split()[0])
    first = [int(x) for x in body.replace(",", " ").split()]
    return label, first, (len(first) if n is None else n)


def from_mesh_trace(a, events, plants):
    import itertools
    sizes = [int(x) for x in a.world_mesh.split(",")]
    world = 1
    for x in sizes:
        world *= x
    strides = [1] * len(sizes)
    for k in range(len(sizes) - 2, -1, -1):
        strides[k] = strides[k + 1] * sizes[k + 1]

    def coords(r):
        return [(r // strides[k]) % sizes[k] for k in range(len(sizes))]

    def members(r, dims):
        c = coords(r)
        base = sum(c[k] * strides[k] for k in range(len(sizes)) if k not in dims)
        out = [base]
        for k in dims:
            out = [x + i * strides[k] for x in out for i in range(sizes[k])]
        return sorted(out)

    subsets = [s for n in range(len(sizes) + 1) for s in itertools.combinations(range(len(sizes)), n)]
    label_dims = {}
    program = {}
    for t, evs in events.items():
        if t >= world:
            raise SystemExit(f"traced rank {t} is outside the mesh {sizes}")
        program.setdefault(coords(t)[0], t)
        for e in evs:
            label, first, n = parse_members(e["args"]["group"])
            dims = label_dims.get(label)
            if dims is None:
                fits = [s for s in subsets if members(t, s)[:16] == first and len(members(t, s)) == n]
                if not fits:
                    raise SystemExit(f"rank {t}'s group '{e['args']['group']}' varies no set of the mesh's dims {sizes}")
                dims = label_dims[label] = tuple(k for k in fits[0] if sizes[k] > 1)
            elif members(t, dims)[:16] != first or len(members(t, dims)) != n:
                raise SystemExit(f"rank {t}'s group '{e['args']['group']}' is not the one '{label}' is elsewhere")
    missing = [p for p in range(sizes[0]) if p not in program]
    if missing:
        raise SystemExit(f"no traced rank at pp coordinates {missing[:8]}: trace one rank of each")
    # Each pp coordinate's program as templates: (label dims, op, bytes, dtype, peer's pp coordinate).
    templates = {}
    for pp, t in program.items():
        out = []
        for e in sorted(events[t], key=lambda e: e["ts"]):
            args = e["args"]
            label = args["group"].split(" ", 1)[0]
            peer_pp = coords(args["peer"])[0] if "peer" in args else None
            out.append((label_dims[label], label, e["name"].split(" ")[0], args["bytes"], args["dtype"], peer_pp))
        templates[pp] = out
    names = {}  # (dims, the coordinates outside them) -> (name, desc, ranks text, members)

    def group(r, dims, label):
        c = coords(r)
        key = (dims, tuple(c[k] for k in range(len(sizes)) if k not in dims))
        g = names.get(key)
        if g is None:
            ranks = members(r, dims)
            g = names[key] = (str(len(names) + 1), "mesh_" + label, "[" + ", ".join(map(str, ranks)) + "]", ranks)
        return g

    frame_names = [("train_step", "train.py", 42)] + [
        ("forward_%d" % k, "/usr/lib/python3/site-packages/torch/nn/modules/module_%d.py" % k, 100 + k)
        for k in range(1, max(a.frames, 1))]
    os.makedirs(a.out, exist_ok=True)
    for r in range(world):
        mine = plants.get(r, set())
        c = coords(r)
        pg_config = {}
        if not a.idle_default_group:
            pg_config["0"] = {"name": "0", "desc": "default_pg", "ranks": "[" + ", ".join(map(str, range(world))) + "]"}
        seq, p2p = {}, {}
        entries = []

        def record(name, desc, profiling, ins, outs, dt, is_p2p=False):
            if is_p2p:
                p2p[name] = p2p.get(name, 0) + 1
            else:
                seq[name] = seq.get(name, 0) + 1
            entries.append({
                "frames": [{"name": n, "filename": f, "line": l} for n, f, l in frame_names[:a.frames]],
                "record_id": len(entries), "pg_id": int(name), "process_group": (name, desc),
                "thread_name": "pt_main_thread", "thread_id": "1", "collective_seq_id": seq.get(name, 0),
                "p2p_seq_id": p2p.get(name, 0), "op_id": len(entries), "profiling_name": profiling,
                "time_created_ns": 1000 * len(entries), "input_sizes": ins, "input_dtypes": [dt] * len(ins),
                "output_sizes": outs, "output_dtypes": [dt] * len(outs), "state": "completed",
                "time_discovered_started_ns": 1, "time_discovered_completed_ns": 2,
                "retired": True, "timeout_ms": 600000, "is_p2p": is_p2p})

        if not a.idle_default_group:
            record("0", "default_pg", "nccl:all_reduce_barrier", [[1]], [[1]], "Float")
        step_records = []
        for dims, label, op, nbytes, dtype, peer_pp in templates[c[0]]:
            dt, width = DTYPES[dtype]
            numel = nbytes // width
            name, desc, text, ranks = group(r, dims, label)
            pg_config[name] = {"name": name, "desc": desc, "ranks": text}
            if op in ("send", "recv"):
                peer = r + (peer_pp - c[0]) * strides[0]
                me, other = ranks.index(r), ranks.index(peer)
                prof = f"nccl:send {me}->{other}" if op == "send" else f"nccl:recv {me}<-{other}"
                ins, outs = ([[numel]], [[numel]]) if op == "send" else ([], [[numel]])
                step_records.append([name, desc, prof, ins, outs, dt, True])
                continue
            step_records.append(collective_record(name, desc, op, numel, len(ranks), dt))
        for step in range(a.steps):
            records = [list(x) for x in step_records] if step == a.steps - 1 else step_records
            if step == a.steps - 1:
                plant_last_step(records, mine)
            for x in records:
                record(*x)
        write_planned_dump(a, r, pg_config, entries)


def collective_record(name, desc, op, numel, n, dt):
    """A planned collective's record: its sizes as NCCL's (an all-gather's input and a
    reduce-scatter's output 1/n of the event's elements)."""
    ins, outs = [[numel]], [[numel]]
    if op == "all_gather":
        ins = [[numel // n]]
    elif op == "reduce_scatter":
        outs = [[numel // n]]
    return [name, desc, "nccl:" + op, ins, outs, dt, False]


def write_planned_dump(a, r, pg_config, entries):
    dump = {"version": "2.10", "pg_config": pg_config, "comm_lib_version": "2.21.5", "pg_status": {},
            "entries": entries[-a.ring:]}
    with open(os.path.join(a.out, f"{a.prefix}{r}"), "wb") as f:
        pickle.dump(dump, f, protocol=a.protocol)


def plant_last_step(records, mine):
    if "planop" in mine:
        k = [i for i, x in enumerate(records) if x[2] == "nccl:all_gather"][2]
        x = records[k]
        x[2], x[3], x[4] = "nccl:reduce_scatter", x[4], x[3]
    if "planswap" in mine:
        k = next(i for i in range(len(records) - 1) if records[i][2] != records[i + 1][2])
        records[k], records[k + 1] = records[k + 1], records[k]
    if "planhang" in mine:
        del records[9:]


def from_trace(a):
    plants = {}
    for p in a.plant:
        kind, rank = p.split("@")
        plants.setdefault(int(rank), set()).add(kind)
    with open(a.from_trace) as f:
        trace = json.load(f)
    events = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X":
            events.setdefault(e["tid"], []).append(e)
    if a.world_mesh:
        return from_mesh_trace(a, events, plants)
    world = max(events) + 1
    names = {}

    def group_of(text):
        # "tp [0, 1]" -> (dim, ranks); one name per distinct group, the same on every rank.
        dim, members = text.split(" ", 1)
        ranks = tuple(json.loads(members))
        if ranks not in names:
            names[ranks] = str(len(names) + 1)
        return names[ranks], "mesh_" + dim, list(ranks)

    os.makedirs(a.out, exist_ok=True)
    for r in range(world):
        mine = plants.get(r, set())
        prog = sorted(events[r], key=lambda e: e["ts"])
        pg_config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[" + ", ".join(map(str, range(world))) + "]"}}
        seq, p2p = {"0": 0}, {}
        entries = []

        def record(name, desc, profiling, ins, outs, dt, is_p2p=False, state="completed"):
            if is_p2p:
                p2p[name] = p2p.get(name, 0) + 1
            else:
                seq[name] = seq.get(name, 0) + 1
            entries.append({
                "frames": [], "record_id": len(entries), "pg_id": int(name), "process_group": (name, desc),
                "thread_name": "pt_main_thread", "thread_id": "1", "collective_seq_id": seq.get(name, 0),
                "p2p_seq_id": p2p.get(name, 0), "op_id": len(entries), "profiling_name": profiling,
                "time_created_ns": 1000 * len(entries), "input_sizes": ins, "input_dtypes": [dt] * len(ins),
                "output_sizes": outs, "output_dtypes": [dt] * len(outs), "state": state,
                "time_discovered_started_ns": 1, "time_discovered_completed_ns": 2 if state == "completed" else None,
                "retired": state == "completed", "timeout_ms": 600000, "is_p2p": is_p2p})

        record("0", "default_pg", "nccl:all_reduce_barrier", [[1]], [[1]], "Float")
        for step in range(a.steps):
            last = step == a.steps - 1
            records = []
            for e in prog:
                args = e["args"]
                op = e["name"].split(" ")[0]
                dt, width = DTYPES[args["dtype"]]
                numel = args["bytes"] // width
                name, desc, ranks = group_of(args["group"])
                pg_config[name] = {"name": name, "desc": desc, "ranks": "[" + ", ".join(map(str, ranks)) + "]"}
                if op in ("send", "recv"):
                    me, peer = ranks.index(r), ranks.index(args["peer"])
                    prof = f"nccl:send {me}->{peer}" if op == "send" else f"nccl:recv {me}<-{peer}"
                    ins, outs = ([[numel]], [[numel]]) if op == "send" else ([], [[numel]])
                    records.append([name, desc, prof, ins, outs, dt, True])
                    continue
                records.append(collective_record(name, desc, op, numel, len(ranks), dt))
                if last and op == "all_to_all" and ("planrouted" in mine and args.get("routed")
                                                    or "plansize" in mine and not args.get("routed")):
                    # The router sent this rank a third more (routed) or a planned fixed size changed.
                    mine = mine - {"plansize"}
                    records[-1][3] = records[-1][4] = [[numel + numel // 3]]
            if last:
                plant_last_step(records, mine)
            for x in records:
                record(*x)
        write_planned_dump(a, r, pg_config, entries)


if __name__ == "__main__":
    main()
