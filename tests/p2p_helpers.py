"""A generic worker for communication tests: runs functions shipped from the test."""

from rlinf.scheduler import Worker
import cloudpickle

from rlinf.scheduler.serialization import dumps_by_value_where_needed


class Peer(Worker):
    def __init__(self):
        super().__init__()
        self.state = {}

    def run(self, payload, *args):
        fn = cloudpickle.loads(payload)
        return fn(self, *args)

    def pid(self):
        import os

        return os.getpid()


def ship(fn) -> bytes:
    return dumps_by_value_where_needed(fn, fn.__module__)


def run_on(group, rank, fn, *args):
    """Start ``fn(worker, *args)`` on one rank; returns the pending result."""
    return group.execute_on(rank).run(ship(fn), *args)
