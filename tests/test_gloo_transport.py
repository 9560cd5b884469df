"""The torch-gloo transport (rlinf-nccl): the conformance kit, pair setup, deadlines and
failure isolation of the torch pair transports, run with gloo on CPU tensors.

torch-nccl shares all of this code with gloo swapped for NCCL; its GPU-only
parts run in tests/test_gpu_transports.py and benchmarks/gpu/check.sh.
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from rlinf.testing import TransportConformance

torch = pytest.importorskip("torch")


class TestTorchGloo(TransportConformance):
    transport_name = "torch-gloo"


def test_listed_usable_and_never_the_default():
    from rlinf.scheduler.plugins import get_registry

    reg = get_registry()
    entry = reg.transport("torch-gloo")
    assert entry.source.distribution == "rlinf-nccl" and entry.unusable_reason() is None
    assert reg.transport(None, "cpu").name == "cpu"


def test_nccl_transports_for_cpu_tensors_is_a_clear_error():
    from rlinf.scheduler.base.errors import PluginError
    from rlinf.scheduler.plugins import get_registry

    for name in ("torch-nccl", "cupy-nccl"):
        with pytest.raises(PluginError, match=name):
            get_registry().transport(name, "cpu")


@dataclasses.dataclass
class Batch:
    obs: object
    meta: dict


# -- pair setup, isolation and the device path, with two transports in this process -----------------
def _dl(seconds=30.0):
    return time.monotonic() + seconds


@pytest.fixture
def two_ends():
    """Transports A and B listening here; accepted links land in ``inbox[name]``."""
    import queue

    from rlinf.scheduler.plugins import get_registry

    factory = get_registry().transport("torch-gloo").descriptor.factory
    ends, inbox = {}, {}
    for name in ("a", "b"):
        inbox[name] = queue.Queue()
        t = factory()
        ends[name] = (t, t.listen(lambda link, hello, q=inbox[name]: q.put((link, hello)), "127.0.0.1"))
    yield ends, inbox
    for t, _ in ends.values():
        t.close()


def test_both_ends_connect_at_once(two_ends):
    """Each end dials the other at the same moment: both pairs form, no deadlock."""
    import threading

    ends, inbox = two_ends
    out = {}

    def dial(src, dst):
        out[src] = ends[src][0].connect(ends[dst][1], f"from {src}".encode(), _dl())

    threads = [threading.Thread(target=dial, args=p) for p in (("a", "b"), ("b", "a"))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert set(out) == {"a", "b"}
    got_b, hello_b = inbox["b"].get(timeout=30)
    got_a, hello_a = inbox["a"].get(timeout=30)
    assert (hello_a, hello_b) == (b"from b", b"from a")
    big = bytes(range(256)) * 4096  # through the process group, not the header link
    out["a"].send([b"x", big], _dl())
    out["b"].send([b"y", big], _dl())
    assert [bytes(f) for f in got_b.recv(_dl())[1]] == [b"x", big]
    assert [bytes(f) for f in got_a.recv(_dl())[1]] == [b"y", big]


def test_failed_pair_leaves_others_working(two_ends):
    ends, inbox = two_ends
    ab = ends["a"][0].connect(ends["b"][1], b"1", _dl())
    ab_far, _ = inbox["b"].get(timeout=30)
    ab2 = ends["a"][0].connect(ends["b"][1], b"2", _dl())
    ab2_far, _ = inbox["b"].get(timeout=30)
    ab_far.close()  # one pair goes away
    with pytest.raises((ConnectionError, TimeoutError)):
        ab.send([b"x", bytes(1 << 20)], _dl(5))
        ab.recv(_dl(5))
    assert not ab.is_open()
    ab2.send([b"still", bytes(1 << 20)], _dl())
    raw, frames = ab2_far.recv(_dl())
    assert bytes(frames[0]) == b"still" and len(frames[1]) == 1 << 20


def test_recv_deadline_is_bounded(two_ends):
    ends, inbox = two_ends
    link = ends["a"][0].connect(ends["b"][1], b"", _dl())
    far, _ = inbox["b"].get(timeout=30)
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        far.recv(time.monotonic() + 0.3)
    assert time.monotonic() - start < 5
    with pytest.raises(TimeoutError):  # a tensor the peer never sends
        far.recv_tensors_into([torch.empty(4)], time.monotonic() + 0.5)


def test_connect_to_an_endpoint_nobody_serves_is_bounded():
    """A CPU endpoint nobody listens on: the dialer gives up by its deadline."""
    from rlinf.scheduler.plugins import get_registry

    t = get_registry().transport("torch-gloo").descriptor.factory()
    try:
        start = time.monotonic()
        with pytest.raises((ConnectionError, OSError, TimeoutError)):
            t.connect({"cpu": {"tcp": ["127.0.0.1", 9], "unix": "rlinf-nobody", "host": "x", "pid": 1}}, b"", _dl(3))
        assert time.monotonic() - start < 15
    finally:
        t.close()


def test_objects_with_device_tensors_split_between_paths(two_ends):
    """The device path (skeleton on the header link, tensors through the group), with CPU tensors
    standing in for device ones: what torch-nccl does with CUDA tensors."""
    import pickle

    from rlinf.scheduler.transports import device_routing as dr

    ends, inbox = two_ends
    link = ends["a"][0].connect(ends["b"][1], b"", _dl())
    far, _ = inbox["b"].get(timeout=30)
    moved = lambda t: t.dtype != torch.int64  # int64 tensors stay "on the host" in this test
    obj = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": [torch.ones(3, dtype=torch.bfloat16), 7],
           "c": Batch(torch.full((4,), 2.5), {"host": torch.arange(3)}), "d": (torch.zeros(0),)}
    skeleton, tensors = dr.split(obj, moved)
    assert len(tensors) == 4 and isinstance(skeleton["a"], dr.DeviceSlot)
    assert torch.equal(skeleton["c"].meta["host"], torch.arange(3))  # host tensors keep their place
    assert dr.needs_device_path(obj, moved) and not dr.needs_device_path({"x": torch.arange(2)}, moved)
    import threading

    sender = threading.Thread(target=dr.send_object,  # gloo's send waits for the matching recv
                              args=(lambda s: link.send([pickle.dumps(s)], _dl()), link, obj, _dl(), moved))
    sender.start()
    got = dr.recv_object(lambda: pickle.loads(bytes(far.recv(_dl())[1][0])), far, _dl(), device=torch.device("cpu"))
    sender.join(30)
    assert torch.equal(got["a"], obj["a"]) and got["b"][1] == 7 and got["b"][0].dtype == torch.bfloat16
    assert torch.equal(got["c"].obs, obj["c"].obs) and isinstance(got["c"], Batch)
    assert torch.equal(got["c"].meta["host"], torch.arange(3)) and got["d"][0].shape == (0,)


def test_device_router_both_directions_over_a_cpu_path():
    """Two routers (one per simulated process) over a real cpu-transport link pair: the receiver dials
    the sender's device listener, links are reused, both directions run at once."""
    import pickle
    import queue
    import threading

    from rlinf.scheduler.transports.device_routing import DeviceEnvelope, DeviceRouter
    from rlinf.scheduler.plugins import get_registry

    moved = lambda t: t.dtype == torch.float32  # float32 tensors take the device path here
    cpu = get_registry().transport("cpu").descriptor.factory
    ta, tb = cpu(), cpu()
    inbox = {"a": queue.Queue(), "b": queue.Queue()}
    ea = ta.listen(lambda l, h: inbox["a"].put(l), "127.0.0.1")
    eb = tb.listen(lambda l, h: inbox["b"].put(l), "127.0.0.1")
    a_to_b = ta.connect(eb, b"a", _dl())
    b_to_a = tb.connect(ea, b"b", _dl())
    b_from_a, a_from_b = inbox["b"].get(timeout=30), inbox["a"].get(timeout=30)
    ra, rb = DeviceRouter("torch-gloo", "cpu"), DeviceRouter("torch-gloo", "cpu")
    try:
        def send(router, link, obj, me, peer):
            router.send(lambda env: link.send([pickle.dumps(env)], _dl()), obj, me, peer, _dl(), is_device=moved)

        def recv(router, link, me):
            got = pickle.loads(bytes(link.recv(_dl())[1][0]))
            assert isinstance(got, DeviceEnvelope) and got.src != me
            return router.unwrap(got, me, _dl(), device=torch.device("cpu"))

        results = {}
        for round_ in range(3):  # links set up once, then reused
            objs = {"a": {"x": torch.full((1000,), float(round_)), "ids": torch.arange(3)},
                    "b": [torch.ones(5) * round_, "text"]}
            threads = [threading.Thread(target=send, args=(ra, a_to_b, objs["a"], "a", "b")),
                       threading.Thread(target=send, args=(rb, b_to_a, objs["b"], "b", "a"))]
            for th in threads:
                th.start()
            results["b"] = recv(rb, b_from_a, "b")
            results["a"] = recv(ra, a_from_b, "a")
            for th in threads:
                th.join(30)
            assert torch.equal(results["b"]["x"], objs["a"]["x"]) and torch.equal(results["b"]["ids"], torch.arange(3))
            assert torch.equal(results["a"][0], objs["b"][0]) and results["a"][1] == "text"
        assert len(ra._in) == len(ra._out) == len(rb._in) == len(rb._out) == 1
    finally:
        ra.close()
        rb.close()
        ta.close()
        tb.close()
