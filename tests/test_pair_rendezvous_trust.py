"""Who can reach a device pair's rendezvous: nobody but the pair (rlinf-nccl, checked with torch-gloo).

Pair setup of the torch pair transports exchanges the few keys gloo (and
NCCL) write over the pair's authenticated CPU link; no ``TCPStore`` listens,
during setup or after.  Real processes: the accepting end is the device echo
peer, the dialing end a process of this file (``dial``), and an outsider
without the cluster secret (``outsider``) watches both for listening ports
while the pair is set up and talks the ``TCPStore`` protocol to each one it
sees: listing, reading and writing keys must fail on every one of them.

gloo still opens listeners of its own for the pair's connections (see
docs/gpu.md): they are the only new ports, and the same on both ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")
psutil = pytest.importorskip("psutil")

HERE = os.path.abspath(__file__)
_TIMEOUT = 60
#: seconds a probe of one port may take (torch's client may hang on a port that is not a store)
_PROBE_LIMIT = 5


def listening(pid: int) -> set:
    """The TCP ports process ``pid`` listens on."""
    try:
        conns = psutil.Process(pid).net_connections("tcp")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return set()
    return {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN}


# -- the processes: ``python tests/test_pair_rendezvous_trust.py dial|outsider ...`` --------------------
def _dial(endpoint: dict) -> None:
    """Wait for ``go``, set a torch-gloo pair up with ``endpoint``, prove it works, wait for stdin's end."""
    import torch

    from rlinf.scheduler.plugins import get_registry

    transport = get_registry().transport("torch-gloo").descriptor.factory()
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    deadline = time.monotonic() + _TIMEOUT
    link = transport.connect(endpoint, b"trust", deadline)
    sent = torch.arange(1 << 18, dtype=torch.float32)  # 1 MiB: through the process group
    link.send([json.dumps([[list(sent.shape), "float32"]]).encode()], deadline)
    link.send_tensors([sent], deadline)
    link.recv(deadline)
    back = torch.empty_like(sent)
    link.recv_tensors_into([back], deadline)
    print("paired" if torch.equal(back, sent) else "corrupt", flush=True)
    sys.stdin.read()
    transport.close()


def _probe(port: int) -> dict:
    """What a client of the ``TCPStore`` protocol gets from ``port``: the keys it can list, read, write."""
    from datetime import timedelta

    import torch.distributed as dist

    out = {"port": port}
    try:
        store = dist.TCPStore("127.0.0.1", port, 2, False, timeout=timedelta(seconds=2))
    except Exception as exc:
        return {**out, "connect": f"{type(exc).__name__}: {str(exc)[:120]}"}
    for name, call in (("keys", lambda: store.num_keys()), ("list", lambda: store.list_keys()),
                       ("write", lambda: store.set("rlinf-outsider", b"x"))):
        try:
            out[name] = repr(call())[:200]
        except Exception as exc:
            out[f"{name}_error"] = type(exc).__name__
    return out


def _probe_into(port: int, out) -> None:
    out.put(_probe(port))


def _outsider(pids: list) -> None:
    """Until stdin says stop: watch ``pids`` for new listening ports and talk to each as a TCPStore client.

    Each probe runs in a process of its own, forked from a server that imported torch already (so it
    starts in milliseconds), and is killed if it hangs: torch's client can wait for ever on a port that
    accepts and says nothing (gloo's).
    """
    import multiprocessing
    import queue
    import threading

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch.distributed"])
    answers = ctx.Queue()
    ctx.Process(target=time.sleep, args=(0,)).start()  # the server starts (and imports torch) now
    known = {pid: listening(pid) for pid in pids}
    probes, stop = {}, threading.Event()

    def scan():
        for pid in pids:
            for port in listening(pid) - known[pid]:
                known[pid].add(port)
                probes[port] = ctx.Process(target=_probe_into, args=(port, answers), daemon=True)
                probes[port].start()

    def watch():
        deadline = time.monotonic() + _TIMEOUT
        while not stop.is_set() and time.monotonic() < deadline:
            scan()
            time.sleep(0.002)
        scan()  # once more after the stop: a port that opened just before it (a starved watcher) is probed too

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    print("ready", flush=True)
    sys.stdin.readline()  # the test says when the pair is set up
    stop.set()
    watcher.join(10)
    results = {}
    give_up = time.monotonic() + _PROBE_LIMIT
    for port, proc in probes.items():
        proc.join(max(0.0, give_up - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(5)
        results[port] = {"port": port, "connect": "no answer"}
    while True:
        try:
            got = answers.get(timeout=0.5)
        except queue.Empty:
            break
        results[got["port"]] = got
    print(json.dumps(list(results.values())), flush=True)


# -- the tests ------------------------------------------------------------------------------------------
def _start(*args, env) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, HERE, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env)
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise RuntimeError(f"{args[0]} did not start (exit code {proc.wait(30)})")
    return proc


def _end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            proc.stdin.close()
            proc.wait(10)
        except (subprocess.TimeoutExpired, OSError):
            proc.kill()
            proc.wait(10)


@pytest.fixture
def ends():
    """``(acceptor, dialer)``: two processes holding the cluster secret; the dialer sets the pair up on ``go``."""
    from rlinf.scheduler.base.security import cluster_secret
    from rlinf.testing.transport import _Peer

    cluster_secret()  # made here if absent, so both ends inherit the same one
    acceptor = _Peer("torch-gloo", dict(os.environ), "rlinf.testing._device_echo_peer", ("cpu",))
    dialer = None
    try:
        dialer = _start("dial", json.dumps(acceptor.endpoint), env=dict(os.environ))
        yield acceptor.proc, dialer
    finally:
        if dialer is not None:
            _end(dialer)
        acceptor.close()


def _pair(dialer) -> None:
    dialer.stdin.write("go\n")
    dialer.stdin.flush()
    assert dialer.stdout.readline().strip() == "paired"


def test_no_store_listens_after_pair_setup(ends):
    """What a pair leaves listening is gloo's own listeners: one set per end, the same on both (the
    dialer hosted a TCPStore besides, for the pair's whole life)."""
    acceptor, dialer = ends
    before = {p.pid: listening(p.pid) for p in ends}
    _pair(dialer)
    new = {pid: listening(pid) - ports for pid, ports in before.items()}
    assert new[acceptor.pid], "gloo opened no listener: this test no longer sees the pair's ports"
    assert len(new[dialer.pid]) == len(new[acceptor.pid]), f"listeners the pair left behind: {new}"


def test_an_outsider_finds_no_store_during_pair_setup(ends):
    """An outsider without the secret watches both ends while the pair is set up and talks the TCPStore
    protocol to every port that appears: none lists, reads or writes a key."""
    acceptor, dialer = ends
    env = {k: v for k, v in os.environ.items() if k != "RLINF_CLUSTER_SECRET"}
    outsider = _start("outsider", json.dumps([acceptor.pid, dialer.pid]), env=env)
    try:
        before = {p.pid: listening(p.pid) for p in ends}
        _pair(dialer)
        new = {pid: listening(pid) - ports for pid, ports in before.items()}
        outsider.stdin.write("done\n")
        outsider.stdin.flush()
        probes = json.loads(outsider.stdout.readline())
    finally:
        _end(outsider)
    assert {p["port"] for p in probes} >= set().union(*new.values()), "the outsider missed a port"
    served = [p for p in probes if "connect" not in p and not {"keys_error", "list_error", "write_error"} <= set(p)]
    assert not served, f"an outsider listed, read or wrote rendezvous keys: {served}"


def _received_through(ports: set) -> int:
    """Bytes received so far on the established TCP connections to or from ``ports`` (``ss -ti``)."""
    import re
    import shutil

    if not shutil.which("ss"):
        pytest.skip("no ss (iproute2) here to count a connection's bytes")
    where = " or ".join(f"sport = :{p} or dport = :{p}" for p in sorted(ports))
    out = subprocess.run(["ss", "-tinH", "state", "established", f"( {where} )"], capture_output=True,
                         text=True, timeout=10, check=True).stdout
    return sum(int(n) for n in re.findall(r"bytes_received:(\d+)", out))


def test_only_raw_buffers_cross_the_group_unauthenticated():
    """gloo's connections carry no authentication, so a message's first frame (an object's pickle) takes
    the pair's CPU link whatever its size; only the raw buffers after it go through the group."""
    import queue

    from rlinf.scheduler.plugins import get_registry

    factory = get_registry().transport("torch-gloo").descriptor.factory
    a, b, inbox = factory(), factory(), queue.Queue()
    try:
        a.listen(lambda link, hello: None, "127.0.0.1")
        endpoint = b.listen(lambda link, hello: inbox.put(link), "127.0.0.1")
        before = listening(os.getpid())
        link = a.connect(endpoint, b"", time.monotonic() + _TIMEOUT)
        far = inbox.get(timeout=_TIMEOUT)
        gloo = listening(os.getpid()) - before
        assert gloo, "gloo opened no listener: this test no longer sees the group's connections"
        pickle_like = os.urandom(4 << 20)

        start = _received_through(gloo)
        link.send([pickle_like], time.monotonic() + _TIMEOUT)
        assert bytes(far.recv(time.monotonic() + _TIMEOUT)[1][0]) == pickle_like
        assert _received_through(gloo) - start < (64 << 10), "a first frame went through the process group"

        start = _received_through(gloo)  # the measure sees the group's traffic: raw buffers go that way
        link.send([b"head", pickle_like], time.monotonic() + _TIMEOUT)
        assert [len(f) for f in far.recv(time.monotonic() + _TIMEOUT)[1]] == [4, 4 << 20]
        assert _received_through(gloo) - start >= 4 << 20
    finally:
        a.close()
        b.close()


if __name__ == "__main__":
    {"dial": lambda: _dial(json.loads(sys.argv[2])), "outsider": lambda: _outsider(json.loads(sys.argv[2]))}[sys.argv[1]]()
