"""Every listener admits only processes of its own cluster: attacks done for real against live workers.

An outsider (``tests/outsider.py``, a separate process without the cluster
secret or with a wrong one) connects to a worker's published TCP and Unix
endpoints and to a channel host's, claims to be a peer and sends a pickle
that would create a marker file.  The marker must never appear, the worker
must hang up, and the real peers must keep working.
"""

import hashlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import uuid

import psutil
import pytest

from rlinf.scheduler import Channel, NodePlacementStrategy
from rlinf.scheduler.base.security import MAX_PENDING_HANDSHAKES, SECRET_ENV

from launcher_marks import TEST_LAUNCHER
from p2p_helpers import Peer, run_on

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUTSIDER = os.path.join(HERE, "outsider.py")
#: the workers of this module give a connection this long to authenticate
HANDSHAKE_S = 2.0


def outsider(spec: dict, secret=None, timeout=60) -> dict:
    """Run one attack from a fresh process that holds ``secret`` (None: no secret at all)."""
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    if secret is not None:
        env[SECRET_ENV] = secret
    proc = subprocess.run([sys.executable, OUTSIDER, json.dumps(spec)], env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def group(cluster):
    os.environ["RLINF_HANDSHAKE_TIMEOUT"] = str(HANDSHAKE_S)  # forwarded to the workers with the launch
    try:
        g = Peer.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name="sec_pair")
    finally:
        del os.environ["RLINF_HANDSHAKE_TIMEOUT"]
    run_on(g, 0, _capture_security_log).wait()
    yield g
    g.stop()


def _capture_security_log(w):
    """In a worker: keep the ``rlinf.security`` records, to check what refusals log."""
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    log = logging.getLogger("rlinf.security")
    log.setLevel(logging.DEBUG)
    log.addHandler(Keep())
    w.state["security_log"] = records
    return True


def endpoint(cluster, group_name: str, rank: int) -> dict:
    return cluster.session.lookup_group(group_name).workers[rank].endpoints["cpu"]


def target(ep: dict, family: str, tmp_path, mode: str, **extra) -> dict:
    spec = {"mode": mode, "family": family, "tcp": ep["tcp"], "unix": ep["unix"], "listener": ep["listener"],
            "marker": str(tmp_path / f"pwned-{uuid.uuid4().hex[:6]}"), **extra}
    return spec


def assert_refused(result: dict, spec: dict) -> None:
    assert result["closed"], f"the worker kept an unauthenticated connection open: {result}"
    assert not os.path.exists(spec["marker"]), "the forged pickle ran in the worker"


def test_forged_peer_cannot_inject_a_pickle_or_replace_the_link(cluster, group, tmp_path):
    ep = endpoint(cluster, "sec_pair", 0)
    claim = {"src": "sec_pair:1", "transport": "cpu"}
    # rank 0 waits for rank 1: without authentication the forged link would be the one it reads
    pending = run_on(group, 0, lambda w: [w.recv("sec_pair", 1, timeout=90), w.recv("sec_pair", 1, timeout=90)])
    specs = []
    for family in ("tcp", "unix"):
        spec = target(ep, family, tmp_path, "attack", hello=claim)
        assert_refused(outsider(spec), spec)
        specs.append(spec)
    run_on(group, 1, lambda w: w.send("real-1", "sec_pair", 0)).wait()
    for family in ("tcp", "unix"):  # now the real link exists: a claimed name must not replace it
        spec = target(ep, family, tmp_path, "attack", hello=claim)
        assert_refused(outsider(spec, secret="not-the-cluster-secret-at-all"), spec)
        specs.append(spec)
    run_on(group, 1, lambda w: w.send("real-2", "sec_pair", 0)).wait()
    assert pending.wait(timeout=60) == [["real-1", "real-2"]]
    time.sleep(0.5)
    assert not any(os.path.exists(s["marker"]) for s in specs)
    log = run_on(group, 0, lambda w: list(w.state["security_log"])).wait()[0]
    refusals = [line for line in log if "refused a connection" in line]
    assert len(refusals) >= 4, log
    assert not any(os.environ[SECRET_ENV] in line for line in log)


def test_channel_host_refuses_outsiders(cluster, group, tmp_path):
    name = f"sec_chan_{uuid.uuid4().hex[:6]}"
    ch = Channel.create(name)
    ep = endpoint(cluster, "Channel." + name, 0)
    specs = []
    for family in ("tcp", "unix"):
        spec = target(ep, family, tmp_path, "attack", hello={"service": "channel", "channel": name})
        assert_refused(outsider(spec), spec)
        specs.append(spec)
    ch.put({"real": 1})
    assert run_on(group, 0, lambda w, n: w.connect_channel(n).get(timeout=30), name).wait() == [{"real": 1}]
    assert not any(os.path.exists(s["marker"]) for s in specs)


def test_only_the_cluster_secret_is_admitted(cluster, group, tmp_path):
    ep = endpoint(cluster, "sec_pair", 1)
    for family in ("tcp", "unix"):
        wrong = outsider(target(ep, family, tmp_path, "handshake", wait=5), secret="x" * 32)
        assert not wrong["accepted"] and "refused" in wrong["error"] and wrong["closed"], wrong
        assert "x" * 32 not in wrong["error"]
        right = outsider(target(ep, family, tmp_path, "handshake", hello={"src": "visitor:0", "transport": "cpu"},
                               wait=1.0), secret=os.environ[SECRET_ENV])
        assert right["accepted"] and not right["closed"], right


def test_the_secret_reaches_workers_and_nothing_shows_it(cluster, group):
    secret = os.environ[SECRET_ENV]
    digest = hashlib.sha256(secret.encode()).hexdigest()

    def inspect(w):
        from rlinf.scheduler.base import context

        mine = hashlib.sha256(os.environ[SECRET_ENV].encode()).hexdigest()
        return mine, os.environ[SECRET_ENV] in repr(context.current())

    assert run_on(group, 0, inspect).wait() == [(digest, False)]
    for p in psutil.process_iter(["cmdline"]):
        assert secret not in " ".join(p.info["cmdline"] or []), f"the secret is on the command line of pid {p.pid}"


@pytest.mark.parametrize("mode", ["garbage", "silent"])
def test_garbage_and_silence_are_closed(cluster, group, tmp_path, mode):
    ep = endpoint(cluster, "sec_pair", 1)
    for family in ("tcp", "unix"):
        spec = target(ep, family, tmp_path, mode)
        result = outsider(spec)
        assert_refused(result, spec)
        if mode == "silent":  # closed by the handshake deadline, not by us
            assert HANDSHAKE_S * 0.5 <= result["seconds"] < HANDSHAKE_S + 15, result
    send = run_on(group, 1, lambda w: w.send("still here", "sec_pair", 0, timeout=30))
    assert run_on(group, 0, lambda w: w.recv("sec_pair", 1, timeout=30)).wait() == ["still here"]
    send.wait()


def test_oversized_hello_is_refused_before_it_is_read(cluster, group, tmp_path):
    ep = endpoint(cluster, "sec_pair", 1)
    for family in ("tcp", "unix"):
        result = outsider(target(ep, family, tmp_path, "handshake", hello_size=1 << 30, wait=10),
                          secret=os.environ[SECRET_ENV])
        assert result["accepted"] and result["closed"] and result["seconds"] < HANDSHAKE_S + 5, result


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="becoming another user needs root")
def test_another_user_is_refused_on_the_unix_socket_before_the_challenge(cluster, group, tmp_path):
    os.chmod(tmp_path, 0o777)  # so that a marker could be written, were the pickle ever run
    spec = target(endpoint(cluster, "sec_pair", 1), "unix", tmp_path, "as_uid", uid=65534,
                  hello={"src": "sec_pair:0", "transport": "cpu"})
    result = outsider(spec)
    assert_refused(result, spec)
    assert result["received"] == 0, "another user's process got the challenge"


def test_a_flood_of_idle_connections_costs_bounded_threads_and_descriptors(cluster, launch):
    g = launch(Peer, placement=NodePlacementStrategy([0, 0]))
    name = g.worker_group_name
    ep = endpoint(cluster, name, 1)
    worker = psutil.Process(cluster.session.lookup_group(name).workers[1].info.pid)
    threads, fds = worker.num_threads(), worker.num_fds()
    idle = []
    try:
        for i in range(4 * MAX_PENDING_HANDSHAKES):
            if i % 2:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect("\0" + ep["unix"])
            else:
                s = socket.create_connection(tuple(ep["tcp"]), timeout=10)
            idle.append(s)
        time.sleep(1.0)
        assert worker.num_threads() <= threads + MAX_PENDING_HANDSHAKES + 8
        assert worker.num_fds() <= fds + MAX_PENDING_HANDSHAKES + 16
        # a real peer connecting for the first time, in the middle of the flood
        start = time.monotonic()
        recv = run_on(g, 1, lambda w, n: w.recv(n, 0, timeout=60), name)
        run_on(g, 0, lambda w, n: w.send("through the flood", n, 1, timeout=60), name).wait(timeout=90)
        assert recv.wait(timeout=90) == ["through the flood"]
        assert time.monotonic() - start < 60
    finally:
        for s in idle:
            s.close()


MPI_PROGRAM = """
import hashlib, json, os, subprocess, sys
import psutil
from rlinf.scheduler import Cluster, NodePlacementStrategy, Worker

class Holder(Worker):
    def digest(self):
        return hashlib.sha256(os.environ["RLINF_CLUSTER_SECRET"].encode()).hexdigest()

cluster = Cluster()
g = Holder.create_group().launch(cluster, NodePlacementStrategy([0]), name="sec_mpi")
ep = cluster.session.lookup_group("sec_mpi").workers[0].endpoints.get("cpu")
secret = os.environ["RLINF_CLUSTER_SECRET"]
print("CPU_LISTENING", ep is not None, flush=True)
print("SAME_SECRET", g.digest().wait() == [hashlib.sha256(secret.encode()).hexdigest()], flush=True)
leaks = [p.pid for p in psutil.process_iter(["cmdline"]) if secret in " ".join(p.info["cmdline"] or [])]
print("CMDLINE_LEAKS", leaks, flush=True)

def outsider(secret):
    env = {k: v for k, v in os.environ.items() if k != "RLINF_CLUSTER_SECRET"}
    if secret:
        env["RLINF_CLUSTER_SECRET"] = secret
    spec = {"mode": "handshake", "family": "tcp", "tcp": ep["tcp"], "unix": ep["unix"], "listener": ep["listener"],
            "marker": "-",
            "hello": {"src": "visitor:0", "transport": "cpu"}, "wait": 1.0}
    out = subprocess.run([sys.executable, OUTSIDER, json.dumps(spec)], env=env, capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout.strip().splitlines()[-1])["accepted"]

print("NO_SECRET_ACCEPTED", outsider(None), flush=True)
print("WRONG_SECRET_ACCEPTED", outsider("y" * 32), flush=True)
print("CLUSTER_SECRET_ACCEPTED", outsider(secret), flush=True)
g.stop()
"""


@pytest.mark.skipif(TEST_LAUNCHER == "mpi", reason="starts MPI jobs of its own; not from inside one")
@pytest.mark.skipif(shutil.which("mpiexec", path=os.path.dirname(sys.executable)) is None,
                    reason="needs mpi4py and an mpiexec (pip install mpi4py mpich)")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["mpiexec", "spawn"])
def test_cpu_listeners_under_mpi_require_the_drivers_secret(tmp_path, mode):
    path = tmp_path / "program.py"
    path.write_text(f"OUTSIDER = {OUTSIDER!r}\n" + textwrap.dedent(MPI_PROGRAM))
    env = {k: v for k, v in os.environ.items()
           if k not in ("RLINF_LAUNCHER", "RLINF_TEST_LAUNCHER", SECRET_ENV) and not k.startswith("RAY_")}
    env.update(PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""), PYTHONUNBUFFERED="1")
    if mode == "mpiexec":
        cmd = ["mpiexec", "-n", "2", sys.executable, "-m", "rlinf.mpi", str(path)]
    else:
        cmd = [sys.executable, str(path)]
        env.update(RLINF_LAUNCHER="mpi", RLINF_MPI_SLOTS="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=240, start_new_session=True)
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:]
    for line in ("CPU_LISTENING True", "SAME_SECRET True", "CMDLINE_LEAKS []", "NO_SECRET_ACCEPTED False",
                 "WRONG_SECRET_ACCEPTED False", "CLUSTER_SECRET_ACCEPTED True"):
        assert line in out, out[-4000:]


def test_the_cpu_transport_forgets_links_once_they_are_closed():
    """Links to restarted peers must not pile up: a closed link leaves the transport's books."""
    import threading

    from rlinf.scheduler.transports.cpu_transport import CpuTransport

    server, client = CpuTransport(), CpuTransport()
    accepted = []
    arrived = threading.Semaphore(0)

    def on_accept(link, hello):
        accepted.append(link)
        arrived.release()

    ep = server.listen(on_accept, "127.0.0.1")
    try:
        for local in ("1", "0"):
            os.environ["RLINF_CPU_LOCAL"] = local
            try:
                links = [client.connect(ep, b"{}", time.monotonic() + 30) for _ in range(5)]
            finally:
                del os.environ["RLINF_CPU_LOCAL"]
            assert all(arrived.acquire(timeout=30) for _ in links)
            assert len(client._links) == 5 and len(server._links) == 5
            links[0].send([b"ping"], time.monotonic() + 30)
            assert [bytes(f) for f in accepted[0].recv(time.monotonic() + 30)[1]] == [b"ping"]
            for link in links + accepted:
                link.close()
            accepted.clear()
            assert not client._links and not server._links
    finally:
        server.close()
        client.close()


def test_a_relay_on_a_dead_peers_port_gets_no_link_to_a_live_listener():
    """A process without the secret takes over a dead peer's port; a worker that still has the old
    endpoint dials it, and the relay passes the handshake on to a live listener, byte for byte.  The
    worker's answer was made for the listener it meant to dial, so the live one refuses it.  Before,
    the relay came out holding an authenticated link to the live listener, under a name of its choosing,
    on which the next pickle it sent would have been run."""
    import threading

    from rlinf.scheduler.base import security
    from rlinf.scheduler.transports.cpu_transport import CpuTransport

    taken = []
    live = CpuTransport()
    live_endpoint = live.listen(lambda link, hello: taken.append(hello), "127.0.0.1")
    relay_server = socket.create_server(("127.0.0.1", 0))
    relay_server.settimeout(10)
    pumps = []

    def pump(src, dst):
        try:
            while True:  # bounded by the sockets' timeouts
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def relay():
        victim, _ = relay_server.accept()
        upstream = socket.create_connection(tuple(live_endpoint["tcp"]), timeout=10)
        victim.settimeout(10)
        for a, b in ((victim, upstream), (upstream, victim)):
            t = threading.Thread(target=pump, args=(a, b), daemon=True)
            t.start()
            pumps.append((t, a))

    relaying = threading.Thread(target=relay, daemon=True)
    relaying.start()
    dead_peer = {"tcp": list(relay_server.getsockname()), "host": "another host", "pid": 0,
                 "listener": security.new_listener_id()}
    worker = CpuTransport()
    try:
        with pytest.raises(security.HandshakeError) as info:
            worker.connect(dead_peer, b'{"src": "a worker"}', time.monotonic() + 10)
        assert not isinstance(info.value, security.NotTaken)  # refused: the sender looks its peer up again
        assert "refused" in str(info.value)
        relaying.join(10)
        for t, _ in pumps:
            t.join(10)
        assert taken == []
    finally:
        worker.close()
        live.close()
        relay_server.close()
        for _, sock in pumps:
            sock.close()
