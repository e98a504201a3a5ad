#!/usr/bin/env python3
"""`meshsim run --backend gloo` under the launchers users run: real torchrun and real mpirun.

torchrun (Debian's python3-torch 1.13): one node of 4 workers on the agent's store; two nodes
of 2 on loopback (two agents, `--nnodes 2 --node_rank K`); `--standalone` (rank 0 serves the
store); planted faults, whose root cause torchrun itself must print with meshsim's diagnosis.
mpirun (Debian's openmpi-bin): 4 processes, rank 0 serving the store at MASTER_ADDR:MASTER_PORT.
Each case prints how long the launcher took. A launcher that is not installed is skipped with
the reason printed; exit 77 (ctest: skipped) when neither is.
"""
import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

ARGS = None
TORCHRUN = shutil.which("torchrun")
MPIRUN = shutil.which("mpirun")
MESH = ["--mesh", "dp=2,tp=2"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env():
    env = dict(os.environ)
    for k in list(env):
        if k.startswith(("MESHSIM_", "TORCHELASTIC_", "OMPI_", "PMI_", "SLURM_")) or k in (
                "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            del env[k]
    return env


def torchrun(logdir, *extra, nproc=4, fault=None, timeout_s=5):
    # Debian's torchrun 1.13 on Python 3.11 fails in its own code when it builds the default
    # stdout/stderr redirect mode (its `Std` flag enum); naming the modes explicitly avoids it.
    cmd = [TORCHRUN, "--nproc_per_node", str(nproc), "--redirects", "1", "--tee", "1", "--log_dir", logdir,
           *extra, "--no_python", ARGS.meshsim, "run", "--backend", "gloo", *MESH, "--timeout", str(timeout_s)]
    if fault:
        cmd += ["--fault", fault]
    return cmd


def run(cmd, timeout=120):
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=clean_env())
    secs = time.monotonic() - t0
    return p.returncode, p.stdout + p.stderr, secs


def report(name, secs):
    print(f"\n  [{name}: {secs:.2f} s]", end=" ", file=sys.stderr)


@unittest.skipUnless(TORCHRUN, "torchrun is not installed (Debian's python3-torch)")
class UnderTorchrun(unittest.TestCase):
    def setUp(self):
        self.logdir = tempfile.mkdtemp(prefix="meshsim-torchrun-")

    def tearDown(self):
        shutil.rmtree(self.logdir, ignore_errors=True)

    def test_one_node_of_four_workers_joins_the_agent_store(self):
        rc, out, secs = run(torchrun(self.logdir, "--master_port", str(free_port())))
        report("torchrun, 1 node x 4", secs)
        self.assertEqual(rc, 0, out)
        self.assertEqual(out.count("OK: every rank's groups match"), 4, out)
        self.assertIn("checks passed: 24 of 24", out)
        self.assertIn("launched by torchrun", out)

    def test_two_nodes_of_two_workers_on_loopback(self):
        port = str(free_port())
        t0 = time.monotonic()
        procs = [subprocess.Popen(torchrun(os.path.join(self.logdir, str(k)), "--nnodes", "2", "--node_rank", str(k),
                                           "--master_addr", "127.0.0.1", "--master_port", port, nproc=2),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env())
                 for k in (0, 1)]
        outs = [p.communicate(timeout=120)[0] for p in procs]
        report("torchrun, 2 nodes x 2", time.monotonic() - t0)
        self.assertEqual([p.returncode for p in procs], [0, 0], outs)
        self.assertIn("checks passed: 24 of 24", outs[0])  # global rank 0 reports the whole job
        for o in outs:
            self.assertEqual(o.count("OK: every rank's groups match"), 2, o)

    def test_standalone_rank_zero_serves_the_store(self):
        # --standalone: the agent's store is not shared (TORCHELASTIC_USE_AGENT_STORE=False) and
        # MASTER_ADDR is a host name: rank 0 serves meshsim's store there.
        rc, out, secs = run(torchrun(self.logdir, "--standalone"))
        report("torchrun --standalone, 4", secs)
        self.assertEqual(rc, 0, out)
        self.assertEqual(out.count("OK: every rank's groups match"), 4, out)

    def check_root_cause(self, fault, kind, timeout_s=5):
        rank = int(fault.split("@")[1])
        rc, out, secs = run(torchrun(self.logdir, "--master_port", str(free_port()), fault=fault, timeout_s=timeout_s))
        report(f"torchrun, fault {fault}", secs)
        self.assertNotEqual(rc, 0, out)
        self.assertLess(secs, 60)
        root = out[out.index("Root Cause"):]
        # torchrun's own report: the faulty rank, and meshsim's diagnosis naming it.
        self.assertRegex(root, rf"rank\s*: {rank} \(local_rank: {rank}\)")
        self.assertIn(f"rank {rank} [{kind}]", root)
        self.assertNotIn("<N/A>", root)

    def test_a_mismatch_is_torchruns_root_cause(self):
        self.check_root_cause("mismatch@2", "mismatch")

    def test_a_skipped_collective_is_torchruns_root_cause(self):
        self.check_root_cause("skip@3", "departed", timeout_s=3)

    def test_a_rank_whose_process_dies_is_named_by_its_peers(self):
        # PyTorch's store has no wills: the peers on this host tell from its pid that it is gone.
        rc, out, secs = run(torchrun(self.logdir, "--master_port", str(free_port()), fault="exit@1", timeout_s=3))
        report("torchrun, fault exit@1", secs)
        self.assertNotEqual(rc, 0, out)
        self.assertLess(secs, 60)
        self.assertIn("rank 1 [exit]", out[out.index("Root Cause"):])

    def test_a_thrown_error_is_torchruns_root_cause(self):
        self.check_root_cause("throw@1", "error")


@unittest.skipUnless(MPIRUN, "mpirun is not installed (Debian's openmpi-bin)")
class UnderMpirun(unittest.TestCase):
    def mpirun(self, *meshsim_args):
        env = ["-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={free_port()}"]
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        return [MPIRUN, *root, "--oversubscribe", "-n", "4", *env, ARGS.meshsim, "run", "--backend", "gloo", *MESH,
                "--timeout", "5", *meshsim_args]

    def test_four_processes(self):
        rc, out, secs = run(self.mpirun())
        report("mpirun -n 4", secs)
        self.assertEqual(rc, 0, out)
        self.assertEqual(out.count("OK: every rank's groups match"), 4, out)
        self.assertIn("launched by openmpi", out)

    def test_a_planted_fault_names_the_rank(self):
        rc, out, secs = run(self.mpirun("--fault", "mismatch@1"))
        report("mpirun -n 4, fault mismatch@1", secs)
        self.assertNotEqual(rc, 0, out)
        self.assertRegex(out, r"FAILED rank 1 \[mismatch\]")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--peer", required=True)
    parser.add_argument("--meshsim", required=True)
    ARGS, rest = parser.parse_known_args()
    if not TORCHRUN and not MPIRUN:
        print("SKIPPED: neither torchrun (python3-torch) nor mpirun (openmpi-bin) is installed")
        sys.exit(77)
    unittest.main(argv=[sys.argv[0], "-v", *rest])
