"""Asynchronous puts sent in batches, and acknowledgements written straight to the ack link's socket.

A real host and real clients in this process (see ``test_channel_trust``):
a burst of asynchronous puts reaches the host in a few messages and in
order; whatever follows a batch (a put, a get) follows it on the wire too; a
batch that cannot be sent fails all its works and delivers none of its
items; a malformed batch is refused whole.  ``Link.detach`` hands over the
socket only when no byte was read ahead, and the host reads acknowledgement
records split between two reads.
"""

import contextlib
import socket
import struct
import threading
import time

import pytest

from rlinf.scheduler import CommTimeoutError
from rlinf.scheduler.base.errors import PeerDiedError
from rlinf.scheduler.channel.works import _BatchedPutWork
from rlinf.scheduler.messaging.channel.batching import BATCH_ITEMS
from rlinf.scheduler.messaging.channel.protocol import pack
from rlinf.scheduler.transports.cpu_link import SocketLink

from p2p_helpers import wait_for
from test_channel_feed_order import _buffered, _get, _put, _state
from test_channel_trust import _frames, host  # noqa: F401 (host: the fixture)


def _unbounded(p):
    """``p`` learns that the host has no maxsize (a put's reply says so): its puts go as pushes from now on."""
    _put(p, "setup", "first")
    assert p.unbounded


def _async_put(client, key, item, weight=0.0):
    """An asynchronous put as ``Channel.put(..., async_op=True)`` makes it: its batch's future, or None (sent)."""
    frames = _frames(item)
    return client.push_async({"op": "put", "key": key, "weight": weight}, frames, sum(len(f) for f in frames))


def _messages(h):
    return h.server._ask(lambda: h.server._messages)


def _pair(host, name):
    """A host, a producer ``p`` whose puts go as pushes, and a consumer ``a``."""
    h = host(name)
    p, a = h.client("p"), h.client("a")
    _unbounded(p)
    return h, p, a


@contextlib.contextmanager
def _held_batch(p):
    """The puts made inside join one batch that stays unsent (its thread cannot take the connection)."""
    with p._flush_lock:
        p._last_push = time.monotonic()
        yield


def test_a_burst_of_async_puts_goes_in_a_few_messages_in_order(host):
    h, p, a = _pair(host, "batch_burst")
    before = _messages(h)
    futures = [_async_put(p, "k", i) for i in range(500)]
    for f in futures:
        if f is not None:
            f.result(5)
    _, fut = p.request({"op": "qsize", "key": "k"}, (), blocking=True)  # read after every batch
    assert p.wait_reply(fut, 5)[0]["value"] == 500
    sent = _messages(h) - before - 1
    assert sent <= 500 // BATCH_ITEMS + 20, sent  # not one message per item
    assert [_get(a, "k") for _ in range(500)] == list(range(500))  # once each, in order


def test_what_follows_a_batch_follows_it_on_the_wire(host):
    """A batch still filling goes before the next put or request of its connection, in any thread."""
    h, p, a = _pair(host, "batch_follow")
    with _held_batch(p):  # the flusher thread cannot send it: only what follows can
        futures = [_async_put(p, "k", i) for i in range(5)]
        assert all(f is not None and not f.done() for f in futures)
    _put(p, "k", 5)  # the next put: the batch goes first
    assert all(f.done() and f.exception() is None for f in futures)
    with _held_batch(p):
        late = _async_put(p, "k", 6)
    _, fut = p.request({"op": "qsize", "key": "k"}, (), blocking=True)  # any request
    assert p.wait_reply(fut, 5)[0]["value"] == 7 and late.done()
    assert [_get(a, "k") for _ in range(7)] == list(range(7))


def test_one_batch_carries_keys_and_weights_as_they_were_put(host):
    h, p, a = _pair(host, "batch_runs")
    with _held_batch(p):
        futures = [_async_put(p, "xy"[i % 2], i, weight=float(i % 3 + 1)) for i in range(9)]
    p.flush_batch(5)
    assert all(f.done() for f in futures)
    rid, fut = a.request({"op": "get_batch", "key": "x", "timeout": 5, "target": 6.0}, (), blocking=True)
    back, _frames_back = a.wait_reply(fut, 7)
    a.ack(rid)
    assert back["count"] == 3  # x holds 0, 2, 4, 6, 8 weighing 1, 3, 2, 1, 3: the first three make 6
    assert [_get(a, "y") for _ in range(4)] == [1, 3, 5, 7]


def test_a_batch_that_cannot_be_sent_fails_its_works_and_delivers_nothing(host):
    h, p, a = _pair(host, "batch_lost")
    with _held_batch(p):
        futures = [_async_put(p, "k", i) for i in range(3)]
        p.fail("the test ended this connection")
    for f in futures:
        with pytest.raises(PeerDiedError):
            f.result(5)
    assert _get(a, "k", nowait=True) == ("error", "QueueEmpty")


def test_a_wait_that_runs_out_withdraws_a_batch_that_has_not_gone(host):
    """Another thread holds the connection (its batch being sent) past the wait's timeout: the waited
    batch is withdrawn, its puts raise, and none of them is ever delivered."""
    h, p, a = _pair(host, "batch_withdrawn")
    release, t = _hold(p._flush_lock)
    p._last_push = time.monotonic()
    futures = [_async_put(p, "k", i) for i in range(2)]
    work = _BatchedPutWork(futures[0], "put on channel 'batch_withdrawn'", p)
    start = time.monotonic()
    with pytest.raises(CommTimeoutError, match="withdrawn"):
        work.wait(0.3)
    assert time.monotonic() - start < 2.0
    release.set()
    t.join(5)
    with pytest.raises(CommTimeoutError):
        futures[1].result(1)  # the same batch
    _put(p, "k", "after")
    assert _get(a, "k") == "after"  # nothing of the withdrawn batch came before it


def test_a_malformed_batch_is_refused_whole(host):
    h, p, a = _pair(host, "batch_malformed")
    frames = _frames(0) + _frames(1)
    for runs in ([["k", 0.0, [2]], ["k", "heavy", [2]]],  # a weight that is not a number, in its second run
                 [["k", 0.0, [2, 1]]],  # sizes that do not add up to its frames
                 [["k", 0.0, [0, 4]]]):  # an item of no frame
        p._send([pack({"id": 0, "op": "push", "runs": runs}), *frames], 5)
    _put(p, "k", "after")
    _, fut = p.request({"op": "qsize", "key": "k"}, (), blocking=True)  # answered once all before it were read
    assert p.wait_reply(fut, 5)[0]["value"] == 1
    assert _get(a, "k") == "after"


# -- Link.detach, and acknowledgement records as the host reads them --------------------------------------
def _link_pair():
    a, b = socket.socketpair()
    return SocketLink(a, local=True), SocketLink(b, local=True)


def test_detach_hands_over_the_socket_only_with_nothing_read_ahead():
    la, lb = _link_pair()
    la.owe(b"\x01")  # what the link owes its peer is sent before the socket is handed over
    sock = la.detach()
    assert sock is not None and not la.is_open()
    with pytest.raises(ConnectionError):
        la.send([b"x"], time.monotonic() + 1)
    sock.sendall(b"raw")
    peer = lb.detach()
    assert peer is not None
    peer.setblocking(True)
    peer.settimeout(5)
    got = b""
    while len(got) < 4:
        got += peer.recv(16)
    assert got == b"\x01raw"
    sock.close()
    peer.close()

    la, lb = _link_pair()
    la.send([b"one"], time.monotonic() + 5)
    la.send([b"two"], time.monotonic() + 5)
    wait_for(lambda: lb.recv_nowait() is not None, 5, "the first message")  # reads the second ahead with it
    assert lb.detach() is None and lb.is_open()  # refused: the link stays as it was
    assert [bytes(f) for f in lb.recv(time.monotonic() + 5)[1]] == [b"two"]
    la.close()
    lb.close()


def test_an_acknowledgement_split_between_two_reads_counts_once_whole(host):
    h = host("batch_ack_split")
    p, a, b = h.client("p"), h.client("a", ack_link=True), h.client("b")
    for i in range(4):
        _put(p, "k", i)
    assert _get(a, "k") == 0  # a is fed from now on
    wait_for(lambda: a._ack_link is not None, 5, "the ack link")
    wait_for(lambda: _buffered(a, "k") == 3, 5, "three items in a's buffer")
    feed = a._feeds["k"]
    first, second = feed.buffer.popleft()[0], feed.buffer.popleft()[0]  # taken by hand: acknowledged below
    record = struct.pack("<2q", first, second)
    a._write_acks(a._ack_link, record[:12])
    wait_for(lambda: _state(h, "k")["fed"] == 2, 5, "the first acknowledgement read")
    time.sleep(0.2)
    assert _state(h, "k")["fed"] == 2  # half a record is not an acknowledgement
    a._write_acks(a._ack_link, record[12:])
    wait_for(lambda: _state(h, "k")["fed"] == 1, 5, "the second, completed")
    assert _get(a, "k") == 3
    _put(p, "k", 4)
    assert _get(b, "k") == 4  # a recall: nothing of a's is left to put back


# -- a batch whose connection is held, callbacks, and the interpreter's exit -------------------------------
def _hold(lock):
    """Hold ``lock`` from another thread (as a batch being sent there does) until the returned event is set."""
    held, release = threading.Event(), threading.Event()

    def hold():
        with lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    assert held.wait(5)
    return release, t


def test_a_full_batch_on_a_held_connection_is_sent_once_it_frees_and_never_raises(host):
    """The put that fills a batch sends it; if another send holds the connection past its limit, the put does
    not raise (its work waits) and the batch goes once the connection is free: never a put that raised and
    was delivered."""
    h, p, a = _pair(host, "batch_full_held")
    p._send_timeout = 0.3
    release, t = _hold(p._flush_lock)
    p._last_push = time.monotonic()
    futures = [_async_put(p, "k", i) for i in range(BATCH_ITEMS)]  # the last one fills it: waits 0.3 s, no raise
    assert not any(f.done() for f in futures)
    release.set()
    t.join(5)
    wait_for(lambda: all(f.done() for f in futures), 5, "the batch sent by its own thread")
    assert all(f.exception() is None for f in futures)
    assert [_get(a, "k") for _ in range(BATCH_ITEMS)] == list(range(BATCH_ITEMS))


def test_a_request_that_cannot_wait_leaves_the_batch_before_it_queued(host):
    """A request with a short limit behind a held connection raises, but the batch it had to follow is not
    failed for it: it goes later, with its own puts' send timeout."""
    h, p, a = _pair(host, "batch_short_limit")
    release, t = _hold(p._flush_lock)
    p._last_push = time.monotonic()
    futures = [_async_put(p, "k", i) for i in range(3)]
    from rlinf.scheduler.messaging.channel.protocol import SendTimeout

    with pytest.raises(SendTimeout):
        p.request({"op": "qsize", "key": "k"}, (), send_timeout=0.2, blocking=True)
    assert not any(f.done() for f in futures)
    release.set()
    t.join(5)
    wait_for(lambda: all(f.done() for f in futures), 5, "the batch")
    assert all(f.exception() is None for f in futures)
    assert [_get(a, "k") for _ in range(3)] == [0, 1, 2]


def test_a_batchs_callbacks_run_after_its_send_let_the_connection_go(host):
    """A callback of a batch's work that makes a blocking call on the same connection does not wait for
    the batch's own send (the works are settled once the connection is free)."""
    h, p, a = _pair(host, "batch_callback")
    with _held_batch(p):
        first = _async_put(p, "k", 0)
        done = threading.Event()

        def then(_f):
            _put(p, "k", 1)  # a put from inside the callback, on the same connection
            done.set()

        first.add_done_callback(then)
    start = time.monotonic()
    p.flush_batch(5)
    assert done.wait(5) and time.monotonic() - start < 1.5
    assert [_get(a, "k") for _ in range(2)] == [0, 1]


_EXITING = """
import json, sys, time
sys.path.insert(0, {tests!r})
from rlinf.scheduler.messaging.channel.client import ChannelClient
from rlinf.scheduler.transports.cpu_transport import CpuTransport
from test_channel_trust import _frames
endpoint = json.loads({endpoint!r})
link = CpuTransport().connect(endpoint, json.dumps({{"service": "channel", "channel": {name!r}, "client": "exiting",
                              "token": "t" * 32}}).encode(), time.monotonic() + 10)
c = ChannelClient({name!r}, "host", link)
c.unbounded = True  # as after its first put's answer
futures = [c.push_async({{"op": "put", "key": "k", "weight": 0.0}}, _frames(i), 16) for i in range(40)]
print(sum(f is not None and not f.done() for f in futures), flush=True)
"""  # the script ends with puts whose works are not done: they still go


def test_async_puts_still_queued_when_a_script_ends_are_delivered(host, tmp_path):
    import json
    import os
    import subprocess
    import sys

    h = host("batch_exit")
    a = h.client("a")
    script = tmp_path / "exiting.py"
    script.write_text(_EXITING.format(tests=os.path.dirname(__file__), endpoint=json.dumps(h.endpoint), name="batch_exit"))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip() or 0) > 0  # some were still queued at the end
    assert [_get(a, "k") for _ in range(40)] == list(range(40))
