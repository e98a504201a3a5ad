#!/usr/bin/env python3
"""`meshsim run --backend gloo` under the launchers users run: real torchrun and real mpirun.

torchrun (the one beside the interpreter running this file: Debian's python3-torch, 1.13 on
Debian 12, or the project's .venv with torch 2.13): one node of 4 workers on the agent's store; two nodes
of 2 on loopback (two agents, `--nnodes 2 --node_rank K`); `--standalone` (rank 0 serves the
store); planted faults, whose root cause torchrun itself must print with meshsim's diagnosis.
mpirun (Debian's openmpi-bin) and mpiexec.mpich (Debian's mpich): 4 processes, rank 0 serving the
store at MASTER_ADDR:MASTER_PORT. srun (Debian's slurm-wlm): a one-node cluster this test starts
itself as root (slurmctld and slurmd in a directory of its own, on ports of its own, stopped by
pid at the end), then `srun -n 4`.
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
# The torchrun of this interpreter's torch (ctest runs this file once per torch: Debian's and
# .venv's).
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
TORCHRUN = TORCHRUN if os.access(TORCHRUN, os.X_OK) else None
TORCH_MAJOR = 0
if TORCHRUN:
    TORCH_MAJOR = int(subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                                     text=True, timeout=120).stdout.split(".")[0] or 0)
# Open MPI's own mpirun: with MPICH installed beside it, plain `mpirun` may be either.
MPIRUN = shutil.which("mpirun.openmpi") or shutil.which("mpirun")
MPIEXEC_MPICH = shutil.which("mpiexec.mpich")
SLURM = [shutil.which(c) for c in ("slurmctld", "slurmd", "srun", "sinfo")]
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


@unittest.skipUnless(TORCHRUN, f"no torchrun beside {sys.executable} (Debian's python3-torch, or .venv's torch)")
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
        root = out[out.index("Root Cause"):]
        # torchrun 1.13's root cause is a peer's failure, carrying meshsim's diagnosis; 2.x's is the
        # first failure observed, rank 1's own exit (86, no error file). Either way it names rank
        # 1, and the peers' diagnoses name it too.
        if TORCH_MAJOR >= 2:
            self.assertRegex(root, r"rank\s*: 1 \(local_rank: 1\)\s*\n\s*exitcode\s*: 86")
            self.assertIn("traceback : meshsim run: rank 0 of 4 failed: rank 1 [exit]", out)
        else:
            self.assertIn("rank 1 [exit]", root)

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


@unittest.skipUnless(MPIEXEC_MPICH, "mpiexec.mpich is not installed (Debian's mpich)")
class UnderMpich(unittest.TestCase):
    def mpiexec(self, *meshsim_args):
        env = ["-genv", "MASTER_ADDR", "127.0.0.1", "-genv", "MASTER_PORT", str(free_port())]
        return [MPIEXEC_MPICH, "-n", "4", *env, ARGS.meshsim, "run", "--backend", "gloo", *MESH, "--timeout", "5",
                *meshsim_args]

    def test_four_processes(self):
        rc, out, secs = run(self.mpiexec())
        report("mpiexec.mpich -n 4", secs)
        self.assertEqual(rc, 0, out)
        self.assertEqual(out.count("OK: every rank's groups match"), 4, out)
        self.assertIn("launched by mpich", out)

    def test_a_planted_fault_names_the_rank(self):
        for fault, kind in (("mismatch@1", "mismatch"), ("skip@2", "departed")):
            rc, out, secs = run(self.mpiexec("--fault", fault))
            report(f"mpiexec.mpich -n 4, fault {fault}", secs)
            self.assertNotEqual(rc, 0, out)
            rank = fault.split("@")[1]
            self.assertRegex(out, rf"FAILED rank {rank} \[{kind}\]")
            self.assertNotIn("OK: every rank", out)


def slurm_skip_reason():
    if not all(SLURM):
        return "slurmctld, slurmd, srun or sinfo is not installed (Debian's slurm-wlm)"
    if os.geteuid() != 0:
        return "a Slurm cluster of its own needs root (slurmd runs the tasks as their user)"
    return None


@unittest.skipIf(slurm_skip_reason(), slurm_skip_reason())
class UnderSrun(unittest.TestCase):
    """A one-node Slurm cluster of this test's own: auth/none (no munge daemon), the node is this
    host at 127.0.0.1, two free ports; stopped by pid in tearDownClass."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="meshsim-slurm-")
        host = socket.gethostname().split(".")[0]
        ctld_port, d_port = free_port(), free_port()
        for sub in ("state", "spool"):
            os.mkdir(os.path.join(cls.dir, sub))
        conf = os.path.join(cls.dir, "slurm.conf")
        with open(conf, "w") as f:
            f.write(f"""ClusterName=meshsim
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
StateSaveLocation={cls.dir}/state
SlurmdSpoolDir={cls.dir}/spool
SlurmctldPidFile={cls.dir}/slurmctld.pid
SlurmdPidFile={cls.dir}/slurmd.pid
SlurmctldLogFile={cls.dir}/slurmctld.log
SlurmdLogFile={cls.dir}/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
SlurmdParameters=config_overrides
NodeName={host} NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=meshsim Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""")
        cls.env = clean_env()
        cls.env["SLURM_CONF"] = conf
        cls.log = open(os.path.join(cls.dir, "daemons.out"), "w")
        cls.daemons = [subprocess.Popen([SLURM[0], "-D", "-i"], env=cls.env, stdout=cls.log, stderr=cls.log),
                       subprocess.Popen([SLURM[1], "-D"], env=cls.env, stdout=cls.log, stderr=cls.log)]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            p = subprocess.run([SLURM[3], "-h", "-o", "%t"], env=cls.env, capture_output=True, text=True, timeout=10)
            if p.returncode == 0 and p.stdout.strip() in ("idle", "mix", "alloc"):
                return
            time.sleep(0.3)
        logs = cls.logs()
        cls.tearDownClass()
        # The machine, not meshsim: said with the daemons' logs, and skipped.
        raise unittest.SkipTest("the test's Slurm cluster did not come up in 30 s (slurmctld/slurmd logs follow)"
                                + logs)

    @classmethod
    def logs(cls):
        out = ""
        for name in ("daemons.out", "slurmctld.log", "slurmd.log"):
            try:
                with open(os.path.join(cls.dir, name)) as f:
                    out += f"\n--- {name}\n" + f.read()[-3000:]
            except OSError:
                pass
        return out

    @classmethod
    def tearDownClass(cls):
        for d in cls.daemons:
            d.terminate()
        for d in cls.daemons:
            try:
                d.wait(timeout=10)
            except subprocess.TimeoutExpired:
                d.kill()
                d.wait()
        cls.log.close()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def srun(self, *meshsim_args):
        return [SLURM[2], "-n", "4", "--overcommit", "--time", "2", "--export", "ALL", ARGS.meshsim, "run",
                "--backend", "gloo", *MESH, "--timeout", "5", *meshsim_args]

    def run_srun(self, *meshsim_args):
        env = dict(self.env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        t0 = time.monotonic()
        p = subprocess.run(self.srun(*meshsim_args), capture_output=True, text=True, timeout=120, env=env)
        return p.returncode, p.stdout + p.stderr, time.monotonic() - t0

    def test_four_tasks(self):
        rc, out, secs = self.run_srun()
        report("srun -n 4", secs)
        self.assertEqual(rc, 0, out + self.logs())
        self.assertEqual(out.count("OK: every rank's groups match"), 4, out)
        self.assertIn("launched by slurm", out)

    def test_a_planted_fault_names_the_rank(self):
        for fault, kind in (("mismatch@1", "mismatch"), ("skip@2", "departed")):
            rc, out, secs = self.run_srun("--fault", fault)
            report(f"srun -n 4, fault {fault}", secs)
            self.assertNotEqual(rc, 0, out)
            rank = fault.split("@")[1]
            self.assertRegex(out, rf"FAILED rank {rank} \[{kind}\]")
            self.assertNotIn("OK: every rank", out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--peer", required=True)
    parser.add_argument("--meshsim", required=True)
    ARGS, rest = parser.parse_known_args()
    # One launcher's class (ctest runs each as its own test): exit 77 (ctest: skipped) with the
    # reason printed when its launcher is not here.
    chosen = [globals()[n] for n in rest if isinstance(globals().get(n), type)] or \
        [UnderTorchrun, UnderMpirun, UnderMpich, UnderSrun]
    if all(getattr(c, "__unittest_skip__", False) for c in chosen):
        for c in chosen:
            print(f"SKIPPED {c.__name__}: {c.__unittest_skip_why__}")
        sys.exit(77)
    result = unittest.main(argv=[sys.argv[0], "-v", *rest], exit=False).result
    if not result.wasSuccessful():
        sys.exit(1)
    if result.skipped and len(result.skipped) >= result.testsRun:
        for test, why in result.skipped[:1]:
            print(f"SKIPPED {test}: {why}")
        sys.exit(77)
