"""What a channel host reports about itself (a part of ``server.ChannelServer``): per key its queued
items, parked gets and puts, and the totals, read on the host's loop once it has served every whole
message already waiting (so a put that returned before the question is counted)."""

from __future__ import annotations

from typing import Callable

from .keys import show_key


class _Introspection:
    """The reporting side of ``ChannelServer`` (uses its queues, connections and loop)."""

    def snapshot(self, detail: bool = False) -> dict:
        """The host's state, read on the loop: totals, and with ``detail`` every key's queue.

        ``keys``/``items``/``clients``/``in_flight`` count keys with state, queued
        items, connected clients and replies not yet acknowledged; ``messages``
        counts the messages handled since the host started; ``queues``
        maps each key (as ``show_key`` writes it) to its ``items``, parked
        ``getters`` and parked ``putters``, and ``uncommitted`` puts (taken, not
        yet committed by their producers: they hold places, unseen).  Call it on the loop (``stats``
        does); a request handler may call it directly.
        """
        out = {"keys": len(self._queues), "items": sum(len(q.items) for q in self._queues.values()),
               "clients": len(self._conns), "in_flight": sum(len(c.inflight) for c in self._conns | self._draining),
               "messages": self._messages}
        if detail:
            out["queues"] = {show_key(k): {"items": len(q.items), "getters": len(q.getters), "putters": len(q.putters),
                                           "uncommitted": q.uncommitted}
                             for k, q in self._queues.items()}
        return out

    def stats(self, detail: bool = False) -> dict:
        """``snapshot`` from any thread, once the loop has served every whole message already waiting.

        So the numbers reflect whatever clients handed to the connections the
        loop reads before asking: a put that returned there has been committed."""
        return self._ask(lambda: self._caught_up(lambda: self.snapshot(detail)))

    def _caught_up(self, fn: Callable):
        """``fn()`` once every connection's whole waiting messages are served (loop only; bounded)."""
        for conn in list(self._conns):
            self._drain_acks(conn)
            for _ in range(1000):  # bursts of _READ_BURST: far more than clients send while this runs
                if not conn.alive or conn.fd is None:
                    break
                self._read(conn)
                if conn not in self._again:
                    break
        return fn()

    def describe(self, max_keys: int = 200, timeout: float = 2.0) -> dict:
        """Read-only, for ``python -m rlinf.scheduler status``: per key its queued items, parked gets and puts.

        Read on the loop (bounded by ``timeout``), like ``stats``.
        """
        snap = self._ask(lambda: self._caught_up(lambda: self.snapshot(True)), timeout=timeout)
        keys = [{"key": k, **v} for k, v in snap["queues"].items()]
        keys.sort(key=lambda k: (-k["items"] - k["getters"] - k["putters"], k["key"]))
        return {"name": self.name, "maxsize": self.maxsize, "clients": snap["clients"], "in_flight": snap["in_flight"],
                "num_keys": len(keys), "keys": keys[:max_keys]}
