"""`meshsim trace check` against its two peers on the same Flight Recorder dumps, in the same run:
CPython's own `pickle.load` of every file (nothing checked: the floor for a reader that builds
Python's objects) and PyTorch's analyzer (`python -m torch.distributed.flight_recorder.fr_trace`).

    .venv/bin/python bench/trace_read_bench.py --exe build/default/apps/meshsim [--dumps 1024,16384]
        [--frames 1] [--steps 8] [--rounds 7] [--format pickle|json] [--idle-default-group]
        [--no-fr-trace] [--against FLAGS] [--planned]

Dumps: tests/traces/make_fr_dumps.py's pp=4 x dp x tp=8 job (dp = dumps / 32), --steps steps,
--frames Python frames per record (PyTorch writes the stack of the call, often 20-40), as pickles
(c10d's default) or as JSON (the peer is then CPython's json.load); --idle-default-group: the
default group never talks, so no dump lists its ranks (each dump otherwise holds all of them:
65,536 dumps of a 65,536-rank job, 29 GB). Each row: CPU time (user + system of the child, as
getrusage counts it: the median and the least of --rounds, the readers interleaved round by
round), median wall time and peak RSS; the interpreter's own start (`python -c pass`, in the
same rounds) is subtracted from the Python rows. Ratios are to pickle.load's (json.load's)
CPU time of the same files in the same run. --against FLAGS adds `trace check --against FLAGS`
(a plan of another job: every rank's first record leaves it, so the row is the plan's cost).
--planned writes instead the dumps of a job that ran a torchtitan plan: pp=8 x dp_shard x tp=8
(dp_shard = dumps / 64; a 6-layer llama3 of dim 256, GPipe, one microbatch), from `meshsim step
--trace` of one rank per pp coordinate (make_fr_dumps.py --world-mesh), and times `trace check
--against` that plan beside the check alone: the plan's cost when every record is held to it."""
import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GEN = os.path.join(HERE, "..", "tests", "traces", "make_fr_dumps.py")
LOAD = "import os, {mod}, sys\nd = sys.argv[1]\nfor f in sorted(os.listdir(d)):\n    with open(os.path.join(d, f), 'rb') as h:\n        {mod}.load(h)\n"


def run(argv):
    """CPU seconds (user + system), wall seconds and peak RSS (MB) of one child."""
    t = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = p.stderr.read()
    _, status, use = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    rc = os.waitstatus_to_exitcode(status)
    if rc not in (0, 1):
        sys.exit("failed (%d): %s\n%s" % (rc, " ".join(argv), err.decode()[-2000:]))
    return use.ru_utime + use.ru_stime, wall, use.ru_maxrss / 1024


def measure(readers, rounds):
    """Each reader once per round, the rounds interleaved (a quiet or a busy moment of a shared
    machine falls on every reader alike): per reader the median and the least CPU, the median
    wall time and the peak RSS."""
    runs = {name: [] for name, _ in readers}
    for _ in range(rounds):
        for name, argv in readers:
            runs[name].append(run(argv))
    out = {}
    for name, rs in runs.items():
        cpu = [r[0] for r in rs]
        out[name] = (statistics.median(cpu), min(cpu), statistics.median(r[1] for r in rs), max(r[2] for r in rs))
    return out


MODEL = """[model]
name = "llama3-bench"
n_layers = 6
dim = 256
ffn_dim = 768
n_heads = 16
n_kv_heads = 8
vocab_size = 2048
"""


def planned_dumps(a, work, d, dp):
    """Writes into d the dumps of a job that ran the plan it returns (meshsim step's flags)."""
    model = os.path.join(work, "model.toml")
    with open(model, "w") as f:
        f.write(MODEL)
    flags = ("--preset torchtitan:pp=8,dp_shard=%d,tp=8 --model %s --seq-len 256 --local-batch-size 1 "
             "--microbatches 1 --schedule GPipe" % (dp, model))
    trace = os.path.join(work, "plan.json")
    ranks = ",".join(str(p * dp * 8) for p in range(8))
    subprocess.run([a.exe, "step"] + flags.split() + ["--ranks", ranks, "--trace", trace], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([sys.executable, GEN, d, "--from-trace", trace, "--world-mesh", "8,%d,8" % dp, "--steps", str(a.steps),
                    "--frames", str(a.frames)] + (["--idle-default-group"] if a.idle_default_group else []),
                   check=True, stdout=subprocess.DEVNULL)
    return flags


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exe", required=True)
    ap.add_argument("--dumps", default="1024,16384")
    ap.add_argument("--frames", type=int, default=1)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-fr-trace", action="store_true", help="leave PyTorch's analyzer out (it takes minutes at 16,384)")
    ap.add_argument("--format", choices=["pickle", "json"], default="pickle")
    ap.add_argument("--idle-default-group", action="store_true")
    ap.add_argument("--against", help="also time `trace check --against FLAGS`")
    ap.add_argument("--planned", action="store_true", help="the dumps of a job that ran a torchtitan plan, held to it")
    a = ap.parse_args()
    py = sys.executable
    mod = "pickle" if a.format == "pickle" else "json"
    work = tempfile.mkdtemp(prefix="meshsim-trace-bench-")
    try:
        print("| dumps | input | reader | CPU s (median) | CPU s (least) | wall s | peak RSS MB | CPU / %s.load (median, least) |" % mod)
        print("|---|---|---|---|---|---|---|---|")
        if a.planned and a.format != "pickle":
            sys.exit("--planned writes pickles only")
        for n in [int(x) for x in a.dumps.split(",")]:
            d = os.path.join(work, "d%d" % n)
            against = a.against
            if a.planned:
                if n % 64 or n < 64:
                    sys.exit("--dumps: %d is not a multiple of 64 (pp=8 x tp=8)" % n)
                against = planned_dumps(a, work, d, n // 64)
            else:
                if n % 32 or n < 32:
                    sys.exit("--dumps: %d is not a multiple of 32 (pp=4 x tp=8)" % n)
                subprocess.run([py, GEN, d, "--pp", "4", "--dp", str(n // 32), "--tp", "8", "--steps", str(a.steps),
                                "--frames", str(a.frames), "--format", a.format]
                               + (["--idle-default-group"] if a.idle_default_group else []),
                               check=True, stdout=subprocess.DEVNULL)
            size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
            load = "CPython %s.load, nothing checked" % mod
            readers = [("start", [py, "-c", "pass"]), (load, [py, "-c", LOAD.format(mod=mod), d])]
            for jobs in (1, os.cpu_count() or 1):
                readers.append(("meshsim trace check --jobs %d" % jobs, [a.exe, "trace", "check", d, "--jobs", str(jobs)]))
            if against:
                for jobs in (1, os.cpu_count() or 1):
                    readers.append(("meshsim trace check --jobs %d --against" % jobs,
                                    [a.exe, "trace", "check", d, "--jobs", str(jobs), "--against", against]))
            got = measure(readers, a.rounds)
            if not a.no_fr_trace and a.format == "pickle":  # fr_trace reads pickles only (and takes seconds: once)
                got.update(measure([("PyTorch fr_trace", [py, "-m", "torch.distributed.flight_recorder.fr_trace", "-p", "rank_", d])], 1))
            start_med, start_least = got.pop("start")[:2]
            python = {load, "PyTorch fr_trace"}
            rows = {}
            for name, (med, least, wall, rss) in got.items():
                if name in python:  # the interpreter's own start, measured in the same rounds, subtracted
                    med, least = med - start_med, least - start_least
                rows[name] = (max(med, 1e-9), max(least, 1e-9), wall, rss)
            floor_med, floor_least = rows[load][:2]
            print("interpreter start (subtracted from the Python rows): median %.3f s, least %.3f s CPU" % (start_med, start_least))
            for name, (med, least, wall, rss) in rows.items():
                print("| %d | %.1f MB | %s | %.3f | %.3f | %.3f | %.0f | %.2f, %.2f |"
                      % (n, size / 1e6, name, med, least, wall, rss, med / floor_med, least / floor_least))
            shutil.rmtree(d)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
