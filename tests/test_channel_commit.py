"""How a channel client commits its puts: in batches, and never against what its callers were told.

On a real local Ray with real processes.  A put's item reaches consumers once
the client commits it; the thread reading the connection commits every put
reply of a burst with one message, so the host handles about one message per
put when many threads put at once.  Whatever the batching:

* a put that returned was delivered, even if its process is killed at once
  after (its commit was handed to the connection before it returned);
* a put of the main thread whose reply another thread read is left to the
  main thread to commit, so a Ctrl-C there before the commit withdraws it.

The producers are this file run as a program (``python test_channel_commit.py
MODE RECORD NAME``), connected to the channel's host with the cluster secret
they inherit.
"""

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

from launcher_marks import survives_worker_death
from test_channel_trust import _stats

from p2p_helpers import wait_for

THREADS, PUTS = 8, 60


def test_puts_of_many_threads_are_committed_in_batches(cluster):
    """Eight threads put at once on one connection (blocking puts, then asynchronous ones): the host
    handles fewer than two messages per put (one put and one commit each, unbatched), and every item
    arrives once."""
    ch = Channel.create("commit_batches")
    ch.put("warm", key="warm", timeout=20)
    assert ch.get(key="warm", timeout=20) == "warm"

    def blocking(t):
        for i in range(PUTS):
            ch.put((t, i), key="k", timeout=30)

    before = _stats("commit_batches")["messages"]
    threads = [threading.Thread(target=blocking, args=(t,), daemon=True) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    blocking_msgs = _stats("commit_batches")["messages"] - before

    before = _stats("commit_batches")["messages"]
    works = [ch.put((THREADS, i), key="k", async_op=True) for i in range(THREADS * PUTS)]
    for w in works:
        w.wait(timeout=30)
    async_msgs = _stats("commit_batches")["messages"] - before

    n = THREADS * PUTS
    print(f"host messages per put: {blocking_msgs / n:.2f} blocking, {async_msgs / n:.2f} asynchronous")
    assert blocking_msgs < 1.8 * n, blocking_msgs
    assert async_msgs < 1.8 * n, async_msgs
    got = [ch.get(key="k", timeout=20) for _ in range(2 * n)]
    assert sorted(got) == sorted([(t, i) for t in range(THREADS) for i in range(PUTS)] + [(THREADS, i) for i in range(n)])
    assert [i for t, i in got if t == 0] == list(range(PUTS))  # one thread's puts stay in order
    with pytest.raises(CommTimeoutError):
        ch.get(key="k", timeout=0.5)


class _Producer:
    """A producer program, started with the channel host's record; reads its output lines."""

    def __init__(self, cluster, mode, name):
        record = cluster.session.lookup_group("Channel." + name)
        fd, self.record_file = tempfile.mkstemp(prefix="rlt-record")
        with os.fdopen(fd, "wb") as f:
            pickle.dump(record.workers[0], f)
        self.proc = subprocess.Popen([sys.executable, __file__, mode, self.record_file, name], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: list = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            if line.endswith("\n"):  # whole: a line cut short by the kill (``OK 2``) says nothing
                self.lines.append(line.rstrip())

    def wait_line(self, prefix, limit, count=1):
        wait_for(lambda: sum(l.startswith(prefix) for l in list(self.lines)) >= count, limit,
                  f"{count} x {prefix!r} from the producer ({self.lines[-5:]})")

    def finish(self):
        try:
            self.proc.wait(timeout=20)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=10)
            os.unlink(self.record_file)
        time.sleep(0.2)  # the reading thread takes the last lines
        return self.lines


@survives_worker_death
def test_a_put_that_returned_is_delivered_though_its_process_is_killed_at_once(cluster):
    """Eight threads of a producer put without pause and print each put that returned; the producer
    is killed mid-stream: every item whose put returned reaches the consumer (none is lost with the
    connection), and none arrives twice."""
    name = "commit_killed"
    ch = Channel.create(name)
    assert ch.qsize() == 0  # this process's own connection: the producer's is the other one
    producer = _Producer(cluster, "stream", name)
    producer.wait_line("OK", 30, count=200)
    producer.proc.kill()
    lines = producer.finish()
    returned = {tuple(map(int, l.split()[1:])) for l in lines if l.startswith("OK ")}
    wait_for(lambda: _stats(name)["clients"] == 1, 20, "the producer's connection released")
    got = []
    while True:
        try:
            got.append(tuple(ch.get(timeout=1.0)))
        except CommTimeoutError:
            break
    assert len(got) == len(set(got))
    missing = returned - set(got)
    assert not missing, f"{len(missing)} of {len(returned)} returned puts lost: {sorted(missing)[:5]}"


@survives_worker_death
def test_an_interrupt_withdraws_a_main_thread_put_whose_reply_another_thread_read(cluster):
    """The producer's main thread parks a put on a full channel while another of its threads reads
    the connection (its get is parked).  The host takes the put while the producer is stopped; the
    producer is interrupted as it runs again: the reading thread hands the reply over uncommitted,
    the main thread raises ``KeyboardInterrupt`` before committing, and the item is never delivered."""
    name = "commit_interrupt"
    ch = Channel.create(name, maxsize=1)
    ch.put("item-1", timeout=10)
    producer = _Producer(cluster, "interrupt", name)
    producer.wait_line("READY", 30)
    wait_for(lambda: _stats(name)["queues"].get("'default_queue'", {}).get("putters") == 1, 20, "the put parked")
    assert _stats(name)["queues"].get("'other'", {}).get("getters") == 1  # the reading thread's get
    pid = producer.proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        assert ch.get(timeout=10) == "item-1"  # the host now takes item-2 and answers the stopped producer
        time.sleep(0.2)
        os.kill(pid, signal.SIGINT)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert producer.finish()[-1] == "INTERRUPTED", producer.lines
    wait_for(lambda: _stats(name)["clients"] == 1, 20, "the producer's connection released")
    with pytest.raises(CommTimeoutError):
        ch.get(timeout=1.0)
    assert _stats(name)["items"] == 0


def _connect(record_file, name, maxsize):
    from rlinf.scheduler.channel import channel as channel_module
    from rlinf.scheduler.messaging.channel.client import ChannelClient

    with open(record_file, "rb") as f:
        record = pickle.load(f)
    # the connection Channel would open, made from the record (this process is no driver of the cluster)
    channel_module._clients[(name, 0)] = ChannelClient.connect(name, f"Channel.{name}:0", record)
    channel_module._replica_counts[name] = 1
    return Channel(name, maxsize)


def _stream(ch):
    """Eight threads put (thread, i) without pause and print each put that returned, until killed."""
    out = threading.Lock()

    def put(t):
        for i in range(100000):
            ch.put([t, i], timeout=30)
            with out:
                print("OK", t, i, flush=True)

    for t in range(THREADS):
        threading.Thread(target=put, args=(t,), daemon=True).start()
    time.sleep(60)  # bounded: the test kills this process long before


def _interrupted(ch):
    """Another thread reads (its get parks), then the main thread puts item-2 on the full channel."""
    threading.Thread(target=lambda: ch.get(key="other", timeout=60), daemon=True).start()
    time.sleep(1.0)  # its get is parked and it reads the connection
    print("READY", flush=True)
    try:
        ch.put("item-2", timeout=30)
        print("PUT OK", flush=True)
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)
    except Exception as exc:
        print("FAILED", type(exc).__name__, exc, flush=True)


if __name__ == "__main__":
    mode, record_file, channel_name = sys.argv[1:4]
    channel = _connect(record_file, channel_name, 0 if mode == "stream" else 1)
    (_stream if mode == "stream" else _interrupted)(channel)
