"""Feeds keep every order a user can see, whatever ends them (a real host and real clients in this process).

A recall, a feed its client ends itself (idle, or before ``get_batch``)
while fed items are still on their way, a return that cannot be sent at
once, an interrupt between taking a fed item and handing it out: in each
case every item is delivered once, in the order it was put, and nothing is
left in flight.
"""

import contextlib
import time

import pytest

from rlinf.scheduler.channel.channel import _NOT_FED, _take_fed
from rlinf.scheduler.transports import codec

from p2p_helpers import wait_for
from test_channel_trust import _frames, host  # noqa: F401 (host: the fixture)


def _put(client, key, item, weight=0.0):
    """A put as ``Channel.put`` makes it: a push once the host said it is unbounded."""
    ctrl = {"op": "put", "key": key, "weight": weight, "timeout": 5.0}
    if client.unbounded and not client._open_puts:
        client.push(ctrl, _frames(item))
        return
    _, fut = client.request(ctrl, _frames(item), blocking=True)
    if client.wait_reply(fut, 7)[0].get("unbounded"):
        client.unbounded = True


def _get(client, key, timeout=5.0, nowait=False):
    """A blocking get as ``Channel.get`` makes it: from the feed if there is one, else asking for one."""
    ctrl = {"op": "get", "key": key, "timeout": timeout, **({"nowait": True} if nowait else {})}
    got = _take_fed(client, ctrl, timeout, "get")
    if got is not _NOT_FED:
        return got
    rid, fut = client.request(ctrl, (), blocking=True)
    back, frames = client.wait_reply(fut, timeout + 2)
    if back.get("error"):
        return ("error", back["error"])
    client.ack(rid)
    return codec.decode(frames[0], list(frames[1:]))


def _get_batch(client, key, target, timeout=5.0):
    if client.has_feed(key):
        client.end_feed(key)
    rid, fut = client.request({"op": "get_batch", "key": key, "timeout": timeout, "target": target}, (), blocking=True)
    back, frames = client.wait_reply(fut, timeout + 2)
    client.ack(rid)
    out, pos = [], 0
    for n in back["sizes"]:
        out.append(codec.decode(frames[pos], list(frames[pos + 1:pos + n])))
        pos += n
    return out


def _state(h, key):
    def read():
        q = h.server._queues.get(key)
        return None if q is None else {"items": len(q.items), "fed": q.fed, "feed": q.feed is not None}
    return h.server._ask(read)


def _buffered(client, key):
    feed = client._feeds.get(key)
    return 0 if feed is None else len(feed.buffer)


def _fed_from(p, a, key, n):
    """``p`` puts 0..n-1 on ``key``; ``a`` gets 0 and is fed ahead."""
    for i in range(n):
        _put(p, key, i)
    assert _get(a, key) == 0


@contextlib.contextmanager
def _returns_held(client):
    """``client``'s returns cannot go meanwhile (as when another send holds its link): they stay queued."""
    sent = client._send_one_way
    client._send_one_way = lambda ctrl, *args, **kw: False if ctrl.get("op") == "return" else sent(ctrl, *args, **kw)
    try:
        yield
    finally:
        client._send_one_way = sent


def test_a_second_consumer_waits_for_the_recalled_items_and_gets_them_first(host):
    h = host("order_recall")
    p, a, b = h.client("p"), h.client("a"), h.client("b")
    _fed_from(p, a, "k", 40)
    wait_for(lambda: _state(h, "k")["fed"] == 32, 5, "a window fed ahead")
    # b comes while 7 newer items are queued: the 32 fed to a come back first, in order
    assert [_get(b, "k") for _ in range(10)] == list(range(1, 11))
    assert _get(a, "k") == 11  # a asks again (its feed was recalled): the head, not an item of its old buffer
    assert [_get(b, "k") for _ in range(28)] == list(range(12, 40))


def test_items_on_their_way_when_a_client_ends_its_feed_keep_their_place(host):
    h = host("order_end")
    p, a = h.client("p"), h.client("a")
    _put(p, "k", 0, weight=1.0)
    assert _get(a, "k") == 0
    for i in (1, 2, 3):
        _put(p, "k", i, weight=1.0)
    wait_for(lambda: _buffered(a, "k") == 3, 5, "three items in a's buffer")
    with a._turn_lock:
        a._reader = -1  # nothing reads a's connection for a moment: the next items stay on their way
    _put(p, "k", 4, weight=1.0)
    _put(p, "k", 5, weight=1.0)
    wait_for(lambda: _state(h, "k")["fed"] == 5, 5, "4 and 5 fed (unread)")
    a.end_feed("k")  # as before get_batch, or after FEED_IDLE: 1-3 go back now, 4 and 5 once read
    a._reader = None
    assert _get_batch(a, "k", 4) == [1, 2, 3, 4]
    assert _get_batch(a, "k", 1) == [5]
    assert _state(h, "k") in (None, {"items": 0, "fed": 0, "feed": False})


def test_a_return_that_cannot_go_at_once_goes_with_the_next_message(host):
    h = host("order_return")
    p, a, b = h.client("p"), h.client("a"), h.client("b")
    _fed_from(p, a, "k", 4)
    wait_for(lambda: _buffered(a, "k") == 3, 5, "three items in a's buffer")
    with _returns_held(a):
        a.end_feed("k")  # another send held the link: the return is kept, not dropped
    assert len(a._returns) == 1 and _state(h, "k")["fed"] == 3
    _, fut = a.request({"op": "qsize", "key": "k"}, (), blocking=True)  # the next message: the return goes first
    assert a.wait_reply(fut, 5)[0]["value"] == 3 and not a._returns
    assert [_get(b, "k") for _ in range(3)] == [1, 2, 3]


def test_an_interrupt_after_a_fed_item_was_taken_puts_it_back(host):
    h = host("order_interrupt")
    p, a = h.client("p"), h.client("a", ack_link=True)
    _fed_from(p, a, "k", 40)
    wait_for(lambda: a._ack_link is not None, 5, "the ack link")
    wait_for(lambda: _buffered(a, "k") == 32, 5, "a full window")
    assert [_get(a, "k") for _ in range(15)] == list(range(1, 16))
    a._acked_quietly = True
    sent = a._send_one_way

    def interrupted(ctrl, *args, **kw):
        if ctrl.get("op") == "more":
            raise KeyboardInterrupt
        return sent(ctrl, *args, **kw)

    a._send_one_way = interrupted
    with pytest.raises(KeyboardInterrupt):
        _get(a, "k")  # takes 16, then its "more" is interrupted
    a._send_one_way = sent
    assert [_get(a, "k") for _ in range(24)] == list(range(16, 40))
    wait_for(lambda: _state(h, "k") in (None, {"items": 0, "fed": 0, "feed": True}), 5, "nothing left in flight")


def test_a_get_batch_parked_beside_a_feed_is_served_first(host):
    h = host("order_batch")
    p, a = h.client("p"), h.client("a")
    _, batch = a.request({"op": "get_batch", "key": "k", "timeout": 10, "target": 3.0}, ())
    wait_for(lambda: (_state(h, "k") or {}).get("items") == 0, 5, "the get_batch parked")
    _put(p, "k", 0, weight=1.0)
    assert _get(a, "k", timeout=5) == 0  # a blocking get beside it asks for a feed
    for i in range(1, 6):
        _put(p, "k", i, weight=1.0)
    ctrl, _ = batch.result(5)
    assert ctrl["count"] == 3  # items 1-3: the feed did not take them from under it
    assert [_get(a, "k") for _ in range(2)] == [4, 5]


def test_a_recalled_feed_whose_items_were_all_taken_holds_nobody_up(host):
    """The feed's client took every item (acknowledged on its ack link, which wakes no one): a second
    consumer's get is served at once, and so is one after a qsize; a get_nowait during a hold answers
    within its second."""
    h = host("order_all_taken")
    p, a, b = h.client("p"), h.client("a", ack_link=True), h.client("b")
    _fed_from(p, a, "k", 4)
    wait_for(lambda: a._ack_link is not None, 5, "the ack link")
    wait_for(lambda: _buffered(a, "k") == 3, 5, "three items in a's buffer")
    assert [_get(a, "k") for _ in range(3)] == [1, 2, 3]
    _put(p, "k", 4)
    start = time.monotonic()
    assert _get(b, "k") == 4 and time.monotonic() - start < 1.0  # no hold: nothing of a's feed is out
    _, fut = b.request({"op": "qsize", "key": "k"}, (), blocking=True)
    assert b.wait_reply(fut, 5)[0]["value"] == 0

    c = h.client("c")
    _fed_from(p, c, "k2", 40)
    wait_for(lambda: _buffered(c, "k2") == 32, 5, "a full window fed to c")
    with _returns_held(c):  # c's recalled items do not come back for a while
        start = time.monotonic()
        got = _get(b, "k2", nowait=True)  # a hold (c's items are out), and 7 items queued behind them
        took = time.monotonic() - start
    assert got == 33 and 0.5 < took < 3.0  # after its second, what is there, not 5 s
    wait_for(lambda: _state(h, "k2")["fed"] == 0, 5, "c's items back with its next tick")
    assert [_get(b, "k2") for _ in range(7)] == [1, 2, 3, 4, 5, 6, 7]


def test_large_items_are_fed_one_at_a_time(host):
    """A feed holds about a megabyte ahead at the most (one item whatever its size): a consumer of large items
    is never sent much more than it asked for."""
    h = host("order_large")
    p, a = h.client("p"), h.client("a", ack_link=True)
    big = [bytes([i]) * (2 << 20) for i in range(6)]
    _put(p, "k", big[0])
    assert _get(a, "k") == big[0]  # a is fed from now on
    for item in big[1:]:
        _put(p, "k", item)  # each put is a chance to feed more
    wait_for(lambda: _state(h, "k")["fed"] == 1, 5, "the next item fed ahead")
    time.sleep(0.2)
    assert _state(h, "k") == {"items": 4, "fed": 1, "feed": True}  # no more than one ahead
    assert [_get(a, "k") for _ in range(5)] == big[1:]
