"""The per-process progress thread: requests, replies and transport hellos.

Every process of an rlinf MPI job runs one ``Service``.  It receives on the
``ctrl`` communicator (requests from other ranks, replies to this rank's
requests) and on the ``data`` communicator's hello tag (a peer opening a
transport link), and runs periodic tasks (the transport's read-ahead).  It
never blocks in MPI: it probes, sleeps in short growing steps when idle, and
receives a message once it has been matched.

A request is ``(id, op, body)``; a handler gets ``(source rank, body, reply)``
and calls ``reply(ok, value)`` once, from any thread, now or later.
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import struct
import threading
import time
import traceback
from concurrent.futures import Future
from typing import Callable, Optional

import cloudpickle
from rlinf.scheduler.base.processes import process_running

from . import runtime
from .polling import IN_MPI, MAX_SLEEP, wait_requests

log = logging.getLogger("rlinf.mpi")

TAG_REQUEST = 1
TAG_REPLY = 2
TAG_HELLO = 1  # on the data communicator
_LISTENER = struct.Struct("<Q")
#: seconds without traffic after which the loop polls every IDLE_SLEEP seconds
IDLE_AFTER = 0.5
IDLE_SLEEP = 0.005
#: seconds to finish receiving a message once it has been matched
RECEIVE_LIMIT = 120.0


class RemoteError(Exception):
    """A request failed on the rank that served it (the handler raised)."""


def rank_alive(rank: int) -> bool:
    """False when the rank's process is known to be gone (checked on this host only)."""
    w = runtime.world()
    info = w.ranks[rank]
    if info.hostname != w.ranks[w.rank].hostname:
        return True
    return process_running(info.pid)


def send_bytes(comm, data, dest: int, tag: int, deadline: Optional[float]) -> None:
    from mpi4py import MPI

    with IN_MPI:
        req = comm.Isend([data, MPI.BYTE], dest, tag)
        wait_requests([req], deadline, f"rank {dest} did not take a message", alive=lambda: rank_alive(dest))


def _receive_matched(message, status) -> bytearray:
    from mpi4py import MPI

    buf = bytearray(status.Get_count(MPI.BYTE))
    req = message.Irecv([buf, MPI.BYTE])
    source = status.Get_source()
    wait_requests([req], time.monotonic() + RECEIVE_LIMIT, "a matched message did not arrive",
                  alive=lambda: rank_alive(source))
    return buf


class Service:
    def __init__(self, world: runtime.World):
        self._world = world
        self._handlers: dict[str, Callable] = {}
        self._pending: dict[int, Future] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._listeners: dict[int, Callable[[int, bytes], None]] = {}
        self._listener_ids = itertools.count(1)
        self._tasks: list[Callable[[], bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rlinf-mpi-service", daemon=True)
        self._thread.start()

    # -- registration ---------------------------------------------------------
    def handle(self, op: str, handler: Callable) -> None:
        self._handlers[op] = handler

    def add_listener(self, callback: Callable[[int, bytes], None]) -> int:
        """Route hellos addressed to the returned listener id to ``callback(source, hello)``."""
        with self._lock:
            listener = next(self._listener_ids)
            self._listeners[listener] = callback
            return listener

    def remove_listener(self, listener: int) -> None:
        with self._lock:
            self._listeners.pop(listener, None)

    def _dispatch_hello(self, source: int, data: bytes) -> None:
        (listener,) = _LISTENER.unpack_from(data, 0)
        callback = self._listeners.get(listener)
        if callback is None:
            log.warning("rank %d: a hello from rank %d for listener %d, which is closed", self._world.rank, source, listener)
            return
        callback(source, data[_LISTENER.size:])

    def add_task(self, task: Callable[[], bool]) -> None:
        """Run ``task()`` on every turn of the loop; it returns whether it did work."""
        with self._lock:
            self._tasks = [*self._tasks, task]

    def remove_task(self, task) -> None:
        with self._lock:
            self._tasks = [t for t in self._tasks if t is not task]

    # -- client side ---------------------------------------------------------------
    def request(self, dest: int, op: str, body=None, deadline: Optional[float] = None) -> Future:
        """Send a request; the future gets the reply's value or raises its error."""
        fut: Future = Future()
        rid = next(self._ids)
        with self._lock:
            self._pending[rid] = fut
        try:
            data = cloudpickle.dumps((rid, op, body), protocol=5)
            send_bytes(self._world.ctrl, data, dest, TAG_REQUEST, deadline)
        except BaseException:
            with self._lock:
                self._pending.pop(rid, None)
            raise
        return fut

    def call(self, dest: int, op: str, body=None, timeout: float = 60.0):
        """``request`` and wait for the value (bounded; notices a dead rank on this host)."""
        deadline = time.monotonic() + timeout
        fut = self.request(dest, op, body, deadline)
        return wait_future(fut, deadline, dest, f"rank {dest} did not answer {op!r} within {timeout:g} s")

    def forget(self, fut: Future) -> None:
        with self._lock:
            for rid, f in list(self._pending.items()):
                if f is fut:
                    del self._pending[rid]

    # -- server side -----------------------------------------------------------------
    def _reply_to(self, source: int, rid: int) -> Callable:
        sent = []

        def reply(ok: bool, value) -> None:
            if sent:
                return
            sent.append(True)
            try:
                data = cloudpickle.dumps((rid, ok, value), protocol=5)
            except Exception as exc:
                data = cloudpickle.dumps((rid, False, RemoteError(f"the reply could not be pickled: {type(exc).__name__}: {exc}")))
            try:
                send_bytes(self._world.ctrl, data, source, TAG_REPLY, time.monotonic() + RECEIVE_LIMIT)
            except (TimeoutError, ConnectionError) as exc:
                log.warning("rank %d: could not reply to rank %d: %s", self._world.rank, source, exc)

        return reply

    def _dispatch_request(self, source: int, data: bytearray) -> None:
        rid, op, body = pickle.loads(data)
        reply = self._reply_to(source, rid)
        handler = self._handlers.get(op)
        if handler is None:
            reply(False, RemoteError(f"rank {self._world.rank} does not serve {op!r}"))
            return
        try:
            handler(source, body, reply)
        except Exception as exc:
            reply(False, exc if _picklable(exc) else RemoteError(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))

    def _dispatch_reply(self, data: bytearray) -> None:
        try:
            rid, ok, value = pickle.loads(data)
        except Exception as exc:  # a value this process cannot rebuild (a class it cannot import)
            log.warning("rank %d: dropped a reply it could not unpickle: %s", self._world.rank, exc)
            return
        with self._lock:
            fut = self._pending.pop(rid, None)
        if fut is None or fut.done():
            return
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value if isinstance(value, BaseException) else RemoteError(str(value)))

    # -- the loop ---------------------------------------------------------------
    def _poll_once(self) -> bool:
        from mpi4py import MPI

        busy = False
        status = MPI.Status()
        message = self._world.ctrl.Improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
        if message is not None:
            busy = True
            data = _receive_matched(message, status)
            if status.Get_tag() == TAG_REQUEST:
                self._dispatch_request(status.Get_source(), data)
            else:
                self._dispatch_reply(data)
        if self._listeners:
            message = self._world.data.Improbe(MPI.ANY_SOURCE, TAG_HELLO, status)
            if message is not None:
                busy = True
                self._dispatch_hello(status.Get_source(), bytes(_receive_matched(message, status)))
        for task in self._tasks:
            busy = task() or busy
        return busy

    def _loop(self) -> None:
        sleep = MAX_SLEEP
        last_busy = time.monotonic()
        while not self._stop.is_set():
            try:
                busy = self._poll_once()
            except Exception:
                log.exception("rank %d: the MPI service loop failed a step", self._world.rank)
                busy = False
            if busy:
                sleep = 0.00002
                last_busy = time.monotonic()
                continue
            time.sleep(sleep)
            # a rank idle for a while polls less often: many idle ranks must not eat the node's cores
            idle_limit = IDLE_SLEEP if time.monotonic() - last_busy > IDLE_AFTER else MAX_SLEEP
            sleep = min(sleep * 2, idle_limit)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def wait_future(fut: Future, deadline: Optional[float], rank: int, what: str):
    """The future's value, waiting in slices; ``ConnectionError`` if the rank died here."""
    while True:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise TimeoutError(what)
        try:
            return fut.result(timeout=1.0 if remaining is None else min(1.0, remaining))
        except TimeoutError:
            if fut.done():
                return fut.result()
            if not rank_alive(rank):
                raise ConnectionError(f"rank {rank}'s process is gone") from None


def _picklable(exc: BaseException) -> bool:
    try:
        pickle.loads(pickle.dumps(exc))
        return True
    except Exception:
        return False


_service: Optional[Service] = None
_service_lock = threading.Lock()


def service() -> Service:
    """This process's service thread (started on first use)."""
    global _service
    if _service is None:
        with _service_lock:
            if _service is None:
                _service = Service(runtime.world())
    return _service


def _stop_service() -> None:
    if _service is not None:
        _service.stop()


runtime.before_finalize(_stop_service)
