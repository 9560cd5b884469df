"""The client side of a channel: one connection per process per channel.

Requests carry ids, and each reply goes to the future of its request, so
any number of blocking and asynchronous operations, on any keys and from any
threads, share the connection without ever receiving another caller's item.
If the host goes away every pending operation fails at once.

One thread at a time reads (the *reader*).  A blocking operation whose
thread finds no reader reads until its own reply has come: handing each
reply from a reader thread to the waiting caller had cost as much as the
rest of a put or get (a put and a get: 350 us handed over, 188 us read in
place, 163 us for the bare exchange on the link, on a 2-core machine).
Otherwise a background reader thread reads whenever a reply or a pong is
awaited and no caller reads; it stops reading to run callbacks, and while
one runs the heartbeat thread reads.  Any reader sets the futures of blocking calls
(they have no callbacks); other replies go to the background reader, so the
callbacks of asynchronous operations never run in a thread that read for
another call (where a Ctrl-C could land in them).  A callback must not wait
for another operation of the same channel: it holds up the hand-over of
every reply, and the heartbeat thread declares the connection dead once it
has run for several heartbeats with replies waiting.  When the connection
is declared dead, every pending operation fails at once in the thread that
found it dead (so a callback stuck on one of them is released), except an
asynchronous put whose commit already went out: it succeeds there and then
(its item will be delivered), even if its reply still waited for the hand-over.

Every send has a deadline, which also bounds its wait for another
thread's send on the link.  A heartbeat thread pings the host; a host not
heard from for several heartbeats (a whole message, or bytes of a long one
moving either way) is declared dead (the link is closed, so
every waiting operation raises ``PeerDiedError``).  A client acknowledges an
item (a message of its own, sent before the item is handed to its user), and
cancels a request it gives up, so the host puts an item that never reached a
user back into its queue, and never one that did.

A put that the host takes is *committed* (a one-way ``commit``) before its
caller, or its asynchronous work, is told it succeeded; until then no
consumer sees the item.  The reading thread commits the put replies of a
burst together (``commits`` says which thread may commit which put).  Every
way a put can fail for its caller after the host took it (an interrupt, a
timeout, the connection lost or its host declared dead, a commit that cannot
be sent) leaves it uncommitted, and the
host drops it on the cancel or on the loss of the connection: a put whose
caller got an error is never delivered, by any path (nothing is resent, and
a new connection starts with nothing of the old one).
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import json
import os
import threading
import time
import uuid
from typing import Optional

from ...base.errors import CommunicationError, PeerDiedError
from ...plugins.transport import Link
from .commits import BURST, _Commits, _Reply, _settle, _settle_decided
from .acking import _Acks
from .feeding import _Feeds
from .batching import _Batches
from .direct_in import _DirectIn
from .direct_out import _DirectOut, dialer
from .sending import _Sends
from .protocol import DEAD_AFTER_BEATS, REPLY_GRACE, control, heartbeat_interval, send_timeout

class ChannelClient(_Sends, _Batches, _Commits, _Acks, _Feeds, _DirectIn, _DirectOut):
    def __init__(self, channel: str, host: str, link: Link):
        self.channel = channel
        self.host = host
        self._link = link
        self._link_progress = getattr(link, "last_progress", lambda: 0.0)  # a link that cannot tell: never
        self._bursts = link.poll_fd() is not None  # its recv_nowait works: a reader takes what is there in one go
        self._ids = itertools.count(1)
        #: the host said it has no maxsize (in a put's reply): puts go as one-way pushes (``push``)
        self.unbounded = False
        #: put requests not yet committed or given up: a later put goes as a request too, not as a push
        #: that the host would append before them (a producer's puts stay in order)
        self._open_puts: set = set()
        self._push_heads: dict = {}  # (key, weight) -> a push's packed control
        self._pending: dict[int, concurrent.futures.Future] = {}
        #: asynchronous puts a reader claimed to commit, until handed over: their commit decides their outcome
        self._claimed: dict[int, _Reply] = {}
        self._lock = threading.Lock()
        self._dead: Optional[str] = None
        self._send_timeout = send_timeout()
        self._beat = heartbeat_interval()
        self._last_heard = time.monotonic()
        #: requests given up by garbage collection (finalizers must not take locks): sent by the heartbeat thread
        self._abandoned: collections.deque = collections.deque()
        #: the thread reading the connection now (a caller reading its own reply, or the background reader)
        self._reader: Optional[int] = None
        self._ping_out = False  # a ping not yet answered: someone must read
        #: requests of blocking calls: their futures have no callbacks, so any reader may set them
        self._blocking: set = set()
        #: replies read by a caller for other operations, handed to their futures by the background reader
        self._replies: collections.deque = collections.deque()
        self._sending: set = set()  # threads in a send on the link now (the heartbeat's sends wait their turn)
        self._handing_since: Optional[float] = None  # when the hand-over running now began (its callbacks run)
        #: guards _reader; its Condition wakes the background reader.  Callers take the plain lock
        #: (``with self._turn_lock``): a C lock's enter and exit leave no gap where a Ctrl-C could
        #: land with it held, as the Condition's Python-level ``__exit__`` would
        self._turn_lock = threading.Lock()
        self._turn = threading.Condition(self._turn_lock)
        self._init_acks()
        self._init_feeds()
        self._init_batches()
        self._init_direct_in()
        self._init_direct_out()
        threading.Thread(target=self._read_replies, name=f"rlinf-channel-{channel}-replies", daemon=True).start()
        threading.Thread(target=self._heartbeat, name=f"rlinf-channel-{channel}-heartbeat", daemon=True).start()

    @classmethod
    def connect(cls, channel: str, host_name: str, record) -> "ChannelClient":
        from ...plugins import get_registry

        registry = get_registry()
        entry = registry.transport(None, "cpu")  # this process's default, if the host offers it
        if entry.name not in record.endpoints and "cpu" in record.endpoints:
            entry = registry.transport("cpu", "cpu")
        endpoint = record.endpoints.get(entry.name)
        if endpoint is None:
            raise CommunicationError(f"the host of channel {channel!r} offers no transport this process can use "
                                     f"(it offers {sorted(record.endpoints)})", peer=host_name)
        transport = _client_transport(entry)
        token = uuid.uuid4().hex  # pairs the ack link (see ``acking``) with this connection
        hello = {"service": "channel", "channel": channel, "client": f"{os.getpid()}-{token[:6]}", "token": token,
                 "direct": True}
        from ..p2p.communicator import Communicator

        def dial(hello: dict):
            return Communicator._connect(transport, endpoint, json.dumps(hello).encode(), time.monotonic() + send_timeout())

        client = cls(channel, host_name, dial(hello))
        if client._bursts:
            client._dial_acks = lambda: dial({"service": "channel", "channel": channel, "acks_for": token})
            client._dial_direct = dialer((entry.name, transport), Communicator._connect)
        return client

    # -- reading ------------------------------------------------------------------------
    def _read_one(self, deadline: Optional[float]) -> bool:
        """Read a message, and the whole ones already behind it (a burst), and route them (the calling
        thread is the reader).

        The reply to a blocking call goes straight to its future, which has
        no callbacks; every other reply is queued for the background reader
        to hand over, so no other operation's callback ever runs in a
        caller's thread.  The put replies this reader may commit are
        committed together, with one message, before they are handed over
        (see ``commits``).  False once the connection is lost (every pending
        operation has then failed); ``TimeoutError`` if nothing came by
        ``deadline`` (the link keeps what it read of a message); ``deadline``
        None: only what has arrived whole, without waiting.  An
        interrupt (``KeyboardInterrupt``) during a read gives the connection
        up: a message may have been half read, or read and dropped, so every
        pending operation fails at once instead of waiting for a lost reply
        (the next operation connects afresh; the host puts back the items it
        had sent)."""
        batch: list = []
        state = [False, False]  # the batch's commit sent, the batch settled
        try:
            try:
                if self._in_routes:  # the routes' links are read with the connection (see ``direct_in``)
                    msg = self._wait_links(deadline) if deadline is not None else (
                        self._read_direct(), self._link.recv_nowait())[1]
                    if msg is None:
                        if self._returns:
                            self._send_returns(when_idle=True)  # direct items of an ended feed go back
                        return True
                    frames = msg[1]
                elif deadline is None:
                    msg = self._link.recv_nowait() if self._bursts else None
                    if msg is None:
                        return True
                    frames = msg[1]
                else:
                    _raw, frames = self._link.recv(deadline)
                self._route(frames, batch)
                for _ in range(BURST if self._bursts else 0):
                    msg = self._link.recv_nowait()
                    if msg is None:
                        break
                    self._route(msg[1], batch)
                if batch:
                    self._commit_batch(batch, state)
                if self._returns:
                    self._send_returns(when_idle=True)  # else with the next message or tick: a reader never waits here
                if self._ending:
                    self._end_routes_out(when_idle=True)  # an ``unroute`` is answered now (or on the next tick)
            finally:
                if batch and not state[1]:  # cut short: the connection is given up below
                    self._settle_batch(batch, state[0])
            return True
        except TimeoutError:
            if self._dead is None and self._link.is_open():
                raise
            self.fail(self._dead or f"{self._connection()} was lost")
            return False
        except Exception as exc:
            # close our end too (its descriptor and mappings), then fail what waits
            self.fail(self._dead or f"{self._connection()} was lost: {type(exc).__name__}: {exc}")
            return False
        except BaseException as exc:
            self.fail(f"{self._connection()} was given up: {type(exc).__name__} interrupted a read of it")
            raise

    def _route(self, frames: list, batch: list) -> None:
        """Route one message read: a pong, a blocking call's reply, one to commit (into ``batch``), or
        one for the background reader to hand over."""
        ctrl = control(frames[0])
        self._last_heard = time.monotonic()
        rid = ctrl.get("id", 0)
        if not rid:
            op = ctrl.get("op")
            if op in ("route", "unroute"):
                self._route_offer(ctrl)  # a route for this producer (see ``direct_out``)
            elif op == "go":
                self._route_go(ctrl)  # a route to this consumer (see ``direct_in``)
            elif "key" in ctrl:
                self._route_feed(ctrl, frames[1:])  # items fed ahead, or a recall
            elif ctrl.get("op") == "acks":
                self._ack_link_confirmed()
            else:
                self._ping_out = False  # a pong
            return
        if ctrl.get("feed"):
            self._route_feed(ctrl, ())  # this get's reply grants a feed
        with self._lock:
            fut = self._pending.get(rid)
            if fut is None:
                return  # a reply to a request given up; the cancel sent for it makes the host put its items back
            blocking = rid in self._blocking
            commit = self._may_commit(fut, blocking, ctrl)
            if ctrl.get("error"):
                self._open_puts.discard(rid)  # no commit will come
            if commit:  # first: an interrupt from here on leaves it to _settle_batch (claimed) or _fail_all (pending)
                batch.append((rid, fut, ctrl, frames[1:], blocking))
            if blocking or commit:
                if not blocking:
                    self._claimed[rid] = fut  # no longer fails with the connection: its commit decides
                del self._pending[rid]  # (no call between these: no interrupt lands between them)
                fut.claimed = commit
                self._blocking.discard(rid)
        if commit:
            return  # its commit is sent with the batch (``_commit_batch``)
        if blocking:
            if not fut.done():
                fut.set_result((ctrl, frames[1:]))
        else:
            self._replies.append((rid, ctrl, frames[1:], None))
            self._nudge()

    def _read_arrived(self) -> None:
        """Route what has arrived, without waiting, if no one reads (a thread that reads for no call:
        the heartbeat's, the batches')."""
        if self._reader is None and self._claim():
            try:
                self._read_one(None)
            finally:
                self._release()

    def _connection(self) -> str:
        return f"the connection to the host of channel {self.channel!r} ({self.host})"

    def _hand_over(self) -> None:
        """Set the futures of the queued replies (background reader only: their callbacks run here)."""
        while self._replies:
            rid, ctrl, frames, failed = self._replies.popleft()
            with self._lock:
                fut = self._pending.pop(rid, None) or self._claimed.pop(rid, None)
            if fut is not None and not fut.done():
                if failed is not None:  # its commit could not be sent when the reply was read
                    fut.set_exception(failed)
                    continue
                self._handing_since = time.monotonic()
                try:
                    fut.set_result((ctrl, frames))  # runs its callbacks
                finally:
                    self._handing_since = None
            # else: a reply to a request given up; the cancel sent for it makes the host put its items back

    def _awaited(self) -> bool:
        return bool(self._pending) or self._ping_out

    def _claim(self) -> bool:
        """Become the reader; False if another thread reads (a callback never runs in a reader)."""
        with self._turn_lock:
            if self._reader is None:
                self._reader = threading.get_ident()
                return True
            return False

    def _release(self) -> None:
        self._reader = None  # first, outside the lock: an interrupt while taking it must not leave us the reader
        with self._turn_lock:
            if self._awaited() or self._replies:
                self._turn.notify_all()  # what this reader leaves unread is the background reader's
        self._wake_fed()  # a get waiting for a fed item reads now

    def _nudge(self) -> None:
        """A request, ping or reply was added: wake the background reader if it may have work (it
        checks what is awaited itself)."""
        with self._turn_lock:
            if self._reader is None or self._replies:
                self._turn.notify_all()

    def _read_replies(self) -> None:
        """The background reader: hands queued replies over, and reads while a reply or pong is
        awaited and no caller reads.

        It stops reading before it hands over: a callback may make a blocking
        call, which must be able to read its own reply, and a slow callback
        must not keep the host's pongs unread (the heartbeat thread reads
        meanwhile).  A callback that runs for several heartbeats while other
        replies wait is taken as stuck (see the module docstring)."""
        me = threading.get_ident()
        while self._dead is None:
            with self._turn:
                if self._replies:
                    reading = False
                elif self._reader is not None or not self._awaited():
                    self._turn.wait(1.0)  # bounded; woken by requests, pings, replies and readers that stop
                    continue
                else:
                    self._reader, reading = me, True
            if not reading:
                self._hand_over()
                continue
            try:
                while self._dead is None and self._awaited() and not self._replies:
                    try:
                        if not self._read_one(time.monotonic() + 0.5):
                            break
                    except TimeoutError:
                        pass  # looks again whether anything is still awaited
            finally:
                self._release()

    def wait_reply(self, fut: concurrent.futures.Future, timeout: float):
        """The reply of a blocking call (``request(blocking=True)``), read by this thread whenever no
        one else reads (looked at again every half second while another thread reads).

        Raises ``concurrent.futures.TimeoutError`` after ``timeout`` seconds,
        or the operation's error (``PeerDiedError`` if the connection was lost)."""
        deadline = time.monotonic() + timeout
        while not fut.done():
            left = deadline - time.monotonic()
            if left <= 0:
                return self._timed_out(fut, self._send_timeout + REPLY_GRACE)
            if not self._claim():  # another thread reads; it may stop before our reply (a callback's call)
                try:
                    fut.result(min(left, 0.5))
                except concurrent.futures.TimeoutError:
                    pass
                continue
            try:
                while not fut.done():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break  # withdrawn (or its claimed commit awaited) above, once no longer the reader
                    try:
                        if not self._read_one(time.monotonic() + min(left, 1.0)):
                            break  # lost: fail() has failed the future
                    except TimeoutError:
                        pass
            finally:
                self._release()
        reply = fut.result(0)
        self._commit_if_put(fut, reply[0])  # unless a reader did; an interrupt before this leaves it to the caller's cancel
        return reply

    def _heartbeat(self) -> None:
        next_beat = time.monotonic()
        dead_after = DEAD_AFTER_BEATS * self._beat
        while self._dead is None:
            time.sleep(min(0.2, self._beat))  # also sends cancels of dropped works (a new request sends them at once)
            # this thread's sends go only while no other send is under way: they never wait behind one
            # (that would hold up the checks below); what is not sent goes on a later tick
            self._send_abandoned(when_idle=True)
            if self._acks:
                acks = self._take_acks()
                if acks and not self._send_one_way({"id": 0, "op": "ack", "ids": acks}, when_idle=True):
                    self._acks.extendleft(reversed(acks))
            now = time.monotonic()
            since = self._handing_since
            held = now - since if since is not None and self._replies else 0.0
            if held > dead_after:
                self.fail(f"a callback of an asynchronous operation on channel {self.channel!r} ({self.host}) has run for "
                          f"{held:.1f} s while replies to others wait to be handed over (a callback must not wait "
                          f"for an operation of the same channel)")
                return
            heard = max(self._last_heard, self._link_progress())  # bytes moving mid-message: alive
            if now - heard > dead_after:
                self.fail(f"the host of channel {self.channel!r} ({self.host}) has not answered for {now - heard:.1f} s "
                          f"(heartbeats every {self._beat:g} s); its process may have died or hung")
                return
            if now >= next_beat:
                # awaited before it goes: its pong may be read (by another thread) before the send returns
                out, self._ping_out = self._ping_out, True
                if self._send_one_way({"id": 0, "op": "ping"}, when_idle=True):
                    next_beat = now + self._beat
                    self._nudge()
                else:  # another send is under way: the next tick tries again
                    self._ping_out = out
            if self._handing_since is not None:
                self._read_for_a_tick()
            self._tend_feeds()
            self._offer_ack_link()
            self._tend_routes()
            self._prune_links()

    def _read_for_a_tick(self) -> None:
        """Read for one heartbeat tick while a callback runs and no one else reads.

        The background reader runs callbacks; one that runs long must not
        make a live host look silent.  What is read here is routed like any
        read (no callback runs in this thread)."""
        if not self._claim():
            return
        try:
            end = time.monotonic() + min(0.2, self._beat)
            while self._dead is None and self._awaited() and time.monotonic() < end:
                try:
                    if not self._read_one(end):
                        return
                except TimeoutError:
                    return
        finally:
            self._release()

    def fail(self, reason: str) -> None:
        """Declare the connection dead: close it and fail every pending operation."""
        with self._lock:
            if self._dead is None:
                self._dead = reason
        try:
            self._link.close()
        except Exception:
            pass
        self._close_ack_link()
        self._close_routes_in()
        self._close_routes_out()
        self._fail_all(reason)
        with self._fed_cond:
            self._feeds.clear()
            self._fed_cond.notify_all()
        with self._turn_lock:
            self._turn.notify_all()  # the background reader ends

    def _fail_all(self, reason: str) -> None:
        """Fail every pending operation with ``PeerDiedError``, and settle now the asynchronous puts whose
        commit has been decided (a committed one succeeds: its item will be delivered), whether or not the
        background reader would still hand them over.  A put whose commit is being sent is left to the
        thread sending it (``_commit_batch`` settles it, seeing the connection dead, or
        ``_settle_batch`` if an interrupt cut that short)."""
        with self._lock:
            self._dead = self._dead or reason
            pending, self._pending = self._pending, {}
            self._blocking.clear()
            self._open_puts.clear()
            decided = [self._claimed.pop(rid) for rid in [r for r, f in self._claimed.items() if f.outcome]]
        self._fail_batch(reason)
        for fut in decided:
            _settle_decided(fut)
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(PeerDiedError(reason, peer=self.host))

    def cancel(self, rid: int, limit: Optional[float] = None, when_idle: bool = False) -> bool:
        """Give up request ``rid``: the host drops it, or puts back the items it already sent for it.

        A cancel that cannot be sent now (see ``_send_one_way``) is queued
        and sent with the next request or heartbeat tick, never dropped;
        False then."""
        self._forget(rid)
        if self._send_one_way({"id": 0, "op": "cancel", "target": rid}, limit, when_idle):
            return True
        self._abandoned.append(rid)
        return False

    def _forget(self, rid: int) -> None:
        with self._lock:
            self._pending.pop(rid, None)
            self._blocking.discard(rid)
            self._open_puts.discard(rid)

    def withdraw(self, fut: _Reply, error: Exception) -> bool:
        """Give an asynchronous request up (its caller's wait ran out) unless a reader already claimed it.

        True: withdrawn (its cancel is sent, or queued: the host drops the
        put, or puts back the items it sent); the caller settles ``fut``.
        False: a reader claimed the put to commit it, or the connection
        failed it; ``fut`` is settled within ``settle_limit`` seconds."""
        with self._lock:
            withdrawn = self._pending.pop(fut.rid, None) is not None
            self._blocking.discard(fut.rid)
            self._open_puts.discard(fut.rid)
            if withdrawn:
                self._abandoned.append(fut.rid)  # its cancel: sent below, or by the next request or heartbeat tick
        if withdrawn:
            _settle(fut, exc=error)  # its cancel goes with the next request or heartbeat tick (0.2 s), not here:
            #                          a send may wait for the link, and an interrupt there must not lose it
        return withdrawn

    @property
    def settle_limit(self) -> float:
        """Seconds within which a claimed put's future is settled: its commit's send, then its hand-over
        (or, if a callback holds the hand-over up, the heartbeat's declaring the connection dead)."""
        return self._send_timeout + DEAD_AFTER_BEATS * self._beat + REPLY_GRACE

    def abandon(self, rid: int) -> None:
        """``cancel`` from a garbage-collection finalizer: queued, sent by the heartbeat thread."""
        self._abandoned.append(rid)

    def close(self, grace: float = 2.0) -> None:
        """Say goodbye (so the host has read every ack sent before), then close the connection."""
        if self._dead is None:
            if self._out_routes:
                self.end_routes(grace)  # what its consumers have not taken is copied to the host first
            try:
                _, fut = self.request({"op": "bye"}, (), grace, blocking=True)
                self.wait_reply(fut, grace)  # bounded; a host that does not answer is closed on anyway
            except Exception:
                pass
        self.fail(f"the connection to channel {self.channel!r} was closed")


_transports: dict = {}
_transports_lock = threading.Lock()


def _client_transport(entry):
    """A transport instance used only to connect (clients do not listen)."""
    with _transports_lock:
        if entry.name not in _transports:
            _transports[entry.name] = entry.descriptor.factory()
        return _transports[entry.name]
