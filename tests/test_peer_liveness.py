"""A peer is dead when its process is dead, whatever now holds its port or its pid.

A dead worker's TCP port can be taken by another process (one listening with
``SO_REUSEADDR``, or a worker started since that was given the same port),
and its pid by any process started since.  Neither may make the dead peer
look alive: a send to it fails with ``PeerDiedError`` at once, not after the
send's whole timeout, and a probe says dead.
"""

import os
import signal
import socket
import subprocess
import threading
import time

import pytest

from rlinf.scheduler import NodePlacementStrategy, PeerDiedError

from launcher_marks import cpu_transport_internals, survives_worker_death
from p2p_helpers import Peer, process_alive, run_on


def _start_ticks(pid: int) -> int:
    """The process's start time (clock ticks since boot): /proc/<pid>/stat field 22."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


class _PortHolder:
    """Takes over a TCP port on 127.0.0.1 and holds every connection open without a word (or, with
    ``greeting``, says that first): what a process that took over a dead peer's port may do."""

    def __init__(self, port: int, greeting: bytes = b""):
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        for attempt in range(100):  # bounded: 5 s
            try:
                self.server.bind(("127.0.0.1", port))
                break
            except OSError:  # a freed port is an ephemeral one: an outgoing connection may hold it a moment
                if attempt == 99:
                    raise
                time.sleep(0.05)
        self.server.listen(16)
        self.server.settimeout(0.2)
        self.greeting = greeting
        self.held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():  # bounded by close()
            try:
                conn, _ = self.server.accept()
            except OSError:
                continue
            if self.greeting:
                conn.sendall(self.greeting)
            self.held.append(conn)

    def close(self):
        self._stop.set()
        self._thread.join(5)
        self.server.close()
        for conn in self.held:
            conn.close()


@survives_worker_death
@cpu_transport_internals
@pytest.mark.parametrize("path", ["local", "tcp"])
def test_a_send_to_a_dead_peer_whose_port_was_taken_fails_at_once(cluster, launch, path):
    """Worker 1 is killed and the test takes over its TCP port, accepting and holding connections.
    Worker 0 then sends to worker 1 with a 60 s timeout: PeerDiedError within 5 s.  Before, the
    sender dialled the holder, waited for a handshake that never began, and dialled again until its
    60 s were spent."""
    g = launch(Peer, placement=NodePlacementStrategy([0, 0]), name=f"liv_port_{path}")

    def endpoint(w):
        from rlinf.scheduler.messaging.p2p.communicator import local_communicator

        return local_communicator(create=True).endpoints()["cpu"]

    ep = run_on(g, 1, endpoint).wait(timeout=60)[0]
    host, port = ep["tcp"]
    assert host == "127.0.0.1", ep  # the test takes over loopback ports only
    pid = g.pid().wait(timeout=60)[1]
    os.kill(pid, signal.SIGKILL)
    for _ in range(100):  # bounded: 10 s
        if not process_alive(pid):
            break
        time.sleep(0.1)
    assert not process_alive(pid)
    holder = _PortHolder(port)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):  # the port is served: by the holder
            for _ in range(50):  # bounded: 5 s
                if holder.held:
                    break
                time.sleep(0.1)
        assert holder.held, "the holder did not take the port"

        def send(w, path, name):
            os.environ["RLINF_CPU_LOCAL"] = "0" if path == "tcp" else "1"
            start = time.monotonic()
            try:
                w.send("to the dead", name, 1, timeout=60)
                return "sent", "", time.monotonic() - start
            except Exception as exc:
                return type(exc).__name__, str(exc), time.monotonic() - start

        kind, text, took = run_on(g, 0, send, path, g.worker_group_name).wait(timeout=120)[0]
        assert kind == PeerDiedError.__name__ and took < 5, (kind, text, took)
    finally:
        holder.close()


@pytest.fixture
def listening():
    """A live CPU transport in this process and its endpoint."""
    from rlinf.scheduler.transports.cpu_transport import CpuTransport

    transport = CpuTransport()
    endpoint = transport.listen(lambda link, hello: link.close(), "127.0.0.1")
    yield transport, endpoint
    transport.close()


def test_a_reused_pid_is_not_the_peer(listening):
    """On one host, an endpoint whose pid now belongs to another process (started later) is dead."""
    transport, endpoint = listening
    assert transport.probe(endpoint) is True
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        assert _start_ticks(sleeper.pid) != _start_ticks(os.getpid())
        reused = dict(endpoint, pid=sleeper.pid)  # the pid, as if the kernel had handed it on
        started = time.monotonic()
        assert transport.probe(reused) is False
        assert time.monotonic() - started < 1
    finally:
        sleeper.kill()
        sleeper.wait(10)
    assert transport.probe(endpoint) is True


def test_a_port_held_by_another_listener_is_not_the_peer(listening, monkeypatch):
    """Across hosts the pid says nothing: the probe asks the listener to prove it holds the cluster
    secret and is the one the endpoint named.  Another rlinf listener on the port (a worker started
    since), or another program, fails that: the peer is dead.  The real listener passes."""
    from rlinf.scheduler.base import security
    from rlinf.scheduler.transports.cpu_transport import CpuTransport

    from rlinf.scheduler.transports import cpu_liveness

    transport, endpoint = listening
    remote = dict(endpoint, host="another host", pid=0)
    # a probe that runs out of time says "alive" (unknown): the refusals below must not run out on a loaded machine
    monkeypatch.setattr(cpu_liveness, "PROBE_TIMEOUT", 10.0)
    assert transport.probe(remote) is True
    elsewhere = dict(remote, listener=security.new_listener_id())  # the port's listener is not this one
    started = time.monotonic()
    assert transport.probe(elsewhere) is False
    assert time.monotonic() - started < 8  # refused, not waited out (10 s)
    talker, silent = _PortHolder(0, greeting=b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"), _PortHolder(0)
    try:
        other_program = dict(remote, tcp=list(talker.server.getsockname()))
        started = time.monotonic()
        assert transport.probe(other_program) is False
        assert time.monotonic() - started < 8  # refused, not waited out (10 s)
        # one that never speaks may be a listener too busy to begin: unknown, so alive for now, within the bound
        monkeypatch.setattr(cpu_liveness, "PROBE_TIMEOUT", 1.0)
        started = time.monotonic()
        assert transport.probe(dict(remote, tcp=list(silent.server.getsockname()))) is True
        assert time.monotonic() - started < 6
    finally:
        talker.close()
        silent.close()
