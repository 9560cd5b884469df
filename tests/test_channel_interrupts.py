"""A channel put is settled, and told the truth, whatever line an interrupt lands on.

Ctrl-C raises ``KeyboardInterrupt`` between any two lines of the thread that
runs Python's signal handlers.  These tests land one (with ``sys.settrace``,
at the line a real signal would hit) at each place of the put path where a
request moves from one owner to the next, and check what the rule asks: no
work is left unfinished (a wait without timeout would hang), a put that
raised is not delivered, and no place on a bounded queue is held for good.
The hosts, transports and clients are real (``test_channel_trust._Host``).
"""

import os
import sys
import threading
import time

import pytest

from rlinf.scheduler import Channel, CommTimeoutError
from rlinf.scheduler.messaging.channel import client as client_module
from rlinf.scheduler.messaging.channel import local as local_module

from test_channel_trust import _frames, _get, _put, _traced, host  # noqa: F401 (host: the fixture)
from p2p_helpers import wait_for


def _line(module, func, text):
    """The number of the first line of ``func`` in ``module``'s source that contains ``text``."""
    lines = open(module.__file__, encoding="utf-8").read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(f"def {func}("))
    return next(i + 1 for i in range(start, len(lines)) if text in lines[i])


def _interrupt_once(module, func, line, when=lambda frame: True):
    """A trace function raising ``KeyboardInterrupt`` the first time ``func`` of ``module`` reaches ``line``."""
    fired = []

    def local(frame, event, arg):
        if event == "line" and frame.f_lineno == line and not fired and when(frame):
            fired.append(line)
            raise KeyboardInterrupt
        return local

    def tracer(frame, event, arg):
        code = frame.f_code
        return local if code.co_name == func and code.co_filename == module.__file__ else None

    return tracer, fired


def _async_put(client, key, item):
    return client.request({"op": "put", "key": key, "weight": 0.0, "timeout": None}, _frames(item))[1]


@pytest.mark.parametrize("where", ["fut.claimed = commit", "return  # its commit is sent with the batch"])
def test_an_interrupt_while_routing_its_own_claimed_put_fails_it_undelivered(host, where):
    """The main thread reads the reply to its own blocking put and claims it for a commit: an interrupt
    as the put changes hands (taken from the pending ones, given to the commit batch) fails the put
    before its commit went out, so the host drops it, and the connection given up leaves nothing
    pending."""
    h = host("interrupt_route")
    producer, consumer = h.client("producer"), h.client("consumer")
    line = _line(client_module, "_route", where)
    tracer, fired = _interrupt_once(client_module, "_route", line,
                                    lambda frame: frame.f_locals.get("commit") and frame.f_locals.get("blocking"))
    _, fut = producer.request({"op": "put", "key": "k", "weight": 0.0, "timeout": 3.0}, _frames("item"), blocking=True)
    with pytest.raises(KeyboardInterrupt), _traced(tracer):
        producer.wait_reply(fut, 5)
    assert fired, f"line {line} of _route was not reached"
    assert fut.done() and fut.exception(0) is not None  # settled, failed: its commit never went out
    assert _get(consumer, "k", 1.0) == ("error", "Timeout")


def test_the_main_thread_never_commits_another_threads_blocking_put(host):
    """The main thread reads while it waits for its own get, and so reads the reply to another thread's
    blocking put.  It leaves that put's commit to the put's own caller, a thread no interrupt reaches:
    with an interrupt landed right after any commit the main thread sends, the put still succeeds and
    is delivered once."""
    from rlinf.scheduler.messaging.channel import commits as commits_module

    h = host("interrupt_foreign")
    producer, consumer = h.client("producer"), h.client("consumer")
    line = _line(commits_module, "_commit_batch", "state[0] = True")
    main = threading.main_thread().ident
    foreign = []  # commits the main thread sent of puts it did not make

    def when(frame):
        theirs = [b[0] for b in frame.f_locals["batch"] if b[4] and b[1].owner != main]
        foreign.extend(theirs)
        return bool(theirs)

    tracer, fired = _interrupt_once(commits_module, "_commit_batch", line, when)
    _, mine = producer.request({"op": "get", "key": "z", "timeout": 2.0}, (), blocking=True)
    outcome = []

    def put():
        try:
            _put(producer, "k", "item")
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    threading.Timer(0.3, put).start()
    try:
        with _traced(tracer):
            producer.wait_reply(mine, 5)
    except KeyboardInterrupt:
        pass  # the main thread committed another call's put, and the interrupt landed just after
    wait_for(lambda: outcome, 8, "the put's settling")  # not left pending for ever
    delivered = _get(consumer, "k", 2.0)
    assert (outcome, delivered) == ([None], "item"), "the put failed although delivered, or the reverse"
    assert _get(consumer, "k", 0.3) == ("error", "Timeout")  # delivered once
    assert not foreign, f"the main thread sent the commit of another call's put (request ids {foreign})"


def test_an_interrupt_while_withdrawing_a_put_settles_it_and_frees_its_place(host, monkeypatch):
    """An async put parked on a full queue (``maxsize=1``); its ``wait(t)`` runs out and withdraws it, and
    an interrupt lands in any send the withdrawal makes (a send may wait for a busy link, seconds in
    which a Ctrl-C is likely).  The put still fails, it is not delivered, and its place on the host is
    released: another client's put gets through once the consumer makes room."""
    from rlinf.scheduler.channel.works import _PutWork

    monkeypatch.setenv("RLINF_CHANNEL_SEND_TIMEOUT", "2")
    h = host("interrupt_withdraw", maxsize=1)
    producer, consumer, other = h.client("producer"), h.client("consumer"), h.client("other")
    _put(producer, "k", "x1")
    raw = _async_put(producer, "k", "x2")
    work = _PutWork(raw, "put x2", lambda reply: None, producer)
    inside = []

    def tracer(frame, event, arg):  # Ctrl-C in the first send (or cancel) made while withdrawing
        name = frame.f_code.co_name
        if name == "withdraw" and frame.f_code.co_filename == client_module.__file__:
            inside.append(True)
            return lambda f, e, a: inside.clear() if e == "return" else None
        if inside and name in ("cancel", "_send", "send", "send_now"):
            inside.clear()
            raise KeyboardInterrupt
        return None

    with pytest.raises((KeyboardInterrupt, CommTimeoutError)), _traced(tracer):
        work.wait(0.3)
    wait_for(raw.done, 5, "the withdrawn put's settling")  # not left unfinished for ever
    assert isinstance(raw.exception(0), CommTimeoutError)
    assert _get(consumer, "k", 2.0) == "x1"
    _put(other, "k", "x3", timeout=3.0)  # the place x2 held on the host is free
    assert _get(consumer, "k", 1.0) == "x3"


def test_a_claimed_put_behind_slow_callbacks_tells_its_wait_it_succeeded(host, monkeypatch):
    """A put's commit goes out while the background reader hands over a queue of slow callbacks (each
    under the stuck limit, so the connection is never declared dead): its ``wait(t)`` runs out, cannot
    withdraw a committed put, and must then report the commit's outcome (it succeeded; the item is
    delivered), not a timeout."""
    from rlinf.scheduler.channel.works import _PutWork

    monkeypatch.setenv("RLINF_CHANNEL_SEND_TIMEOUT", "1")
    monkeypatch.setattr(client_module, "REPLY_GRACE", 1.0)  # settle_limit 3 s instead of 12 s: a shorter test
    h = host("interrupt_slow_callbacks")
    producer, consumer, other = h.client("producer"), h.client("consumer"), h.client("other")
    assert producer.settle_limit <= 3.5
    ran = []
    for i in range(12):  # 12 x 0.4 s of callbacks (each far under the 1 s stuck limit): the hand-over is held
        _, got = producer.request({"op": "get", "key": f"g{i}", "timeout": None}, ())  # past wait + settle_limit
        got.add_done_callback(lambda _f: (time.sleep(0.4), ran.append(1)))
    for i in range(12):
        _put(other, f"g{i}", i)
    wait_for(lambda: ran, 5, "the first callback")
    raw = _async_put(producer, "p", "item")
    work = _PutWork(raw, "put p", lambda reply: "ok", producer)
    assert work.wait(0.5) == "ok"
    assert producer._dead is None and len(ran) < 12  # the callbacks were still running: no death settled it
    assert _get(consumer, "p", 2.0) == "item"


def test_an_interrupt_just_after_a_local_put_parked_withdraws_it():
    """The in-process channel (``maxsize=1``): an interrupt lands in a blocking put right after it parked.
    The put raised, so it is withdrawn, and its place is not held for good once room is made."""
    ch = Channel.create("interrupt_local_parked", maxsize=1, local=True)
    ch.put("x1", timeout=5)
    line = _line(local_module, "put", "self._progress(token)")
    tracer, fired = _interrupt_once(local_module, "put", line)
    with pytest.raises(KeyboardInterrupt), _traced(tracer):
        ch.put("x2", timeout=5)
    assert fired, "the put's parking was not reached"
    assert ch.get(timeout=2) == "x1"
    ch.put("x3", timeout=1)  # x2 does not hold the place
    assert ch.get(timeout=1) == "x3"
    assert ch.qsize() == 0


@pytest.mark.parametrize("where", ["waiting", "served"])
def test_an_interrupted_local_get_loses_no_item(where):
    """The in-process channel: an interrupt lands in a blocking get while it waits, or just after it
    was served.  The get raised, so its item stays in the channel (at the head) for the next get: the
    waiting get used to stay registered and swallow the next item put."""
    ch = Channel.create(f"interrupt_local_get_{where}", local=True)
    if where == "waiting":
        func, line = "_finish", _line(local_module, "_finish", "return fut.result(timeout)")
    else:
        ch.put("x0", timeout=1)
        func, line = "_get", _line(local_module, "_get", "taken = True")
    tracer, fired = _interrupt_once(local_module, func, line)
    with pytest.raises(KeyboardInterrupt), _traced(tracer):
        ch.get(timeout=5)
    assert fired, f"line {line} of {func} was not reached"
    ch.put("x1", timeout=1)
    expected = ["x1"] if where == "waiting" else ["x0", "x1"]
    assert [ch.get(timeout=1) for _ in expected] == expected
    assert ch.qsize() == 0


if __name__ == "__main__":
    sys.exit(pytest.main([os.path.abspath(__file__), "-q"]))
