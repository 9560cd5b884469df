"""Channel throughput against ``ray.util.queue.Queue``, in one run.

    hatch run bench channel

A producer and a consumer worker move N messages of each kind (a small dict,
a 1 MiB tensor, a list of 8 tensors of 128 KiB): put and get concurrently,
then put-only, then get-only.  Targets: at least 2x the Ray queue's
throughput for 1 MiB tensors and at least 1x for small dicts.

Under load: 32 producers and 32 consumers on 8 keys of one channel (4 of
each per key), against 8 ``ray.util.queue.Queue`` (one per key: a Ray queue
has no keys).  The 64 clients are threads spread over 4 worker processes
(8 producers and 8 consumers in each; a process holds one connection to the
channel host, shared by its threads); 64 client processes would measure
the scheduler of a small machine.  Each producer puts ``--load-messages``
small dicts; each consumer takes as many.  Target: at least 2x the Ray
queues.  Then the slow-consumer case: the same load on a bounded channel
(``maxsize`` 8) whose key-7 consumers sleep ``--slow-ms`` after each get, so
key 7's producers wait on a full queue; producers of the other 7 keys should
keep the rate they have when every consumer is fast (target: at least 0.5x).

Latency and one stream (``--stream-messages``, 10,000 by default), between the
two workers of one group, in the same run: a ping-pong of a small dict
through two channels (rank 0 puts on "ping", rank 1 gets it and puts on
"pong", rank 0 gets it: 2 puts and 2 gets) against the same exchange by p2p
``send``/``recv`` between them and two plain processes bouncing 100 bytes
over a loopback TCP socket (target: at most 3x p2p); one stream of small
dicts from rank 0 to rank 1, with ``put(..., async_op=True)`` (waited on at
the end) against the same stream by p2p ``send``/``recv`` (target: at least
0.5x), and with synchronous puts against one item per p2p round trip
(target: at least 0.5).

``--with-rlinf`` also runs the same work on RLinf 0.3.0's ``Channel`` (its own
virtual environment and Ray, after this run's cluster has stopped; see
``rlinf_baseline.py``; the Ray queues are not run again there): an RLinf
column on every row, rlinf's rate over RLinf's (>= 1 means rlinf is faster),
and the target ">= 1x RLinf" on each row RLinf ran.
"""

from __future__ import annotations

import argparse
import multiprocessing
import socket
import time

from common import (SMALL_MESSAGE, RoundTripPeer, Target, add_run_options, close_cluster, local_cluster, parse, print_table,
                    save_bar_plot)

import rlinf_baseline

from rlinf.scheduler import Channel, NodePlacementStrategy, Worker


def make_item(kind: str, i: int):
    import torch

    if kind == "small dict":
        return {"step": i, "reward": 0.5, "done": False}
    if kind == "1 MiB tensor":
        return torch.full((1 << 18,), float(i))
    return [torch.full((1 << 15,), float(i)) for _ in range(8)]


class Endpoint(RoundTripPeer):
    """Rank 0 produces and rank 1 consumes; the two also run the ping-pongs and streams between them."""

    def __init__(self):
        super().__init__()

    def put_all(self, queue, kind, n, ours):
        items = [make_item(kind, i) for i in range(min(n, 16))]
        start = time.perf_counter()
        for i in range(n):
            item = items[i % len(items)]
            if ours:
                queue.put(item)
            else:
                queue.put(item)
        return start, time.perf_counter()

    def get_all(self, queue, kind, n, ours):
        start = time.perf_counter()
        for _ in range(n):
            item = queue.get()
            del item
        return start, time.perf_counter()

    def p2p_round_trip(self, n, warmup):
        return self._time_round_trips(self._round_trip, n, warmup)

    def channel_round_trip(self, ch, n, warmup):
        if self._rank == 0:
            def one(msg):
                ch.put(msg, key="ping")
                ch.get(key="pong")
        else:
            def one(_msg):
                ch.put(ch.get(key="ping"), key="pong")
        return self._time_round_trips(one, n, warmup)

    def p2p_stream(self, n):
        name, msg = self.worker_group_name, dict(SMALL_MESSAGE)
        start = time.perf_counter()
        for _ in range(n):
            if self._rank == 0:
                self.send(msg, name, 1)
            else:
                self.recv(name, 0)
        return start, time.perf_counter()

    def channel_stream(self, ch, n, async_op):
        msg = dict(SMALL_MESSAGE)
        start = time.perf_counter()
        if self._rank == 0:
            works = [ch.put(msg, key="stream", async_op=async_op) for _ in range(n)]
            if async_op:
                for w in works:
                    w.wait()
        else:
            for _ in range(n):
                ch.get(key="stream")
        return start, time.perf_counter()


class _Rank:
    """One rank of a group: ``_Rank(group, 0).put_all(...)`` runs ``put_all`` on rank 0 only."""

    def __init__(self, group, rank):
        self._group, self._rank = group, rank

    def __getattr__(self, name):
        return lambda *args: getattr(self._group.execute_on(self._rank), name)(*args)


def _both(group, method, *args):
    """Run ``method`` on rank 0 and rank 1 at once; their results."""
    calls = [getattr(group.execute_on(r), method)(*args) for r in (0, 1)]
    return [c.wait()[0] for c in calls]


def _socket_echo(port, n):
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(n):
            s.sendall(_recv_exact(s, 100))


def _recv_exact(s, size):
    buf = b""
    while len(buf) < size:
        chunk = s.recv(size - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def socket_round_trip(n: int, warmup: int) -> float:
    """Seconds per round trip of 100 bytes between two plain processes over loopback TCP."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(60)  # bounded: a child that fails to start must not hang the run
    proc = multiprocessing.get_context("spawn").Process(target=_socket_echo, args=(listener.getsockname()[1], n + warmup))
    proc.start()
    try:
        conn, _ = listener.accept()
        conn.settimeout(60)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        payload = b"x" * 100
        for i in range(n + warmup):
            if i == warmup:
                start = time.perf_counter()
            conn.sendall(payload)
            _recv_exact(conn, 100)
        took = (time.perf_counter() - start) / n
        conn.close()
    finally:
        proc.join(10)
        listener.close()
    return took


def latency_cases(group, n: int, warmup: int, stream: int) -> tuple[list, list, dict]:
    """The ping-pong and one-stream rows, their targets and the figures (p2p and socket of the same run)."""
    ch = Channel.create("bench_latency")
    p2p_rtt = _both(group, "p2p_round_trip", n, warmup)[0]
    ch_rtt = _both(group, "channel_round_trip", ch, n, warmup)[0]
    sock_rtt = socket_round_trip(n, warmup)

    def rate(spans):
        return stream / (max(e for _, e in spans) - min(s for s, _ in spans))

    _both(group, "p2p_stream", max(10, stream // 10))
    _both(group, "channel_stream", ch, max(10, stream // 10), True)
    p2p_rate = rate(_both(group, "p2p_stream", stream))
    async_rate = rate(_both(group, "channel_stream", ch, stream, True))
    sync_rate = rate(_both(group, "channel_stream", ch, stream, False))
    per_rtt = sync_rate * p2p_rtt  # items per p2p round trip
    rows = [["ping-pong, small dict (us per round)", f"{ch_rtt * 1e6:.0f}", f"{p2p_rtt * 1e6:.0f}", f"{sock_rtt * 1e6:.0f}",
             f"{ch_rtt / p2p_rtt:.1f}x p2p (target <= 3), {ch_rtt / sock_rtt:.0f}x socket"],
            [f"one stream of {stream}, async puts (items/s)", f"{async_rate:.0f}", f"{p2p_rate:.0f}", "",
             f"{async_rate / p2p_rate:.2f}x p2p (target >= 0.5)"],
            [f"one stream of {stream}, sync puts (items/s)", f"{sync_rate:.0f}", f"{1 / p2p_rtt:.0f} (1 per round trip)", "",
             f"{per_rtt:.2f} item per p2p round trip (target >= 0.5)"]]
    targets = [Target("channel ping-pong vs p2p ping-pong (time)", ch_rtt / p2p_rtt, "<=", 3.0),
               Target("one stream, async puts vs p2p stream", async_rate / p2p_rate, ">=", 0.5),
               Target("one stream, sync puts: items per p2p round trip", per_rtt, ">=", 0.5)]
    return rows, targets, {"round trip": ch_rtt, "async stream": async_rate, "sync stream": sync_rate}


LOAD_KEYS, LOAD_PER_KEY, LOAD_PROCESSES = 8, 4, 4


class LoadWorker(Worker):
    """Runs some of the load's producer and consumer threads (all on one channel, or on per-key Ray queues)."""

    def __init__(self):
        super().__init__()

    def run_threads(self, queues, jobs, n, slow_key=None, slow_s=0.0):
        """Jobs are ("put", key) or ("get", key); returns (key, start, end) per thread."""
        import threading

        def target(key):
            return queues[key] if isinstance(queues, dict) else queues

        def put(key):
            q = target(key)
            item = {"step": 0, "reward": 0.5, "done": False}
            for i in range(n):
                item["step"] = i
                if isinstance(queues, dict):
                    q.put(item)
                else:
                    q.put(item, key=key, timeout=300)

        def get(key):
            q = target(key)
            for _ in range(n):
                if isinstance(queues, dict):
                    q.get()
                else:
                    q.get(key=key, timeout=300)
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
    """Per process: its producer and consumer threads, keys spread evenly over the processes."""
    jobs = [[] for _ in range(LOAD_PROCESSES)]
    for k in range(LOAD_KEYS):
        for j in range(LOAD_PER_KEY):
            i = k * LOAD_PER_KEY + j
            jobs[i % LOAD_PROCESSES].append(("put", f"key{k}"))
            jobs[(i + 1) % LOAD_PROCESSES].append(("get", f"key{k}"))
    return jobs


def run_load(group, queues, n, slow_key=None, slow_s=0.0) -> dict:
    """Items/s over all keys, and over the keys other than ``slow_key``."""
    jobs = load_jobs()
    results = [group.execute_on(r).run_threads(queues, jobs[r], n, slow_key, slow_s) for r in range(LOAD_PROCESSES)]
    spans = [span for res in results for span in res.wait()[0]]

    def rate(keep):
        chosen = [(s, e) for key, s, e in spans if keep(key)]
        keys = len({key for key, _, _ in spans if keep(key)})
        return keys * LOAD_PER_KEY * n / (max(e for _, e in chosen) - min(s for s, _ in chosen))

    return {"all": rate(lambda key: True), "others": rate(lambda key: key != slow_key)}


def load_cases(cluster, n: int, warmup: int, slow_ms: float, repeat: int = 2) -> tuple[list, list, dict]:
    """The load and slow-consumer cases: table rows, targets and the rates (best of ``repeat``)."""
    from ray.util.queue import Queue

    group = LoadWorker.create_group().launch(cluster, NodePlacementStrategy([0] * LOAD_PROCESSES), name="bench_load")
    ours = Channel.create("bench_load_channel")
    bounded = Channel.create("bench_load_bounded", maxsize=8)
    theirs = {f"key{k}": Queue(actor_options={"num_cpus": 0.01}) for k in range(LOAD_KEYS)}
    try:
        for q in (ours, theirs, bounded):
            run_load(group, q, warmup)  # connections, actors, shared memory
        o = t = fast = slow = 0.0
        for _ in range(repeat):  # interleaved, best of each: a busy machine's noise hits all cases alike
            o = max(o, run_load(group, ours, n)["all"])
            t = max(t, run_load(group, theirs, n)["all"])
            fast = max(fast, run_load(group, bounded, n)["others"])
            slow = max(slow, run_load(group, bounded, n, slow_key=f"key{LOAD_KEYS - 1}", slow_s=slow_ms / 1000)["others"])
    finally:
        group.stop()
        for q in theirs.values():
            q.shutdown()
    clients = f"{LOAD_KEYS * LOAD_PER_KEY} producers x {LOAD_KEYS * LOAD_PER_KEY} consumers, {LOAD_KEYS} keys"
    rows = [[clients, "rlinf Channel vs 8 Ray Queues", f"{o:.0f}", f"{t:.0f}", f"{o / t:.2f}x"],
            [f"keys 0-{LOAD_KEYS - 2}, maxsize 8", f"key {LOAD_KEYS - 1} consumers sleep {slow_ms:g} ms vs not",
             f"{slow:.0f}", f"{fast:.0f}", f"{slow / fast:.2f}x"]]
    targets = [Target(f"{clients}: Channel vs Ray Queues", o / t, ">=", 2.0),
               Target("other keys' rate beside a slow consumer vs without", slow / fast, ">=", 0.5)]
    return rows, targets, {"load": (o, t), "slow": (slow, fast)}


def run_case(prod, cons, queue, kind, n, ours):
    out = {}
    p, c = prod.put_all(queue, kind, n, ours), cons.get_all(queue, kind, n, ours)
    (ps, pe), = p.wait()
    (cs, ce), = c.wait()
    out["concurrent"] = n / (max(pe, ce) - min(ps, cs))
    (ps, pe), = prod.put_all(queue, kind, n, ours).wait()
    out["put-only"] = n / (pe - ps)
    (cs, ce), = cons.get_all(queue, kind, n, ours).wait()
    out["get-only"] = n / (ce - cs)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--load-messages", type=int, default=300, help="items per producer in the load cases")
    parser.add_argument("--slow-ms", type=float, default=20.0, help="sleep of the slow consumers after each get")
    parser.add_argument("--load-repeat", type=int, default=2, help="runs of each load case (best counts)")
    parser.add_argument("--round-trips", type=int, default=2000, help="ping-pong rounds timed")
    parser.add_argument("--stream-messages", type=int, default=10000, help="items of the one-stream rows")
    rlinf_baseline.add_option(parser)
    add_run_options(parser, messages=20, warmup=5, load_messages=5, slow_ms=2.0, load_repeat=1, round_trips=20,
                    stream_messages=50)
    args = parse(parser, argv)
    from ray.util.queue import Queue

    cluster = local_cluster()
    pair = Endpoint.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name="bench_pair")
    lat_rows, lat_targets, lat = latency_cases(pair, args.round_trips, max(5, args.round_trips // 10), args.stream_messages)
    prod, cons = _Rank(pair, 0), _Rank(pair, 1)
    ours = Channel.create("bench_channel")
    theirs = Queue(actor_options={"num_cpus": 0.01})
    results = {}
    for kind in KINDS:
        run_case(prod, cons, ours, kind, args.warmup, True)  # warm-up: connections, shared memory
        run_case(prod, cons, theirs, kind, args.warmup, False)
        results[kind] = (run_case(prod, cons, ours, kind, args.messages, True),
                         run_case(prod, cons, theirs, kind, args.messages, False))
    pair.stop()
    load_rows, load_targets, load = load_cases(cluster, args.load_messages, max(2, args.load_messages // 10), args.slow_ms,
                                               args.load_repeat)
    close_cluster(cluster)  # before RLinf's run: two Rays at once would share the machine's cores
    rl = None
    if args.with_rlinf:
        rl = rlinf_baseline.try_run_rlinf("channel", {
            "messages": args.messages, "warmup": args.warmup, "load_messages": args.load_messages,
            "slow_ms": args.slow_ms, "load_repeat": args.load_repeat, "round_trips": args.round_trips,
            "stream_messages": args.stream_messages,
            "load_timeout": max(60.0, args.rlinf_timeout / 3)}, args.rlinf_timeout)
    rows = []
    for kind in KINDS:
        o, t = results[kind]
        for mode in MODES:
            rows.append([kind, mode, f"{o[mode]:.0f}", f"{t[mode]:.0f}", f"{o[mode] / t[mode]:.2f}x"])
    rlinf_targets = []
    if args.with_rlinf:
        rlinf_targets = rlinf_columns(rows, load_rows, results, load, rl)
    header = ["item", "mode", "rlinf Channel", "Ray Queue", "ratio"] + RLINF_HEADER * args.with_rlinf
    print_table(f"Channel vs ray.util.queue.Queue, {args.messages} messages (items/s)", header, rows)
    series = {"rlinf Channel": [results[k][0]["concurrent"] for k in KINDS],
              "Ray Queue": [results[k][1]["concurrent"] for k in KINDS]}
    if args.with_rlinf:
        series["RLinf 0.3.0 Channel"] = [rl["rates"][k]["concurrent"] if rl else NAN for k in KINDS]
    save_bar_plot("channel", "Concurrent put+get throughput", KINDS, series, "throughput (items/s)", log=True)
    lat_header = ["case", "rlinf Channel", "p2p send/recv", "plain socket", "ratio"]
    if args.with_rlinf:
        lat_header += RLINF_HEADER
        rlinf_targets += rlinf_latency_columns(lat_rows, lat, rl)
    print_table("Latency and one stream between two workers, same run", lat_header, lat_rows)
    print_table(f"Channels under load, {args.load_messages} small dicts per producer, best of {args.load_repeat} (items/s)",
                ["clients", "case", "rlinf Channel", "baseline", "ratio"] + RLINF_HEADER * args.with_rlinf, load_rows)
    series = {"rlinf Channel": [load["load"][0], load["slow"][0]],
              "baseline (8 Ray Queues; no slow consumer)": [load["load"][1], load["slow"][1]]}
    if args.with_rlinf:
        got = rl.get("load") if rl else None
        series["RLinf 0.3.0 Channel"] = [got["all"], got["slow"]] if got else [NAN, NAN]
    save_bar_plot("channel_load", "32 producers x 32 consumers on 8 keys", ["all keys", "beside a slow consumer"],
                  series, "throughput (items/s)", log=True)
    ratio = {k: results[k][0]["concurrent"] / results[k][1]["concurrent"] for k in KINDS}
    return [*lat_targets, Target("1 MiB tensors concurrent vs Ray Queue", ratio["1 MiB tensor"], ">=", 2.0),
            Target("small dicts concurrent vs Ray Queue", ratio["small dict"], ">=", 1.0), *load_targets,
            *rlinf_targets]


KINDS = ["small dict", "1 MiB tensor", "list of 8 tensors"]
MODES = ("concurrent", "put-only", "get-only")
NAN = float("nan")
#: the columns ``--with-rlinf`` adds: RLinf's rate, and rlinf's over RLinf's (the inverse of their times' ratio)
RLINF_HEADER = ["RLinf 0.3.0", "rlinf/RLinf rate = RLinf/rlinf time (>= 1: rlinf faster)"]


def rlinf_columns(rows: list, load_rows: list, results: dict, load: dict, rl: dict | None) -> list:
    """Add RLinf's rate and the ratio to each row (in place); the ">= 1x RLinf" targets of the rows RLinf ran."""
    targets = []

    def add(row, measure, ours, theirs, missing):
        if theirs is None:
            row += [missing, ""]
            return
        row += [f"{theirs:.0f}", f"{ours / theirs:.2f}x (target >= 1)"]
        targets.append(Target(f"{measure}: rlinf vs RLinf 0.3.0", ours / theirs, ">=", 1.0))

    failed = "failed (see above)"
    it = iter(rows)
    for kind in KINDS:
        for mode in MODES:
            add(next(it), f"{kind} {mode}", results[kind][0][mode], rl["rates"][kind][mode] if rl else None, failed)
    got = rl.get("load") if rl else None
    why = failed if rl is None else f"n/a: RLinf's load run failed ({rl.get('load_error')})"
    add(load_rows[0], "load, all keys", load["load"][0], got["all"] if got else None, why)
    add(load_rows[1], "load, other keys beside a slow consumer", load["slow"][0], got["slow"] if got else None, why)
    return targets


def rlinf_latency_columns(rows: list, lat: dict, rl: dict | None) -> list:
    """RLinf's figures on the latency and one-stream rows (in place); ">= 1x RLinf" targets where it ran."""
    got = (rl or {}).get("latency")
    targets = []
    for row, measure in zip(rows, ("round trip", "async stream", "sync stream")):
        theirs = None if got is None else got.get(measure)
        if theirs is None:
            row += ["failed (see above)" if rl is None else "n/a", ""]
            continue
        if measure == "round trip":
            row += [f"{theirs * 1e6:.0f}", f"{theirs / lat[measure]:.2f}x (target >= 1)"]
            targets.append(Target(f"{measure}: RLinf time / rlinf time", theirs / lat[measure], ">=", 1.0))
        else:
            row += [f"{theirs:.0f}", f"{lat[measure] / theirs:.2f}x (target >= 1)"]
            targets.append(Target(f"{measure}: rlinf vs RLinf 0.3.0", lat[measure] / theirs, ">=", 1.0))
    return targets


if __name__ == "__main__":
    from run import main as run_main

    raise SystemExit(run_main(["channel", *__import__("sys").argv[1:]]))
