"""RLinf 0.3.0's side of ``benchmarks/channel.py``: the same producer/consumer work on RLinf's ``Channel``.

Arguments (JSON): ``messages``, ``warmup``, ``load_messages``, ``slow_ms``,
``load_repeat`` as in ``benchmarks/channel.py``; ``load`` (default true) runs
the load cases; ``load_timeout`` (seconds, default 600) bounds them: RLinf's
``Worker.send``, which its channel's ``put`` uses inside a worker, is
documented as not thread safe, and the load cases put from 8 threads of one
worker, so they may fail or hang; the result then says so in ``load_error``.

Prints: ``rates`` (kind -> mode -> items/s for "concurrent", "put-only",
"get-only"), ``latency`` (``round trip``: seconds per ping-pong of a small
dict through two keys; ``async stream``/``sync stream``: items/s of one
stream of small dicts, puts with and without ``async_op``; at most 200 rounds
and 1,000 items: RLinf's round trip takes milliseconds), and ``load`` (items/s: ``all`` on the unbounded channel,
``fast`` and ``slow``: the other keys' rate on the bounded one without and
with the slow key-7 consumers) or ``load_error``.
"""

from __future__ import annotations

import os
import threading
import time

import _harness

from rlinf.scheduler import Channel, NodePlacementStrategy, Worker

KINDS = ["small dict", "1 MiB tensor", "list of 8 tensors"]
LOAD_KEYS, LOAD_PER_KEY, LOAD_PROCESSES = 8, 4, 4


def make_item(kind: str, i: int):
    import torch

    if kind == "small dict":
        return {"step": i, "reward": 0.5, "done": False}
    if kind == "1 MiB tensor":
        return torch.full((1 << 18,), float(i))
    return [torch.full((1 << 15,), float(i)) for _ in range(8)]


class Endpoint(Worker):
    def __init__(self):
        super().__init__()

    def put_all(self, channel, kind, n):
        items = [make_item(kind, i) for i in range(min(n, 16))]
        start = time.perf_counter()
        for i in range(n):
            channel.put(items[i % len(items)])
        return start, time.perf_counter()

    def get_all(self, channel, kind, n):
        start = time.perf_counter()
        for _ in range(n):
            item = channel.get()
            del item
        return start, time.perf_counter()

    def ping_pong(self, channel, n, first):
        """``first`` puts on "ping" and gets from "pong"; the other echoes: seconds per round."""
        msg = {"step": 0, "reward": 0.5, "done": False, "info": "ok"}
        start = time.perf_counter()
        for _ in range(n):
            if first:
                channel.put(msg, key="ping")
                channel.get(key="pong")
            else:
                channel.put(channel.get(key="ping"), key="pong")
        return (time.perf_counter() - start) / n

    def stream(self, channel, n, put, async_op):
        msg = {"step": 0, "reward": 0.5, "done": False, "info": "ok"}
        start = time.perf_counter()
        if put:
            works = [channel.put(msg, key="stream", async_op=async_op) for _ in range(n)]
            for w in works if async_op else ():
                w.wait()
        else:
            for _ in range(n):
                channel.get(key="stream")
        return start, time.perf_counter()


class LoadWorker(Worker):
    def __init__(self):
        super().__init__()

    def run_threads(self, channel, jobs, n, slow_key=None, slow_s=0.0):
        """Jobs are ("put", key) or ("get", key); returns (key, start, end) per thread."""

        def put(key):
            item = {"step": 0, "reward": 0.5, "done": False}
            for i in range(n):
                item["step"] = i
                channel.put(item, key=key)

        def get(key):
            for _ in range(n):
                channel.get(key=key)
                if key == slow_key:
                    time.sleep(slow_s)

        out = [None] * len(jobs)

        def body(i, op, key):
            start = time.perf_counter()
            (put if op == "put" else get)(key)
            out[i] = (key, start, time.perf_counter())

        threads = [threading.Thread(target=body, args=(i, op, key)) for i, (op, key) in enumerate(jobs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out


def load_jobs() -> list:
    jobs = [[] for _ in range(LOAD_PROCESSES)]
    for k in range(LOAD_KEYS):
        for j in range(LOAD_PER_KEY):
            i = k * LOAD_PER_KEY + j
            jobs[i % LOAD_PROCESSES].append(("put", f"key{k}"))
            jobs[(i + 1) % LOAD_PROCESSES].append(("get", f"key{k}"))
    return jobs


def run_load(group, channel, n, slow_key=None, slow_s=0.0) -> dict:
    jobs = load_jobs()
    results = [group.execute_on(r).run_threads(channel, jobs[r], n, slow_key, slow_s) for r in range(LOAD_PROCESSES)]
    spans = [span for res in results for span in res.wait()[0]]

    def rate(keep):
        chosen = [(s, e) for key, s, e in spans if keep(key)]
        keys = len({key for key, _, _ in spans if keep(key)})
        return keys * LOAD_PER_KEY * n / (max(e for _, e in chosen) - min(s for s, _ in chosen))

    return {"all": rate(lambda key: True), "others": rate(lambda key: key != slow_key)}


def run_case(prod, cons, channel, kind, n) -> dict:
    out = {}
    p, c = prod.put_all(channel, kind, n), cons.get_all(channel, kind, n)
    (ps, pe), = p.wait()
    (cs, ce), = c.wait()
    out["concurrent"] = n / (max(pe, ce) - min(ps, cs))
    (ps, pe), = prod.put_all(channel, kind, n).wait()
    out["put-only"] = n / (pe - ps)
    (cs, ce), = cons.get_all(channel, kind, n).wait()
    out["get-only"] = n / (ce - cs)
    return out


def main() -> None:
    a = _harness.args()
    messages, warmup = a.get("messages", 2000), a.get("warmup", 50)
    load_n, slow_ms, repeat = a.get("load_messages", 300), a.get("slow_ms", 20.0), a.get("load_repeat", 2)
    cluster = _harness.cluster()
    prod = Endpoint.create_group().launch(cluster, NodePlacementStrategy([0]), name="bench_producer")
    cons = Endpoint.create_group().launch(cluster, NodePlacementStrategy([0]), name="bench_consumer")
    channel = Channel.create("bench_channel")
    out = {"rates": {}}
    for kind in KINDS:
        run_case(prod, cons, channel, kind, warmup)
        out["rates"][kind] = run_case(prod, cons, channel, kind, messages)
    try:  # RLinf's round trip is milliseconds: fewer rounds and items (rates and times are per item)
        rounds, items = min(a.get("round_trips", 2000), 200), min(a.get("stream_messages", 10000), 1000)
        lat = Channel.create("bench_latency")
        p, c = prod.ping_pong(lat, rounds, True), cons.ping_pong(lat, rounds, False)
        (rtt,), _ = p.wait(), c.wait()
        latency = {"round trip": rtt}
        for name, async_op in (("async stream", True), ("sync stream", False)):
            p, c = prod.stream(lat, items, True, async_op), cons.stream(lat, items, False, async_op)
            (ps, pe), = p.wait()
            (cs, ce), = c.wait()
            latency[name] = items / (max(pe, ce) - min(ps, cs))
        out["latency"] = latency
    except Exception as e:
        out["latency_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if not a.get("load", True):
        _harness.emit(out)
        return _harness.shutdown()

    def give_up():  # the load cases hung: report what was measured, and why the rest is missing
        out["load_error"] = f"the load cases did not finish within {a.get('load_timeout', 600)} s"
        _harness.emit(out)
        os._exit(0)

    watchdog = threading.Timer(a.get("load_timeout", 600), give_up)
    watchdog.daemon = True
    watchdog.start()
    try:
        group = LoadWorker.create_group().launch(cluster, NodePlacementStrategy([0] * LOAD_PROCESSES), name="bench_load")
        ours = Channel.create("bench_load_channel")
        bounded = Channel.create("bench_load_bounded", maxsize=8)
        for q in (ours, bounded):
            run_load(group, q, max(2, load_n // 10))
        o = fast = slow = 0.0
        for _ in range(repeat):
            o = max(o, run_load(group, ours, load_n)["all"])
            fast = max(fast, run_load(group, bounded, load_n)["others"])
            slow = max(slow, run_load(group, bounded, load_n, f"key{LOAD_KEYS - 1}", slow_ms / 1000)["others"])
        out["load"] = {"all": o, "fast": fast, "slow": slow}
    except Exception as e:  # reported in the table as n/a, with the reason
        out["load_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    watchdog.cancel()
    _harness.emit(out)
    _harness.shutdown()


if __name__ == "__main__":
    main()
