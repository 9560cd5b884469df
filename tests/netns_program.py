"""Driver run inside simulated host 0 by tests/test_netns.py: cross-host cases, one JSON line each.

Usage: netns_program.py IP0,IP1,IP2 SWITCH_NS HOST2_NS

One group ``hosts`` of four workers: rank r on host r for r < 3, rank 3 on
host 0 next to rank 0.  Every case prints ``CASE name {json}``; the test
asserts on those.  The last case kills host 2, so it runs last.
"""

import json
import os
import signal
import subprocess
import sys
import time
import traceback

import psutil
import torch

from rlinf.scheduler import Channel, Cluster, NodePlacementStrategy, Worker, WorkerError

GROUP = "hosts"


def report(case, **result):
    print(f"CASE {case} {json.dumps(result)}", flush=True)


def tcp_connections():
    """This process's established TCP connections, as (local ip, local port, remote ip, remote port)."""
    conns = psutil.Process().net_connections(kind="tcp")
    return {(*c.laddr, *c.raddr) for c in conns if c.status == psutil.CONN_ESTABLISHED and c.raddr}


def new_tcp_peers(before):
    """(local ip, remote ip) of each TCP connection made since ``before`` was taken."""
    return sorted((c[0], c[2]) for c in tcp_connections() - before)


def failure(exc):
    return {"type": type(exc).__name__, "message": str(exc)}


class Host(Worker):
    def where(self):
        return {"rank": self._rank, "node_ip": self.worker_info.node_ip}

    # -- p2p across hosts, both directions, objects and raw tensors ---------------
    def exchange(self, first, second):
        """``first`` sends first, then ``second`` answers: both directions, objects and raw tensors."""
        peer = second if self._rank == first else first
        mine = torch.arange(1 << 18, dtype=torch.float32) + self._rank  # 1 MiB
        got = torch.empty_like(mine)
        before = tcp_connections()
        if self._rank == first:
            self.send({"from": self._rank, "t": mine}, GROUP, peer)
            back = self.recv(GROUP, peer)
            self.send_tensor(mine, GROUP, peer)
            self.recv_tensor(got, GROUP, peer)
        else:
            back = self.recv(GROUP, peer)
            self.send({"from": self._rank, "t": mine}, GROUP, peer)
            self.recv_tensor(got, GROUP, peer)
            self.send_tensor(mine, GROUP, peer)
        want = torch.arange(1 << 18, dtype=torch.float32) + peer
        return {
            "object_ok": back["from"] == peer and torch.equal(back["t"], want),
            "tensor_ok": torch.equal(got, want),
            "new_tcp": new_tcp_peers(before),  # the links this exchange made, if they are TCP
        }

    # -- broadcast to two other hosts and one worker on the same host -------------
    def bcast(self, size):
        obj = None
        if self._rank == 0:
            obj = {"w": torch.arange(size, dtype=torch.int64), "step": 7}
        out = self.broadcast(obj, groups=[(GROUP, [0, 1, 2, 3])], src=(GROUP, 0))
        return {"step": out["step"], "ok": torch.equal(out["w"], torch.arange(size, dtype=torch.int64))}

    # -- a channel hosted on another host -----------------------------------------
    def produce(self, name, n):
        ch = self.connect_channel(name)
        for i in range(n):
            ch.put({"i": i, "from": self._rank, "t": torch.full((1024,), float(i))})
        return n

    def consume(self, name, n):
        ch = self.connect_channel(name)
        items = [ch.get(timeout=60) for _ in range(n)]
        return {"order": [x["i"] for x in items], "ok": all(torch.equal(x["t"], torch.full((1024,), float(x["i"]))) for x in items)}

    # -- a partition: host 1's cable is cut while rank 0 sends to it --------------
    def partition_sender(self, switch_ns, port, timeout):
        self.send("warm", GROUP, 1)
        assert self.recv(GROUP, 1) == "ready"  # both directions are connected now, so the send below starts at once
        subprocess.run(["ip", "-n", switch_ns, "link", "set", port, "down"], check=True, timeout=30)
        start = time.monotonic()
        try:
            self.send(torch.zeros(16 << 20), GROUP, 1, timeout=timeout)  # 64 MiB: more than the socket buffers hold
            result = {"error": None}
        except Exception as exc:
            result = {"error": failure(exc)}
        result["elapsed"] = time.monotonic() - start
        subprocess.run(["ip", "-n", switch_ns, "link", "set", port, "up"], check=True, timeout=30)
        self.send("after", GROUP, 1, timeout=60)  # a new connection once the cable is back
        return result

    def partition_receiver(self):
        assert self.recv(GROUP, 0) == "warm"
        self.send("ready", GROUP, 0)
        return self.recv(GROUP, 0, timeout=90)

    # -- host 2 vanishes while rank 0 waits for it --------------------------------
    def wait_for(self, peer, timeout):
        start = time.monotonic()
        try:
            self.recv(GROUP, peer, timeout=timeout)
            result = {"error": None}
        except Exception as exc:
            result = {"error": failure(exc)}
        result["elapsed"] = time.monotonic() - start
        return result

    def block(self):
        self.send("blocking", GROUP, 0)
        time.sleep(600)  # ends when its host is killed


def node_ranks(cluster, ips):
    by_ip = {n.ip: rank for rank, n in enumerate(cluster.nodes)}
    return [by_ip[ip] for ip in ips]


def run_case(name, fn):
    start = time.monotonic()
    try:
        result = fn()
        report(name, ok=True, seconds=round(time.monotonic() - start, 2), **result)
    except Exception as exc:
        report(name, ok=False, error=failure(exc), traceback=traceback.format_exc()[-3000:])


def main(ips, switch_ns, host2_ns):
    cluster = Cluster(num_nodes=3, node_wait_timeout=60)
    nodes = node_ranks(cluster, ips)
    group = Host.create_group().launch(
        cluster, placement_strategy=NodePlacementStrategy([nodes[0], nodes[1], nodes[2], nodes[0]]), name=GROUP
    )
    report("placement", ok=True, where=group.where().wait())

    def p2p():
        cross = group.execute_on(0, 1).exchange(0, 1).wait()
        cross_back = group.execute_on(2, 0).exchange(2, 0).wait()  # rank 2 starts the other way round
        local = group.execute_on(0, 3).exchange(0, 3).wait()
        return {"cross": cross, "cross_back": cross_back, "local": local}

    run_case("p2p", p2p)
    run_case("broadcast", lambda: {"results": group.bcast(1 << 20).wait()})  # 8 MiB

    def channel():
        Channel.create("netns_queue", node_id=nodes[1])  # hosted on host 1
        host = cluster.session.lookup_group("Channel.netns_queue").workers[0].info
        consumer = group.execute_on(0).consume("netns_queue", 20)
        produced = group.execute_on(2).produce("netns_queue", 20).wait()
        return {"host_ip": host.node_ip, "produced": produced, "consumed": consumer.wait()[0]}

    run_case("channel", channel)

    def partition():
        receiver = group.execute_on(1).partition_receiver()
        sender = group.execute_on(0).partition_sender(switch_ns, "p1", 2.0)  # the cable stays cut: any bound times out
        return {"sender": sender.wait()[0], "receiver": receiver.wait()[0]}

    run_case("partition", partition)

    def vanish():
        blocker = group.execute_on(2).block()
        first = group.execute_on(0).wait_for(2, 60).wait()[0]  # takes "blocking": rank 2 is inside block()
        assert first["error"] is None, first
        waiter = group.execute_on(0).wait_for(2, 60)
        pids = [int(p) for p in subprocess.run(["ip", "netns", "pids", host2_ns], capture_output=True, text=True,
                                                 timeout=30).stdout.split()]
        killed_at = time.monotonic()
        for pid in pids:  # host 2 is gone: its Ray node and its workers
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        waited = waiter.wait()[0]
        try:
            blocker.wait()
            lost = None
        except WorkerError as exc:
            lost = {"type": type(exc).__name__, "message": str(exc), "group": exc.group, "rank": exc.rank,
                    "node_ip": exc.node_ip}
        return {"killed": len(pids), "waiter": waited, "lost": lost, "lost_after": time.monotonic() - killed_at}

    run_case("vanish", vanish)
    stop_start = time.monotonic()
    group.stop()
    cluster.shutdown()
    report("shutdown", ok=True, seconds=round(time.monotonic() - stop_start, 2))


if __name__ == "__main__":
    main(sys.argv[1].split(","), sys.argv[2], sys.argv[3])
