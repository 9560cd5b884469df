"""A get waiting for fed items while another thread of its client reads the connection is never held up.

A real host and real clients in this process (see ``test_channel_trust``).
Two races of the client's reader turn had stalled a consumer for up to a
quarter of a second at a time (the host's next check of its connections):
a pong read by another thread before the ping's send returned left the
ping "unanswered" for good, so the background reader took the turn to
read for it; and a get that found another thread reading waited for fed
items without telling the host it had taken the ones it held, so the host,
whose window for it looked full, sent none.
"""

import threading
import time

from rlinf.scheduler.messaging.channel.protocol import control

from p2p_helpers import wait_for
from test_channel_feed_order import _buffered, _fed_from, _get, _put
from test_channel_trust import host  # noqa: F401 (host: the fixture)


def test_a_pong_read_before_its_pings_send_returned_is_not_awaited_again(host, monkeypatch):
    monkeypatch.setenv("RLINF_CHANNEL_HEARTBEAT", "1.0")  # one ping in the test's time
    h = host("turn_pong")
    c, p = h.client("c"), h.client("p")
    pong = threading.Event()
    route, send = c._route, c._send_one_way

    def routed(frames, batch):
        out = route(frames, batch)
        if control(frames[0]).get("op") == "pong":
            pong.set()
        return out

    def ping_answered_first(ctrl, *args, **kw):
        ok = send(ctrl, *args, **kw)
        if ctrl.get("op") == "ping":
            pong.wait(5)  # the get below reads the pong before this send returns
        return ok

    c._route, c._send_one_way = routed, ping_answered_first
    got = []
    t = threading.Thread(target=lambda: got.append(_get(c, "k", timeout=5)))
    t.start()  # reads the connection while it waits for its item
    assert pong.wait(5)
    time.sleep(0.1)
    assert not c._ping_out  # answered: nobody takes the reader turn to read for it
    _put(p, "k", "item")
    t.join(5)
    assert got == ["item"]


def test_a_get_waiting_while_another_thread_reads_asks_the_host_for_more(host, monkeypatch):
    monkeypatch.setenv("RLINF_CHANNEL_HEARTBEAT", "2.0")
    h = host("turn_more")
    p, c = h.client("p"), h.client("c", ack_link=True)
    h.server._check_connections = lambda now: None  # no periodic read of c's acks: only c's messages make the host read them
    _fed_from(p, c, "k", 34)
    wait_for(lambda: c._ack_link is not None, 5, "the ack link")
    wait_for(lambda: _buffered(c, "k") == 32, 5, "a full window, item 33 queued behind it")
    say_more, c._say_more = c._say_more, lambda key: None  # the host hears nothing from c while it takes them
    assert [_get(c, "k") for _ in range(32)] == list(range(1, 33))  # acknowledged quietly: the window looks full
    c._say_more = say_more
    c._ping_out = True  # the background reader takes the turn and reads (as for a ping's pong)
    c._nudge()
    wait_for(lambda: c._reader is not None, 5, "the background reader reading")
    start = time.monotonic()
    assert _get(c, "k") == 33
    assert time.monotonic() - start < 0.1  # not at the host's next check of its connections (or never, here)
    c._ping_out = False
