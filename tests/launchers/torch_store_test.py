#!/usr/bin/env python3
"""meshsim's PyTorch TCPStore client opposite a real torch.distributed.TCPStore.

The server and the Python-side client are PyTorch's own, the torch of the interpreter running
this file: Debian's python3-torch (1.13 on Debian 12) or the project's .venv (2.13, both its
servers: libuv, the default, and the legacy one); the other side is
tests/launchers/torch_store_peer.cpp over meshsim's TorchStoreClient. Keys go both ways:
PyTorch's Python TCPStore puts "/" before every key on the wire, so the peer's "/x" is Python's
"x". Exit 77 (ctest: skipped) with the reason printed when torch is not installed.
"""
import argparse
import os
import socket
import subprocess
import sys
import threading
import time
import unittest
from datetime import timedelta

try:
    import torch
    import torch.distributed as dist
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"SKIPPED: torch is not importable by {sys.executable} ({e}); scripts/install-deps.sh installs it")
    sys.exit(77)

TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
# The protocol meshsim's probe must name for this torch's server.
PROTOCOL = "torch-1.13" if TORCH < (2, 0) else "torch-2"
print(f"torch {torch.__version__} from {sys.executable}: its TCPStore speaks {PROTOCOL}", file=sys.stderr)

ARGS = None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peer(port, *ops, env=None, timeout=30):
    """Runs the peer; returns (exit status, output lines, seconds)."""
    t0 = time.monotonic()
    e = dict(os.environ)
    e.pop("MESHSIM_TORCH_STORE_PROTOCOL", None)
    e.update(env or {})
    p = subprocess.run([ARGS.peer, "127.0.0.1", str(port), *ops], capture_output=True, text=True,
                       timeout=timeout, env=e)
    return p.returncode, p.stdout.splitlines(), time.monotonic() - t0


def the_113_protocol_forced_on_a_2x_server_fails(test, port):
    """An ADD in the 1.13 protocol, forced, to a 2.x server: refused within the reply deadline
    (libuv never answers it, the legacy server closes it), naming the server and the setting."""
    rc, out, secs = peer(port, "add", "/k", "1",
                         env={"MESHSIM_TORCH_STORE_PROTOCOL": "1.13", "MESHSIM_REPLY_TIMEOUT_MS": "1000"})
    test.assertEqual(rc, 1)
    test.assertIn(f"127.0.0.1:{port}", out[0])
    test.assertIn("MESHSIM_TORCH_STORE_PROTOCOL=1.13 may be wrong", out[0])
    test.assertLess(secs, 5)


def gloo_run_over_agent_store(test, port):
    """Four `meshsim run --backend gloo` processes as torchrun's workers: the agent's store at
    MASTER_ADDR:MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE), run id "emu", attempt 1."""
    procs = []
    for r in range(4):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="4", LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RUN_ID="emu",
                   TORCHELASTIC_RESTART_COUNT="1")
        env.pop("MESHSIM_TORCH_STORE_PROTOCOL", None)
        procs.append(subprocess.Popen([ARGS.meshsim, "run", "--backend", "gloo", "--mesh", "dp=2,tp=2",
                                       "--timeout", "10"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, env=env))
    outs = [p.communicate(timeout=60)[0] for p in procs]
    test.assertEqual([p.returncode for p in procs], [0, 0, 0, 0], outs)
    test.assertIn("checks passed: 24 of 24", outs[0])


class RealTorchStore:
    """This torch's own server (a mixin: the classes below name the server kind)."""

    SERVER_KWARGS = {}

    def setUp(self):
        self.port = free_port()
        self.server = dist.TCPStore("127.0.0.1", self.port, 1, True, timedelta(seconds=10), **self.SERVER_KWARGS)

    def client(self):
        return dist.TCPStore("127.0.0.1", self.port, 1, False, timedelta(seconds=10), **self.SERVER_KWARGS)

    def test_probe_names_the_protocol(self):
        rc, out, _ = peer(self.port, "probe")
        self.assertEqual((rc, out), (0, [PROTOCOL]))

    def test_keys_written_by_meshsim_are_read_by_pytorch(self):
        rc, out, _ = peer(self.port, "set", "/from_meshsim", "hello", ";", "add", "/counter", "5", ";", "protocol")
        self.assertEqual((rc, out), (0, ["ok", "5", PROTOCOL]))
        c = self.client()
        self.assertEqual(c.get("from_meshsim"), b"hello")
        self.assertEqual(c.add("counter", 2), 7)

    def test_keys_written_by_pytorch_are_read_by_meshsim(self):
        c = self.client()
        c.set("from_torch", "bytes \x01 and spaces")
        c.add("n", 40)
        rc, out, _ = peer(self.port, "get", "/from_torch", "1000", ";", "add", "/n", "2", ";", "check", "/n", ";",
                          "check", "/absent")
        self.assertEqual((rc, out), (0, ["bytes \x01 and spaces", "42", "ready", "not-ready"]))

    def test_meshsim_waits_for_a_key_pytorch_sets_later(self):
        c = self.client()
        threading.Timer(0.5, lambda: c.set("later", "v")).start()
        rc, out, secs = peer(self.port, "get", "/later", "10000")
        self.assertEqual((rc, out), (0, ["v"]))
        self.assertGreater(secs, 0.4)

    def test_pytorch_waits_for_a_key_meshsim_sets_later(self):
        c = self.client()
        got = []
        t = threading.Thread(target=lambda: got.append(c.get("from_peer")))  # get waits for the key
        t.start()
        time.sleep(0.3)
        self.assertEqual(peer(self.port, "set", "/from_peer", "x")[0], 0)
        t.join(10)
        self.assertEqual(got, [b"x"])

    def test_a_wait_that_times_out_is_reported_and_the_connection_stays_usable(self):
        # 1.13 cannot cancel a wait: after the deadline the server still holds the registration
        # and sends STOP_WAITING when the key comes. The next query must not read that byte.
        # 2.x cancels it (CANCEL_WAIT, answered WAIT_CANCELED or, if the key came first,
        # STOP_WAITING then WAIT_CANCELED).
        rc, out, secs = peer(self.port, "wait", "/never", "400", ";", "set", "/never", "now", ";", "add", "/c", "1",
                             ";", "get", "/never", "1000")
        self.assertEqual(rc, 1)
        self.assertTrue(out[0].startswith("error DeadlineExceeded:"), out)
        self.assertIn("'/never'", out[0])
        self.assertIn(f"127.0.0.1:{self.port}", out[0])
        self.assertEqual(out[1:], ["ok", "1", "now"])
        self.assertLess(secs, 5)

    def test_pytorch_wait_times_out_too(self):
        c = self.client()
        c.set_timeout(timedelta(milliseconds=300))
        with self.assertRaises(RuntimeError):
            c.wait(["never_set"])

    def test_compare_set_delete_and_key_count(self):
        rc, out, _ = peer(self.port, "cas", "/cs", "-", "v1", ";", "cas", "/cs", "v1", "v2", ";", "cas", "/cs",
                          "wrong", "v3", ";", "cas", "/absent", "x", "y", ";", "del", "/cs", ";", "del", "/cs")
        self.assertEqual((rc, out), (0, ["v1", "v2", "v2", "-", "1", "0"]))
        c = self.client()
        c.set("a", "1")
        rc, out, _ = peer(self.port, "numkeys")
        self.assertEqual(rc, 0)
        self.assertGreaterEqual(int(out[0]), 1)
        self.assertEqual(c.compare_set("z", "", "made"), b"made")
        self.assertEqual(peer(self.port, "get", "/z", "0")[1], ["made"])

    def test_add_to_a_value_that_is_not_an_integer_is_refused(self):
        self.client().set("text", "abc")
        rc, out, secs = peer(self.port, "add", "/text", "1", ";", "add", "/fine", "3")
        self.assertEqual(rc, 1)
        self.assertTrue(out[0].startswith("error InvalidArgument:"), out)
        self.assertEqual(out[1], "3")  # a fresh connection serves the next query
        self.assertLess(secs, 5)

    def test_the_other_protocol_forced_fails_within_the_deadline_naming_the_server(self):
        if PROTOCOL == "torch-2":
            the_113_protocol_forced_on_a_2x_server_fails(self, self.port)
            self.assertEqual(peer(self.port, "add", "/ok", "1")[1], ["1"])  # the server serves everyone else
            return
        rc, out, secs = peer(self.port, "set", "/k", "v", env={"MESHSIM_TORCH_STORE_PROTOCOL": "2"})
        self.assertEqual(rc, 1)
        self.assertIn(f"127.0.0.1:{self.port}", out[-1])
        self.assertIn("torch-1.13", out[-1])
        self.assertLess(secs, 5)
        # and the server still serves everyone else
        self.assertEqual(peer(self.port, "add", "/ok", "1")[1], ["1"])

    def test_a_bad_protocol_name_is_refused(self):
        rc, out, _ = peer(self.port, "set", "/k", "v", env={"MESHSIM_TORCH_STORE_PROTOCOL": "3"})
        self.assertEqual(rc, 1)
        self.assertIn("MESHSIM_TORCH_STORE_PROTOCOL='3'", out[0])


    def test_a_gloo_run_of_four_processes_over_this_torchs_store(self):
        # What torchrun's workers see: the agent's store at MASTER_ADDR:MASTER_PORT.
        gloo_run_over_agent_store(self, self.port)
        # meshsim's keys went to this server (a client of its own counts them).
        self.assertGreater(self.client().num_keys(), 4)


if TORCH < (2, 0):
    class TorchStore113(RealTorchStore, unittest.TestCase):
        """PyTorch 1.13's server (Debian 12's python3-torch)."""
else:
    class TorchStore2Libuv(RealTorchStore, unittest.TestCase):
        """PyTorch 2.x's libuv server, its default since 2.4."""
        SERVER_KWARGS = {"use_libuv": True}

    class TorchStore2Legacy(RealTorchStore, unittest.TestCase):
        """PyTorch 2.x's legacy (thread-per-socket) server."""
        SERVER_KWARGS = {"use_libuv": False}


class NotATorchStore(unittest.TestCase):
    """Servers that are not PyTorch's: every probe ends by its deadline with the address named."""

    def test_a_silent_server_is_named_within_the_deadline(self):
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        port = srv.getsockname()[1]
        try:
            rc, out, secs = peer(port, "probe")
            self.assertEqual(rc, 1)
            self.assertIn(f"127.0.0.1:{port}", out[0])
            self.assertIn("no answer", out[0])
            self.assertLess(secs, 8)
        finally:
            srv.close()

    def test_a_server_that_answers_garbage_is_named(self):
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        port = srv.getsockname()[1]

        def serve():
            conn, _ = srv.accept()
            conn.recv(64)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            time.sleep(1)
            conn.close()

        threading.Thread(target=serve, daemon=True).start()
        try:
            rc, out, secs = peer(port, "probe")
            self.assertEqual(rc, 1)
            self.assertIn(f"127.0.0.1:{port}", out[0])
            self.assertLess(secs, 8)
        finally:
            srv.close()

    def test_nothing_listening_is_unavailable_after_the_connect_deadline(self):
        rc, out, secs = peer(free_port(), "probe")
        self.assertEqual(rc, 1)
        self.assertTrue(out[0].startswith("error Unavailable:"), out)
        self.assertLess(secs, 8)


class Torch2Server:
    """An emulation of PyTorch 2.x's TCPStore server (the libuv one, the default since 2.4),
    written from PyTorch's TCPStoreBackend.hpp and TCPStoreLibUvBackend.cpp before a 2.x torch
    could be installed here; kept because it runs under any interpreter (the real 2.13 servers
    are the classes above, under .venv's). A connection's first message must be VALIDATE with the magic; any other first
    message gets no answer and no close (as libuv's server does)."""

    MAGIC = 0x3C85F7CE

    def __init__(self):
        self.kv = {}
        self.waiters = {}  # conn -> (set of missing keys, send lock)
        self.mu = threading.Lock()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def close(self):
        self.sock.close()

    def accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    @staticmethod
    def read(conn, n):
        b = b""
        while len(b) < n:
            c = conn.recv(n - len(b))
            if not c:
                raise EOFError
            b += c
        return b

    def u64(self, conn):
        return int.from_bytes(self.read(conn, 8), "little")

    def string(self, conn):
        return self.read(conn, self.u64(conn))

    def wake(self):
        for conn, (missing, lock) in list(self.waiters.items()):
            missing.difference_update(self.kv.keys())
            if not missing:
                del self.waiters[conn]
                with lock:
                    conn.sendall(b"\x00")  # STOP_WAITING

    def serve(self, conn):
        lock = threading.Lock()
        send = lambda b: (lock.acquire(), conn.sendall(b), lock.release())
        vec = lambda v: len(v).to_bytes(8, "little") + v
        try:
            if self.read(conn, 1) != b"\x00" or int.from_bytes(self.read(conn, 4), "little") != self.MAGIC:
                while conn.recv(4096):  # a miscellaneous client: never answered, never closed
                    pass
                return
            while True:
                q = self.read(conn, 1)[0]
                with self.mu:
                    if q == 13:  # PING
                        send(self.read(conn, 4))
                    elif q == 1:  # SET
                        k, v = self.string(conn), self.string(conn)
                        self.kv[k] = v
                        self.wake()
                    elif q == 2:  # COMPARE_SET
                        k, e, d = self.string(conn), self.string(conn), self.string(conn)
                        if k not in self.kv:
                            if e == b"":
                                self.kv[k] = d
                                send(vec(d))
                            else:
                                send(vec(e))
                        else:
                            if self.kv[k] == e:
                                self.kv[k] = d
                            send(vec(self.kv[k]))
                        self.wake()
                    elif q == 3:  # GET
                        send(vec(self.kv.get(self.string(conn), b"")))
                    elif q == 4:  # ADD
                        k, d = self.string(conn), int.from_bytes(self.read(conn, 8), "little", signed=True)
                        v = int(self.kv.get(k, b"0")) + d  # ValueError on text: the connection closes
                        self.kv[k] = str(v).encode()
                        send(v.to_bytes(8, "little", signed=True))
                        self.wake()
                    elif q in (5, 6):  # CHECK, WAIT
                        keys = {self.string(conn) for _ in range(self.u64(conn))}
                        missing = keys - self.kv.keys()
                        if q == 5:
                            send(b"\x01" if missing else b"\x00")
                        elif not missing:
                            send(b"\x00")
                        else:
                            self.waiters[conn] = (missing, lock)
                    elif q == 7:  # GETNUMKEYS
                        send(len(self.kv).to_bytes(8, "little"))
                    elif q == 8:  # DELETE_KEY
                        send((1 if self.kv.pop(self.string(conn), None) is not None else 0).to_bytes(8, "little"))
                    elif q == 12:  # CANCEL_WAIT
                        self.waiters.pop(conn, None)
                        send(b"\x01")  # WAIT_CANCELED
                    else:
                        return  # "Client sent invalid command": closed
        except (EOFError, OSError, ValueError):
            pass
        finally:
            with self.mu:
                self.waiters.pop(conn, None)
            conn.close()


class TorchStore2Emulated(unittest.TestCase):
    """The 2.x protocol (VALIDATE, PING, renumbered codes, CANCEL_WAIT) against the emulation."""

    def setUp(self):
        self.server = Torch2Server()
        self.port = self.server.port

    def tearDown(self):
        self.server.close()

    def test_probe_names_the_protocol(self):
        self.assertEqual(peer(self.port, "probe")[1], ["torch-2"])

    def test_every_query(self):
        rc, out, _ = peer(self.port, "protocol", ";", "set", "/a", "x", ";", "get", "/a", "1000", ";", "add", "/n", "4",
                          ";", "add", "/n", "-1", ";", "check", "/a", ";", "check", "/b", ";", "cas", "/c", "-", "v1",
                          ";", "cas", "/c", "v1", "v2", ";", "cas", "/absent", "e", "d", ";", "del", "/a", ";", "del",
                          "/a", ";", "numkeys")
        self.assertEqual((rc, out), (0, ["torch-2", "ok", "x", "4", "3", "ready", "not-ready", "v1", "v2", "-", "1",
                                         "0", "2"]))
        self.assertEqual(self.server.kv, {b"/n": b"3", b"/c": b"v2"})

    def test_a_wait_that_times_out_is_cancelled_and_the_connection_stays_usable(self):
        rc, out, secs = peer(self.port, "wait", "/never", "300", ";", "set", "/never", "now", ";", "add", "/c", "1",
                             ";", "get", "/never", "1000")
        self.assertEqual(rc, 1)
        self.assertTrue(out[0].startswith("error DeadlineExceeded:"), out)
        self.assertEqual(out[1:], ["ok", "1", "now"])
        self.assertLess(secs, 5)

    def test_a_wait_is_answered_when_another_client_sets_the_key(self):
        threading.Timer(0.4, lambda: peer(self.port, "set", "/late", "v")).start()
        rc, out, secs = peer(self.port, "get", "/late", "10000")
        self.assertEqual((rc, out), (0, ["v"]))

    def test_the_113_protocol_forced_on_a_2x_server_ends_at_the_reply_deadline(self):
        the_113_protocol_forced_on_a_2x_server_fails(self, self.port)
        self.assertNotIn(b"/k", self.server.kv)

    def test_a_gloo_run_of_four_processes_over_the_2x_agent_store(self):
        # What a newest-2.x torchrun's workers see: the agent's store at MASTER_ADDR:MASTER_PORT.
        gloo_run_over_agent_store(self, self.port)
        # Its keys live under the run's and the attempt's prefix.
        self.assertTrue(any(k.startswith(b"meshsim/run/torchelastic/emu/attempt_1/") for k in self.server.kv))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--peer", required=True)
    parser.add_argument("--meshsim", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0], "-v", *rest])
