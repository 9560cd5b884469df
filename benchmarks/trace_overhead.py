"""What the timeline costs: tracing off vs on, in one run.

    hatch run bench trace

Targets (issue: "overhead when on"): the small-object p2p round trip between
two workers and ``group.noop().wait()`` over 4 workers, each at most 1.1x
with tracing on (``cluster.trace()``) than off.  Off vs on is measured in
interleaved rounds, so both see the same machine noise; the trace written by
each "on" round is read back to prove the events were recorded.  The round
trip's ratio comes from finer interleaving: the two workers switch their own
recording on and off every ``--block-trips`` round trips (what
``cluster.trace()`` switches in each of them), because a 0.1 s round of
round trips is 20-100% slower one time in three on a 2-core machine, off or
on; the ratio from the trace rounds is printed beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

from common import (SMALL_MESSAGE, RoundTripPeer, Target, add_run_options, close_cluster, local_cluster, parse,
                    print_table, save_plot)

import plots

from rlinf.scheduler import NodePlacementStrategy, Worker


class NoopWorker(Worker):
    def __init__(self):
        super().__init__()

    def noop(self):
        return None


class PingPeer(RoundTripPeer):
    def __init__(self):
        super().__init__()

    def pingpong(self, n):
        return self._time_round_trips(self._round_trip, n, warmup=20)

    def interleaved(self, blocks: int, trips: int):
        """Round-trip times, tracing off and on in alternate blocks of ``trips``, switched in this
        process as ``cluster.trace()`` switches it in every worker (both ranks switch at the same
        block, in step): off and on then see the same seconds of machine noise."""
        from rlinf.scheduler.tracing import recorder

        assert not recorder.is_on(), "call it outside a trace block"
        times = {False: [], True: []}
        try:
            for b in range(blocks):
                on = b % 2 == 1
                if on:
                    recorder.enable()
                else:
                    recorder.disable()
                for _ in range(5):
                    self._round_trip(SMALL_MESSAGE)
                start = time.perf_counter()
                for _ in range(trips):
                    self._round_trip(SMALL_MESSAGE)
                times[on].append((time.perf_counter() - start) / trips)
        finally:
            recorder.disable()
            recorder.reset()
        return statistics.median(times[False]), statistics.median(times[True])


def event_cost_us(n: int) -> float:
    """CPU microseconds one recorded p2p event adds (wrapper around a no-op vs the no-op, this thread's CPU time):
    a figure the machine's load barely moves, unlike the wall-clock ratios."""
    import timeit

    from rlinf.scheduler.base.address import WorkerAddress
    from rlinf.scheduler.tracing import recorder, wrappers

    def send_frames(self, peer, transport, frames, deadline, raw=False):
        return None

    traced = wrappers.make("p2p_send", send_frames)
    peer, frames = WorkerAddress("bench", 1), [b"x" * 64]
    was_on = recorder.is_on()
    recorder.enable()
    try:
        def cost(fn):
            return min(timeit.Timer(lambda: fn(None, peer, "cpu", frames, None), timer=time.thread_time)
                       .repeat(number=n, repeat=3)) / n

        extra = cost(traced) - cost(send_frames)
    finally:
        if not was_on:
            recorder.disable()
            recorder.reset()
    return extra * 1e6


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--calls", type=int, default=150)
    parser.add_argument("--trips", type=int, default=2000)
    # a round's round trips take about 0.1 s, and on a 2-core machine one round in three is 20-100%
    # slower for reasons of its own, off or on: the median needs many rounds
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--blocks", type=int, default=400, help="p2p: blocks of round trips, off and on in turn")
    parser.add_argument("--block-trips", type=int, default=200)
    add_run_options(parser, workers=2, calls=20, trips=50, rounds=1, blocks=4, block_trips=20)
    args = parse(parser, argv)

    cluster = local_cluster()
    group = NoopWorker.create_group().launch(cluster, NodePlacementStrategy([0] * args.workers), name="bench_trace_calls")
    peers = PingPeer.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name="bench_trace_p2p")
    group.noop().wait()
    folder = tempfile.mkdtemp(prefix="rlinf-trace-bench-")

    def calls():
        start = time.perf_counter()
        for _ in range(args.calls):
            group.noop().wait()
        return (time.perf_counter() - start) / args.calls

    def round_trips():
        return peers.pingpong(args.trips).wait()[0]

    off_call, on_call, off_rt, on_rt = [], [], [], []
    events = 0
    for i in range(args.rounds):  # interleaved: off and on see the same machine noise
        off_call.append(calls())
        off_rt.append(round_trips())
        path = os.path.join(folder, f"round{i}.json")
        with cluster.trace(path):
            on_call.append(calls())
            on_rt.append(round_trips())
        with open(path) as f:
            trace = json.load(f)
        names = {e["name"] for e in trace["traceEvents"] if e["ph"] in ("X", "b")}
        assert {"noop", "send", "recv", "pingpong"} <= names, f"the trace misses events: {sorted(names)}"
        events = sum(1 for e in trace["traceEvents"] if e["ph"] != "M")
    fine_off, fine_on = peers.interleaved(args.blocks, args.block_trips).wait()[0]
    group.stop()
    peers.stop()
    close_cluster(cluster)
    shutil.rmtree(folder, ignore_errors=True)
    per_event = event_cost_us(20_000 if args.smoke else 200_000)

    c_off, c_on = statistics.median(off_call), statistics.median(on_call)
    r_off, r_on = statistics.median(off_rt), statistics.median(on_rt)
    print_table(
        f"Tracing overhead ({args.workers}-worker group call, 2-worker p2p round trip; medians of {args.rounds} "
        f"interleaved rounds; {events} events per traced round)",
        ["measure", "off (the baseline)", "on", "ratio (on/off)", "target"],
        [
            ["group call noop (ms)", c_off * 1e3, c_on * 1e3, c_on / c_off, "<= 1.1"],
            ["p2p small round trip (us)", fine_off * 1e6, fine_on * 1e6, fine_on / fine_off, "<= 1.1"],
            ["  (in the trace rounds)", r_off * 1e6, r_on * 1e6, r_on / r_off, "(noisier)"],
        ],
    )
    print("p2p round trip per round (us), off: " + " ".join(f"{t * 1e6:.1f}" for t in off_rt) + "; on: "
          + " ".join(f"{t * 1e6:.1f}" for t in on_rt), flush=True)
    print(f"recording one p2p event: {per_event:.2f} us of CPU (a round trip records 4: a send and a recv "
          f"on each side)", flush=True)
    save_plot("trace", "Tracing off vs on (medians)",
              plots.bar([f"{args.workers} workers"], {"off": [c_off * 1e3], "on": [c_on * 1e3]}, "time (ms)",
                        title="group call, noop"),
              plots.bar(["2 workers"], {"off": [fine_off * 1e6], "on": [fine_on * 1e6]}, "time (µs)",
                        title="p2p small round trip"))
    return [Target("group call, tracing on vs off", c_on / c_off, "<=", 1.1),
            Target("p2p small round trip, tracing on vs off", fine_on / fine_off, "<=", 1.1)]


if __name__ == "__main__":
    from run import main as run_main

    raise SystemExit(run_main(["trace", *__import__("sys").argv[1:]]))
