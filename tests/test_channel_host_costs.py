"""What a channel host spends besides the work itself: its spin after a message, and garbage collection.

A real host and real clients in this process (see ``test_channel_trust``).
``RLINF_CHANNEL_SPIN_US``: how long the host keeps polling after a client's
message before it sleeps; the host's loop is the only thread that can burn
CPU here once the client is quiet, so the process's CPU time tells whether
it spun.  Queued items hold nothing the garbage collector tracks, so a host
with many items queued does not scan them at every collection.
"""

import gc
import time

import pytest

from p2p_helpers import wait_for
from test_channel_feed_order import _put
from test_channel_trust import host  # noqa: F401 (host: the fixture)


def _cpu_after_messages(h, n=5, pause=0.3):
    p = h.client("p")
    _put(p, "k", "first")  # connected, and its first put answered
    start = time.process_time()
    for i in range(n):
        _put(p, "k", i)
        time.sleep(pause)  # the host is idle: it spins, or sleeps
    return time.process_time() - start


def test_the_host_spins_as_long_as_told_after_a_message(host, monkeypatch):
    cpu = {}
    for spin in ("0", "1000000"):  # never; up to a second after each message (longer than each pause)
        monkeypatch.setenv("RLINF_CHANNEL_SPIN_US", spin)
        cpu[spin] = _cpu_after_messages(host(f"spin_{spin}"))
    # 1.5 s of pauses: polling burns much of it even on a busy machine (it yields, so others still run);
    # sleeping in select burns next to nothing
    assert cpu["1000000"] > 0.3, cpu
    assert cpu["0"] < cpu["1000000"] / 3, cpu


def test_by_default_the_host_spins_only_where_it_has_cpus_to_spare(host, monkeypatch):
    import os

    from rlinf.scheduler.messaging.channel.server import DEFAULT_SPIN_US, SPIN_MIN_CPUS

    monkeypatch.delenv("RLINF_CHANNEL_SPIN_US", raising=False)
    cpus = len(os.sched_getaffinity(0))
    assert host("spin_default").server._spin == (DEFAULT_SPIN_US / 1e6 if cpus >= SPIN_MIN_CPUS else 0.0)


def test_a_spin_that_is_not_a_number_is_refused_by_name(monkeypatch):
    from rlinf.scheduler.messaging.channel.server import ChannelServer

    monkeypatch.setenv("RLINF_CHANNEL_SPIN_US", "fast")
    with pytest.raises(ValueError, match="RLINF_CHANNEL_SPIN_US"):
        ChannelServer("spin_bad", 0)


def test_queued_items_are_not_scanned_by_the_garbage_collector(host):
    h = host("gc_items")
    p = h.client("p")
    for i in range(20):
        _put(p, "k", {"step": i, "obs": list(range(10))})
    wait_for(lambda: h.server._ask(lambda: len(h.server._queues["k"].items)) == 20, 5, "the pushes read")
    for _ in range(2):  # a collection untracks a tuple all of whose members it found untracked (inner first)
        gc.collect()

    def tracked():
        return sum(gc.is_tracked(item) or gc.is_tracked(item[0]) for item in h.server._queues["k"].items)

    assert h.server._ask(tracked) == 0
