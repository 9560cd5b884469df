"""RLinf's ``CollectiveGroupOptions`` tuning fields reaching the device transports (rlinf-nccl).

What runs without a GPU: which fields each transport declares in its plugin
descriptor, a field a transport cannot honour (ignored, said once at DEBUG),
a value NCCL refuses (the call fails before anything is sent), the mapping onto
``ProcessGroupNCCL.Options``, and the pair setup that carries the fields from
the dialer to the acceptor, exercised with torch's gloo backend (torch-nccl
runs the same code with NCCL's group).  The NCCL side proper runs on GPUs:
tests/test_gpu_transports.py and benchmarks/gpu/check.sh.
"""

from __future__ import annotations

import logging
import queue
import time

import pytest

from rlinf.scheduler import CollectiveGroupOptions
from rlinf.scheduler.plugins.options import link_options
from rlinf.scheduler.plugins import get_registry

torch = pytest.importorskip("torch")

from rlinf.nccl import tuning  # noqa: E402
from rlinf.nccl.torch_pair import GlooTransport  # noqa: E402

ALL = {"accel_max_ctas": 8, "accel_min_ctas": 2, "accel_cluster_size": 4, "is_high_priority_stream": True}


def _entry(name):
    return get_registry().provided["transport"][name]


def test_descriptors_declare_what_each_transport_honours():
    nccl, cupy, gloo = _entry("torch-nccl"), _entry("cupy-nccl"), _entry("torch-gloo")
    assert set(nccl.descriptor.options) == set(ALL)
    assert tuple(cupy.descriptor.options) == ("is_high_priority_stream",)
    assert tuple(gloo.descriptor.options) == () and tuple(_entry("cpu").descriptor.options) == ()
    # declared even where the transport is unusable (no GPU here): the checks need no device
    assert link_options(CollectiveGroupOptions(**ALL), nccl) == ALL
    assert link_options(CollectiveGroupOptions(is_high_priority_stream=True), cupy) == {"is_high_priority_stream": True}
    # unset fields and use_ring_broadcast (broadcast's hint) never reach a transport
    assert link_options(CollectiveGroupOptions(use_ring_broadcast=True, timeout=5), nccl) == {}
    assert link_options(None, cupy) == {}


def test_a_field_a_transport_cannot_honour_is_ignored_and_said_once_at_debug(caplog):
    caplog.set_level(logging.DEBUG, logger="rlinf.p2p")
    both = CollectiveGroupOptions(accel_max_ctas=4, is_high_priority_stream=True)
    assert link_options(both, _entry("cupy-nccl")) == {"is_high_priority_stream": True}
    assert link_options(both, _entry("cupy-nccl")) == {"is_high_priority_stream": True}
    said = [r.getMessage() for r in caplog.records if "ignores" in r.getMessage() and "'cupy-nccl'" in r.getMessage()]
    assert len(said) == 1 and "accel_max_ctas" in said[0] and "torch-nccl" in said[0], said
    assert link_options(CollectiveGroupOptions(accel_cluster_size=2), _entry("torch-gloo")) == {}


@pytest.mark.parametrize("fields, message", [
    ({"accel_max_ctas": 33}, "accel_max_ctas must be between 1 and 32"),
    ({"accel_min_ctas": 40}, "accel_min_ctas must be between 1 and 32"),
    ({"accel_cluster_size": 9}, "accel_cluster_size must be between 1 and 8"),
])
def test_values_nccl_refuses_fail_before_anything_is_sent(fields, message):
    with pytest.raises(ValueError, match=message):
        link_options(CollectiveGroupOptions(**fields), _entry("torch-nccl"))
    # the bounds every CollectiveGroupOptions keeps, whatever the transport
    with pytest.raises(ValueError, match="exceeds accel_max_ctas"):
        CollectiveGroupOptions(accel_min_ctas=5, accel_max_ctas=4)


def test_torch_nccl_settings_name_process_group_options():
    assert tuning.torch_nccl_settings(ALL) == {
        "config.max_ctas": 8, "config.min_ctas": 2, "config.cga_cluster_size": 4, "is_high_priority_stream": True}
    assert tuning.torch_nccl_settings({}) == {}


class _TunedGloo(GlooTransport):
    """torch-gloo declaring a field, so the pair setup torch-nccl uses carries it (gloo itself has no knobs)."""

    honours = ("is_high_priority_stream", "accel_max_ctas")


def _dl(seconds=30.0):
    return time.monotonic() + seconds


@pytest.fixture
def ends():
    """An acceptor of each kind listening in this process; accepted links land in ``inbox``."""
    made, inbox = {}, queue.Queue()
    for name, cls in (("tuned", _TunedGloo), ("plain", GlooTransport)):
        t = cls()
        made[name] = (t, t.listen(lambda link, hello: inbox.put((link, hello)), "127.0.0.1"))
    dialer = _TunedGloo()
    yield made, inbox, dialer
    dialer.close()
    for t, _ in made.values():
        t.close()


def test_pair_setup_carries_the_fields_to_both_ends(ends):
    made, inbox, dialer = ends
    fields = {"is_high_priority_stream": True, "accel_max_ctas": 4}
    out = dialer.connect(made["tuned"][1], b"hello", _dl(), options=fields)
    back, hello = inbox.get(timeout=30)
    assert hello == b"hello" and out.options == fields and back.options == fields
    out.send([b"x" * 100_000], _dl())  # the pair works: a frame big enough to go through the group
    raw, frames = back.recv(_dl())
    assert bytes(frames[0]) == b"x" * 100_000
    plain = dialer.connect(made["tuned"][1], b"again", _dl())  # no fields: none on either end
    assert plain.options == {} and inbox.get(timeout=30)[0].options == {}


def test_an_acceptor_that_cannot_honour_a_field_refuses_the_pair(ends):
    made, inbox, dialer = ends
    with pytest.raises(ConnectionError, match="refused the pair: torch-gloo here does not honour .*accel_max_ctas"):
        dialer.connect(made["plain"][1], b"hello", _dl(), options={"accel_max_ctas": 4})
    with pytest.raises(ValueError, match="accel_max_ctas must be between 1 and 32"):
        dialer.connect(made["tuned"][1], b"hello", _dl(), options={"accel_max_ctas": 64})
    with pytest.raises(ValueError, match="does not honour"):  # checked before dialling
        made["plain"][0].connect(made["tuned"][1], b"hello", _dl(), options={"is_high_priority_stream": True})
    assert inbox.empty()


def test_device_router_sets_a_link_up_with_the_senders_fields_then_the_receivers():
    """Two routers over a real cpu-transport link: the envelope carries the sender's fields, the receiver
    dials with them (completed by its own), and the link keeps them for later messages."""
    import pickle
    import threading

    from rlinf.scheduler.transports.device_routing import DeviceRouter

    cpu = get_registry().transport("cpu").descriptor.factory
    ta, tb = cpu(), cpu()
    inbox = queue.Queue()
    eb = tb.listen(lambda link, hello: inbox.put(link), "127.0.0.1")
    a_to_b = ta.connect(eb, b"a", _dl())
    b_from_a = inbox.get(timeout=30)
    routers = []
    for _ in range(2):
        r = DeviceRouter("torch-gloo", "cpu")
        r.transport.close()
        r.transport = _TunedGloo()  # the router's device transport, declaring fields
        routers.append(r)
    ra, rb = routers
    try:
        for sent_fields in ({"accel_max_ctas": 4}, {"accel_max_ctas": 2}):
            sender = threading.Thread(target=ra.send, args=(
                lambda env: a_to_b.send([pickle.dumps(env)], _dl()), {"x": torch.arange(4.0)}, "a", "b", _dl()),
                kwargs={"is_device": lambda t: True, "options": sent_fields})
            sender.start()  # it waits for the receiver to dial its device listener
            env = pickle.loads(bytes(b_from_a.recv(_dl())[1][0]))
            assert env.options == sent_fields
            got = rb.unwrap(env, "b", _dl(), device=torch.device("cpu"),
                            options={"accel_max_ctas": 1, "is_high_priority_stream": True})
            sender.join(30)
            assert torch.equal(got["x"], torch.arange(4.0)) and not sender.is_alive()
            # set up once, by the first message: the sender's value wins, the receiver's fills in
            assert rb._in["a"].options == ra._out["b"].options == {"accel_max_ctas": 4, "is_high_priority_stream": True}
    finally:
        ra.close()
        rb.close()
        ta.close()
        tb.close()
