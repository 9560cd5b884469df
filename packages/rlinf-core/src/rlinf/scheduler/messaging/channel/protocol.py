"""The channel wire protocol, on top of any transport link.

A request is ``[control, *item_frames]`` and a reply likewise, where
``control`` is a small JSON object (``id``, ``op``, ``key``, ...) and the item
frames are exactly what ``p2p.codec.encode`` produced: the host stores and
forwards them without decoding, so tensors are never pickled and the host
needs no torch.

Operations with a reply: ``put``, ``get``, ``get_batch``, ``qsize``, ``full``,
``ping`` (answered by a ``pong`` with id 0), ``bye`` (sent before a client
closes its connection, so that the host has read its last acks).  One-way: ``ack`` (``ids``: the
client handed those replies' items to its user, the host may forget them;
acks also ride on any request as ``acks``),
``commit`` (``ids``: puts the host answered as taken, whose callers the client
is telling they succeeded: only now do their items reach consumers, in the
order of ``ids``; it may carry ``acks`` too; a put taken and never committed
is dropped on a cancel or when the connection ends, so a put whose caller got
an error never happened)
``cancel`` (``target``: the request was given up; a parked request or an
uncommitted put is dropped, an item already sent for it goes back to the head
of its queue), and ``push`` (a put already made, appended as it is read: a
host without ``maxsize`` says so in its put answers (``unbounded``), and the
client sends its later puts of small items this way, returning once the message was handed
to the connection; a host with a ``maxsize`` refuses it).

A consumer's client acknowledges a get's items with an ``ack`` of their own
before the call returns them, so no way the consumer ends (returning,
stopped, exiting, killed) has them delivered again.

Feeds (see ``queues`` and ``feeding``): a ``get`` may carry ``feed`` (a
window); a reply that grants it carries ``feed`` and ``key``, and the host
then sends ``fed`` messages (``key``, ``ids``: one negative id per item,
``sizes``) with id 0.  ``recall`` (``key``) ends a feed from the host's side;
the client answers with ``return`` (``key``, ``ids`` of the items it did not
hand out, ``end``: the client ended the feed itself), whose items go back to
their places in the queue (items carry their sequence).  ``more`` (``key``) asks the host to read the
client's acknowledgements and refill.  A client's *ack link* is a second
connection whose hello names the first's ``token`` (``acks_for``); once the
host confirms it (``acks``, id 0) the client's acks go there, each message
one frame of little-endian int64 ids, read by the host without waiting on it.

Why a put's outcome is what its caller was told:

* *A call that returned happened.*  The client hands a put's commit (or its
  push) to the connection before the caller (or its asynchronous work) hears
  that it succeeded.  A message handed over reaches the host whole even if the
  client's process dies or the connection is given up right after: the host
  reads the whole messages a departed client left (commits, pushes and acks) before it
  drops that client's uncommitted puts.  Only the host's own death loses it.
* *A call that raised did not happen.*  A commit is sent only for a caller that
  can no longer get an error: every failure before it (a timeout, a lost
  connection, a host declared dead, a commit that could not be sent, an
  interrupt) leaves the put uncommitted, and the host drops it on the cancel
  or the end of the connection.  A caller whose wait times out while a reader
  is committing its put waits for that commit instead and returns its outcome.
  Interrupts land only in the main thread, so only its own thread commits a
  main-thread put; an interrupt that lands after the commit was handed over
  is like one that lands just after the call returned.
* *No put takes a queue past maxsize.*  A put taken holds its place (counted
  against ``maxsize``) from the take until it is committed or dropped.  An
  item handed to a consumer that then gave it up (cancelled, lost, timed out)
  goes back to the head of its queue even when that takes the queue past
  ``maxsize`` for a while: items in flight do not count toward the room, or
  every producer would wait for the consumer's acknowledgement.

Commits are batched, which is what keeps the host near one message per put:
the client's reading thread commits every put reply it reads in one burst
(the whole messages already there) with one ``commit`` before handing them
over, so under load one commit covers the puts of many threads.  A commit is
never held back waiting for company: an item becomes visible as soon as its
reply has been read, so a lone put is no slower than with a commit of its own.
"""

from __future__ import annotations

import json

from ...base import config

#: seconds one send of the host (or of a client's request) may take, plus one per
#: ``SEND_RATE_FLOOR`` bytes it carries; a client that does not read the host's
#: replies for that long is treated as dead
SEND_TIMEOUT_ENV = "RLINF_CHANNEL_SEND_TIMEOUT"
DEFAULT_SEND_TIMEOUT = 30.0
#: bytes per second a send of a large item is given on top of the send timeout: the timeout bounds
#: waiting for a peer that takes nothing, and an item of any size still has time to cross a slow
#: link or a receiver that faults fresh memory in as it reads (1 GiB took 3.4 s over loopback TCP
#: on a 2-core virtual machine when the receiver zero-filled its buffer first; 0.4-1.3 s without)
SEND_RATE_FLOOR = 64 << 20
#: seconds between heartbeats of a client; either side declares the other
#: dead after ``DEAD_AFTER_BEATS`` heartbeats' time without hearing from it
HEARTBEAT_ENV = "RLINF_CHANNEL_HEARTBEAT"
DEFAULT_HEARTBEAT = 3.0
DEAD_AFTER_BEATS = 5


def send_timeout() -> float:
    return config._float_env(SEND_TIMEOUT_ENV, DEFAULT_SEND_TIMEOUT)


def send_limit(base: float, frames) -> float:
    """Seconds one send of ``frames`` may take: ``base`` (the send timeout) plus the time they take
    at ``SEND_RATE_FLOOR``."""
    if not frames:
        return base
    return base + sum(memoryview(f).nbytes for f in frames) / SEND_RATE_FLOOR


def heartbeat_interval() -> float:
    return config._float_env(HEARTBEAT_ENV, DEFAULT_HEARTBEAT)


def control(frame) -> dict:
    return json.loads(bytes(frame))


def pack(ctrl: dict) -> bytes:
    return json.dumps(ctrl, separators=(",", ":")).encode()


#: direct item ids (see ``routes``): ``DIRECT_BASE | r << 32 | n`` (fed ids are negative, request ids small)
DIRECT_BASE = 1 << 62
#: the most items one route carries (then the producer ends it; another may be granted): their places in
#: the queue are fractions of one sequence step
ROUTE_ITEMS = (1 << 20) - 1
#: items a producer may send on a route that its consumer has not taken yet (then it ends the route)
ROUTE_WINDOW = 64


def direct_id(r: int, n: int) -> int:
    return DIRECT_BASE | (r << 32) | n


def split_direct(i: int) -> tuple[int, int]:
    return (i >> 32) & ((1 << 29) - 1), i & 0xFFFFFFFF


#: seconds a client waits beyond an operation's own timeout for the host's reply
REPLY_GRACE = 10.0


class SendTimeout(TimeoutError):
    """A request could not be handed to the transport in time; nothing of it was sent.

    ``busy``: another thread's send on the connection held it that long (the
    host may well be taking items)."""

    def __init__(self, message: str, busy: bool = False):
        super().__init__(message)
        self.busy = busy
