"""`meshsim trace check` against its two peers on the same Flight Recorder dumps, in the same run:
CPython's own `pickle.load` of every file (nothing checked: the floor for a reader that builds
Python's objects) and PyTorch's analyzer (`python -m torch.distributed.flight_recorder.fr_trace`).

    .venv/bin/python bench/trace_read_bench.py --exe build/default/apps/meshsim [--dumps 1024,16384]
        [--frames 1] [--steps 8] [--rounds 3] [--no-fr-trace]

Dumps: tests/traces/make_fr_dumps.py's pp=4 x dp x tp=8 job (dp = dumps / 32), --steps steps,
--frames Python frames per record (PyTorch writes the stack of the call, often 20-40). Each
row: CPU time (user + system of the child, as getrusage counts it) and wall time, the best of
--rounds; the interpreter's own start (`python -c pass`) is subtracted from the Python rows.
Ratios are to pickle.load's CPU time of the same files in the same run."""
import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GEN = os.path.join(HERE, "..", "tests", "traces", "make_fr_dumps.py")
LOAD = "import os, pickle, sys\nd = sys.argv[1]\nfor f in sorted(os.listdir(d)):\n    with open(os.path.join(d, f), 'rb') as h:\n        pickle.load(h)\n"


def run(argv):
    """CPU seconds (user + system) and wall seconds of one child."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode not in (0, 1):
        sys.exit("failed (%d): %s\n%s" % (p.returncode, " ".join(argv), p.stderr.decode()[-2000:]))
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def best(argv, rounds):
    cpu = wall = float("inf")
    for _ in range(rounds):
        c, w = run(argv)
        cpu, wall = min(cpu, c), min(wall, w)
    return cpu, wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exe", required=True)
    ap.add_argument("--dumps", default="1024,16384")
    ap.add_argument("--frames", type=int, default=1)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-fr-trace", action="store_true", help="leave PyTorch's analyzer out (it takes minutes at 16,384)")
    a = ap.parse_args()
    py = sys.executable
    work = tempfile.mkdtemp(prefix="meshsim-trace-bench-")
    try:
        start, _ = best([py, "-c", "pass"], a.rounds)
        print("interpreter start (subtracted): %.3f s CPU" % start)
        print("| dumps | input | reader | CPU s | wall s | CPU / pickle.load |")
        print("|---|---|---|---|---|---|")
        for n in [int(x) for x in a.dumps.split(",")]:
            if n % 32 or n < 32:
                sys.exit("--dumps: %d is not a multiple of 32 (pp=4 x tp=8)" % n)
            d = os.path.join(work, "d%d" % n)
            subprocess.run([py, GEN, d, "--pp", "4", "--dp", str(n // 32), "--tp", "8", "--steps", str(a.steps),
                            "--frames", str(a.frames)], check=True, stdout=subprocess.DEVNULL)
            size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
            rows = []
            load_cpu, load_wall = best([py, "-c", LOAD, d], a.rounds)
            floor = max(load_cpu - start, 1e-9)
            rows.append(("CPython pickle.load, nothing checked", floor, load_wall))
            for jobs in (1, os.cpu_count() or 1):
                c, w = best([a.exe, "trace", "check", d, "--jobs", str(jobs)], a.rounds)
                rows.append(("meshsim trace check --jobs %d" % jobs, c, w))
            if not a.no_fr_trace:
                c, w = best([py, "-m", "torch.distributed.flight_recorder.fr_trace", "-p", "rank_", d], 1)
                rows.append(("PyTorch fr_trace", c - start, w))
            for name, c, w in rows:
                print("| %d | %.1f MB | %s | %.3f | %.3f | %.2f |" % (n, size / 1e6, name, c, w, c / floor))
            shutil.rmtree(d)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
