"""Exceptions that say who failed, where, and why.

Every failure raised to a caller names the group, rank, node and method
involved and, when the failure happened in another process, carries that
process's traceback as text (``remote_traceback``) so it survives even when
the original exception cannot be unpickled here.
"""

from __future__ import annotations

import time
from typing import Optional


class RlinfError(Exception):
    """Base class of every rlinf exception."""


class PluginError(RlinfError):
    """A plugin could not be loaded, selected or used."""


class PlacementError(RlinfError, ValueError, AssertionError):
    """A placement asks for nodes or accelerators the cluster does not have.

    It is a ``ValueError`` (this project's contract) and an ``AssertionError``
    (RLinf checks placements with ``assert``), so ``except ValueError`` and
    ``except AssertionError`` both catch it.
    """


#: how to get more nodes, said where a placement or ``Cluster(num_nodes=N)`` asks for more than there are
MORE_NODES_HINT = ("to run on more nodes, start a Ray cluster: `ray start --head` on one machine and "
                   "`ray start --address=<head ip>:6379` on each of the others, then run the program with "
                   "RAY_ADDRESS=<head ip>:6379; or run it as an MPI job across the nodes "
                   "(mpiexec or srun ... python -m rlinf.mpi program.py, docs/mpi.md)")


class PlacementArgumentError(PlacementError):
    """A placement strategy or component placement was given an invalid argument.

    Raised when the strategy is built (a negative rank, an end before the
    start, ranks that do not split into processes, an empty list), before any
    cluster is consulted.  Like ``PlacementError`` it is both a ``ValueError``
    and an ``AssertionError``.
    """


class ClusterConfigError(RlinfError, ValueError, AssertionError):
    """RLinf's ``cluster`` config section is invalid (a missing or unknown field, a bad rank range, ...).

    Both a ``ValueError`` and an ``AssertionError`` (RLinf validates the
    section with ``assert``); the message names the offending entry.
    """


class GroupNameError(RlinfError, ValueError):
    """A group name is already taken in this cluster, or unknown."""


class WorkerError(RlinfError, RuntimeError):
    """A failure attributed to one worker of one group."""

    #: a failure that was caused by another worker failing first (a peer died,
    #: a message never came): when several ranks fail, the primary one is reported
    secondary = False

    def __init__(
        self,
        summary: str,
        *,
        group: Optional[str] = None,
        rank: Optional[int] = None,
        node: Optional[int] = None,
        node_ip: Optional[str] = None,
        method: Optional[str] = None,
        pid: Optional[int] = None,
        remote_traceback: Optional[str] = None,
        timestamp: Optional[float] = None,
    ):
        """Record who failed and where; the message shows all of it.

        Args:
            summary: what went wrong, in one line.
            group: the group's name.
            rank: the worker's rank in it.
            node: its node's rank.
            node_ip: its node's IP address.
            method: the method that was running, if any.
            pid: the worker's process id.
            remote_traceback: the worker's traceback, appended to the message.
            timestamp: when it failed (``time.time()``; default: now).
        """
        self.summary = summary
        self.group = group
        self.rank = rank
        self.node = node
        self.node_ip = node_ip
        self.method = method
        self.pid = pid
        self.remote_traceback = remote_traceback
        self.timestamp = timestamp if timestamp is not None else time.time()
        super().__init__(self._render())

    def where(self) -> str:
        """Where the failure happened, as in the message: ``"group 'actor' rank 3 (node 1, 10.0.0.2, pid 4242)"``."""
        parts = []
        if self.group is not None:
            parts.append(f"group {self.group!r}")
        if self.rank is not None:
            parts.append(f"rank {self.rank}")
        loc = []
        if self.node is not None:
            loc.append(f"node {self.node}")
        if self.node_ip:
            loc.append(self.node_ip)
        if self.pid:
            loc.append(f"pid {self.pid}")
        text = " ".join(parts)
        if loc:
            text += f" ({', '.join(loc)})"
        return text

    def _render(self) -> str:
        head = self.summary
        if self.method:
            head = f"method {self.method!r} on {self.where()}: {head}"
        else:
            head = f"{self.where()}: {head}"
        if self.remote_traceback:
            head += "\n\nRemote traceback:\n" + self.remote_traceback.rstrip()
        return head

    def __reduce__(self):
        # the full state travels, so extra attributes (cause, secondary, ...) survive
        return (_rebuild_worker_error, (type(self), self.args[0] if self.args else self.summary), dict(self.__dict__))


def _rebuild_worker_error(cls, message):
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    return err


class WorkerMethodError(WorkerError):
    """A worker method raised; ``remote_traceback`` holds the worker's traceback."""

    def __init__(self, summary: str, *, exc_type: str = "", **kw):
        """Record a worker method's exception.

        Args:
            summary: the exception's type and message.
            exc_type: the name of the exception's type in the worker.
            **kw (Any): the location fields of ``WorkerError`` (``group``, ``rank``,
                ``node``, ``node_ip``, ``method``, ``pid``, ``remote_traceback``, ``timestamp``).
        """
        self.exc_type = exc_type
        super().__init__(summary, **kw)


class WorkerDiedError(WorkerError):
    """A worker process died (killed, crashed, or its node went away)."""


class LaunchError(WorkerError):
    """A worker could not be started or constructed."""


class CommunicationError(RlinfError, RuntimeError):
    """Point-to-point or channel communication with a peer failed."""

    secondary = False

    def __init__(self, message: str, *, peer: Optional[str] = None):
        """A communication failure, naming the peer when known.

        Args:
            message: what failed.
            peer: the peer's address or host, kept as ``peer``.
        """
        self.peer = peer
        super().__init__(message)


class PeerDiedError(CommunicationError):
    """The peer's process or connection went away mid-operation."""

    secondary = True


class CommTimeoutError(CommunicationError, TimeoutError):
    """A blocking communication operation did not finish in time."""

    secondary = True
