"""The timeline (``RLINF_TRACE`` / ``cluster.trace()``): real runs, traces read back.

Two groups exchange objects, a tensor and a broadcast point to point and go
through a channel; the trace written by ``cluster.trace()`` must hold each
worker's events on its own process track, with the peer, bytes, transport and
key of each operation, on one clock (a send starts before its receive ends).
The ``RLINF_TRACE`` form is checked end to end under ``mpiexec`` (the file is
written when the driver exits), which also covers the MPI launcher.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from launcher_marks import TEST_LAUNCHER
from rlinf.scheduler import Channel, Worker, WorkerGroup
from rlinf.scheduler.tracing import collect, recorder
from rlinf.scheduler.base import hooks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TENSOR_BYTES = 256 * 4

pytestmark = pytest.mark.skipif(TEST_LAUNCHER == "mpi", reason="uses the session's Ray cluster; the MPI form is "
                                                               "tested by test_env_var_trace_under_mpiexec")


class Producer(Worker):
    def __init__(self):
        super().__init__()

    def work(self, peer: str, channel):
        import torch

        with self.worker_timer("produce"):
            self.send({"step": 1, "reward": 0.5}, peer, 0)
            self.send_tensor(torch.ones(256), peer, 0)
            self.send("later", peer, 0, async_op=True).wait()
            channel.put("item", key="k1")
        return True

    def share(self, groups):
        return self.broadcast("shared", groups=groups)

    def tracing_state(self):
        return recorder.is_on(), len(recorder._events), hooks.installed(), os.environ.get(collect.RECORD_ENV)


class Consumer(Worker):
    def __init__(self):
        super().__init__()
        with self.worker_timer("warm_up"):
            pass

    def work(self, peer: str, channel):
        import torch

        first = self.recv(peer, 0)
        buf = torch.zeros(256)
        self.recv_tensor(buf, peer, 0)
        later = self.recv(peer, 0)
        return first["step"], float(buf.sum()), later, channel.get(key="k1")

    def share(self, groups):
        return self.broadcast(groups=groups)


def _load(path) -> dict:
    with open(path) as f:
        return json.load(f)


def _processes(trace) -> dict:
    """process label -> pid"""
    return {e["args"]["name"]: e["pid"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}


def _events(trace, pid, ph="X") -> list:
    return [e for e in trace["traceEvents"] if e["pid"] == pid and e["ph"] == ph]


def _one(events, name):
    found = [e for e in events if e["name"] == name]
    assert len(found) == 1, (name, [e["name"] for e in events])
    return found[0]


@pytest.fixture(scope="module")
def pair(cluster):
    """A producer and a consumer group, launched once for this module (launches are the slow part)."""
    tag = uuid.uuid4().hex[:6]
    producers = Producer.create_group().launch(cluster, name=f"prod{tag}")
    consumers = Consumer.create_group().launch(cluster, name=f"cons{tag}")  # its constructor's timer: before tracing
    yield producers, consumers, tag
    producers.stop()
    consumers.stop()


def test_two_groups_p2p_and_a_channel_on_one_timeline(cluster, pair, tmp_path):
    producers, consumers, tag = pair
    prod, cons = producers.worker_group_name, consumers.worker_group_name
    channel = Channel.create(f"trace{tag}")
    path = tmp_path / "run.json"
    with cluster.trace(path) as block:
        results = producers.work(cons, channel), consumers.work(prod, channel)
        assert results[0].wait() == [True]
        assert results[1].wait() == [(1, 256.0, "later", "item")]
        groups = [(prod, 0), (cons, 0)]
        assert producers.share(groups).wait() == ["shared"] and consumers.share(groups).wait() == ["shared"]
    assert block.path == str(path)
    trace = _load(path)

    procs = _processes(trace)
    assert procs[f"{prod}:0 @ node 0"] != procs[f"{cons}:0 @ node 0"]  # one track per worker
    assert f"Channel.trace{tag}:0 @ node 0" in procs
    driver = [label for label in procs if label.startswith("driver @ ")]
    assert len(driver) == 1
    p_ev, c_ev = _events(trace, procs[f"{prod}:0 @ node 0"]), _events(trace, procs[f"{cons}:0 @ node 0"])

    # method runs and timers, on the worker's own track
    assert _one(p_ev, "work")["cat"] == "run" and _one(c_ev, "work")["cat"] == "run"
    produce = _one(p_ev, "produce")
    assert produce["cat"] == "timer" and produce["dur"] > 0
    assert not [e for e in c_ev if e["name"] == "warm_up"]

    # point to point: peer, bytes, transport; the sender's bytes are the receiver's
    sends = [e for e in p_ev if e["name"] == "send"]
    recvs = [e for e in c_ev if e["name"] == "recv"]
    assert len(sends) == 2 and len(recvs) == 2  # two objects (the broadcast has its own span, below)
    for e in sends + recvs:
        assert e["cat"] == "p2p" and e["args"]["transport"] == "cpu" and e["args"]["bytes"] > 0
    assert {e["args"]["peer"] for e in sends} == {f"{cons}:0"} and {e["args"]["peer"] for e in recvs} == {f"{prod}:0"}
    sends.sort(key=lambda e: e["ts"])
    recvs.sort(key=lambda e: e["ts"])
    assert [e["args"]["bytes"] for e in sends] == [e["args"]["bytes"] for e in recvs]
    for send, recv in zip(sends, recvs):  # one clock: a message leaves before it has arrived
        assert send["ts"] <= recv["ts"] + recv["dur"], (send, recv)
    assert _one(p_ev, "send_tensor")["args"]["bytes"] == TENSOR_BYTES
    assert _one(c_ev, "recv_tensor")["args"] == {"peer": f"{prod}:0", "bytes": TENSOR_BYTES, "transport": "cpu"}
    assert _one(p_ev, "broadcast")["args"]["src"] is None and _one(c_ev, "broadcast")
    # the broadcast's own links: the hand-over and the take, inside the broadcast's spans
    feed, take = _one(p_ev, "broadcast send"), _one(c_ev, "broadcast recv")
    assert feed["args"]["peer"] == f"{cons}:0" and take["args"]["peer"] == f"{prod}:0"
    assert feed["args"]["bytes"] == take["args"]["bytes"] > 0 and feed["args"]["transport"] == "cpu"
    outer = _one(c_ev, "broadcast")
    assert outer["ts"] <= take["ts"] and take["ts"] + take["dur"] <= outer["ts"] + outer["dur"] + 1
    async_sends = [e for e in _events(trace, procs[f"{prod}:0 @ node 0"], "b") if e["name"] == "send (async)"]
    assert len(async_sends) == 1 and {e["args"]["peer"] for e in async_sends} == {f"{cons}:0"}
    assert _one(p_ev, "send_tensor")["ts"] <= produce["ts"] + produce["dur"]

    # channel operations: key and wait time
    put, get = _one(p_ev, "channel.put"), _one(c_ev, "channel.get")
    assert put["args"]["key"] == "k1" and get["args"]["key"] == "k1"  # a str key as itself, no quotes
    assert put["args"]["channel"] == f"trace{tag}" and get["args"]["wait_ms"] >= 0
    assert put["ts"] <= get["ts"] + get["dur"]

    # the driver: submit spans and group calls from submit to result
    d_pid = procs[driver[0]]
    assert _one(_events(trace, d_pid), f"submit {prod}.work")["args"]["ranks"] == [0]
    begins = {e["name"]: e for e in _events(trace, d_pid, "b")}
    ends = {e["id"]: e for e in _events(trace, d_pid, "e")}
    call = begins[f"{cons}.work"]
    assert ends[call["id"]]["ts"] >= _one(c_ev, "work")["ts"] + _one(c_ev, "work")["dur"] - 1
    # every thread used has a name; all processes here share the machine's clock
    named = {(e["pid"], e["tid"]) for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in p_ev + c_ev} <= named
    meta = trace["otherData"]["rlinf"]
    assert abs(meta["clock_offsets_ns"][f"{prod}:0 @ node 0"]) < 50_000_000  # their wall-minus-monotonic readings
    assert not [n for n in meta["notes"] if prod in n or cons in n]


def test_groups_launched_and_stopped_inside_a_block_and_nothing_left_after(cluster, pair, tmp_path):
    before, _, _ = pair
    tag = uuid.uuid4().hex[:6]
    path = tmp_path / "block.json"
    with pytest.raises(RuntimeError, match="tracing is off"):
        cluster.dump_trace(tmp_path / "off.json")
    with cluster.trace(path):
        assert before.tracing_state().wait()[0][0] is True  # switched on in a running worker
        inside = Consumer.create_group().launch(cluster, name=f"inside{tag}")
        inside.share([(f"inside{tag}", 0)]).wait()
        now = cluster.dump_trace(tmp_path / "now.json")  # on demand: recording goes on
        inside.stop()  # its events are taken before its process ends
    snapshot, trace = _load(now), _load(path)
    assert f"inside{tag}:0 @ node 0" in _processes(snapshot)
    pid = _processes(trace)[f"inside{tag}:0 @ node 0"]
    names = {e["name"] for e in _events(trace, pid)}
    assert {"warm_up", "share", "broadcast"} <= names  # recorded from its start, constructor included
    # off again everywhere: no hooks, no buffer, no flag for new launches, no file without asking
    assert before.tracing_state().wait() == [(False, 0, False, None)]
    assert not hooks.installed() and not recorder.is_on() and len(recorder._events) == 0
    assert not hasattr(WorkerGroup._call, "__wrapped__")
    assert collect.RECORD_ENV not in os.environ
    assert sorted(p.name for p in tmp_path.iterdir()) == ["block.json", "now.json"]


def test_hook_points_are_the_plain_functions_unless_tracing_is_on():
    from rlinf.scheduler.base import timing
    from rlinf.scheduler.messaging.p2p import api, communicator
    from rlinf.scheduler.tracing import export

    points = [(WorkerGroup, "_call"), (timing, "_timed"), (communicator.Communicator, "_submit"),
              (communicator.Communicator, "_send_frames")]
    plain = [getattr(owner, name) for owner, name in points]
    assert not recorder.is_on() and not hooks.installed()
    send = api.send  # a blocking send pays only for its transfer's wrapper, not for one around the call
    recorder.enable()
    try:
        for (owner, name), fn in zip(points, plain):
            wrapped = getattr(owner, name)
            assert wrapped is not fn and wrapped.__wrapped__ is fn, name
        assert api.send is send
        with timing.capture_durations():  # its own log: a timing outside any call would wait for the next one
            with timing.worker_timer("unit_span"):
                pass
        mine = recorder.dump(drain=True)
    finally:
        recorder.disable()
    assert [getattr(owner, name) for owner, name in points] == plain  # the originals, back in place
    assert len(recorder._events) == 0
    span = [e for e in mine["events"] if e[1] == "unit_span"]
    assert len(span) == 1 and span[0][0] == "X" and span[0][2] == "timer" and span[0][4] >= span[0][3]
    assert mine["label"].startswith("driver @ ")
    other = {"label": "g:0 @ node 0", "group": "g", "rank": 0, "pid": 1, "host": "h", "threads": {7: "loop"},
             "dropped": 3, "events": [("A", "call", "run", span[0][3] + 2000, span[0][3] + 5000, 7, None)]}
    trace = export.chrome_trace([other, mine], ["a note"])
    names = {e["args"]["name"]: e["pid"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names[mine["label"]] == 1 and names["g:0 @ node 0"] == 2  # the driver first
    b, e = [ev for ev in trace["traceEvents"] if ev["pid"] == 2 and ev["ph"] in "be"]
    assert (b["ph"], e["ph"], b["id"]) == ("b", "e", e["id"]) and e["ts"] - b["ts"] == 3.0  # microseconds
    assert {"ph": "M", "name": "thread_name", "pid": 2, "tid": 1, "args": {"name": "loop"}} in trace["traceEvents"]
    notes = trace["otherData"]["rlinf"]["notes"]
    assert notes[0] == "a note" and "3 oldest event(s)" in notes[1]


@contextlib.contextmanager
def _recording(monkeypatch, max_events: int):
    """Recording on in this process with a limit of ``max_events``; off, empty and at the default after."""
    monkeypatch.setenv(recorder.MAX_EVENTS_ENV, str(max_events))
    assert not recorder.is_on()
    recorder.enable()
    try:
        yield
    finally:
        recorder.disable()
        recorder.reset()
        monkeypatch.delenv(recorder.MAX_EVENTS_ENV)
        recorder.enable()  # back to the default buffer
        recorder.disable()


def test_p2p_events_are_whole_name_their_thread_and_count_what_gave_way(monkeypatch):
    """The point-to-point wrappers write out what ``record`` does (for speed): they must keep
    its contract: whole events, the recording thread's name, the bytes of every frame (a
    tensor's payload only), and a count of the events a full buffer pushed out."""
    import threading

    from rlinf.scheduler.base.address import WorkerAddress
    from rlinf.scheduler.tracing import wrappers

    def send_frames(self, peer, transport, frames, deadline, raw=False):
        return None

    def receive(self, peer, transport, deadline, read):
        return False, [bytearray(5), memoryview(bytes(28)).cast("i")]

    peer = WorkerAddress("g", 1)
    with _recording(monkeypatch, max_events=3):
        # made as enable() makes them: the p2p wrappers hold the buffer of the moment
        send, recv = wrappers.make("p2p_send", send_frames), wrappers.make("p2p_recv", receive)
        recorder.record("X", "first", "timer", 1, 2)
        send(None, peer, "cpu", [b"abc"], None)
        send(None, peer, "cpu", [b"fingerprint", memoryview(bytes(16)).cast("i")], None, True)  # the limit
        t = threading.Thread(target=recv, args=(None, peer, "cpu", None, None), name="unit-recv")
        t.start()
        t.join(10)
        send(None, peer, "cpu", [b"abcd"], None)  # "first" and the first send give way (by the dump at last)
        mine = recorder.dump(drain=True)
    events = mine["events"]
    assert [e[1] for e in events] == ["send_tensor", "recv", "send"] and mine["dropped"] == 2
    assert events[0][6] == {"peer": "g:1", "bytes": 16, "transport": "cpu"}
    assert events[1][6] == {"peer": "g:1", "bytes": 5 + 28, "transport": "cpu"}
    assert mine["threads"][events[1][5]] == "unit-recv"
    assert events[2][6] == {"peer": "g:1", "bytes": 4, "transport": "cpu"}
    assert all(e[4] >= e[3] for e in events)


def test_the_buffer_is_kept_to_its_limit_while_recording_goes_on(monkeypatch):
    """No event tests the buffer's length: the trimmer thread keeps it to ``RLINF_TRACE_MAX_EVENTS``
    within its interval, oldest first, and the dump counts every event that gave way."""
    with _recording(monkeypatch, max_events=100):
        for i in range(1000):
            recorder.record("i", f"e{i % 7}", "timer", i, i)
        deadline = time.monotonic() + 10
        while len(recorder._events) > 100 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(recorder._events) == 100  # trimmed with nobody dumping
        mine = recorder.dump(drain=True)
    assert mine["dropped"] == 900
    assert [e[3] - mine["clock_delta_ns"] for e in mine["events"]] == list(range(900, 1000))  # the newest kept


def test_events_that_give_way_uncounted_make_the_count_a_lower_bound(monkeypatch):
    """A smaller limit set between two traces counts what it has no room for; and should the trimmer not
    run while p2p events pour in (they test nothing), the buffer's own bound drops the oldest, and the
    dump says its count is a lower bound rather than a wrong number."""
    from rlinf.scheduler.base.address import WorkerAddress
    from rlinf.scheduler.tracing import export, wrappers

    with _recording(monkeypatch, max_events=1000):
        for i in range(1000):
            recorder.record("i", "early", "timer", i, i)
        recorder.disable()
        monkeypatch.setenv(recorder.MAX_EVENTS_ENV, "100")
        recorder.enable()
        shrunk = recorder.dump(drain=True)
        assert (len(shrunk["events"]), shrunk["dropped"], shrunk["overflowed"]) == (100, 900, False)

        recorder._Trimmer.stop()  # as if starved
        send = wrappers.make("p2p_send", lambda self, peer, transport, frames, deadline, raw=False: None)
        peer = WorkerAddress("g", 1)
        for _ in range(recorder._hard_limit(100) + 1000):
            send(None, peer, "cpu", [b"x"], None)
        flooded = recorder.dump(drain=True)
    assert flooded["overflowed"] and flooded["dropped"] >= recorder._hard_limit(100) - 100
    trace = export.chrome_trace([dict(flooded, label="me", pid=1, host="h")], [])
    assert any("at least" in n for n in trace["otherData"]["rlinf"]["notes"])


class _FakeLink:
    """Hook points of the p2p kinds, for the test below (marked only while it runs)."""

    release = None  # a threading.Event the receive waits for

    def send_frames(self, peer, transport, frames, deadline, raw=False):
        return None

    def receive(self, peer, transport, deadline, read):
        assert _FakeLink.release.wait(10)
        return False, [bytearray(6)]


@pytest.fixture
def fake_link():
    """``_FakeLink``'s methods marked as p2p hook points and tracing on; the peer to name.
    Everything is put back after."""
    import threading

    from rlinf.scheduler.base.address import WorkerAddress

    marks = [(_FakeLink.send_frames, "p2p_send"), (_FakeLink.receive, "p2p_recv")]
    hooks._points.extend(marks)
    _FakeLink.release = threading.Event()
    assert not recorder.is_on()
    recorder.enable()
    try:
        yield WorkerAddress("g", 1)
    finally:
        recorder.disable()
        recorder.reset()
        for mark in marks:
            hooks._points.remove(mark)
    assert _FakeLink.send_frames is marks[0][0] and _FakeLink.receive is marks[1][0]


def test_p2p_events_in_flight_across_a_drain_are_in_the_next_dump(fake_link):
    """A drain empties the buffer while tracing stays on: an operation that started before it and
    ends after it is in the next dump, and so is every later one; the thread is named."""
    import threading

    peer = fake_link
    _FakeLink().send_frames(peer, "cpu", [b"one"], None)
    waiting = threading.Thread(target=_FakeLink().receive, args=(peer, "cpu", None, None), name="in-flight")
    waiting.start()
    first = recorder.dump(drain=True)
    _FakeLink.release.set()
    waiting.join(10)
    _FakeLink().send_frames(peer, "cpu", [b"two!"], None)
    second = recorder.dump(drain=True)
    assert [(e[1], e[6]["bytes"]) for e in first["events"]] == [("send", 3)]
    assert [(e[1], e[6]["bytes"]) for e in second["events"]] == [("recv", 6), ("send", 4)]
    assert second["threads"][second["events"][0][5]] == "in-flight"


def test_a_p2p_event_in_flight_while_the_buffer_is_resized_is_in_the_next_dump(fake_link, monkeypatch):
    """Tracing switched off and on again at a new ``RLINF_TRACE_MAX_EVENTS`` gets a new buffer; an
    operation in flight across the switch records into the one its wrapper holds, and the next
    drain takes it from there."""
    import threading

    peer = fake_link
    _FakeLink().send_frames(peer, "cpu", [b"one"], None)
    waiting = threading.Thread(target=_FakeLink().receive, args=(peer, "cpu", None, None))
    waiting.start()
    recorder.disable()
    monkeypatch.setenv(recorder.MAX_EVENTS_ENV, "1000")
    recorder.enable()
    assert recorder._capacity == 1000
    _FakeLink.release.set()
    waiting.join(10)
    _FakeLink().send_frames(peer, "cpu", [b"two!"], None)
    mine = recorder.dump(drain=True)
    assert recorder.dump(drain=True)["events"] == []
    assert sorted((e[1], e[6]["bytes"]) for e in mine["events"]) == [("recv", 6), ("send", 3), ("send", 4)]


def test_each_event_is_named_for_the_thread_that_recorded_it():
    """Thread ids are reused once a thread ends: each event still carries its own thread's name."""
    import threading

    assert not recorder.is_on()
    recorder.enable()
    try:
        for i in range(4):  # one after another: the system tends to hand the next thread the same id
            t = threading.Thread(target=recorder.record, args=("i", f"mark{i}", "timer", i, i), name=f"worker-{i}")
            t.start()
            t.join(10)
        mine = recorder.dump(drain=True)
    finally:
        recorder.disable()
        recorder.reset()
    assert [mine["threads"][e[5]] for e in mine["events"]] == [f"worker-{i}" for i in range(4)]


def test_a_thread_renamed_after_its_first_event_shows_its_new_name():
    """Names are read when events are dumped: a thread named after it started recording (the
    importing thread was numbered at import) is shown under the name it has then."""
    import threading

    me = threading.current_thread()
    old = me.name
    assert not recorder.is_on()
    recorder.enable()
    try:
        recorder.record("i", "before", "timer", 1, 1)
        me.name = "renamed-later"
        mine = recorder.dump(drain=True)
    finally:
        me.name = old
        recorder.disable()
        recorder.reset()
    assert [mine["threads"][e[5]] for e in mine["events"]] == ["renamed-later"]


def test_bad_trace_paths_are_refused_before_anything_starts(cluster, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        cluster.trace(tmp_path / "missing" / "t.json")
    with pytest.raises(TypeError, match="str or os.PathLike"):
        cluster.trace(3)
    with pytest.raises(IsADirectoryError):
        cluster.trace(tmp_path)
    with pytest.raises(PermissionError, match="cannot create a file in '/proc'"):  # root may write anywhere else
        cluster.trace("/proc/t.json")
    assert not recorder.is_on()


def test_a_trace_whose_folder_went_away_is_written_elsewhere_not_lost(cluster, pair, tmp_path):
    """The folder passed the check at ``trace()`` and was removed before the block ended: the events,
    drained already, go to a file in the temporary folder, and the error says where."""
    from rlinf.scheduler.tracing.export import TraceWriteError

    producers, _, _ = pair
    folder = tmp_path / "gone"
    folder.mkdir()
    with pytest.raises(TraceWriteError, match="it was written to") as caught:
        with cluster.trace(folder / "t.json"):
            producers.tracing_state().wait()
            folder.rmdir()
    saved = caught.value.saved
    try:
        names = {e["name"] for e in _load(saved)["traceEvents"]}
        assert "tracing_state" in names or f"{producers.worker_group_name}.tracing_state" in names
        assert os.stat(saved).st_mode & 0o077 == 0
    finally:
        os.unlink(saved)
    assert not recorder.is_on()


class Napper(Worker):
    def __init__(self):
        super().__init__()

    def nap(self, seconds: float):
        time.sleep(seconds)
        return True

    def mark(self):
        with self.worker_timer("after_nap"):
            pass
        return True

    def recording(self):
        return recorder.is_on()


def test_a_busy_worker_is_waited_for_once_per_trace_and_records_once_free(cluster, tmp_path, monkeypatch):
    """A worker busy in a long call cannot answer the trace's control calls: the block waits for the
    first one only (``RLINF_TRACE_TIMEOUT``), notes the worker, and queues the stop behind it; once free,
    the worker takes part in the next trace."""
    monkeypatch.setenv(collect.COLLECT_TIMEOUT_ENV, "3")
    g = Napper.create_group().launch(cluster, name=f"napper{uuid.uuid4().hex[:6]}")
    try:
        napping = g.nap(9)
        start = time.monotonic()
        with cluster.trace(tmp_path / "busy.json"):
            pass
        took = time.monotonic() - start
        notes = _load(tmp_path / "busy.json")["otherData"]["rlinf"]["notes"]
        assert any("no answer to trace start within 3 s" in n for n in notes), notes
        assert any("still busy (no answer to trace start yet)" in n for n in notes), notes
        assert took < 7.5, took  # one wait of 3 s, not one per control call (start, collect, stop: 9 s)
        assert napping.wait(timeout=30) == [True]
        with cluster.trace(tmp_path / "after.json"):
            assert g.mark().wait() == [True]
        after = _load(tmp_path / "after.json")
        assert "after_nap" in {e["name"] for e in after["traceEvents"]}
        assert not [n for n in after["otherData"]["rlinf"]["notes"] if g.worker_group_name in n]
        assert g.recording().wait() == [False]  # the queued stop ran, and the second block's stop
    finally:
        g.stop()


def test_a_late_answer_to_a_dump_is_not_counted_twice(cluster, tmp_path, monkeypatch):
    """``dump_trace`` does not drain: a busy worker's late answer to it holds events its buffer still has,
    which the block's own collect then takes.  They are in the file once."""
    monkeypatch.setenv(collect.COLLECT_TIMEOUT_ENV, "1")
    g = Napper.create_group().launch(cluster, name=f"napper{uuid.uuid4().hex[:6]}")
    try:
        with cluster.trace(tmp_path / "t.json"):
            assert g.mark().wait() == [True]
            napping = g.nap(4)
            cluster.dump_trace(tmp_path / "early.json")  # waits 1 s for the busy worker, then goes on
            assert napping.wait(timeout=30) == [True]
        marks = [e for e in _load(tmp_path / "t.json")["traceEvents"] if e["name"] == "after_nap"]
        assert len(marks) == 1, marks
    finally:
        g.stop()


def test_events_of_a_process_on_this_machine_are_aligned_through_the_monotonic_clock():
    """A process on this machine whose wall clock read 7 s ahead when it started recording (a step of
    the wall clock between two starts): its events land where the shared monotonic clock puts them."""
    step = 7_000_000_000
    at = recorder.clock()
    theirs = {"boot": recorder.boot_id(), "clock_delta_ns": recorder._delta_ns + step, "label": "g:0 @ node 0",
              "events": [("X", "work", "run", at + recorder._delta_ns + step, at + recorder._delta_ns + step + 10,
                          1, None)]}
    (dump,) = collect._aligned(None, "g", 0, [], [], {"dumps": [theirs], "notes": []}, time.monotonic() + 5)
    assert dump["offset_ns"] == step
    assert dump["events"][0][3] == at + recorder._delta_ns and dump["events"][0][4] == at + recorder._delta_ns + 10


def test_clock_offset_of_a_worker_is_estimated_from_round_trips(cluster, pair):
    offset = collect._offset(cluster.session, pair[0]._handles[0], time.monotonic() + 30)
    assert offset is not None
    assert abs(offset) < 0.5e9  # one machine: the true offset is 0, the estimate within half a round trip


MPI_PROGRAM = """
from rlinf.scheduler import Cluster, NodePlacementStrategy, Worker

class Pair(Worker):
    def __init__(self):
        super().__init__()

    def bounce(self):
        me, other = self._rank, 1 - self._rank
        if me == 0:
            self.send("ping", self.worker_group_name, other)
            return self.recv(self.worker_group_name, other)
        self.send(self.recv(self.worker_group_name, other), self.worker_group_name, other)
        return "pong"

group = Pair.create_group().launch(Cluster(), NodePlacementStrategy([0, 0]), name="mpitrace")
print("RESULT", group.bounce().wait(), flush=True)
"""


@pytest.mark.timeout(240)
@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None or shutil.which(
    "mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")) is None,
    reason="needs mpi4py and an mpiexec (pip install mpi4py mpich)")
def test_env_var_trace_under_mpiexec(tmp_path):
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(MPI_PROGRAM))
    out_path = tmp_path / "mpi.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RLINF_LAUNCHER", "RLINF_TEST_LAUNCHER")}
    env.update(RLINF_TRACE=str(out_path), PYTHONUNBUFFERED="1", UCX_NET_DEVICES="lo")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run(["mpiexec", "-n", "3", sys.executable, "-m", "rlinf.mpi", str(script)], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=200)
    assert proc.returncode == 0 and "RESULT ['ping', 'pong']" in proc.stdout, proc.stdout[-4000:]
    trace = _load(out_path)  # written by the driver (rank 0) at exit
    assert f"rlinf: trace written to {out_path}" in proc.stdout, proc.stdout[-2000:]  # the user is told where
    procs = _processes(trace)
    p0, p1 = _events(trace, procs["mpitrace:0 @ node 0"]), _events(trace, procs["mpitrace:1 @ node 0"])
    assert _one(p0, "bounce")["cat"] == "run" and _one(p1, "bounce")["cat"] == "run"
    send, recv = _one(p0, "send"), _one(p1, "recv")
    assert send["args"]["peer"] == "mpitrace:1" and recv["args"]["peer"] == "mpitrace:0"
    assert send["args"]["bytes"] == recv["args"]["bytes"] > 0 and send["args"]["transport"] == recv["args"]["transport"]
    assert send["ts"] <= recv["ts"] + recv["dur"]
    driver = next(pid for label, pid in procs.items() if label.startswith("driver @ "))
    assert [e["name"] for e in _events(trace, driver, "b")] == ["mpitrace.bounce"]

