"""A channel put whose caller got an error did not happen: on a real local Ray, with real processes.

A producer process parks a put on a full channel (``maxsize=1``) and its
caller then gets an error: it is interrupted (Ctrl-C), its process is killed,
or its heartbeat declares the (stopped, merely slow) host dead.  Whether the
host had already taken the item or not, the consumer must see only the first
item, and the host must never hold more than ``maxsize`` items.  The local
(in-process) channel keeps the same rule.

The producer is this file run as a program (``python test_channel_trust.py
RECORD NAME``): it connects to the channel's host with the cluster secret it
inherits, puts ``item-2`` and prints how the put ended.
"""

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from rlinf.scheduler import Channel, CommTimeoutError
from rlinf.scheduler.channel.channel import _hosts

from p2p_helpers import wait_for

from launcher_marks import survives_worker_death


def _stats(name):
    return _hosts[name].stats(True).wait()[0]


class _Producer:
    """The producer program, started with the channel host's record; reads its output lines."""

    def __init__(self, cluster, name, env=None, mode="put"):
        record = cluster.session.lookup_group("Channel." + name)
        fd, self.record_file = tempfile.mkstemp(prefix="rlt-record")
        with os.fdopen(fd, "wb") as f:
            pickle.dump(record.workers[0], f)
        self.proc = subprocess.Popen([sys.executable, __file__, self.record_file, name, mode], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})})
        self.lines: list = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    def wait_line(self, prefix, limit):
        wait_for(lambda: any(l.startswith(prefix) for l in self.lines), limit, f"{prefix!r} from the producer ({self.lines})")

    def finish(self):
        try:
            self.proc.wait(timeout=20)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=10)
            os.unlink(self.record_file)
        return self.lines


def _parked(cluster, name, env=None):
    """A channel of ``maxsize=1`` holding item-1, and a producer process whose put of item-2 is parked."""
    ch = Channel.create(name, maxsize=1)
    ch.put("item-1", timeout=10)
    producer = _Producer(cluster, name, env)
    producer.wait_line("READY", 30)
    wait_for(lambda: _stats(name)["queues"].get("'default_queue'", {}).get("putters") == 1, 20, "the put parked")
    return ch, producer


def _only_item_1(ch, name):
    """The producer has gone: the host holds item-1 alone, and a consumer gets item-1 and nothing else."""
    wait_for(lambda: _stats(name)["clients"] == 1, 20, "the producer's connection released")
    assert _stats(name)["items"] == 1  # never past maxsize
    assert ch.get(timeout=10) == "item-1"
    with pytest.raises(CommTimeoutError):
        ch.get(timeout=1.0)
    assert _stats(name)["items"] == 0


def test_a_put_announcing_a_segment_larger_than_its_memfd_is_refused(cluster):
    """A client with the cluster secret sends a put whose shared-memory segment is announced larger than
    the memfd it sends: mapping it whole and reading past the file's end would kill the host (SIGBUS)
    with every queued item.  The host refuses the frame (drops that connection) and keeps its items."""
    ch = Channel.create("trust_shm_lie")
    ch.put("item-1", timeout=10)
    producer = _Producer(cluster, "trust_shm_lie", mode="lying-shm")
    lines = producer.finish()
    assert "PUT OK" not in lines, lines
    assert ch.get(timeout=10) == "item-1"  # the host lives, with its queue
    ch.put("item-3", timeout=10)
    assert ch.get(timeout=10) == "item-3"
    assert _stats("trust_shm_lie")["items"] == 0


@pytest.mark.parametrize("end", ["return", "SIGTERM", "SIGINT"])
def test_items_a_script_took_are_not_delivered_again_however_it_ends(cluster, end):
    """A script takes items (``get``, then ``get_batch``) and ends: it simply returns, or is sent SIGTERM
    or Ctrl-C (SIGINT) once it has them.  The items it took are never delivered again."""
    name = f"trust_taken_{end.lower()}"
    ch = Channel.create(name)
    for i in range(5):
        ch.put(i, weight=1)
    consumer = _Producer(cluster, name, mode="take" if end == "return" else "take-then-wait")
    consumer.wait_line("TOOK", 30)
    if end != "return":
        consumer.proc.send_signal(getattr(signal, end))
    lines = consumer.finish()
    took = [int(x) for x in next(l for l in lines if l.startswith("TOOK")).split()[1:]]
    wait_for(lambda: _stats(name)["clients"] == 1 and _stats(name)["in_flight"] == 0, 20, "the consumer's connection settled")
    rest = [ch.get(timeout=5) for _ in range(_stats(name)["items"])]
    assert sorted(took + rest) == list(range(5)), (took, rest)


@survives_worker_death
def test_an_interrupted_parked_put_is_not_delivered(cluster):
    """Ctrl-C during a parked put gives the connection up before any cancel goes out: the host drops the put."""
    ch, producer = _parked(cluster, "trust_interrupt")
    os.kill(producer.proc.pid, signal.SIGINT)
    assert producer.finish()[-1] == "INTERRUPTED"
    _only_item_1(ch, "trust_interrupt")


@survives_worker_death
def test_a_killed_producer_s_parked_put_is_not_delivered(cluster):
    """A producer killed while its put is parked never saw it succeed: the host drops it."""
    ch, producer = _parked(cluster, "trust_killed")
    producer.proc.kill()
    producer.finish()
    _only_item_1(ch, "trust_killed")


@survives_worker_death
def test_a_put_taken_while_its_producer_could_not_hear_is_not_delivered(cluster):
    """The host takes the parked item (a consumer made room) while the producer is stopped; the producer is
    then interrupted before it reads the host's answer: its caller gets the interrupt, so the item must
    never reach a consumer."""
    ch, producer = _parked(cluster, "trust_unheard")
    pid = producer.proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        assert ch.get(timeout=10) == "item-1"  # the host now takes item-2 and answers the stopped producer
        time.sleep(0.2)
        os.kill(pid, signal.SIGINT)  # handled the moment it runs again, before it reads that answer
    finally:
        os.kill(pid, signal.SIGCONT)
    assert producer.finish()[-1] == "INTERRUPTED"
    wait_for(lambda: _stats("trust_unheard")["clients"] == 1, 20, "the producer's connection released")
    with pytest.raises(CommTimeoutError):
        ch.get(timeout=1.0)
    assert _stats("trust_unheard")["items"] == 0


@survives_worker_death
def test_a_put_whose_host_was_declared_dead_is_not_delivered(cluster):
    """A host that stops for a while is declared dead by the producer's heartbeat (0.5 s beats): the put
    raises ``PeerDiedError``, and the host, once it runs again, must not deliver it."""
    ch, producer = _parked(cluster, "trust_slow_host", {"RLINF_CHANNEL_HEARTBEAT": "0.5"})
    host = cluster.session.lookup_group("Channel.trust_slow_host").workers[0].info.pid
    os.kill(host, signal.SIGSTOP)
    try:
        producer.wait_line("FAILED PeerDiedError", 20)
    finally:
        os.kill(host, signal.SIGCONT)
    producer.finish()
    _only_item_1(ch, "trust_slow_host")


def test_an_interrupted_parked_put_on_a_local_channel_is_not_delivered():
    """The in-process channel: a put parked on a full queue and interrupted is withdrawn."""
    import asyncio

    ch = Channel.create("trust_local", maxsize=1, local=True)
    ch.put("item-1", timeout=5)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(KeyboardInterrupt):
            ch.put("item-2", timeout=10)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert ch.qsize() == 1
    assert ch.get(timeout=5) == "item-1"
    with pytest.raises(asyncio.QueueEmpty):
        ch.get_nowait()



@contextlib.contextmanager
def _traced(tracer):
    """``sys.settrace(tracer)`` for the block (where a test lands its interrupt), then off again."""
    sys.settrace(tracer)
    try:
        yield
    finally:
        sys.settrace(None)


def test_a_local_put_interrupted_after_its_room_was_made_is_withdrawn():
    """The in-process channel (``maxsize=1``): a blocking put waits for room, a get makes it, and an interrupt
    lands in the putter after its wait ended but before its item joined the queue.  The put raised, so it
    is withdrawn, and the place it held is free again (the key takes new puts)."""
    ch = Channel.create("trust_local_late", maxsize=1, local=True)
    ch.put("item-1", timeout=5)
    threading.Timer(0.3, lambda: ch.get(timeout=5)).start()  # makes room for item-2 while its put waits

    def interrupt_at_commit(frame, event, arg):  # a Ctrl-C landing the moment the put goes on to queue its item
        if event == "call" and frame.f_code.co_name == "_commit" and "local.py" in frame.f_code.co_filename:
            raise KeyboardInterrupt
        return None

    with pytest.raises(KeyboardInterrupt), _traced(interrupt_at_commit):
        ch.put("item-2", timeout=10)
    assert ch.qsize() == 0  # item-2 was withdrawn
    ch.put("item-3", timeout=2)  # the place item-2 held is free: not blocked for good
    assert ch.get(timeout=2) == "item-3"


# -- a channel host, its transport and clients in this process (no Ray): races inside one client ---------
class _Host:
    """A real ``ChannelServer`` listening on a real ``CpuTransport``; ``client()`` connects a real client."""

    def __init__(self, name, maxsize):
        import json

        from rlinf.scheduler.messaging.channel.server import ChannelServer
        from rlinf.scheduler.transports.cpu_transport import CpuTransport

        self.name = name
        self.server = ChannelServer(name, maxsize)
        self.transport = CpuTransport()
        self.endpoint = self.transport.listen(lambda link, hello: self.server.on_connect(link, json.loads(hello)),
                                              "127.0.0.1")
        self.clients = []

    def client(self, who, ack_link=False):
        """A client as ``ChannelClient.connect`` makes it; ``ack_link``: it may open an ack link once fed."""
        import json
        import uuid

        from rlinf.scheduler.messaging.channel.client import ChannelClient
        from rlinf.scheduler.transports.cpu_transport import CpuTransport

        token = uuid.uuid4().hex

        def dial(hello):
            return CpuTransport().connect(self.endpoint, json.dumps(hello).encode(), time.monotonic() + 10)

        c = ChannelClient(self.name, f"{self.name}-host",
                          dial({"service": "channel", "channel": self.name, "client": who, "token": token}))
        if ack_link:
            c._dial_acks = lambda: dial({"service": "channel", "channel": self.name, "acks_for": token})
        self.clients.append(c)
        return c

    def close(self):
        for c in self.clients:
            c.fail("the test is over")
        self.transport.close()


def _frames(item):
    from rlinf.scheduler.transports import codec

    header, buffers = codec.encode(item)
    return [header, *buffers]


def _put(client, key, item, timeout=5.0):
    """A blocking put through ``client`` (what ``Channel.put`` does)."""
    _, fut = client.request({"op": "put", "key": key, "weight": 0.0, "timeout": timeout}, _frames(item), blocking=True)
    client.wait_reply(fut, timeout + 2)


def _get(client, key, timeout):
    """A blocking get through ``client``: the item, or ``("error", kind)``."""
    from rlinf.scheduler.transports import codec

    rid, fut = client.request({"op": "get", "key": key, "timeout": timeout}, (), blocking=True)
    ctrl, frames = client.wait_reply(fut, timeout + 2)
    if ctrl.get("error"):
        return ("error", ctrl["error"])
    client.ack(rid)
    return codec.decode(frames[0], list(frames[1:]))


@pytest.fixture
def host(monkeypatch):
    """A channel host in this process; its clients beat every 0.2 s (declared dead after 1 s unheard or stuck)."""
    monkeypatch.setenv("RLINF_CHANNEL_HEARTBEAT", "0.2")
    made = []

    def make(name, maxsize=0):
        made.append(_Host(name, maxsize))
        return made[-1]

    yield make
    for h in made:
        h.close()


def test_an_async_put_committed_before_its_client_was_declared_dead_succeeds(host):
    """An async put whose reply is read and committed while a callback of the same client runs long: the
    heartbeat then declares the client dead (the callback holds the hand-over up), but the put was committed,
    so its caller must hear that it succeeded (the item is delivered), and at once, not behind the callback."""
    h = host("trust_committed")
    producer, other, consumer = h.client("producer"), h.client("other"), h.client("consumer")
    _, got_a = producer.request({"op": "get", "key": "a", "timeout": None}, ())
    put_b = []
    seen = {}
    started, asked = threading.Event(), threading.Event()

    def slow(_f):  # a user's callback that waits for another operation of the same channel
        started.set()
        asked.wait(5)
        begin = time.monotonic()
        try:
            put_b[0].result(4)
            seen["b"] = "succeeded"
        except Exception as exc:
            seen["b"] = type(exc).__name__
        seen["waited"] = time.monotonic() - begin

    got_a.add_done_callback(slow)
    _put(other, "a", "for-a")
    assert started.wait(5), "the callback never ran"
    put_b.append(producer.request({"op": "put", "key": "b", "weight": 0.0, "timeout": None}, _frames("item-B"))[1])
    asked.set()
    try:
        put_b[0].result(6)
        outcome = "succeeded"
    except Exception as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    delivered = _get(consumer, "b", 3.0)
    assert producer._dead is not None  # the stuck callback got the client declared dead
    assert (outcome, delivered) == ("succeeded", "item-B")
    wait_for(lambda: "waited" in seen, 6, "the callback's end")
    assert seen["b"] == "succeeded" and seen["waited"] < 3.0, seen



def test_an_async_put_whose_wait_timed_out_is_not_delivered(cluster):
    """An async put parked on a full hosted channel (``maxsize=1``): its work's ``wait(timeout)`` raises, so
    the put is withdrawn, and a consumer that makes room later gets only the first item."""
    ch = Channel.create("trust_async_wait", maxsize=1)
    ch.put("x1", timeout=10)
    work = ch.put("x2", async_op=True)
    with pytest.raises(CommTimeoutError, match="withdrawn"):
        work.wait(0.5)
    with pytest.raises(CommTimeoutError):  # it stays failed
        work.wait(0.1)
    assert ch.get(timeout=10) == "x1"
    with pytest.raises(CommTimeoutError):
        ch.get(timeout=1.0)
    assert _stats("trust_async_wait")["items"] == 0


def test_an_async_put_on_a_local_channel_whose_wait_timed_out_is_not_delivered():
    """The in-process channel keeps the same rule: a wait that times out withdraws the async put."""
    ch = Channel.create("trust_local_async_wait", maxsize=1, local=True)
    ch.put("x1", timeout=5)
    work = ch.put("x2", async_op=True)
    with pytest.raises(CommTimeoutError, match="withdrawn"):
        work.wait(0.3)
    assert ch.get(timeout=2) == "x1"
    assert ch.qsize() == 0
    with pytest.raises(CommTimeoutError):
        ch.get(timeout=0.5)


def test_an_untaken_async_get_on_a_local_channel_gives_its_items_back():
    """The in-process channel keeps the hosted channel's rule for gets: an async get's items leave the
    channel only when the user takes them.  A work dropped untaken puts what it was served back at the
    head (in order, with their weights), or withdraws the get if nothing came yet; it used to lose them."""
    import gc

    ch = Channel.create("trust_local_untaken", local=True)
    work = ch.get(async_op=True)
    ch.put("first", timeout=1)
    ch.put("second", timeout=1)
    assert work.done()
    del work
    gc.collect()
    assert [ch.get(timeout=1), ch.get(timeout=1)] == ["first", "second"]

    work = ch.get(async_op=True)  # dropped before anything came: withdrawn, it takes nothing later
    del work
    gc.collect()
    ch.put("third", timeout=1)
    assert ch.get(timeout=1) == "third"

    work = ch.get_batch(2, async_op=True)
    ch.put("a", weight=1, timeout=1)
    ch.put("b", weight=1, timeout=1)
    ch.put("c", weight=1, timeout=1)
    assert work.done()
    del work
    gc.collect()
    assert ch.get_batch(2, timeout=1) == ["a", "b"]  # back with their weights
    assert ch.get(timeout=1) == "c"

    work = ch.get(async_op=True)  # taken: gone for good
    ch.put("fourth", timeout=1)
    assert work.wait(1) == "fourth"
    del work
    gc.collect()
    assert ch.qsize() == 0

    work = ch.get(async_op=True)  # a wait that runs out leaves the get waiting, as on a hosted channel
    with pytest.raises(TimeoutError):
        work.wait(0.1)
    ch.put("fifth", timeout=1)
    assert work.wait(1) == "fifth"


def test_puts_are_pushed_only_to_a_host_that_says_it_is_unbounded(host):
    """A host without ``maxsize`` says so in its put answers (the client's later puts go as one-way
    pushes); a host with one never does, and refuses a push (a buggy or hostile client's) unqueued."""
    unbounded, bounded = host("trust_push_unbounded"), host("trust_push_bounded", maxsize=1)
    for h, says in ((unbounded, True), (bounded, None)):
        producer = h.client("producer")
        _, fut = producer.request({"op": "put", "key": "k", "weight": 0.0, "timeout": 5.0}, _frames("first"), blocking=True)
        assert producer.wait_reply(fut, 7)[0].get("unbounded") is says
        producer.push({"op": "put", "key": "k", "weight": 0.0}, _frames("pushed"))
    consumer = unbounded.client("consumer")
    assert [_get(consumer, "k", 2.0) for _ in range(2)] == ["first", "pushed"]
    consumer = bounded.client("consumer")
    assert _get(consumer, "k", 2.0) == "first"
    assert _get(consumer, "k", 0.5) == ("error", "Timeout")  # the push was refused, not queued


def test_a_commit_read_but_not_yet_handled_when_its_tcp_client_is_dropped_is_applied(host, monkeypatch):
    """On TCP the host reads each client on a thread of its own, which queues what it read for the
    loop.  If the loop drops the client (its heartbeat check, a send deadline) while the client's
    commit waits in that queue, the put its caller was told succeeded must still be delivered: it
    used to be dropped with the connection.  The test holds the host's loop right after it answered
    the put, until the commit is queued, then drops the client as the heartbeat check does."""
    from rlinf.scheduler.messaging.channel.protocol import control
    from rlinf.scheduler.transports.cpu_transport import LOCAL_ENV

    monkeypatch.setenv(LOCAL_ENV, "0")  # TCP, as from another node
    h = host("trust_inbox_commit")
    producer, consumer = h.client("producer"), h.client("consumer")
    server = h.server
    handle, flush = server._handle, server._flush_all
    seen = {}

    def queued_commit(conn):
        return any(fn == server._on_message and args[0] is conn and control(args[1][0]).get("op") == "commit"
                   for fn, args in list(server._inbox))

    def handle_and_note(conn, ctrl, item):
        handle(conn, ctrl, item)
        if conn.name == "producer" and ctrl.get("op") == "put":
            seen.setdefault("conn", conn)

    def flush_then_drop():  # on the loop, once the put's answer is out
        flush()
        conn = seen.get("conn")
        if conn is not None and "dropped" not in seen:
            end = time.monotonic() + 5
            while not queued_commit(conn) and time.monotonic() < end:
                time.sleep(0.01)
            seen["commit queued"] = queued_commit(conn)
            server._lost(conn)
            seen["dropped"] = True

    monkeypatch.setattr(server, "_handle", handle_and_note)
    monkeypatch.setattr(server, "_flush_all", flush_then_drop)
    _put(producer, "k", "item")  # returns once its commit is sent: the caller is told it succeeded
    wait_for(lambda: "dropped" in seen, 5, "the drop")
    assert seen["commit queued"], "the commit was not waiting in the loop's queue when the client was dropped"
    assert _get(consumer, "k", 2.0) == "item"


class _Intercepted:
    """A host-side connection's link whose receives run the test's code on that connection's reader
    thread: ``on_commit()`` when one brings a commit, ``on_error()`` when one fails (before it raises)."""

    def __init__(self, link, on_commit, on_error):
        self._link, self._on_commit, self._on_error = link, on_commit, on_error

    def __getattr__(self, name):
        return getattr(self._link, name)

    def recv(self, deadline):
        from rlinf.scheduler.messaging.channel.protocol import control

        try:
            raw, frames = self._link.recv(deadline)
        except Exception:
            self._on_error()
            raise
        if control(frames[0]).get("op") == "commit":
            self._on_commit()
        return raw, frames


def _intercept(server, client_name, on_commit=lambda conn: None, on_error=lambda conn: None):
    """Route the host's receives on ``client_name``'s connection through ``_Intercepted``; the connection.

    The receive its reader thread waits in now is the link's own: the client's next message passes,
    the ones after it are intercepted (a put's request, then its commit)."""
    conn = None
    end = time.monotonic() + 5
    while conn is None and time.monotonic() < end:
        conn = next((c for c in server._ask(lambda: list(server._conns)) if c.name == client_name), None)
    assert conn is not None, f"no connection of {client_name} on the host"
    conn.link = _Intercepted(conn.link, lambda: on_commit(conn), lambda: on_error(conn))
    return conn


def test_a_commit_still_with_the_reader_thread_when_its_tcp_client_is_dropped_is_applied(host, monkeypatch):
    """The same, one step earlier: the client's commit has been received by the host's reader thread
    for that connection but not yet handed to the loop when the loop drops the client.  The dropped
    connection drains: what its reader thread still hands over is applied, and its uncommitted puts
    are settled once that thread has ended.  The test holds the commit in the reader thread until the
    loop has dropped the client."""
    from rlinf.scheduler.transports.cpu_transport import LOCAL_ENV

    monkeypatch.setenv(LOCAL_ENV, "0")  # TCP, as from another node
    h = host("trust_draining")
    producer, consumer = h.client("producer"), h.client("consumer")
    server = h.server
    held = []

    def hold(conn):  # on the reader thread, holding the commit: the loop drops the client (as its heartbeat check would)
        if not held:
            held.append(True)
            server._post(server._lost, conn)
            wait_for(lambda: not conn.alive, 5, "the drop")

    _intercept(server, "producer", on_commit=hold)
    _put(producer, "k", "item")  # returns once its commit is sent: the caller is told it succeeded
    wait_for(lambda: held, 5, "the commit reaching the reader thread")
    assert _get(consumer, "k", 2.0) == "item"
    wait_for(lambda: not server._ask(lambda: list(server._draining)), 5, "the dropped connection's end")
    assert server._ask(lambda: sum(q.uncommitted for q in server._queues.values())) == 0


def test_a_dropped_connection_whose_reader_thread_hangs_still_frees_its_places(host, monkeypatch):
    """A link whose close does not end the receive its reader thread waits in (a transport plugin's,
    say): the dropped connection stops draining after ``_DRAIN_LIMIT`` and its uncommitted put gives
    its place back (``maxsize=1``), so other producers are not held for good."""
    from rlinf.scheduler.messaging.channel import server as server_module
    from rlinf.scheduler.transports.cpu_transport import LOCAL_ENV

    monkeypatch.setenv(LOCAL_ENV, "0")
    monkeypatch.setattr(server_module, "_DRAIN_LIMIT", 0.5)
    h = host("trust_drain_limit", maxsize=1)
    producer, consumer, other = h.client("producer"), h.client("consumer"), h.client("other")
    server = h.server
    release = threading.Event()

    def hang(conn):  # the commit never reaches the loop: drop the client, then hang until the test ends
        server._post(server._lost, conn)
        release.wait(20)
        raise ConnectionError("released")

    _intercept(server, "producer", on_commit=hang)
    try:
        _put(producer, "k", "held")  # taken, committed by the client; the commit never reaches the loop
        begin = time.monotonic()
        _put(other, "k", "next", timeout=5.0)  # waits for the place the dropped put held
        waited = time.monotonic() - begin
        assert waited < 3.0, waited
        assert _get(consumer, "k", 1.0) == "next"
    finally:
        release.set()


def test_an_item_whose_reply_never_left_for_a_dropped_client_is_given_back_at_once(host, monkeypatch):
    """A get's reply still in the host's outbox when the client is dropped never reached it, so no ack
    can come for its item: the item goes back to the head at once, not when the connection's drain
    ends (up to ``_DRAIN_LIMIT`` on a link whose close does not end its reader thread's receive)."""
    from rlinf.scheduler.transports.cpu_transport import LOCAL_ENV

    monkeypatch.setenv(LOCAL_ENV, "0")
    h = host("trust_unsent")
    producer, consumer, other = h.client("producer"), h.client("consumer"), h.client("other")
    server = h.server
    release = threading.Event()
    conn = _intercept(server, "consumer", on_error=lambda conn: release.wait(20))  # its reader thread then hangs
    flush = server._flush_all

    def drop_before_flush():  # on the loop: the reply to the consumer's get is queued, not sent yet
        with conn.lock:
            queued = any(ctrl.get("id") in conn.inflight for ctrl, _ in conn.outbox)
        if queued:
            server._lost(conn)
        flush()

    monkeypatch.setattr(server, "_flush_all", drop_before_flush)
    consumer.request({"op": "get", "key": "k", "timeout": 10.0}, ())
    end = time.monotonic() + 20
    while not server._ask(lambda: bool(server._queues.get("k") and server._queues["k"].getters)):
        assert time.monotonic() < end, "the consumer's get was never parked"
        time.sleep(0.02)
    try:
        _put(producer, "k", "item")
        begin = time.monotonic()
        assert _get(other, "k", 4.0) == "item"  # at once: not after the connection's 5 s of draining
        assert time.monotonic() - begin < 4.0
        assert server._ask(lambda: conn.draining is not None)  # given back while the connection still drains
    finally:
        release.set()


def test_a_host_drops_silent_tcp_clients_without_keeping_a_thread_for_each(host, monkeypatch):
    """Connections that authenticate and then say nothing (a hung or partitioned client) are dropped by
    the host's heartbeat check.  On TCP the host reads each one on a thread of its own, blocked in a
    receive that the drop must end: it used to wait on for good, one thread (and its link) kept per
    client ever dropped."""
    import json

    from rlinf.scheduler.transports.cpu_transport import LOCAL_ENV, CpuTransport

    monkeypatch.setenv(LOCAL_ENV, "0")  # TCP, as from another node
    h = host("trust_silent_tcp")
    prefix = "rlinf-channel-trust_silent_tcp-client"

    def readers():
        return sum(t.name == prefix for t in threading.enumerate())

    hello = json.dumps({"service": "channel", "channel": h.name, "client": "silent"}).encode()
    transport = CpuTransport()
    links = [transport.connect(h.endpoint, hello, time.monotonic() + 10) for _ in range(5)]
    wait_for(lambda: readers() == 5, 5, "a reader thread for each connection")
    # heartbeat 0.2 s: each is dropped after 1 s unheard; its reader thread must then end
    wait_for(lambda: readers() == 0, 8, "the dropped connections' reader threads ending")
    assert all(_closed_by_host(link) for link in links)
    transport.close()


def _closed_by_host(link) -> bool:
    """The host closed its end: a receive on ours ends at once instead of waiting."""
    try:
        link.recv(time.monotonic() + 2)
    except ConnectionError:
        return True
    except TimeoutError:
        return False
    return False


def _produce(record_file, name, mode="put"):
    """The producer program: put item-2 on channel ``name`` through this process's own connection.

    ``mode`` ``lying-shm``: item-2 is a 1 MiB array whose shared-memory segment is announced at its
    full size while the descriptor sent with it is a memfd of one page (a buggy or compromised client)."""
    from rlinf.scheduler.channel import channel as channel_module
    from rlinf.scheduler.messaging.channel.client import ChannelClient

    with open(record_file, "rb") as f:
        record = pickle.load(f)
    # the connection Channel would open, made from the record (this process is no driver of the cluster)
    channel_module._clients[(name, 0)] = ChannelClient.connect(name, f"Channel.{name}:0", record)
    channel_module._replica_counts[name] = 1
    ch = Channel(name, 1)
    item = "item-2"
    if mode.startswith("take"):  # a consumer: takes items, says which, then ends (or waits for a signal)
        got = [ch.get(timeout=30)] + ch.get_batch(2, timeout=30)
        print("TOOK", *got, flush=True)
        if mode == "take-then-wait":
            time.sleep(60)
        return
    if mode == "lying-shm":
        import numpy as np

        from rlinf.scheduler.transports import shm

        make = shm.create_segment

        def lying_segment(seg_id, nbytes):
            seg = make(seg_id, nbytes)  # written through its own mapping; a one-page memfd goes instead
            small = os.memfd_create("rlt-small", os.MFD_CLOEXEC)
            os.ftruncate(small, shm.PAGE)
            os.close(seg.fd)
            seg.fd = small
            return seg

        shm.create_segment = lying_segment
        item = np.ones(1 << 20, dtype=np.uint8)
    print("READY", flush=True)
    try:
        ch.put(item, timeout=30)
        print("PUT OK", flush=True)
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)
    except Exception as exc:
        print("FAILED", type(exc).__name__, exc, flush=True)


if __name__ == "__main__":
    _produce(*sys.argv[1:])


def test_a_get_batch_waiting_on_weightless_items_is_said_early_in_the_host_log(host, monkeypatch, caplog):
    """Items put without weight= weigh 0 and never reach a get_batch's target: the host says so once the get
    has waited STALL_NOTE_AFTER seconds, long before its timeout; a get_batch short of weight it may still get
    is a normal wait and is not reported."""
    from rlinf.scheduler.messaging.channel import queues

    monkeypatch.setattr(queues, "STALL_NOTE_AFTER", 0.3)
    h = host("stall_note")
    producer, consumer = h.client("producer"), h.client("consumer")
    for key, weight in (("weightless", 0.0),) * 3 + (("light", 0.5),):
        _, fut = producer.request({"op": "put", "key": key, "weight": weight, "timeout": 5.0}, _frames(0),
                                  blocking=True)
        producer.wait_reply(fut, 7)
    with caplog.at_level("WARNING", logger="rlinf.channel"):
        for key in ("weightless", "light"):
            _, fut = consumer.request({"op": "get_batch", "key": key, "target": 2.0, "timeout": 30.0}, ())
            deadline = time.monotonic() + 10
            while key == "weightless" and "holds 3 item(s) of total weight 0" not in caplog.text:
                assert time.monotonic() < deadline, "no early word of the weightless get_batch within 10 s"
                time.sleep(0.05)
            if key == "light":
                time.sleep(0.8)  # past the note's time: nothing to say of a key that holds weight
            assert not fut.done()  # still waiting: the note ends nothing
    notes = [r.getMessage() for r in caplog.records if "get_batch" in r.getMessage()]
    assert len(notes) == 1 and "key 'weightless'" in notes[0] and "weight=" in notes[0], notes
