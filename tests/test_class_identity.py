"""Objects of the driver's own classes come back as instances of those very classes.

Classes from ``__main__`` or a test module travel to workers by value; what a
worker returns, puts in a channel or sends must arrive in the driver as an
instance of the driver's class (``isinstance`` holds), not of a look-alike.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass

import pytest
import torch

from rlinf.scheduler import Channel, NodePlacementStrategy, Worker

from launcher_marks import TEST_LAUNCHER


@dataclass
class Sample:
    step: int
    obs: torch.Tensor


class Payload:
    def __init__(self, tag):
        self.tag = tag


class Maker(Worker):
    def __init__(self):
        super().__init__()

    def sample(self, step):
        return Sample(step, torch.full((2,), float(step)))

    def nested(self):
        return {"items": [Sample(1, torch.zeros(1)), Payload("p")], "pair": (Payload("q"),)}

    def put(self, channel, n):
        for i in range(n):
            channel.put(Sample(i, torch.arange(3)))
        channel.put(Payload("last"))
        return n

    def echo(self, item):
        """The argument as it arrived, and what the worker makes of it."""
        return item, type(item).__name__, getattr(item, "tag", None) or getattr(item, "step", None)

    def forward(self, item, to_rank):
        """Rank 0 sends its argument to ``to_rank`` (p2p); that rank returns what it received."""
        if self._rank == 0:
            self.send(item, self._group_name, to_rank)
            return None
        return self.recv(self._group_name, 0)

    def take(self, channel):
        item = channel.get(timeout=60)
        return item, type(item).__name__

    def relay(self, to_rank):
        """Rank 0 sends a Sample to ``to_rank``; that rank returns what it received."""
        if self._rank == 0:
            self.send(Sample(7, torch.ones(2)), self._group_name, to_rank)
            return None
        got = self.recv(self._group_name, 0)
        return got, type(got).__name__


@pytest.fixture(scope="module")
def makers(cluster):
    group = Maker.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name="class_identity")
    yield group
    group.stop()


@pytest.fixture(scope="module")
def channel(cluster):
    """One channel for the module: under MPI a channel holds a rank for the rest of the job."""
    return Channel.create(f"identity_{os.getpid()}", maxsize=0)


def test_group_call_returns_the_drivers_class(makers):
    own_init, own_repr = Sample.__init__, Sample.__repr__
    results = makers.sample(3).wait()
    assert Sample.__init__ is own_init and Sample.__repr__ is own_repr  # the driver's class is left as it was
    assert len(results) == 2
    for r in results:
        assert type(r) is Sample and isinstance(r, Sample) and r.step == 3 and torch.equal(r.obs, torch.full((2,), 3.0))
    nested = makers.execute_on(0).nested().wait()[0]
    assert type(nested["items"][0]) is Sample and type(nested["items"][1]) is Payload and type(nested["pair"][0]) is Payload


def test_channel_get_on_the_driver_gives_the_drivers_class(makers, channel):
    ch = channel
    assert makers.execute_on(0).put(ch, 3).wait() == [3]
    items = [ch.get() for _ in range(4)]
    assert [type(x) for x in items] == [Sample, Sample, Sample, Payload]
    assert Sample.__init__.__globals__ is globals()  # not replaced by a copy from the worker
    assert [x.step for x in items[:3]] == [0, 1, 2] and items[3].tag == "last"


def test_recv_then_return(makers):
    results = makers.relay(1).wait()
    got, name = results[1]
    assert name == "Sample" and type(got) is Sample and got.step == 7


def test_instances_of_test_module_classes_as_arguments(makers):
    """The workers cannot import this module: its instances travel by value, both ways."""
    sample, payload = Sample(5, torch.arange(3.0)), Payload("arg")
    for (got, name, what) in makers.echo(sample).wait():
        assert name == "Sample" and type(got) is Sample and got.step == 5 and torch.equal(got.obs, sample.obs)
    for (got, name, what) in makers.echo(payload).wait():
        assert (name, what) == ("Payload", "arg") and type(got) is Payload and got.tag == "arg"
    nested = makers.execute_on(1).echo({"batch": [sample, payload]}).wait()[0][0]
    assert type(nested["batch"][0]) is Sample and type(nested["batch"][1]) is Payload


def test_arguments_of_test_module_classes_sent_on_p2p_and_through_a_channel(makers, channel):
    got = makers.forward(Sample(9, torch.ones(2)), 1).wait()[1]
    assert type(got) is Sample and got.step == 9 and torch.equal(got.obs, torch.ones(2))
    got = makers.forward(Payload("p2p"), 1).wait()[1]
    assert type(got) is Payload and got.tag == "p2p"
    ch = channel
    ch.put(Payload("from the driver"))
    ch.put(Sample(11, torch.zeros(1)))
    first = makers.execute_on(0).take(ch).wait()[0]
    second = makers.execute_on(1).take(ch).wait()[0]
    assert first[1] == "Payload" and type(first[0]) is Payload and first[0].tag == "from the driver"
    assert second[1] == "Sample" and type(second[0]) is Sample and second[0].step == 11


_SCRIPT = """
    import sys
    from dataclasses import dataclass

    from rlinf.scheduler import Cluster, NodePlacementStrategy, Worker


    @dataclass
    class Point:
        x: int
        y: int


    class Shapes(Worker):
        def __init__(self):
            super().__init__()

        def point(self, x):
            return Point(x, self._rank)


    if __name__ == "__main__":
        cluster = Cluster(temp_dir=sys.argv[1], num_cpus=2, log_to_driver=False)
        group = Shapes.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name="shapes")
        points = group.point(4).wait()
        print("TYPES", [type(p).__module__ + "." + type(p).__qualname__ for p in points], flush=True)
        print("ISINSTANCE", all(isinstance(p, Point) for p in points), [(p.x, p.y) for p in points], flush=True)
        group.stop()
        cluster.shutdown()
"""


@pytest.mark.skipif(TEST_LAUNCHER == "mpi", reason="starts its own Ray driver as a subprocess")
def test_main_module_class_from_a_script():
    with tempfile.TemporaryDirectory(prefix="rci") as tmp:
        script = os.path.join(tmp, "script.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent(_SCRIPT))
        proc = subprocess.run([sys.executable, script, os.path.join(tmp, "ray")], capture_output=True, text=True,
                              timeout=150, start_new_session=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "ISINSTANCE True [(4, 0), (4, 1)]" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_a_class_coming_back_is_left_unchanged():
    """In process: a by-value copy of our own class resolves to it and does not overwrite its methods."""
    import cloudpickle

    from rlinf.scheduler.base.serialization import dumps_by_value_where_needed

    own_init = Sample.__init__
    data = dumps_by_value_where_needed(Sample(2, torch.ones(1)), __name__)
    assert b"_make_skeleton_class" in data  # really by value
    back = cloudpickle.loads(data)
    assert type(back) is Sample and back.step == 2 and Sample.__init__ is own_init
