"""Channels lose nothing, never hang and never leak: on a real local Ray, with real processes.

Each test names the failure it guards against.  Host-side limits (send
deadline, heartbeat) are shortened through the ``RLINF_CHANNEL_*`` settings,
which the launching process forwards to the channel's host.
"""

import asyncio
import gc
import os
import signal
import threading
import time

import psutil
import pytest
import torch

from rlinf.scheduler import Channel, CommTimeoutError, NodePlacementStrategy, PeerDiedError
from rlinf.scheduler.channel.channel import _hosts
from rlinf.scheduler.messaging.channel.client import ChannelClient

from launcher_marks import survives_worker_death
from p2p_helpers import Peer, run_on, wait_for

MiB = 1 << 20


@pytest.fixture
def short_limits(monkeypatch):
    """A 3 s send deadline and 0.5 s heartbeats (dead after 2.5 s), for the host and this process."""
    monkeypatch.setenv("RLINF_CHANNEL_SEND_TIMEOUT", "3")
    monkeypatch.setenv("RLINF_CHANNEL_HEARTBEAT", "0.5")


def _host_pid(cluster, name):
    return cluster.session.lookup_group("Channel." + name).workers[0].info.pid


def test_consumer_keeping_items_never_blocks_the_host(cluster, launch, short_limits):
    """A consumer that keeps 200 received 1 MiB tensors (pinning shared memory) cannot hang the host."""
    ch = Channel.create("keeper")
    other = launch(Peer, placement=NodePlacementStrategy([0]))
    for i in range(200):
        ch.put(torch.full((MiB // 4,), float(i)), timeout=30)

    def round_trips(w, ch, seconds):
        """Another client's put/get round trips on another key while the host deals with the keeper."""
        worst, end = 0.0, time.monotonic() + seconds
        while time.monotonic() < end:
            start = time.monotonic()
            ch.put("ping", key="other", timeout=10)
            assert ch.get(key="other", timeout=10) == "ping"
            worst = max(worst, time.monotonic() - start)
            time.sleep(0.05)
        return worst

    others = run_on(other, 0, round_trips, ch, 8.0)
    kept, error, slowest = [], None, 0.0
    for _ in range(200):
        start = time.monotonic()
        try:
            kept.append(ch.get(timeout=30))
        except Exception as exc:  # the host gave up on this client: it did not read in time
            error = exc
            slowest = max(slowest, time.monotonic() - start)
            break
        slowest = max(slowest, time.monotonic() - start)
    # either every item arrived, or the host declared this client dead after its send deadline
    assert slowest < 20, f"a get waited {slowest:.1f} s"
    assert others.wait()[0] < 5  # the host kept serving others meanwhile
    got = [int(t[0]) for t in kept]
    del kept
    gc.collect()
    rest = [int(ch.get(timeout=30)[0]) for _ in range(200 - len(got))]
    assert got + rest == list(range(200)), f"items lost or reordered (error was {error!r})"
    assert ch.qsize() == 0


def test_parked_get_batch_never_pins_the_producer():
    """Items the host keeps for a parked get_batch do not pin the producer's shared memory."""
    ch = Channel.create("parked_batch")
    parked = ch.get_batch(1000, async_op=True)
    time.sleep(0.2)
    done, errors = [], []

    def produce():
        try:
            for i in range(60):
                ch.put(torch.full((MiB // 4,), float(i)), weight=1, timeout=10)
                done.append(i)
            ch.put_nowait(torch.zeros(MiB // 4))
            done.append("nowait")
        except Exception as exc:
            errors.append(exc)

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    t.join(60)
    assert errors == [] and len(done) == 61, f"the producer stalled after {len(done)} puts: {errors}"
    assert not parked.done() and ch.qsize() == 61
    del parked
    gc.collect()
    assert [int(ch.get(timeout=10)[0]) for _ in range(60)] == list(range(60))


def test_get_batch_on_a_full_bounded_channel_returns_what_is_there():
    """A full queue cannot grow: get_batch returns the prefix that fits instead of waiting."""
    ch = Channel.create("full_batch", maxsize=3)
    for i in range(3):
        ch.put(i, weight=1)
    start = time.monotonic()
    assert ch.get_batch(10, timeout=20) == [0, 1, 2]
    assert time.monotonic() - start < 10
    # a parked batch is served as soon as the queue fills up
    work = ch.get_batch(10, async_op=True)
    for i in range(3, 6):
        ch.put(i, weight=1, timeout=10)
    assert work.wait(10) == [3, 4, 5]


def _host_usage(pid):
    p = psutil.Process(pid)
    with open(f"/proc/{pid}/maps") as f:
        maps = sum(1 for _ in f)
    return {"fds": p.num_fds(), "threads": p.num_threads(), "maps": maps, "rss": p.memory_info().rss}


def test_departed_clients_leave_nothing_behind(cluster):
    """200 connect/put/get/close cycles: the host's descriptors, threads, mappings and RSS return to baseline."""
    ch = Channel.create("churn")
    ch.put(0)
    assert ch.get() == 0
    pid = _host_pid(cluster, "churn")
    record = cluster.session.lookup_group("Channel.churn").workers[0]
    item = torch.ones(MiB // 4)

    def cycle():
        client = ChannelClient.connect("churn", "Channel.churn:0", record)
        try:
            from rlinf.scheduler.transports import codec

            header, buffers = codec.encode(item)
            _, fut = client.request({"op": "put", "key": "churn", "timeout": 10}, [header, *buffers])
            assert "error" not in fut.result(20)[0]
            rid, fut = client.request({"op": "get", "key": "churn", "timeout": 10})
            ctrl, frames = fut.result(20)
            assert ctrl["count"] == 1
            client.ack(rid)
            del frames
        finally:
            client.close()

    for _ in range(20):
        cycle()
    time.sleep(1.0)
    base = _host_usage(pid)
    for _ in range(200):
        cycle()

    # RSS tolerance: the cpu transport keeps each accepted link object (with its 64 KiB read buffer) in its
    # list of links after the link is closed, about 13 MiB for 200 links; everything else returns exactly
    def settled():
        now = _host_usage(pid)
        return (now["fds"] <= base["fds"] + 2 and now["threads"] <= base["threads"] + 2
                and now["maps"] <= base["maps"] + 8 and now["rss"] <= base["rss"] + 16 * MiB)

    try:
        wait_for(settled, 20, "the host's usage back to baseline")
    except AssertionError:
        raise AssertionError(f"baseline {base}, after 200 cycles {_host_usage(pid)}") from None
    print(f"host usage: baseline {base}, after 200 cycles {_host_usage(pid)}")
    # a client's close reaches the host once its reader thread leaves its poll slice (up to 1 s later)
    wait_for(lambda: _hosts["churn"].stats().wait()[0]["clients"] <= 1, 20, "departed clients forgotten")
    stats = _hosts["churn"].stats().wait()[0]
    assert stats["items"] == 0 and stats["in_flight"] == 0


def test_abandoned_async_get_puts_the_item_back_at_the_head():
    """A get whose AsyncWork is dropped after its item arrived does not lose the item (nor reorder)."""
    ch = Channel.create("abandon")
    work = ch.get(key="k", async_op=True)
    ch.put("first", key="k")
    ch.put("second", key="k")
    wait_for(work.done, 10, "the reply")
    del work
    gc.collect()
    assert [ch.get(key="k", timeout=10), ch.get(key="k", timeout=10)] == ["first", "second"]
    # an async get that is waited for takes its item for good
    work = ch.get(key="k", async_op=True)
    ch.put("third", key="k")
    assert work.wait(10) == "third"
    del work
    gc.collect()
    time.sleep(0.3)
    assert ch.qsize(key="k") == 0


@survives_worker_death
def test_dying_consumer_puts_its_item_back(launch):
    """A consumer process that dies holding a received (unacknowledged) item loses nothing."""
    ch = Channel.create("dying")
    victim = launch(Peer, placement=NodePlacementStrategy([0]))

    def receive_then_die(w, ch):
        work = ch.get(async_op=True)
        end = time.monotonic() + 20
        while not work.done() and time.monotonic() < end:
            time.sleep(0.01)
        os._exit(1)  # the reply is here but the user never took it

    pending = run_on(victim, 0, receive_then_die, ch)
    time.sleep(1.0)
    ch.put("a")
    ch.put("b")
    with pytest.raises(Exception):
        pending.wait()
    assert [ch.get(timeout=15), ch.get(timeout=15)] == ["a", "b"]


def _drain(name):
    """Every item left on ``name``'s default key, once the host has no item in flight and only this
    process connected (a departed consumer's unacknowledged items are back by then)."""
    wait_for(lambda: (lambda s: s["clients"] == 1 and s["in_flight"] == 0)(_hosts[name].stats().wait()[0]), 20,
              "the departed consumers' connections settled")
    ch, out = Channel.connect(name), []
    while True:
        try:
            out.append(ch.get_nowait())
        except asyncio.QueueEmpty:
            return out


def test_items_a_stopped_consumer_group_took_are_not_delivered_again(cluster, launch):
    """A consumer group takes items (``get``, then ``get_batch``), returns them and is stopped at once, as
    a driver replacing rollout workers does; twice.  The driver then drains the channel: every item is
    delivered exactly once (the acks used to wait for the consumer's next request or heartbeat tick, and
    a stopped actor sent neither, so its items were delivered again)."""
    ch = Channel.create("taken_once")
    for i in range(9):
        ch.put(i, weight=1)
    taken = []
    for _ in range(2):
        g = launch(Peer, placement=NodePlacementStrategy([0]))
        taken += run_on(g, 0, lambda w, ch: [ch.get(timeout=10)] + ch.get_batch(2, timeout=10), ch).wait()[0]
        g.stop()
    delivered = taken + _drain("taken_once")
    assert sorted(delivered) == list(range(9)), delivered


@survives_worker_death
def test_hung_consumer_is_dropped_and_its_parked_gets_with_it(cluster, launch, short_limits):
    """A consumer that stops (SIGSTOP) is declared dead by heartbeat; items go to live consumers."""
    ch = Channel.create("hung")
    assert ch.qsize() == 0  # this process is connected too
    g = launch(Peer, placement=NodePlacementStrategy([0]))
    pid = g.worker_info_list[0].pid
    run_on(g, 0, lambda w, ch: (w.state.setdefault("works", []).append(ch.get(async_op=True)), True)[1], ch).wait()
    time.sleep(0.5)
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: _hosts["hung"].stats().wait()[0]["clients"] == 1, 20, "the stopped client dropped")
        ch.put("x")
        assert ch.get(timeout=10) == "x"  # not handed to the stopped process's parked get
    finally:
        os.kill(pid, signal.SIGCONT)


@survives_worker_death
def test_client_of_a_hung_host_gets_peer_died(cluster, short_limits):
    """A client waiting on a host that stopped answering raises PeerDiedError in bounded time."""
    ch = Channel.create("hung_host")
    ch.put(1)
    assert ch.get() == 1
    pid = _host_pid(cluster, "hung_host")
    os.kill(pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(PeerDiedError, match="has not answered"):
            ch.get(timeout=60)
        assert time.monotonic() - start < 20
    finally:
        os.kill(pid, signal.SIGKILL)
        os.kill(pid, signal.SIGCONT)


def test_concurrent_create_launches_one_host(cluster, launch):
    """Two processes creating one channel at once: one host; the loser connects to it."""
    g = launch(Peer, placement=NodePlacementStrategy([0, 0]))

    def create_and_use(w, rank):
        ch = Channel.create("raced")
        if rank == 0:
            ch.put("from 0", timeout=30)
            return "put"
        return ch.get(timeout=30)

    a, b = run_on(g, 0, create_and_use, 0), run_on(g, 1, create_and_use, 1)
    assert a.wait() == ["put"] and b.wait() == ["from 0"]
    assert [n for n in cluster.session.list_groups() if n == "Channel.raced"] == ["Channel.raced"]


def test_stream_of_large_items_between_processes(pair_for_stream):
    """Producer and consumer processes stream 1 MiB tensors through a backlog larger than the host's block
    pool, so consumed blocks are released while other sends are under way; every item arrives, in order."""
    ch = Channel.create("stream")
    for i in range(100):
        ch.put(torch.full((MiB // 4,), float(i)), timeout=30)

    def consume(w, ch, n):
        return [int(ch.get(timeout=60)[0]) for _ in range(n)]

    def produce(w, ch, start, n):
        for i in range(start, start + n):
            ch.put(torch.full((MiB // 4,), float(i)), timeout=60)
        return True

    got = run_on(pair_for_stream, 1, consume, ch, 300)
    assert run_on(pair_for_stream, 0, produce, ch, 100, 200).wait() == [True]
    assert got.wait() == [list(range(300))]
    stats = _hosts["stream"].stats().wait()[0]
    assert stats["items"] == 0


@pytest.fixture
def pair_for_stream(launch):
    return launch(Peer, placement=NodePlacementStrategy([0, 0]))


def test_one_reader_at_a_time_hands_over_and_an_idle_client_stays_alive(cluster, short_limits):
    """Whoever waits reads the connection: a blocking call reads its own reply when no one else
    does, and dispatches the others' while it waits.  Each case fails if the turn to read is lost:
    a put made while another thread's get waits parked at the host returns (its reply read by that
    thread); an idle client, with no call waiting, still reads the host's pongs, so it is not
    declared dead (heartbeats every 0.5 s: dead after 2.5 s unheard); a callback of an async get
    that makes a blocking call on the same channel, in the thread that read the reply, completes."""
    ch = Channel.create("turns")
    ch.put(0)
    assert ch.get(timeout=10) == 0
    client = ch._client()
    time.sleep(4)  # idle, longer than the client's dead-after
    assert client._dead is None, client._dead  # a dead one would be replaced unseen by the next call
    got = {}

    def parked_get():
        got["a"] = ch.get(key="a", timeout=60)

    reader = threading.Thread(target=parked_get, name="parked-get")
    reader.start()
    wait_for(lambda: sum(q["getters"] for q in _hosts["turns"].stats(detail=True).wait()[0]["queues"].values()) == 1,
              20, "the get parked at the host")
    start = time.monotonic()
    ch.put("x", key="b", timeout=20)  # its reply comes while the parked get's thread reads
    assert ch.get(key="b", timeout=20) == "x"
    assert time.monotonic() - start < 10
    ch.put("y", key="a", timeout=20)
    reader.join(30)
    assert not reader.is_alive() and got == {"a": "y"}

    ch.put("dv", key="d", timeout=20)
    work = ch.get(key="c", async_op=True).then(lambda v: (v, ch.get(key="d", timeout=10)))
    ch.put("cv", key="c", timeout=20)
    assert work.wait(timeout=30) == ("cv", "dv")


def test_callbacks_never_run_in_a_callers_thread_and_an_interrupted_read_fails_nothing_silently(cluster, short_limits):
    """A caller reading the connection for its blocking call also reads the replies of asynchronous
    operations: their callbacks must run on the background reader, never in the caller's thread
    (a Ctrl-C there would land in another operation's callback, and callbacks that make blocking
    calls would nest without end).  A Ctrl-C while a caller reads gives the connection up: the
    operations still pending fail at once instead of waiting for a reply that may be lost, and the
    next call connects afresh."""
    import signal

    ch = Channel.create("interrupt")
    ran_in, works = [], []

    def get_async():  # made while this thread reads, so its reply is read here
        works.append(ch.get(key="y", async_op=True).then(lambda v: ran_in.append(threading.current_thread().name) or v))

    threading.Timer(0.3, get_async).start()
    threading.Timer(0.8, lambda: ch.put("yv", key="y", timeout=20)).start()
    with pytest.raises(CommTimeoutError):
        ch.get(key="x", timeout=2)  # parked at the host: this thread reads until then
    assert works and works[0].wait(timeout=20) == "yv"
    assert ran_in and ran_in[0] != threading.current_thread().name, ran_in

    # a hundred callbacks that each make a blocking call: no nesting, all complete
    works = [ch.get(key="in", async_op=True).then(lambda v: ch.put(v, key="out", timeout=20)) for _ in range(100)]
    for i in range(100):
        ch.put(i, key="in", timeout=20)
    for w in works:
        w.wait(timeout=30)
    assert sorted(ch.get(key="out", timeout=20) for _ in range(100)) == list(range(100))

    pending = []

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        # made while this thread reads (nothing else is awaited before it, so it reads)
        threading.Timer(0.3, lambda: pending.append(ch.get(key="b", async_op=True))).start()
        signal.setitimer(signal.ITIMER_REAL, 1.5)  # mid-way through a read slice (they last 1 s)
        with pytest.raises(KeyboardInterrupt):
            ch.get(key="a", timeout=30)  # parked: this thread reads until the interrupt
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    with pytest.raises(PeerDiedError, match="KeyboardInterrupt interrupted a read"):
        pending[0].wait(timeout=10)
    ch.put("z", key="a", timeout=20)  # a fresh connection
    assert ch.get(key="a", timeout=20) == "z"


def test_callbacks_that_make_calls_read_in_turn_and_one_that_waits_ends_in_bounded_time(cluster, short_limits):
    """Callbacks of asynchronous operations run on the background reader.  One that makes a blocking
    call while a caller reads gets its reply even after that caller stops reading (it takes its turn
    to read).  One that waits, without a limit, for another asynchronous operation of the same
    channel holds up every hand-over: the connection is declared dead within a few heartbeats, with
    a message saying why, even while other threads' blocking calls keep the host heard from."""
    ch = Channel.create("callbacks")
    works = []

    def chain():  # made while this thread reads: its callback's get parks at the host
        works.append(ch.get(key="y", async_op=True).then(lambda v: (v, ch.get(key="z", timeout=30))))

    threading.Timer(0.3, chain).start()
    threading.Timer(0.6, lambda: ch.put("yv", key="y", timeout=20)).start()
    with pytest.raises(CommTimeoutError):
        ch.get(key="x", timeout=2)  # then this thread stops reading; the callback's get is still parked
    ch.put("zv", key="z", async_op=True).wait(timeout=20)  # its reply: read by the callback's call in turn
    assert works and works[0].wait(timeout=30) == ("yv", "zv")

    other = ch.get(key="q", async_op=True)
    stuck = ch.get(key="p", async_op=True).then(lambda v: other.wait())  # waits with no limit
    ch.put("pv", key="p", async_op=True)  # no caller reads: the background reader reads its reply,
    time.sleep(0.5)  # and must stop reading before it runs the callback
    ch.put("qv", key="q", timeout=20)  # reads in turn; its get's reply waits behind the stuck callback
    start = time.monotonic()
    while not stuck.done() and time.monotonic() - start < 20:
        ch.put(0, key="busy", timeout=20)  # blocking calls read the host's pongs meanwhile
        time.sleep(0.1)
    with pytest.raises(PeerDiedError, match="a callback of an asynchronous operation .* has run for"):
        stuck.wait(timeout=1)
    assert time.monotonic() - start < 10


def test_a_slow_callback_does_not_make_a_live_host_look_silent(cluster, short_limits):
    """A callback that runs longer than the host may stay silent (five heartbeats) while no other
    reply waits for it: the host's pongs are still read, so the connection and an operation parked
    at the host meanwhile live on."""
    ch = Channel.create("slow-callback")
    parked = ch.get(key="later", async_op=True)
    slow = ch.get(key="a", async_op=True).then(lambda v: time.sleep(4) or v)  # 4 s > 2.5 s
    ch.put("av", key="a", timeout=20)
    assert slow.wait(timeout=20) == "av"
    ch.put("lv", key="later", timeout=20)
    assert parked.wait(timeout=20) == "lv"


def test_a_nowait_put_behind_a_stalled_send_times_out_and_the_connection_lives(cluster, monkeypatch):
    """``put_nowait`` waits for another thread's send on the same connection at most its own second:
    a connection busy with a long send is a timeout, not a full queue.  The heartbeat does not queue
    behind the stalled send either, and once the host reads again everything goes through."""
    monkeypatch.setenv("RLINF_CPU_LOCAL", "0")  # TCP: a large item goes through the socket, not shared memory
    monkeypatch.setenv("RLINF_CHANNEL_SEND_TIMEOUT", "8")  # the stalled send lives through the stop below
    monkeypatch.setenv("RLINF_CHANNEL_HEARTBEAT", "1")  # pings go out during it; dead after 5 s of silence
    ch = Channel.create("busy-link")
    ch.put(0, key="warm", timeout=20)
    assert ch.get(key="warm", timeout=20) == 0
    pid = _host_pid(cluster, "busy-link")
    client = ch._client()
    big = torch.ones(32 * MiB, dtype=torch.uint8)  # more than the socket buffers of a stopped host take
    stalled = threading.Thread(target=lambda: ch.put(big, key="big", timeout=20), daemon=True)
    os.kill(pid, signal.SIGSTOP)
    try:
        stalled.start()
        wait_for(lambda: stalled.ident in client._sending, 3, "the large put's send under way")
        start = time.monotonic()
        with pytest.raises(CommTimeoutError, match="another send"):
            ch.put_nowait(1, key="small")
        assert time.monotonic() - start < 3.0 and stalled.is_alive()  # its own second, not the 20 s put's
    finally:
        os.kill(pid, signal.SIGCONT)  # within the 5 s the host may stay silent
    stalled.join(30)
    assert not stalled.is_alive()
    assert int(ch.get(key="big", timeout=20).sum()) == 32 * MiB
    ch.put_nowait(2, key="small")
    assert ch.get(key="small", timeout=20) == 2


SLOW_PUT_MIB = 384  # 4.5-10 s at this duty cycle, measured: at least 3 times the 1.5 s of silence allowed


def test_a_put_that_takes_longer_than_the_silence_allowed_lives_while_its_bytes_move(cluster, short_limits, monkeypatch):
    """A large item over TCP to a host that reads it slowly takes longer than either side may stay
    silent (1.5 s here: 0.3 s heartbeats), and no whole message crosses meanwhile: bytes moving
    count as hearing from the peer, on both sides, so neither gives the connection up."""
    monkeypatch.setenv("RLINF_CPU_LOCAL", "0")
    monkeypatch.setenv("RLINF_CHANNEL_HEARTBEAT", "0.3")
    ch = Channel.create("slow-reader")
    ch.put(0, key="warm", timeout=20)
    assert ch.get(key="warm", timeout=20) == 0
    pid = _host_pid(cluster, "slow-reader")
    big = torch.ones(SLOW_PUT_MIB * MiB, dtype=torch.uint8)
    done = threading.Event()
    errors = []

    def put():
        try:
            ch.put(big, key="big", timeout=60)
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    start = time.monotonic()
    threading.Thread(target=put, daemon=True).start()
    try:
        while not done.is_set() and time.monotonic() - start < 30:  # the host runs 0.05 s of every 0.45 s
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.4)
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.05)
    finally:
        os.kill(pid, signal.SIGCONT)
    if errors:
        import traceback
        traceback.print_exception(errors[0])
    assert done.wait(30) and not errors, errors
    took = time.monotonic() - start
    print(f"{SLOW_PUT_MIB} MiB put to a throttled host in {took:.1f} s")
    assert took > 3, "the put went through too fast to prove anything"
    assert int(ch.get(key="big", timeout=30).sum()) == SLOW_PUT_MIB * MiB
