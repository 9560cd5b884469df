"""How a channel client commits the puts its host took (a part of ``client.ChannelClient``).

The host answers a put it takes; only the client's ``commit`` makes the item
visible to consumers (see ``protocol``).  A put's caller, or its
asynchronous work, hears that it succeeded only once the commit has been
handed to the connection, so a put that returned was delivered (unless the
host itself dies), and one whose caller got an error was not.

Commits go out in batches: the thread that reads the connection (see
``client``) commits every put reply it reads in one burst (the whole
messages already there) with one ``commit`` message, before it hands those
replies over.  Under load one message thus commits the puts of many threads,
and the host handles about one message per put instead of two.

Which puts a reader may commit: a put is committed in the thread where its
caller could no longer be interrupted before it returns.  An interrupt
(``KeyboardInterrupt``, or any exception a signal handler raises) lands only
in the main thread, so a reader commits the puts of other threads, the
asynchronous puts (as it reads them: their hand-over may wait behind a
callback that waits for the item), and its own put; a put of the main thread
read by another thread reaches its caller uncommitted, and the caller
commits it itself (an interrupt before then withdraws it, as before).  A
caller whose wait for the reply times out withdraws the put unless a reader
has already claimed it for a commit, in which case the commit's outcome is
the call's outcome (it never raises after its put was committed).
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Callable, Optional

from ...base.errors import CommTimeoutError, PeerDiedError
from .protocol import pack

#: whole messages a reader takes from the link in one burst before it commits and hands over
BURST = 32

_MAIN = threading.main_thread().ident


class _Reply(concurrent.futures.Future):
    """The future of a request's reply.

    ``rid``: its request id; ``put_id``: the request id of a put (which must
    be committed); ``owner``: the thread that made the request; ``claimed``:
    a reader took it to commit it (its outcome is the commit's);
    ``committed``: its commit was handed to the connection; ``outcome``: an
    asynchronous put's ``(reply, error)`` once its commit was sent or failed
    (``error`` None: it succeeds with ``reply``)."""

    rid: int = 0
    put_id: Optional[int] = None
    owner: Optional[int] = None
    claimed: bool = False
    committed: bool = False
    outcome: Optional[tuple] = None


class _Commits:
    """The commit side of ``ChannelClient`` (uses its link, locks and failure handling)."""

    def _may_commit(self, fut: _Reply, blocking: bool, ctrl: dict) -> bool:
        """Whether the reading thread commits this reply now (see the module docstring)."""
        if fut.put_id is None or ctrl.get("error"):
            return False
        if not blocking:
            return True
        me = threading.get_ident()
        return fut.owner == me or (fut.owner != _MAIN and me != _MAIN)

    def _commit_batch(self, batch: list, state: list) -> None:
        """Commit the put replies a reader claimed in one burst, with one message, then hand them over.

        ``batch``: ``(rid, future, ctrl, frames, blocking)``.  A blocking
        call's future gets its reply (or the commit's error); an
        asynchronous one's outcome is decided and its reply queued for the
        background reader.  ``state``: ``[commit sent, all settled]``, set
        here as they come true; an interrupt is raised, and the reader then
        settles what this left (``_settle_batch``)."""
        ids = [b[0] for b in batch]
        failed: Optional[Callable[[], Exception]] = None
        try:
            self._send_commits(ids)
            state[0] = True
        except Exception as exc:
            failed = _again(exc)
        queued = False
        with self._lock:  # decided under the lock ``_fail_all`` takes: if it has run, no hand-over will come
            dead = self._dead is not None
            for rid, fut, ctrl, frames, blocking in batch:
                fut.committed = failed is None
                if blocking:
                    continue
                fut.outcome = ((ctrl, frames), None if failed is None else failed())
                if not dead:
                    self._replies.append((rid, ctrl, frames, fut.outcome[1]))
                    queued = True
        for rid, fut, ctrl, frames, blocking in batch:
            if blocking:
                _settle(fut, result=(ctrl, frames)) if failed is None else _settle(fut, exc=failed())
        if dead:  # no hand-over will come: settle the decided puts still claimed (an interrupt leaves them claimed)
            self._fail_all(self._dead)
        state[1] = True
        if queued:
            self._nudge()

    def _settle_batch(self, batch: list, sent: bool) -> None:
        """Settle the puts a reader's burst left unsettled: its read failed, or an interrupt cut its
        commit short (the connection is then given up).  They succeed if the commit was ``sent``, and
        otherwise fail (the host drops them), so none is left pending for good."""
        for rid, fut, ctrl, frames, blocking in batch:
            if not blocking:
                with self._lock:
                    left = self._claimed.get(rid) is fut and fut.outcome is None  # else decided: settled elsewhere
                    if left:
                        del self._claimed[rid]
                if not left:
                    continue
            if sent:
                fut.committed = True
                _settle(fut, result=(ctrl, frames))
            else:
                _settle(fut, exc=PeerDiedError(self._dead or f"{self._connection()} was lost", peer=self.host))

    def _commit_if_put(self, fut: _Reply, ctrl: dict) -> None:
        """Commit a put its caller's own thread got uncommitted, before the caller hears that it succeeded.

        Raises, with the put left uncommitted (the host drops it), what
        ``_send_commits`` raises."""
        if fut.put_id is None or fut.committed or ctrl.get("error"):
            return
        self._send_commits([fut.put_id])
        fut.committed = True

    def _send_commits(self, ids: list) -> None:
        """Hand one ``commit`` of ``ids`` (and the acknowledgements waiting) to the connection.

        Raises ``PeerDiedError`` if the connection is lost (the host drops
        the puts), ``CommTimeoutError`` if another send held the connection
        for the send timeout (nothing was sent: the puts are cancelled), and
        re-raises an interrupt after giving the connection up (a message
        broken midway leaves the stream unusable)."""
        try:
            self._send_commit(ids)
        finally:
            self._open_puts.difference_update(ids)  # committed, or dropped by the host: no longer in the way of a push

    def _send_commit(self, ids: list) -> None:
        if self._dead:
            raise PeerDiedError(self._dead, peer=self.host)
        ctrl = {"id": 0, "op": "commit", "ids": ids}
        acks = self._take_acks() if self._acks else None
        if acks:
            ctrl["acks"] = acks
        try:
            self._send([pack(ctrl)], self._send_timeout)
        except TimeoutError:
            if not self._link.is_open():
                raise PeerDiedError(self._dead or f"{self._connection()} was lost", peer=self.host) from None
            if acks:
                self._acks.extendleft(reversed(acks))
            for rid in ids:
                self.cancel(rid)  # nothing of the commit was sent; queued if it cannot go now
            raise CommTimeoutError(f"the put on channel {self.channel!r} was taken, but another send held the "
                                   f"connection for {self._send_timeout:g} s and it could not be committed; "
                                   f"it was withdrawn", peer=self.host) from None
        except BaseException as exc:
            reason = f"cannot reach the host of channel {self.channel!r} ({self.host}): {type(exc).__name__}: {exc}"
            self.fail(reason)
            if isinstance(exc, Exception):
                raise PeerDiedError(reason, peer=self.host) from None
            raise

    def _timed_out(self, fut: _Reply, grace: float):
        """The caller's wait for ``fut`` ran out: withdraw the request, or, if a reader already claimed
        the put to commit it, wait (at most ``grace`` s) for that commit and return its outcome.

        Raises ``concurrent.futures.TimeoutError`` once withdrawn (the
        caller cancels it: the host drops the put or puts back the items)."""
        with self._lock:
            withdrawn = self._pending.pop(fut.rid, None) is not None
            self._blocking.discard(fut.rid)
        if withdrawn or not fut.claimed:
            raise concurrent.futures.TimeoutError()
        return fut.result(grace)  # the reader's commit send is bounded by the send timeout


def _settle(fut: concurrent.futures.Future, result=None, exc: Optional[BaseException] = None) -> None:
    try:
        if exc is None:
            fut.set_result(result)
        else:
            fut.set_exception(exc)
    except concurrent.futures.InvalidStateError:
        pass  # already failed with the connection


def _settle_decided(fut: _Reply) -> None:
    """Settle an asynchronous put with the outcome its commit decided (runs its callbacks)."""
    reply, exc = fut.outcome
    _settle(fut, result=reply, exc=exc)


def _again(exc: Exception) -> Callable[[], Exception]:
    """A maker of fresh copies of ``exc`` (each caller raises its own: tracebacks are per raise)."""
    kind, args, peer = type(exc), exc.args, getattr(exc, "peer", None)

    def make() -> Exception:
        try:
            return kind(*args, peer=peer) if peer is not None else kind(*args)
        except Exception:
            return exc
    return make
