"""A worker rank: hosts one worker at a time and runs its calls in order.

The service thread receives requests; calls on the worker are queued and run
on the rank's main thread one after another, as they would in an actor.  When
the group stops, the rank releases everything the worker held and frees
itself for the next group.  The rank exits when the driver says so, or
(spawn mode) when the driver's process is gone.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import traceback

import cloudpickle

from rlinf.scheduler.base import config
from rlinf.scheduler.base.errors import LaunchError
from rlinf.scheduler.plugins import node_env
from rlinf.scheduler.runtime.host import WorkerHost

from . import runtime
from .service import Service, rank_alive, service

log = logging.getLogger("rlinf.mpi")

#: seconds the rank waits for a running call after the driver said exit (``RLINF_MPI_EXIT_GRACE``)
EXIT_GRACE_ENV = "RLINF_MPI_EXIT_GRACE"
DEFAULT_EXIT_GRACE = 10.0


def exit_grace() -> float:
    """Seconds a call still running when the driver says exit may go on before the rank exits anyway.

    Raises:
        ValueError: ``RLINF_MPI_EXIT_GRACE`` is not a positive, finite number.
    """
    return config._float_env(EXIT_GRACE_ENV, DEFAULT_EXIT_GRACE)


def same_interpreter(path: str, running: str) -> bool:
    """Whether ``path`` names the interpreter ``running`` (the same file in the same directory: ``bin/python3``
    for ``bin/python`` passes, another virtualenv's ``python`` linked to the same binary does not)."""
    path, running = os.path.abspath(path), os.path.abspath(running)
    if path == running:
        return True
    try:
        return os.path.dirname(path) == os.path.dirname(running) and os.path.samefile(path, running)
    except OSError:
        return False


def check_interpreter(spec, running: str) -> None:
    """Refuse a worker whose node group asks for another Python interpreter than this rank's ``running`` one.

    Raises:
        LaunchError: ``env_configs`` give the worker's node a ``python_interpreter_path`` that is not ``running``
            (mpiexec started every rank with one interpreter; a rank cannot change it).
    """
    own = node_env.peek(spec.env)
    if own is None or own.python_interpreter_path is None or same_interpreter(own.python_interpreter_path, running):
        return
    raise LaunchError(
        f"node {spec.placement.node_rank}'s python_interpreter_path {own.python_interpreter_path!r} (env_configs of "
        f"node group(s) {', '.join(own.groups)}) cannot be used under MPI: mpiexec started this rank with {running}, "
        f"and a running rank cannot change its interpreter; start the job with that interpreter "
        f"(mpiexec -n N {own.python_interpreter_path} -m rlinf.mpi ...) or drop python_interpreter_path",
        group=spec.group_key, rank=spec.placement.rank, node=spec.placement.node_rank, method="__init__",
    )


class CallRejected(Exception):
    """A call could not start on this rank (its arguments could not be unpickled, or its group is gone)."""

    def __init__(self, reason: str, traceback_text: str = ""):
        super().__init__(reason, traceback_text)
        self.reason = reason
        self.traceback_text = traceback_text


class Slot:
    def __init__(self, world: runtime.World, svc: Service):
        self._world = world
        self._service = svc
        self._queue: "queue.Queue" = queue.Queue()
        self._host: WorkerHost | None = None
        self._generation = 0
        self._environ = dict(os.environ)
        self._exit = threading.Event()
        self._finished = threading.Event()
        svc.handle("reserve_port", self._reserve_port)
        for op in ("construct", "execute", "stop"):
            svc.handle(op, lambda source, body, reply, op=op: self._queue.put((op, body, reply)))
        svc.handle("exit", self._on_exit)

    def _reserve_port(self, source, body, reply) -> None:
        if self._host is None:
            self._host = WorkerHost()
        reply(True, self._host.reserve_master_port())

    def _on_exit(self, source, body, reply) -> None:
        self._exit.set()
        self._queue.put(None)
        reply(True, None)

        try:
            grace = exit_grace()
        except ValueError as exc:
            log.warning("rank %d: %s; using %g s", self._world.rank, exc, DEFAULT_EXIT_GRACE)
            grace = DEFAULT_EXIT_GRACE

        def force():  # a call that never returns must not keep the job alive
            if not self._finished.wait(grace):
                log.warning("rank %d: a call is still running %g s after the program ended; exiting",
                            self._world.rank, grace)
                os._exit(1)

        threading.Thread(target=force, daemon=True).start()

    # -- main thread ----------------------------------------------------------------
    def run(self) -> None:
        driver_gone = self._world.mode == "spawn"
        while not self._exit.is_set():
            try:
                item = self._queue.get(timeout=1.0)
            except queue.Empty:
                if driver_gone and not rank_alive(0):
                    log.warning("rank %d: the driver is gone; exiting", self._world.rank)
                    return
                continue
            if item is None:
                break
            op, body, reply = item
            try:
                getattr(self, "_" + op)(body, reply)
            except Exception as exc:
                reply(False, exc)
        if self._host is not None:
            self._release()
        self._finished.set()

    def _construct(self, body, reply) -> None:
        spec, payload, master_port = body
        if self._host is None:
            self._host = WorkerHost()
        self._generation += 1
        info = self._world.ranks[self._world.rank]
        try:
            check_interpreter(spec, sys.executable)
            record = self._host.construct(spec, payload, master_port, "mpi", info.ip)
        except BaseException:
            self._release()  # free for the next group; the launcher reports the error
            raise
        reply(True, (self._generation, record))

    def _execute(self, body, reply) -> None:
        generation, method, packed = body
        if generation != self._generation or self._host is None:
            reply(False, CallRejected(f"the worker this call was sent to was stopped (rank {self._world.rank})"))
            return
        try:
            args, kwargs = cloudpickle.loads(packed)
        except BaseException as exc:
            reply(False, CallRejected(f"cannot unpickle the call's arguments here: {type(exc).__name__}: {exc}",
                                      traceback.format_exc()))
            return
        if self._host.is_async:  # runs on the worker's loop: the next call can start while this one awaits
            self._host.submit(method, args, kwargs, lambda wire: reply(True, wire))
            return
        reply(True, self._host.execute(method, args, kwargs))

    def _stop(self, body, reply) -> None:
        if self._host is not None and body in (None, self._generation):  # None: whatever is hosted
            self._release()
        reply(True, None)

    def _release(self) -> None:
        host, self._host = self._host, None
        self._generation += 1
        try:
            host.release()
        except Exception:
            log.exception("rank %d: releasing the stopped worker failed", self._world.rank)
        os.environ.clear()
        os.environ.update(self._environ)
        import gc

        gc.collect()
        if self._exit.is_set():
            return  # the job is ending: rank 0 no longer hands out ranks
        try:
            self._service.call(0, "release_ranks", [self._world.rank], timeout=30)
        except Exception as exc:
            log.warning("rank %d: could not tell rank 0 it is free: %s", self._world.rank, exc)


def serve() -> None:
    """The whole life of a worker rank."""
    world = runtime.world()
    Slot(world, service()).run()
