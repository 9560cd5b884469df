"""A generic worker for communication tests: runs functions shipped from the test."""

import time

import cloudpickle

from rlinf.scheduler import Worker

from rlinf.scheduler.base.serialization import dumps_by_value_where_needed


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


def await_with_ticker(work):
    """Await ``work.async_wait()`` in a fresh event loop while a ticker runs; return (value, ticks).

    Many ticks prove the wait never blocked the loop.
    """
    import asyncio

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        t = asyncio.create_task(ticker())
        value = await work.async_wait()
        t.cancel()
        return value, ticks

    return asyncio.run(main())


def process_alive(pid) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def link_to(peer: str, incoming: bool = False):
    """Inside a worker: this process's link to (or, with ``incoming``, from) worker ``peer``."""
    from rlinf.scheduler.messaging.p2p.communicator import local_communicator

    comm = local_communicator()
    return (comm._in if incoming else comm._out)[peer].link


def ship(fn) -> bytes:
    return dumps_by_value_where_needed(fn, fn.__module__, __name__)  # helpers here travel by value too


def run_on(group, rank, fn, *args):
    """Start ``fn(worker, *args)`` on one rank; returns the pending result."""
    return group.execute_on(rank).run(ship(fn), *args)


def wait_for(predicate, limit, what, every=0.05):
    """Return once ``predicate()`` is true; ``AssertionError`` naming ``what`` if it is not within ``limit`` s."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(every)
    raise AssertionError(f"{what} not within {limit} s")
