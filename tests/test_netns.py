"""Cross-host paths between real network namespaces: three simulated hosts, one Ray cluster across them.

The module starts the hosts and their Ray nodes once (tests/netns.py), runs
tests/netns_program.py as the driver inside host 0, and each test checks one
case of what it printed.  Workers on different hosts share no loopback and no
abstract Unix sockets, so their links must go over TCP between the namespace
addresses, as between machines.
"""

import json
import os
import sys

import pytest

from launcher_marks import TEST_LAUNCHER
from netns import NetnsHosts, unavailable_reason

PROGRAM = os.path.join(os.path.dirname(__file__), "netns_program.py")
PARTITION_TIMEOUT = 2.0  # the send timeout netns_program.py uses while host 1 is cut off

pytestmark = [
    pytest.mark.skipif(TEST_LAUNCHER == "mpi", reason="starts its own Ray nodes in network namespaces"),
    pytest.mark.timeout(600),  # a ceiling for loaded machines: about a minute when idle
]


@pytest.fixture(scope="module")
def cases():
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"no network namespaces here: {reason}")
    hosts = NetnsHosts(3)
    try:
        hosts.create()
        hosts.start_ray(num_cpus=2, timeout=200)  # Ray starts min(cores, num_cpus) worker processes at once
        done = hosts.run(0, [sys.executable, PROGRAM, ",".join(hosts.ips), hosts.switch, hosts.names[2]],
                         timeout=300, extra_env={"RLINF_ERROR_GRACE": "2", "RLINF_TIMEOUT": "120"})
        found = {}
        for line in done.stdout.splitlines():
            if line.startswith("CASE "):
                _, name, payload = line.split(" ", 2)
                found[name] = json.loads(payload)
        found["_output"] = f"rc={done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
        found["_ips"] = hosts.ips
        yield found
    finally:
        hosts.stop()


def case(cases, name):
    assert name in cases, f"the driver did not finish case {name!r}:\n{cases['_output']}"
    result = cases[name]
    assert result["ok"], f"{name}: {result.get('error')}\n{result.get('traceback', '')}"
    return result


def test_workers_advertise_their_namespace_address(cases):
    where = case(cases, "placement")["where"]
    ips = cases["_ips"]
    assert [w["node_ip"] for w in where] == [ips[0], ips[1], ips[2], ips[0]], where


def test_p2p_across_hosts_goes_over_tcp_between_namespace_addresses(cases):
    result = case(cases, "p2p")
    ips = cases["_ips"]
    for key, (a, b) in (("cross", (0, 1)), ("cross_back", (2, 0))):
        for r in result[key]:
            assert r["object_ok"] and r["tensor_ok"], (key, r)
        # the exchange made one TCP link per direction between the two namespace addresses: each side
        # sees the one it opened and the one it accepted (Ray's own connections, IPv6-mapped, do not match)
        first, second = ([tuple(t) for t in r["new_tcp"]] for r in result[key])
        assert first.count((ips[a], ips[b])) == 2 and second.count((ips[b], ips[a])) == 2, (key, result[key])
        assert not any("127.0.0.1" in ip for t in first + second for ip in t), (key, result[key])
    for r in result["local"]:
        assert r["object_ok"] and r["tensor_ok"], r
        # ranks 0 and 3 share host 0: their links are local (Unix socket + shared memory), not TCP
        assert (ips[0], ips[0]) not in [tuple(t) for t in r["new_tcp"]], result["local"]


def test_broadcast_reaches_two_other_hosts_and_a_local_worker(cases):
    results = case(cases, "broadcast")["results"]
    assert [r["step"] for r in results] == [7, 7, 7, 7], results
    assert all(r["ok"] for r in results), results


def test_channel_hosted_on_one_host_used_from_two_others(cases):
    result = case(cases, "channel")
    assert result["host_ip"] == cases["_ips"][1], result
    assert result["produced"] == [20], result
    assert result["consumed"] == {"order": list(range(20)), "ok": True}, result


def test_cut_cable_times_out_naming_the_peer_and_links_recover(cases):
    result = case(cases, "partition")
    sender = result["sender"]
    assert sender["error"] is not None, "a 64 MiB send to a host with no cable succeeded"
    assert sender["error"]["type"] == "CommTimeoutError", sender
    assert "'hosts:1'" in sender["error"]["message"] and cases["_ips"][1] in sender["error"]["message"], sender
    assert sender["elapsed"] < PARTITION_TIMEOUT + 10, sender
    # the torn 64 MiB message is dropped, the next one arrives on a new connection once the cable is back
    assert result["receiver"] == "after", result


def test_vanished_host_fails_the_waiting_peer_and_the_group_call(cases):
    result = case(cases, "vanish")
    assert result["killed"] > 0, result
    waiter = result["waiter"]
    assert waiter["error"] is not None and waiter["error"]["type"] == "PeerDiedError", waiter
    assert "'hosts:2'" in waiter["error"]["message"], waiter
    lost = result["lost"]
    assert lost is not None, "the call on the killed host did not fail"
    assert lost["group"] == "hosts" and lost["rank"] == 2 and lost["node_ip"] == cases["_ips"][2], lost
    # nothing hung: the driver went on to stop the group and the cluster
    assert case(cases, "shutdown")["seconds"] < 60
