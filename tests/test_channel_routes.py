"""Direct routes: a producer sends a fed key's items straight to its consumer (a real host, real clients and
real links in this process; see ``messaging/channel/routes.py``).

Whatever ends a route (a recall, a consumer that falls behind, either end's death) every item is delivered
once and in the order its producer put it, and the host is left with nothing in flight.
"""

import json
import threading
import time
import uuid

import pytest

from rlinf.scheduler.messaging.channel import direct_in, direct_out
from rlinf.scheduler.messaging.channel.batching import BATCH_GAP
from rlinf.scheduler.messaging.channel.direct_out import START_RETRY, dialer
from rlinf.scheduler.messaging.channel.direct_wire import pack_credit, send_item
from rlinf.scheduler.messaging.channel.protocol import ROUTE_WINDOW
from rlinf.scheduler.messaging.p2p.communicator import Communicator
from rlinf.scheduler.transports.cpu_transport import CpuTransport

from p2p_helpers import wait_for
from test_channel_feed_order import _get, _put
from test_channel_trust import _Host, _frames


class _RoutedHost(_Host):
    def client(self, who, ack_link=True, direct=True):
        """A client as ``ChannelClient.connect`` makes it, which may take and send direct routes."""
        from rlinf.scheduler.messaging.channel.client import ChannelClient

        token = uuid.uuid4().hex

        def dial(hello):
            return CpuTransport().connect(self.endpoint, json.dumps(hello).encode(), time.monotonic() + 10)

        c = ChannelClient(self.name, f"{self.name}-host",
                          dial({"service": "channel", "channel": self.name, "client": who, "token": token,
                                "direct": direct}))
        if ack_link:
            c._dial_acks = lambda: dial({"service": "channel", "channel": self.name, "acks_for": token})
        if direct:
            c._dial_direct = dialer(("cpu", CpuTransport()), Communicator._connect)
        self.clients.append(c)
        return c


@pytest.fixture
def routed(monkeypatch):
    """A host in this process and a listener that takes route links for its clients (beats every 0.2 s)."""
    monkeypatch.setenv("RLINF_CHANNEL_HEARTBEAT", "0.2")
    listener = CpuTransport()
    endpoint = listener.listen(lambda link, hello: direct_in.on_direct(link, json.loads(hello)), "127.0.0.1")
    direct_in.serve_direct({"cpu": endpoint})
    made = []

    def make(name):
        made.append(_RoutedHost(name, 0))
        return made[-1]

    yield make
    for h in made:
        h.close()
    direct_in.serve_direct(None)
    listener.close()


def _hear(client, key=None):
    """Make ``client`` read what its host sent it: a blocking request reads its connection (until a route
    on ``key`` came, if given: the host offers it at the end of the turn that fed the push)."""
    def read():
        _, fut = client.request({"op": "qsize", "key": "_"}, (), blocking=True)
        client.wait_reply(fut, 5)
        return key is None or key in client._out_routes
    wait_for(read, 5, f"a route on {key!r}")


def _host_state(h):
    def read():
        s = h.server
        return {"routes": sum(r.started for r in s._routes.values()), "fed": sum(q.fed for q in s._queues.values()),
                "items": sum(len(q.items) for q in s._queues.values()),
                "held_routes": sum(q.routes for q in s._queues.values())}
    return h.server._ask(read)


def _routed_pair(h, key="k"):
    """Producer ``p`` with a started route to consumer ``c`` on ``key``; 0 was put and taken through the host."""
    p, c = h.client("p"), h.client("c")
    _put(p, key, 0)
    assert _get(c, key) == 0
    _put(p, key, 1)  # fed at once, leaving the queue empty: the host offers p a route
    assert _get(c, key) == 1
    _hear(p, key)
    return p, c


def test_a_route_carries_the_items_in_order_after_the_earlier_ones(routed):
    h = routed("routes_order")
    p, c = h.client("p"), h.client("c")
    _put(p, "k", 0)
    assert _get(c, "k") == 0
    for i in range(1, 5):
        _put(p, "k", i)  # fed through the host
    _hear(p, "k")  # the route offered after those pushes
    for i in range(5, 60):
        _put(p, "k", i)  # the first starts the route (the host says go after 1-4): the rest go straight to c
    route = p._out_routes["k"]
    assert route.started and route.n == 55
    assert [_get(c, "k") for _ in range(59)] == list(range(1, 60))
    assert len(c._in_routes) == 1
    wait_for(lambda: _host_state(h)["fed"] == 0, 5, "nothing in flight")


def test_a_recall_returns_the_direct_items_to_their_places_before_later_puts(routed):
    h = routed("routes_recall")
    p, c = _routed_pair(h)
    for i in range(2, 12):
        _put(p, "k", i)
    assert p._out_routes["k"].n == 10
    assert [_get(c, "k") for _ in range(3)] == [2, 3, 4]
    wait_for(lambda: sum(len(f.buffer) for f in c._feeds.values()) == 7, 5, "7 direct items in c's buffer")
    d = h.client("d")
    assert _get(d, "k") == 5  # c's feed is recalled: its direct items come back (with their bytes) first
    _hear(p)  # p hears its route ended; its next put goes through the host, after the route's items
    _put(p, "k", 12)
    assert "k" not in p._out_routes
    assert [_get(d, "k") for _ in range(7)] == list(range(6, 13))
    wait_for(lambda: _host_state(h) == {"routes": 0, "fed": 0, "items": 0, "held_routes": 0}, 5, "nothing left")


def test_a_consumer_that_falls_behind_ends_the_route_and_order_holds(routed):
    h = routed("routes_behind")
    p, c = _routed_pair(h)
    n = 2 + ROUTE_WINDOW + 40
    for i in range(2, n):
        _put(p, "k", i)  # the window fills: the route ends and the rest go through the host
    assert "k" not in p._out_routes
    assert [_get(c, "k") for _ in range(n - 2)] == list(range(2, n))
    wait_for(lambda: _host_state(h) == {"routes": 0, "fed": 0, "items": 0, "held_routes": 0}, 5, "nothing left")


def test_a_consumer_that_dies_holding_direct_items_loses_none(routed):
    h = routed("routes_consumer_dies")
    p, c = _routed_pair(h)
    for i in range(2, 22):
        _put(p, "k", i)
    assert [_get(c, "k") for _ in range(5)] == [2, 3, 4, 5, 6]
    wait_for(lambda: sum(len(f.buffer) for f in c._feeds.values()) == 15, 5, "15 direct items in c's buffer")
    c._read_direct = lambda: 0  # nothing more is read or returned: as if killed
    c._queue_return = lambda *args: None
    c._link.close()  # its host sees it gone (its copies, sent later by p, go back to the queue)
    c._ack_link and c._ack_link.close()
    d = h.client("d")
    _hear(p)  # p's copies go before this request; p hears its route ended
    assert [_get(d, "k") for _ in range(15)] == list(range(7, 22))
    _put(p, "k", 22)
    assert _get(d, "k") == 22
    wait_for(lambda: _host_state(h)["routes"] == 0 and _host_state(h)["fed"] == 0, 5, "nothing in flight")


def test_a_producer_that_dies_after_direct_puts_loses_none(routed):
    h = routed("routes_producer_dies")
    p, c = _routed_pair(h)
    for i in range(2, 12):
        _put(p, "k", i)
    assert len(p._out_routes["k"].kept) == 10  # c has not said it took them: p keeps them
    p._link.close()  # as if killed: what it kept is gone with it
    assert _get(c, "k") == 2
    wait_for(lambda: _host_state(h)["routes"] == 1 and not h.server._ask(lambda: [r for r in h.server._routes.values()
                                                                                    if r.a.alive]), 5, "p gone")
    d = h.client("d")  # recalls c's feed: the direct items c has not taken come back from c, with their bytes
    assert [_get(d, "k") for _ in range(9)] == list(range(3, 12))
    wait_for(lambda: _host_state(h) == {"routes": 0, "fed": 0, "items": 0, "held_routes": 0}, 5, "nothing left")


def test_a_route_starts_only_once_older_items_are_fed(routed):
    h = routed("routes_refused")
    p, c = _routed_pair(h)
    q = h.client("q")
    with c._turn_lock:
        c._reader = -1  # c reads nothing for a while: its window fills and items queue at the host
    try:
        for i in range(100, 140):
            _put(q, "k", i)
        wait_for(lambda: _host_state(h)["items"] > 0, 5, "items queued behind c's full window")
        _put(p, "k", 2)  # the host answers "later" (older items wait): it goes through the host
    finally:
        c._reader = None
    route = p._out_routes["k"]
    assert not route.started and route.n == 0  # the offer stands
    got = [_get(c, "k") for _ in range(41)]
    assert sorted(got) == [2, *range(100, 140)] and got[-1] == 2
    time.sleep(START_RETRY)
    _put(p, "k", 3)  # nothing waits now: this put starts the route
    assert route.started and route.n == 1
    assert _get(c, "k") == 3


def test_a_link_with_a_token_nobody_expects_is_never_read(routed):
    h = routed("routes_stranger")
    p, c = _routed_pair(h)
    endpoint = direct_in.direct_endpoints()["cpu"]
    stranger = CpuTransport().connect(endpoint, json.dumps({"service": "channel-direct", "token": "f" * 32}).encode(),
                                      time.monotonic() + 5)
    send_item(stranger.detach(), 1, 0.0, [b"junk"], time.monotonic() + 5)  # an item 1, as a route's first
    for i in range(2, 6):
        _put(p, "k", i)
    assert [_get(c, "k") for _ in range(4)] == [2, 3, 4, 5]
    assert all(r.token != "f" * 32 for r in c._in_routes.values())
    stranger.close()


def test_an_end_whose_copies_do_not_match_their_frames_is_refused_whole(routed):
    h = routed("routes_bad_copies")
    p, c = _routed_pair(h)
    _put(p, "k", 2)
    r = p._out_routes["k"].r
    _, fut = p.request({"op": "unrouted", "r": r, "last": 6, "n": [5, 6], "w": [0, 0], "sizes": [2, 9]}, [b"x"] * 3,
                       blocking=True)
    assert p.wait_reply(fut, 5)[0]["error"] == "ChannelError"
    assert h.server._ask(lambda: (h.server._routes[r].live, h.server._routes[r].last, len(h.server._routes[r].copies))) \
        == (True, None, 0)
    assert _get(c, "k") == 2


def test_a_stream_of_puts_from_threads_through_a_route_is_delivered_once(routed):
    h = routed("routes_threads")
    p, c = _routed_pair(h)
    got = []

    def consume():
        for _ in range(400):
            got.append(_get(c, "k", timeout=10))

    t = threading.Thread(target=consume)
    t.start()
    for i in range(2, 402):
        _put(p, "k", i)
    t.join(30)
    assert got == list(range(2, 402))
    wait_for(lambda: _host_state(h)["fed"] == 0, 5, "nothing in flight")


def _put_async(client, key, item):
    """An asynchronous put as ``Channel.put(async_op=True)`` makes it to an unbounded host: None if it went
    now, else its batch's future."""
    frames = _frames(item)
    return client.push_async({"op": "put", "key": key, "weight": 0.0, "timeout": None}, frames,
                             sum(len(f) for f in frames))


def _consume(c, key, n, got, every=0, pause=0.0):
    """Take ``n`` items into ``got`` on a thread of its own (pausing ``pause`` s every ``every`` items)."""
    def run():
        for i in range(n):
            got.append(_get(c, key, timeout=10))
            if every and i % every == 0:
                time.sleep(pause)
    t = threading.Thread(target=run)
    t.start()
    return t


def test_a_producer_faster_than_its_consumer_stays_on_the_route(routed):
    """The window fills (the consumer is slower): the producer waits for the consumer's credits instead of
    ending the route, so a whole stream goes straight."""
    h = routed("routes_flow")
    p, c = _routed_pair(h)
    got = []
    t = _consume(c, "k", 400, got, every=8, pause=0.002)  # about 4 ms per window: well under ROUTE_STALL
    for i in range(2, 402):
        _put(p, "k", i)
    t.join(30)
    route = p._out_routes["k"]
    assert route.started and route.n == 400  # every item went straight
    assert got == list(range(2, 402))
    wait_for(lambda: _host_state(h)["fed"] == 0, 5, "nothing in flight")


def test_an_asynchronous_put_alone_starts_the_route_and_its_burst_follows(routed):
    h = routed("routes_async")
    p, c = _routed_pair(h)
    route = p._out_routes["k"]
    assert route.dialed.wait(5) and route.sock is not None  # its link was opened by a thread of its own
    time.sleep(2 * BATCH_GAP)
    got = []
    t = _consume(c, "k", 300, got)
    works = [_put_async(p, "k", i) for i in range(2, 302)]  # the first, not part of a burst, starts the route
    for w in works:
        assert w is None or w.result(5) is None
    t.join(30)
    assert route.started and route.n == 300
    assert got == list(range(2, 302))


def test_a_producer_that_only_puts_asynchronously_hears_its_offer(routed):
    """No request reads its connection: the offer is read after a batch is sent, or on a heartbeat tick."""
    h = routed("routes_async_offer")
    p, c = h.client("p"), h.client("c")
    _put(p, "k", 0)  # (the host says it is unbounded: the puts below are pushes)
    assert _get(c, "k") == 0  # c is fed from now on
    got = []
    t = _consume(c, "k", 200, got)
    works = [_put_async(p, "k", i) for i in range(1, 201)]
    for w in works:
        assert w is None or w.result(5) is None
    t.join(30)
    assert got == list(range(1, 201))
    wait_for(lambda: "k" in p._out_routes, 2, "the route offered to p, heard without any request of p's")


def test_a_route_never_started_is_given_up_with_its_link(routed, monkeypatch):
    monkeypatch.setattr(direct_out, "START_WITHIN", 0.5)
    h = routed("routes_unstarted")
    p, c = _routed_pair(h)  # offered; p puts nothing more on k
    route = p._out_routes["k"]
    assert route.dialed.wait(5) and route.sock is not None
    wait_for(lambda: "k" not in p._out_routes, 5, "p gave the route up on a heartbeat tick")
    assert route.sock is None or route.sock.fileno() == -1  # its link closed
    wait_for(lambda: not h.server._ask(lambda: list(h.server._routes)), 5, "the host forgot it")


def test_a_consumer_that_stays_behind_costs_its_producer_few_links(routed, monkeypatch):
    """Items wait in the queue (the consumer reads nothing): each start is answered *later*, and an offer
    given up is not made again at once, so the producer opens a link once per offer period, not per put."""
    monkeypatch.setattr(direct_out, "START_WITHIN", 0.15)
    h = routed("routes_behind_links")
    p, c, q = h.client("p"), h.client("c"), h.client("q")
    _put(p, "k", 0)
    assert _get(c, "k") == 0
    dials, real = [], p._dial_direct

    def counting(to, hello, timeout):
        dials.append(time.monotonic())
        return real(to, hello, timeout)

    p._dial_direct = counting
    with c._turn_lock:
        c._reader = -1  # c reads nothing: its window fills, and items wait in the queue
    try:
        for i in range(100, 140):
            _put(q, "k", i)
        wait_for(lambda: _host_state(h)["items"] > 0, 5, "items queued")
        end, i = time.monotonic() + 0.8, 1  # (c's heartbeat gives its host up after 1.2 s unread)
        while time.monotonic() < end:
            _put(p, "k", i)
            i += 1
            time.sleep(0.02)
            if i % 10 == 0:
                _hear(p)
    finally:
        c._reader = None
    assert 1 <= len(dials) <= 2, len(dials)  # (no new offer for 1 s after one is given up: REFUSED_PAUSE)
    assert sorted(_get(c, "k") for _ in range(39 + i)) == sorted([*range(100, 140), *range(1, i)])


def test_the_producer_forgets_what_the_consumer_took(routed):
    h = routed("routes_credits")
    p, c = _routed_pair(h)
    for i in range(2, 202):
        _put(p, "k", i)
        assert _get(c, "k") == i
    route = p._out_routes["k"]  # the route lives on: c keeps up
    assert route.n == 200 and len(route.kept) <= ROUTE_WINDOW // 2  # c's credits let p forget what c took


def test_two_threads_putting_through_a_route_that_ends_keep_their_own_order(routed):
    """Two producer threads share a route; the consumer falls behind, so the route ends while both put:
    whichever way each item went (straight, kept and copied back, through the host), each thread's items
    come out in the order it put them, once."""
    h = routed("routes_two_threads")
    p, c = _routed_pair(h)
    n = ROUTE_WINDOW * 2

    def produce(tag):
        for i in range(n):
            _put(p, "k", (tag, i))

    threads = [threading.Thread(target=produce, args=(tag,)) for tag in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    got = [_get(c, "k") for _ in range(2 * n)]
    for tag in "ab":
        assert [i for t, i in got if t == tag] == list(range(n))
    wait_for(lambda: _host_state(h) == {"routes": 0, "fed": 0, "items": 0, "held_routes": 0}, 5, "nothing left")


def test_a_put_that_cannot_go_straight_ends_the_route_first(routed):
    """A put that goes as a request (``put_nowait``, a large item, one behind an unanswered put) while the
    route is live ends the route before it: it cannot overtake the items sent straight before it."""
    h = routed("routes_request_put")
    p, c = _routed_pair(h)
    for i in (2, 3):
        _put(p, "k", i)
    assert p._out_routes["k"].n == 2
    _, fut = p.request({"op": "put", "key": "k", "weight": 0.0, "nowait": True}, _frames(4), blocking=True)
    assert not p.wait_reply(fut, 5)[0].get("error")
    assert "k" not in p._out_routes
    assert [_get(c, "k") for _ in range(3)] == [2, 3, 4]
    wait_for(lambda: _host_state(h) == {"routes": 0, "fed": 0, "items": 0, "held_routes": 0}, 5, "nothing left")


def test_an_item_kept_for_the_consumer_is_the_one_put_not_the_buffer_reused_after(routed):
    np = pytest.importorskip("numpy")
    h = routed("routes_snapshot")
    p, c = _routed_pair(h)
    arr = np.zeros(16, dtype=np.int64)
    _put(p, "k", arr)  # straight to c, kept by p until c says it took it
    arr[:] = 7  # the caller reuses its buffer once put returned
    d = h.client("d")
    got = _get(d, "k")  # c's feed is recalled; p's copy and c's return both say what was put
    assert (got == 0).all()


def test_gets_after_a_feed_ends_do_not_wait_for_an_idle_producer(routed, monkeypatch):
    """A producer with a started route reads its connection, so it ends the route as soon as the consumer's
    feed ends, not on its next heartbeat (3 s here): a get_nowait finds the queued item, a get gets it."""
    monkeypatch.setenv("RLINF_CHANNEL_HEARTBEAT", "3.0")
    h = routed("routes_idle_producer")
    p, c = _routed_pair(h)
    _put(p, "k", 2)
    assert p._out_routes["k"].started and _get(c, "k") == 2
    q = h.client("q")
    _put(q, "k", 100)  # fed to c
    time.sleep(0.8)  # p's first heartbeat (right after it connected) is long over: p reads nothing now unless it must
    d = h.client("d")
    start = time.monotonic()
    assert _get(d, "k") == 100  # c's feed is recalled; its item comes back; the route ends
    assert time.monotonic() - start < 1.0
    wait_for(lambda: _host_state(h) == {"routes": 0, "fed": 0, "items": 0, "held_routes": 0}, 5, "nothing left")


def test_a_consumer_killed_after_its_producer_closed_loses_none(routed):
    """The producer's work is done and it closes its channel: the items its consumer had not taken are copied
    to the host first, so the consumer's death afterwards loses none of them."""
    h = routed("routes_closed_producer")
    p, c = _routed_pair(h)
    for i in range(2, 22):
        _put(p, "k", i)
    assert [_get(c, "k") for _ in range(3)] == [2, 3, 4]
    c._read_direct = lambda: 0  # c reads no more, nor gives anything back: as if killed from here on
    c._queue_return = lambda *args: None
    p.close()
    c._link.close()
    c._ack_link and c._ack_link.close()
    d = h.client("d")
    assert [_get(d, "k") for _ in range(17)] == list(range(5, 22))
    wait_for(lambda: _host_state(h) == {"routes": 0, "fed": 0, "items": 0, "held_routes": 0}, 5, "nothing left")


def test_a_put_on_its_way_to_the_host_goes_before_the_route_starts(routed):
    """Thread t2 looked for a route (none yet) and is about to push through the host when thread t1 starts
    the route: the start waits for t2's push (or gives up), so t2's next put, straight, cannot overtake it."""
    h = routed("routes_race")
    p, c = h.client("p"), h.client("c")
    _put(p, "k", 0)
    assert _get(c, "k") == 0
    _put(p, "k", 1)  # fed at once: the host offers p a route, which p has not read yet
    assert _get(c, "k") == 1
    go_on, waiting = threading.Event(), threading.Event()
    before, t2 = p._before_send, []

    def held_before(limit, batch=True):
        if threading.current_thread() in t2 and not go_on.is_set():
            waiting.set()
            go_on.wait(5)  # t2 found no route and is about to send through the host
        return before(limit, batch)

    p._before_send = held_before

    def second():
        _put(p, "k", ("t2", 0))
        _put(p, "k", ("t2", 1))

    t2.append(threading.Thread(target=second))
    t2[0].start()
    assert waiting.wait(5)
    _hear(p, "k")
    threading.Timer(0.02, go_on.set).start()  # t2 goes on while t1 starts the route
    _put(p, "k", ("t1", 0))
    t2[0].join(10)
    got = [_get(c, "k") for _ in range(3)]
    assert [x for x in got if x[0] == "t2"] == [("t2", 0), ("t2", 1)] and ("t1", 0) in got


class _DialInterrupted:
    """Stands for ``route.dialed`` while the dial is under way; an interrupt lands in a put's wait for it."""

    def __init__(self, real):
        self.real = real

    def is_set(self):
        return False

    def wait(self, timeout=None):
        raise KeyboardInterrupt

    def set(self):
        self.real.set()


def test_an_interrupted_put_leaves_no_count_that_would_hold_starts_back(routed):
    h = routed("routes_count_interrupt")
    p, c = _routed_pair(h)
    route = p._out_routes["k"]
    assert route.dialed.wait(5) and route.sock is not None
    real, route.dialed = route.dialed, _DialInterrupted(route.dialed)
    with pytest.raises(KeyboardInterrupt):
        _put(p, "k", 2)  # interrupted while it waits for the link to open: it did not happen
    route.dialed = real
    assert p._hosted == {}
    start = time.monotonic()
    _put(p, "k", 3)  # starts the route at once (a count left behind would hold it 50 ms, then end it)
    assert route.started and time.monotonic() - start < 0.04
    assert _get(c, "k") == 3


def test_puts_on_other_keys_do_not_hold_a_start_back(routed):
    h = routed("routes_count_keys")
    p, c = _routed_pair(h)
    route = p._out_routes["k"]
    assert route.dialed.wait(5)
    stop = threading.Event()

    def other():  # another thread of p's puts through the host on a key nobody is fed on
        i = 0
        while not stop.is_set() and i < 20000:
            _put(p, "z", i)
            i += 1

    t = threading.Thread(target=other)
    t.start()
    try:
        time.sleep(0.05)
        _put(p, "k", 2)
    finally:
        stop.set()
        t.join(10)
    assert route.started and route.n == 1
    assert _get(c, "k") == 2


def test_a_put_that_comes_while_another_thread_starts_the_route_keeps_its_order(routed):
    """Thread a's asynchronous put, part of a burst, comes while the main thread's start is being sent:
    it waits for the start's outcome instead of going through the host behind it, where its own next put,
    straight on the route, would overtake it."""
    h = routed("routes_start_race")
    p, c = _routed_pair(h)
    route = p._out_routes["k"]
    assert route.dialed.wait(5) and route.sock is not None
    start_sent, a_first, a_done = threading.Event(), threading.Event(), threading.Event()
    main, works = threading.current_thread(), []

    def thread_a():
        p._last_push = time.monotonic() + 1  # part of a burst: it would not start a route itself
        works.append(_put_async(p, "k", ("a", 0)))
        a_first.set()
        assert start_sent.wait(5)
        wait_for(lambda: route.started, 5, "the route started")
        works.append(_put_async(p, "k", ("a", 1)))
        a_done.set()

    send_with_acks = p._send_with_acks

    def sending(ctrl, frames, limit, undo=None):
        if threading.current_thread() is main and ctrl.get("op") == "start" and not start_sent.is_set():
            threading.Thread(target=thread_a).start()  # a puts after the start looked at the counts
            a_first.wait(0.2)
            try:
                return send_with_acks(ctrl, frames, limit, undo)
            finally:
                start_sent.set()
        return send_with_acks(ctrl, frames, limit, undo)

    p._send_with_acks = sending
    send_batch = p._send_batch

    def batch_late(ctrl, frames, limit):  # a batch of a's goes after a's next put (the worst order for it)
        if threading.current_thread() is not main:
            a_done.wait(5)
        return send_batch(ctrl, frames, limit)

    p._send_batch = batch_late
    _put(p, "k", ("b", 0))  # starts the route
    assert a_done.wait(5)
    for w in works:
        assert w is None or w.result(5) is None
    got = [_get(c, "k") for _ in range(3)]
    assert [x for x in got if x[0] == "a"] == [("a", 0), ("a", 1)], got


def test_a_route_whose_link_was_closed_here_under_a_full_window_ends_cleanly(routed):
    h = routed("routes_closed_here")
    p, c = _routed_pair(h)
    for i in range(2, 2 + ROUTE_WINDOW):
        _put(p, "k", i)  # c takes nothing: no credit comes
    route = p._out_routes["k"]
    assert route.started and route.n == ROUTE_WINDOW
    route.sock.close()  # as a failing connection closes it, from another thread, without the route's lock
    _put(p, "k", 999)  # the route ends (no ValueError from the closed socket); this goes through the host
    assert [_get(c, "k") for _ in range(ROUTE_WINDOW + 1)] == [*range(2, 2 + ROUTE_WINDOW), 999]


def test_a_credit_stream_out_of_step_credits_nothing(routed):
    """Bytes of the consumer's credits lost (an interrupt in a read) leave the stream out of step: the
    producer takes no record read from it for a credit, ends the route, and keeps every item it sent, so a
    consumer that then dies loses none."""
    h = routed("routes_credit_step")
    p, c = _routed_pair(h)
    for i in range(2, 22):
        _put(p, "k", i)
    route = p._out_routes["k"]
    assert route.n == 20 and len(route.kept) == 20
    _hear(c)  # c reads the host's go: the route's link joins its connection
    wait_for(lambda: len(c._in_routes) == 1, 5, "the route's link at c")
    (inbound,) = c._in_routes.values()
    inbound.sock.send(b"\x01\x02\x03" + pack_credit(20))  # as if 3 bytes were lost before a credit for all 20
    p._read_credits(route)
    assert route.ending and route.credited == 0 and len(route.kept) == 20
    c._read_direct = lambda: 0  # c dies holding whatever came on the route
    c._queue_return = lambda *args: None
    c._link.close()
    c._ack_link and c._ack_link.close()
    d = h.client("d")
    _hear(p)  # p's end of the route, with copies of all 20, goes before this request
    assert [_get(d, "k") for _ in range(20)] == list(range(2, 22))
