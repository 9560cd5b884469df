"""An object that cannot be pickled is named: what was being sent, where to, and the path to the bad part."""

import dataclasses
import threading

import pytest

from rlinf.scheduler import Channel, NodePlacementStrategy, Worker
from rlinf.scheduler.base.unpicklable import UnpicklableError, find_unpicklable


@dataclasses.dataclass
class Batch:
    tokens: list
    state: dict


class Holder:
    def __init__(self):
        self.name = "model"
        self.guard = threading.Lock()


def test_the_innermost_part_that_does_not_pickle_is_found():
    item = {"step": 3, "batch": Batch(tokens=[1, 2], state={"holder": Holder()})}
    path, part = find_unpicklable(item, "item")
    assert path == "item['batch'].state['holder'].guard" and type(part).__name__ == "lock"
    assert find_unpicklable({"fine": [1, 2.0, "x", None]}) is None


class Sender(Worker):
    def __init__(self):
        super().__init__()
        self.runs = 0

    def send_bad(self):
        if self._rank == 1:  # the receiver is told the send failed: the pair stays in step
            try:
                return self.recv(self.worker_group_name, 0, timeout=10)
            except Exception as exc:
                return type(exc).__name__, None
        try:
            self.send({"weights": [1.0], "lock": threading.Lock()}, self.worker_group_name, 1, timeout=10)
        except UnpicklableError as exc:
            return str(exc), exc.path
        return "sent", None

    def take(self, value):
        self.runs += 1
        return self.runs

    def count(self):
        return self.runs

    def put_bad(self, name):
        channel = self.connect_channel(name)
        try:
            channel.put({"obs": [0.5], "env": Holder()}, key="rollouts", timeout=10)
        except UnpicklableError as exc:
            return str(exc), exc.path
        return "put", None


def test_send_names_the_peer_and_the_field(launch):
    group = launch(Sender, placement=NodePlacementStrategy([0, 0]))
    (message, path), (received, _) = group.send_bad().wait()
    assert path == "object['lock']", message
    assert f"cannot pickle the object sent to {group._name}:1" in message and "_thread.lock" in message, message
    assert received != "sent" and received is not None


def test_a_group_call_with_an_unpicklable_argument_starts_nowhere(launch):
    group = launch(Sender, placement=NodePlacementStrategy([0, 0]))
    with pytest.raises(UnpicklableError) as info:
        group.take({"config": Holder()})
    text = str(info.value)
    assert f"the arguments of {group._name}.take()" in text and "args[0]['config'].guard" in text, text
    assert isinstance(info.value, TypeError)
    assert group.count().wait() == [0, 0]  # the call that raised did not happen on any rank


def test_a_channel_put_names_the_channel_the_key_and_the_field(launch, cluster):
    Channel.create("unpicklable_items", cluster=cluster)
    group = launch(Sender, placement=NodePlacementStrategy([0]))
    message, path = group.put_bad("unpicklable_items").wait()[0]
    assert path == "item['env'].guard", message
    assert "channel 'unpicklable_items'" in message and "'rollouts'" in message, message
    with pytest.raises(UnpicklableError, match=r"item\['lock'\]"):
        Channel.connect("unpicklable_items").put({"lock": threading.Lock()})


class Returns(Worker):
    def state(self):
        return {"ok": 1, "state": [1, Holder()]}

    async def state_async(self):
        return Batch(tokens=[1], state={"guard": threading.Lock()})

    def fine(self):
        return 7


def test_a_return_value_that_cannot_be_pickled_names_the_method_and_the_field(launch):
    """The method ran: its return value is what failed, named down to the field, not a call that could not
    start; no terminal codes or Ray's serializer traceback come with it."""
    from rlinf.scheduler import WorkerMethodError

    group = launch(Returns, name="returns")
    with pytest.raises(WorkerMethodError) as info:
        group.state().wait(timeout=60)
    text = str(info.value)
    assert "method 'state' on group 'returns' rank 0" in text, text
    assert "the method ran, but cannot pickle the return value of state(): result['state'][1].guard is a " \
           "_thread.lock" in text, text
    assert "could not start" not in text and "\x1b" not in text and "cloudpickle" not in text, text
    assert group.fine().wait(timeout=60) == [7]  # the worker is fine
    # a coroutine's result too (a worker with async methods is a Ray async actor: another forwarder)
    with pytest.raises(WorkerMethodError, match=r"return value of state_async\(\): result\.state\['guard'\]"):
        group.state_async().wait(timeout=60)
