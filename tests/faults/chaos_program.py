"""A seeded chaos run: group calls, p2p and channel traffic while workers are SIGKILLed.

    python tests/faults/chaos_program.py [--seconds S | --minutes M] [--seed N] [--min-steps N] [--min-kills K]
                                         [--temp-dir DIR]

Three groups of two workers: ``stable`` is never killed, ``a`` and ``b`` are.
Each step picks, from the seed, one operation (a group call with a random
blob, a p2p message of a random size from tiny to a few MiB between two
workers of different groups, or a worker putting items into a channel that
the driver drains) and, sometimes, a worker of ``a`` or ``b`` to SIGKILL
while the operation runs; a group that lost a worker is stopped and
launched again under the same name.

Invariants (each violation is printed with the seed, so the run can be
repeated): no wait outlives its timeout by more than ``--slack`` seconds; a
message is delivered exactly once and intact, or the side that survives
gets an error naming the dead peer; channel items arrive at most once and
all of them when nobody died; at the end no process of a stopped or killed
worker is left, and the driver's and the stable workers' descriptors,
threads and memfd mappings (counted from /proc) are back near their start.

Prints ``CHAOS_SUMMARY {json}`` last; exits 1 when an invariant was violated.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
import traceback

#: seconds a single wait may take; generous for a loaded two-core machine
OP_TIMEOUT = 20.0
#: allowed growth of descriptors / threads / memfd mappings between start and end
LEAK_SLACK = {"fds": 16, "threads": 8, "memfd": 4}


def resources(pid: int | str = "self") -> dict:
    """Descriptors, threads and memfd mappings of a process, from /proc only."""
    base = f"/proc/{pid}"
    with open(f"{base}/maps") as f:
        memfd = sum(1 for line in f if "/memfd:" in line)
    return {"fds": len(os.listdir(f"{base}/fd")), "threads": len(os.listdir(f"{base}/task")), "memfd": memfd}


def blob(nbytes: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)


def digest(t) -> str:
    return hashlib.sha1(t.numpy().tobytes()).hexdigest()


def _guarded(fn):
    """Run ``fn`` in the worker; report its error and how long it took instead of raising."""
    start = time.monotonic()
    try:
        return {"ok": True, "value": fn(), "elapsed": time.monotonic() - start}
    except Exception as exc:
        return {"ok": False, "type": type(exc).__name__, "error": str(exc), "elapsed": time.monotonic() - start}


from rlinf.scheduler import Channel, Cluster, NodePlacementStrategy, Worker  # noqa: E402


class Chaos(Worker):
    def __init__(self):
        super().__init__()

    def pid(self):
        return os.getpid()

    def resources(self):
        return resources()

    def echo(self, data: bytes):
        return hashlib.sha1(data).hexdigest()

    def send_to(self, group, rank, msg_id, nbytes, timeout):
        t = blob(nbytes, msg_id)
        return _guarded(lambda: (self.send({"id": msg_id, "t": t}, group, rank, timeout=timeout), digest(t))[1])

    def recv_from(self, group, rank, timeout):
        def take():
            got = self.recv(group, rank, timeout=timeout)
            return got["id"], digest(got["t"])

        return _guarded(take)

    def produce(self, channel, ids, timeout):
        def put_all():
            for i in ids:
                channel.put({"id": i, "t": blob(64, i)}, timeout=timeout)
            return len(ids)

        return _guarded(put_all)


class Run:
    def __init__(self, args):
        self.args = args
        self.seed = args.seed
        self.rng = random.Random(args.seed)
        self.counts = collections.Counter()
        self.errors = collections.Counter()
        self.violations: list[str] = []
        self.max_overshoot = 0.0
        self.pids_seen: set[int] = set()
        self.groups: dict = {}
        self.pids: dict = {}
        self.next_id = 1
        self.received_items: set[int] = set()
        #: per (src, dst): messages sent and not yet received, in send order, as [id, digest, certain]
        #: (a receive that times out leaves its message for the next receive on that pair)
        self.in_flight: dict = collections.defaultdict(collections.deque)
        self.warming = False

    # -- bookkeeping ---------------------------------------------------------------
    def violate(self, step: int, text: str) -> None:
        msg = f"[seed {self.seed}] step {step}: {text}"
        self.violations.append(msg)
        print("VIOLATION", msg, flush=True)

    def timed_wait(self, step, result, timeout, what):
        """``result.wait(timeout)``; records how far past its timeout a wait ran."""
        start = time.monotonic()
        try:
            return result.wait(timeout=timeout), None
        except Exception as exc:
            return None, exc
        finally:
            over = time.monotonic() - start - timeout
            self.max_overshoot = max(self.max_overshoot, over)
            if over > self.args.slack:
                self.violate(step, f"{what}: wait ran {over:.2f} s past its {timeout} s timeout")

    def check_worker_elapsed(self, step, outcome, timeout, what):
        if outcome and not outcome["ok"]:
            over = outcome["elapsed"] - timeout
            self.max_overshoot = max(self.max_overshoot, over)
            if over > self.args.slack:
                self.violate(step, f"{what}: {outcome['type']} after {outcome['elapsed']:.2f} s, timeout {timeout} s")

    # -- groups ------------------------------------------------------------------------
    def launch(self, name):
        group = Chaos.create_group().launch(self.cluster, NodePlacementStrategy([0, 0]), name=name)
        self.groups[name] = group
        self.pids[name] = group.pid().wait(timeout=OP_TIMEOUT)
        self.pids_seen.update(self.pids[name])

    def relaunch(self, name):
        self.forget_receiver(name)
        self.groups[name].stop()
        self.counts["relaunches"] += 1
        self.launch(name)

    def kill_later(self, name, rank, delay):
        pid = self.pids[name][rank]

        def kill():
            time.sleep(delay)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        t = threading.Thread(target=kill, daemon=True)
        t.start()
        self.counts["kills"] += 1
        return t

    def maybe_kill(self, candidates):
        """Sometimes pick one of ``candidates`` (group, rank) of the killable groups to kill."""
        killable = [c for c in candidates if c[0] != "stable"]
        if self.warming:  # the warm-up measures the baseline: nothing may die in it
            return None, None
        if killable and self.rng.random() < self.args.kill_rate:
            victim = self.rng.choice(killable)
            return victim, self.kill_later(*victim, self.rng.uniform(0.0, 0.3))
        return None, None

    def names_peer(self, text: str, group: str) -> bool:
        return group in text

    # -- operations ------------------------------------------------------------------------
    def op_call(self, step):
        name = self.rng.choice(list(self.groups))
        data = self.rng.randbytes(self.rng.choice([0, 10, 1000, 100_000, 1_000_000]))
        victim, killer = self.maybe_kill([(name, 0), (name, 1)])
        values, exc = self.timed_wait(step, self.groups[name].echo(data), OP_TIMEOUT, f"group call on {name}")
        if killer:
            killer.join()
        want = hashlib.sha1(data).hexdigest()
        if exc is None:
            if values != [want, want]:
                self.violate(step, f"group call on {name} returned {values}, want {want}")
        else:
            self.errors[type(exc).__name__] += 1
            if victim is None:
                self.violate(step, f"group call on {name} failed with nobody killed: {type(exc).__name__}: {exc}")
            elif getattr(exc, "group", None) != name or getattr(exc, "rank", None) is None:
                self.violate(step, f"group call error does not name group {name} and a rank: {type(exc).__name__}: {exc}")
        return victim

    def op_p2p(self, step):
        names = list(self.groups)
        src_name = self.rng.choice(names)
        dst_name = self.rng.choice([n for n in names if n != src_name])
        src, dst = (src_name, self.rng.randrange(2)), (dst_name, self.rng.randrange(2))
        nbytes = self.rng.choice([1, 100, 4096, 65536, 1 << 20, 3 << 20]) + self.rng.randrange(100)
        msg_id = self.next_id
        self.next_id += 1
        timeout = self.rng.choice([2.0, 5.0, 10.0])
        victim, killer = self.maybe_kill([src, dst])
        r_recv = self.groups[dst_name].execute_on(dst[1]).recv_from(src_name, src[1], timeout)
        r_send = self.groups[src_name].execute_on(src[1]).send_to(dst_name, dst[1], msg_id, nbytes, timeout)
        sent, s_exc = self.timed_wait(step, r_send, timeout + OP_TIMEOUT, "send call")
        got, r_exc = self.timed_wait(step, r_recv, timeout + OP_TIMEOUT, "recv call")
        if killer:
            killer.join()
        sent = sent[0] if sent else None
        got = got[0] if got else None
        self.check_worker_elapsed(step, sent, timeout, f"send {src}->{dst}")
        self.check_worker_elapsed(step, got, timeout, f"recv {src}->{dst}")
        where = f"p2p {src}->{dst} id {msg_id} ({nbytes} B)"
        for outcome in (sent, got):
            if outcome and not outcome["ok"]:
                self.errors[outcome["type"]] += 1
        for exc in (s_exc, r_exc):
            if exc is not None:
                self.errors[type(exc).__name__] += 1
        queue = self.in_flight[(src, dst)]
        if sent and sent["ok"]:
            queue.append([msg_id, sent["value"], True])
        elif victim == src:  # the sender died mid-send: the message may or may not have left
            queue.append([msg_id, None, False])
        if got and got["ok"]:
            rid, rdigest = got["value"]
            while queue and queue[0][0] != rid and not queue[0][2]:
                queue.popleft()  # an uncertain message that never arrived
            if not queue or queue[0][0] != rid:
                self.violate(step, f"{where}: received message id {rid}, expected {queue[0][0] if queue else 'none'} "
                                   f"(lost, stale or duplicate)")
            else:
                _, want, _ = queue.popleft()
                if want is not None and rdigest != want:
                    self.violate(step, f"{where}: payload of message {rid} differs")
        elif got is not None:
            # not received now: fine only as a timeout (the message stays queued) or with the sender dead
            if got["type"] not in ("CommTimeoutError", "PeerDiedError") or not self.names_peer(got["error"], src_name):
                self.violate(step, f"{where}: receive failed without naming {src_name}: {got['type']}: {got['error']}")
            elif victim is None and got["type"] != "CommTimeoutError":
                self.violate(step, f"{where}: receive failed with nobody killed: {got['type']}: {got['error']}")
        if sent and not sent["ok"]:
            if victim is None:
                self.violate(step, f"{where}: send failed with nobody killed: {sent['type']}: {sent['error']}")
            elif victim == dst and not self.names_peer(sent["error"], dst_name):
                self.violate(step, f"{where}: receiver killed; sender's error does not name it: {sent['error']}")
        return victim

    def forget_receiver(self, group: str) -> None:
        """A receiver group relaunched: what its old processes had not received is gone with them."""
        for (src, dst), queue in self.in_flight.items():
            if dst[0] == group:
                queue.clear()

    def op_channel(self, step):
        name = self.rng.choice(list(self.groups))
        rank = self.rng.randrange(2)
        ids = list(range(self.next_id, self.next_id + self.rng.randint(1, 20)))
        self.next_id += len(ids)
        victim, killer = self.maybe_kill([(name, rank)])
        result = self.groups[name].execute_on(rank).produce(self.channel, ids, OP_TIMEOUT)
        got = []
        for _ in ids:
            start = time.monotonic()
            timeout = 3.0 if victim else OP_TIMEOUT
            try:
                got.append(self.channel.get(timeout=timeout)["id"])
            except Exception as exc:
                over = time.monotonic() - start - timeout
                self.max_overshoot = max(self.max_overshoot, over)
                if over > self.args.slack:
                    self.violate(step, f"channel get ran {over:.2f} s past its {timeout} s timeout")
                self.errors[type(exc).__name__] += 1
                break
        produced, exc = self.timed_wait(step, result, OP_TIMEOUT * 2, "produce call")
        if killer:
            killer.join()
        dup = [i for i in got if i in self.received_items]
        self.received_items.update(got)
        if dup or len(set(got)) != len(got):
            self.violate(step, f"channel items delivered twice: {dup or got}")
        if any(i not in ids for i in got):
            stale = [i for i in got if i not in ids]
            if not all(i < ids[0] for i in stale):
                self.violate(step, f"channel returned unknown items {stale}")
        if victim is None and sorted(i for i in got if i in ids) != ids:
            self.violate(step, f"channel op on {name}[{rank}] with nobody killed got {got}, want {ids}; produce: {produced} {exc}")
        if exc is not None:
            self.errors[type(exc).__name__] += 1
        return victim

    # -- the run ------------------------------------------------------------------------------
    def run(self):
        self.cluster = Cluster(num_nodes=1, launcher="ray", temp_dir=self.args.temp_dir, num_cpus=2, log_to_driver=False)
        for name in ("stable", "a", "b"):
            self.launch(name)
        self.channel = Channel.create(f"chaos_{os.getpid()}", maxsize=0)
        ops = [self.op_call, self.op_p2p, self.op_channel]
        self.warming = True
        for step in range(3):  # warm up: connections and threads that stay for the whole run
            ops[step](-1)
        self.warming = False
        start_driver = resources()
        stable_pids = list(self.pids["stable"])
        start_stable = [resources(p) for p in stable_pids]
        deadline = time.monotonic() + self.args.seconds
        # a short run keeps going (at most 60 s more) until it made --min-steps steps and --min-kills kills
        overtime = deadline + 60.0
        step = 0
        while time.monotonic() < deadline or (
                (step < self.args.min_steps or self.counts["kills"] < self.args.min_kills)
                and time.monotonic() < overtime):
            op = self.rng.choice(ops)
            self.counts[op.__name__] += 1
            try:
                victim = op(step)
            except Exception as exc:  # the harness itself must not die silently
                self.violate(step, f"{op.__name__} raised {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
                victim = None
            print(f"step {step}: {op.__name__[3:]}{f', killed {victim[0]}[{victim[1]}]' if victim else ''}", flush=True)
            if victim is not None:
                self.relaunch(victim[0])
            step += 1
        self.counts["steps"] = step
        # leaks: same groups alive as at the start of the measured part
        time.sleep(1.0)
        end_driver = resources()
        end_stable = [resources(p) for p in stable_pids]
        leaks = {}
        for who, before, after in [("driver", start_driver, end_driver)] + [
            (f"stable[{i}]", b, a) for i, (b, a) in enumerate(zip(start_stable, end_stable))
        ]:
            for key, slack in LEAK_SLACK.items():
                if after[key] - before[key] > slack:
                    leaks[f"{who}.{key}"] = (before[key], after[key])
        for name in list(self.groups):
            self.groups[name].stop()
        alive = self._alive_after(self.pids_seen, 20.0)
        if alive:
            leaks["processes"] = sorted(alive)
        for key, value in leaks.items():
            self.violate(step, f"leak {key}: {value}")
        summary = {
            "seed": self.seed,
            "seconds": self.args.seconds,
            "operations": {k: v for k, v in self.counts.items() if k.startswith("op_")},
            "steps": step,
            "kills": self.counts["kills"],
            "relaunches": self.counts["relaunches"],
            "errors_by_type": dict(self.errors),
            "max_timeout_overshoot_s": round(self.max_overshoot, 3),
            "resources": {"driver": [start_driver, end_driver], "stable": [start_stable, end_stable]},
            "leaks": leaks,
            "violations": self.violations,
        }
        self.cluster.shutdown()
        return summary

    @staticmethod
    def _alive_after(pids, timeout):
        deadline = time.monotonic() + timeout
        while True:
            alive = {p for p in pids if _running(p)}
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(0.2)


def _running(pid) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--minutes", type=float, default=None)
    parser.add_argument("--seed", type=int, default=int(os.environ.get("RLINF_CHAOS_SEED", "1")))
    parser.add_argument("--kill-rate", type=float, default=0.15, help="chance that a step kills a worker")
    parser.add_argument("--slack", type=float, default=3.0, help="seconds a wait may run past its timeout")
    parser.add_argument("--min-steps", type=int, default=0,
                        help="keep going past --seconds (at most 60 s more) until this many steps were made")
    parser.add_argument("--min-kills", type=int, default=0,
                        help="keep going past --seconds (at most 60 s more) until this many workers were killed")
    parser.add_argument("--temp-dir", default=None)
    args = parser.parse_args(argv)
    if args.minutes is not None:
        args.seconds = args.minutes * 60
    own_temp = args.temp_dir is None
    if own_temp:
        args.temp_dir = tempfile.mkdtemp(prefix="rlc")
    print(f"chaos: seed {args.seed}, {args.seconds:.0f} s (repeat with --seed {args.seed})", flush=True)
    summary = Run(args).run()
    print(f"operations {summary['operations']}, kills {summary['kills']}, errors {summary['errors_by_type']}, "
          f"max overshoot {summary['max_timeout_overshoot_s']} s, leaks {summary['leaks'] or 'none'}, "
          f"violations {len(summary['violations'])}", flush=True)
    print("CHAOS_SUMMARY " + json.dumps(summary), flush=True)
    if own_temp:
        import shutil

        shutil.rmtree(args.temp_dir, ignore_errors=True)
    return 1 if summary["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
