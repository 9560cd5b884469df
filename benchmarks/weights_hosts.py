"""Weight sync across hosts: one trainer to N rollout workers, each on a host of its own, same run.

    hatch run bench weights-hosts [--size-mb 64] [--tensors 16] [--ns 1,2,4,8] [--rounds 3] [--link-mbit 1000]

On one machine, the way the tests do it (``tests/netns.py``; needs root): every
host is a network namespace with one interface (``eth0``), all joined by a
bridge, with a Ray node in each.  Each host's interface sends at most
``--link-mbit`` (a ``tc`` token bucket on its egress), as a NIC does, so what
is measured is the traffic each design puts on the links, not the machine's
cores; ``weights`` (one host, ``RLINF_CPU_LOCAL=0``) measures those instead.

* rlinf: ``broadcast(state_dict)`` on the trainer (host 0), ``broadcast(out=own_state_dict)``
  on each receiver (hosts 1..N): receivers on other hosts form a chain that forwards
  each chunk as soon as it has it.
* torch gloo: ``dist.broadcast`` of every tensor (asynchronously, then waited for) in a
  gloo process group of N+1 processes over the same interfaces.
* one transfer (raw floor, not a target, measured in the same run): two plain processes,
  host 0 sending the payload over one TCP socket to host 1 until host 1 has every byte
  (and says so with one byte back): what one copy of the weights takes on these links;
  the payload's size over the link's nominal rate is printed beside it.

Targets (issue: "across hosts: chunked and pipelined so that total time stays
close to one transfer"): at N=8 at least 3x gloo, and time at N=8 at most 2x
time at N=1.  Times run from the trainer's call until every receiver has the
weights; median of ``--rounds`` after one warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(HERE), "tests")  # the simulated hosts of the test suite
MiB = 1 << 20


def _driver(hosts_ips: list, ns: list, size_mb: int, tensors: int, rounds: int) -> None:
    """Inside host 0: launch one worker per host, time both designs for each N, print one JSON line each."""
    from rlinf.scheduler import Cluster, NodePlacementStrategy
    from weights import WeightWorker

    class HostWeightWorker(WeightWorker):
        def __init__(self, size_mb: int, tensors: int):
            super().__init__(size_mb, tensors)

        def init_gloo(self, ns):
            os.environ["GLOO_SOCKET_IFNAME"] = "eth0"  # every simulated host's one interface
            return super().init_gloo(ns)

    start = time.monotonic()
    cluster = Cluster(num_nodes=len(hosts_ips), node_wait_timeout=120)
    by_ip = {n.ip: rank for rank, n in enumerate(cluster.nodes)}
    nodes = [by_ip[ip] for ip in hosts_ips]
    group = HostWeightWorker.create_group(size_mb, tensors).launch(
        cluster, NodePlacementStrategy(nodes), name="bench_weights")
    print(f"group of {len(nodes)} launched after {time.monotonic() - start:.1f} s", flush=True)
    group.init_gloo(ns).wait()
    print(f"gloo ready after {time.monotonic() - start:.1f} s", flush=True)
    for n in ns:
        rlinf = group.rlinf_sync(n, rounds, False).wait()[0]
        gloo = group.gloo_sync(n, rounds).wait()[0]
        print("RESULT " + json.dumps({"n": n, "rlinf": rlinf, "gloo": gloo}), flush=True)
        print(f"N={n} done after {time.monotonic() - start:.1f} s", flush=True)
    group.stop()


_FLOOR_RECEIVER = """
import socket, sys, time
size = int(sys.argv[2])
server = socket.create_server((sys.argv[1], 0))
server.settimeout(120)
print(server.getsockname()[1], flush=True)
conn, _ = server.accept()
conn.settimeout(120)
buf = memoryview(bytearray(size))
for _ in range(2):
    pos = 0
    while pos < size:
        got = conn.recv_into(buf[pos:], size - pos)
        if not got:
            raise SystemExit("sender closed early")
        pos += got
    conn.sendall(b"k")
"""
_FLOOR_SENDER = """
import socket, sys, time
size = int(sys.argv[3])
payload = memoryview(bytearray(b"x" * size))
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=120)
times = []
for _ in range(2):
    start = time.perf_counter()
    sock.sendall(payload)
    if sock.recv(1) != b"k":
        raise SystemExit("no acknowledgement")
    times.append(time.perf_counter() - start)
print(min(times), flush=True)
"""


def socket_floor(hosts, nbytes: int) -> float:
    """Seconds for a plain process in host 0 to send ``nbytes`` over one TCP socket to a plain process in host 1
    until that one has them all (best of 2 on one connection): one transfer over these links.

    Raises:
        RuntimeError: either process failed or the receiver gave no port within 60 s.
    """
    import selectors

    receiver = hosts.popen(1, [sys.executable, "-c", _FLOOR_RECEIVER, hosts.ips[1], str(nbytes)],
                           stdout=subprocess.PIPE, text=True)
    try:
        sel = selectors.DefaultSelector()
        sel.register(receiver.stdout, selectors.EVENT_READ)
        if not sel.select(60):
            raise RuntimeError("the floor's receiver gave no port within 60 s")
        port = receiver.stdout.readline().strip()
        sent = hosts.run(0, [sys.executable, "-c", _FLOOR_SENDER, hosts.ips[1], port, str(nbytes)], timeout=300)
        if sent.returncode != 0:
            raise RuntimeError(f"the floor's sender failed: {sent.stderr[-2000:]}")
        return float(sent.stdout.split()[-1])
    finally:
        try:
            receiver.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(receiver.pid, 9)
            receiver.wait(30)
        receiver.stdout.close()


def _shape(hosts, mbit: int) -> None:
    """Each host's interface sends at most ``mbit``: a token bucket on its egress."""
    burst = max(64 * 1024, mbit * 1_000_000 // 8 // 250)  # at least one timer tick's worth at HZ=250
    for name in hosts.names:
        subprocess.run(["ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
                        "rate", f"{mbit}mbit", "burst", str(burst), "latency", "100ms"],
                       check=True, capture_output=True, timeout=30)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mb", type=int, default=64, help="state dict size in MiB")
    parser.add_argument("--tensors", type=int, default=16)
    parser.add_argument("--ns", default="1,2,4,8", help="receiver counts (one host each)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--link-mbit", type=int, default=1000, help="each host's send rate")
    from common import Target, add_run_options, parse, print_table

    add_run_options(parser, size_mb=4, tensors=4, ns="1,2", rounds=1)
    args = parse(parser, argv)
    ns = [int(n) for n in args.ns.split(",")]
    top, lo = max(ns), min(ns)
    sys.path.insert(0, TESTS)
    from netns import NetnsHosts, unavailable_reason

    reason = unavailable_reason()
    if reason:
        print(f"Weight sync across hosts: not run, no network namespaces here: {reason}", flush=True)
        return []
    results = {}
    with NetnsHosts(top + 1) as hosts:
        hosts.create()
        _shape(hosts, args.link_mbit)
        started = time.monotonic()
        hosts.start_ray(num_cpus=1, timeout=400)
        print(f"{top + 1} hosts with a Ray node each after {time.monotonic() - started:.1f} s", flush=True)
        code = (f"import sys; sys.path[:0] = [{HERE!r}]; import weights_hosts; "
                f"weights_hosts._driver({hosts.ips!r}, {ns!r}, {args.size_mb}, {args.tensors}, {args.rounds})")
        done = hosts.run(0, [sys.executable, "-c", code], timeout=900,
                         extra_env={"RLINF_TIMEOUT": "600", "PYTHONPATH": HERE})
        for line in done.stdout.splitlines():
            if line.startswith(("group ", "gloo ", "N=")):
                print(line, flush=True)
            if line.startswith("RESULT "):
                r = json.loads(line[len("RESULT "):])
                results[r["n"]] = r
        if done.returncode != 0 or set(results) != set(ns):
            raise RuntimeError(f"the driver in host 0 failed (rc={done.returncode}):\n{done.stdout[-3000:]}\n"
                               f"{done.stderr[-5000:]}")
        one = socket_floor(hosts, args.size_mb * MiB)
    nominal = args.size_mb * MiB * 8 / (args.link_mbit * 1e6)
    rows = [[n, results[n]["rlinf"], results[n]["gloo"], one, results[n]["gloo"] / results[n]["rlinf"],
             results[n]["rlinf"] / one] for n in ns]
    print_table(f"Weight sync across hosts: {args.size_mb} MiB in {args.tensors} tensors, one source to N receivers, "
                f"each on its own host, links of {args.link_mbit} Mbit/s (seconds, median of {args.rounds})",
                ["N", "rlinf", "torch gloo", "one transfer (floor)", "gloo/rlinf", "rlinf/one transfer"], rows)
    print(f"  one transfer (floor): a plain socket from host 0 to host 1, measured in this run ({one:.3f} s; "
          f"the size over the link's nominal rate: {nominal:.3f} s)")
    from weights import save_line_plot

    save_line_plot("weights-hosts", f"Broadcast of {args.size_mb} MiB to N hosts, {args.link_mbit} Mbit/s links",
                   ns, {"rlinf (chain)": [results[n]["rlinf"] for n in ns],
                        "torch gloo": [results[n]["gloo"] for n in ns],
                        "one transfer (floor, plain socket)": [one for _ in ns]}, "time, lower is better (s)")
    return [Target(f"across hosts, N={top}: torch gloo time / rlinf time", results[top]["gloo"] / results[top]["rlinf"],
                   ">=", 3.0),
            Target(f"across hosts, rlinf: time at N={top} / time at N={lo}", results[top]["rlinf"] / results[lo]["rlinf"],
                   "<=", 2.0)]


if __name__ == "__main__":
    from run import main as run_main

    raise SystemExit(run_main(["weights-hosts", *sys.argv[1:]]))
