"""Simulated hosts for tests: Linux network namespaces joined by a bridge, with a Ray node in each.

Each "host" is a network namespace with its own loopback and one veth
interface on a private subnet (``10.231.0.0/24``); a further namespace holds
the bridge that joins them, so nothing is added to the machine's own network
and names never clash with another test run (they carry this process's pid
and a random tag).  Processes in different namespaces share the file system,
the pid space and the boot id, but not the network: not 127.0.0.1, not
abstract Unix sockets, not ports.  That is what two machines look like to
rlinf's transports, so cross-host paths run for real.

Ray runs as ``ray start --block`` in each namespace (the head in host 0),
every node advertising its namespace address, with token authentication on.
Drivers run in a namespace too (``run_driver``).  ``stop()`` kills every
process in our namespaces (``ip netns pids``: exactly ours, nothing else),
then deletes the namespaces, which removes their links.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Optional

SUBNET = "10.231.0"
RAY_PORT = 6379  # every namespace has its own ports: the defaults cannot clash
#: how often a node is started before giving up (Ray gives a node a fixed 30 s to register)
START_TRIES = 5  # a 30 s registration each: at most 150 s of the start's 200 s budget


def unavailable_reason() -> Optional[str]:
    """Why namespaces cannot be made here (not root, no ``ip``, no CAP_NET_ADMIN), or None."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux only"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    probe = f"rlp{os.getpid()}{secrets.token_hex(2)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    if made.returncode != 0:
        return f"`ip netns add` failed (no CAP_NET_ADMIN?): {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")


class NetnsHosts:
    """``n`` simulated hosts; host ``i`` has address ``10.231.0.(i+1)``."""

    def __init__(self, n: int, temp_dir: Optional[str] = None):
        tag = f"rl{os.getpid()}{secrets.token_hex(2)}"
        self.switch = f"{tag}-sw"
        self.names = [f"{tag}-h{i}" for i in range(n)]
        self.ips = [f"{SUBNET}.{i + 1}" for i in range(n)]
        self.temp_dir = temp_dir or tempfile.mkdtemp(prefix="rlns")  # short: Ray's socket paths must fit in 107 bytes
        self._made: list[str] = []
        self._nodes: dict[int, subprocess.Popen] = {}
        token = secrets.token_hex(24)
        self.env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="1",  # Ray refuses multi-node without it
                        RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
        for key in ("RAY_ADDRESS", "RLINF_CLUSTER_SECRET", "GLOO_SOCKET_IFNAME", "UCX_NET_DEVICES"):
            self.env.pop(key, None)

    @property
    def address(self) -> str:
        return f"{self.ips[0]}:{RAY_PORT}"

    # -- network ---------------------------------------------------------------
    def create(self) -> None:
        """Make the namespaces, the bridge and one veth pair per host; each host can reach every other."""
        for ns in [self.switch, *self.names]:
            _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, ns in enumerate(self.names):
            # both ends are created inside their namespaces: nothing appears in the machine's own
            _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{i}", "netns", self.switch)
            _ip("-n", self.switch, "link", "set", f"p{i}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{self.ips[i]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            # a default route, so that Ray's "which address reaches the outside" probe answers at once
            _ip("-n", ns, "route", "add", "default", "dev", "eth0")

    def link(self, i: int, up: bool) -> None:
        """Cut (or restore) host ``i``'s cable: its switch port goes down, no packet passes, nothing is closed."""
        _ip("-n", self.switch, "link", "set", f"p{i}", "up" if up else "down")

    def pids(self, i: int) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.names[i]], capture_output=True, text=True, timeout=30)
        return [int(p) for p in out.stdout.split()]

    def kill_host(self, i: int) -> list[int]:
        """SIGKILL every process in host ``i`` (its Ray node and workers): the host is gone. Return the pids."""
        pids = self.pids(i)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    # -- processes -------------------------------------------------------------
    def popen(self, i: int, argv: list[str], **kw) -> subprocess.Popen:
        """Start ``argv`` in host ``i``, in a process group of its own."""
        return subprocess.Popen(["ip", "netns", "exec", self.names[i], *argv], start_new_session=True,
                                stdin=subprocess.DEVNULL, **kw)

    def start_ray(self, num_cpus: int = 1, timeout: float = 150) -> None:
        """A Ray head in host 0 and a node in every other host; return once every node has started.

        A node gives up if it has not registered within Ray's fixed 30 s (which
        a loaded machine can miss), so one that exits is started again (up to
        ``START_TRIES`` times), after what it left in its host is killed.
        """
        deadline = time.monotonic() + timeout
        self._num_cpus = num_cpus
        self._start_node(0, num_cpus)
        self._wait_started([0], deadline)
        # one node at a time: raylets registering at once on a small machine miss Ray's 30 s registration
        # deadline (seen with two at once on 2 cores), and each miss costs a restart
        for i in range(1, len(self.names)):
            self._start_node(i, num_cpus)
            self._wait_started([i], deadline)

    def _start_node(self, i: int, num_cpus: int) -> None:
        args = [f"--node-ip-address={self.ips[i]}", f"--num-cpus={num_cpus}", "--num-gpus=0"]
        if i == 0:
            args += ["--head", f"--port={RAY_PORT}", "--include-dashboard=false", f"--temp-dir={self.temp_dir}"]
        else:
            args += [f"--address={self.address}"]
        with open(self._log(i), "w") as log:
            self._nodes[i] = self.popen(i, [sys.executable, "-m", "ray.scripts.scripts", "start", "--block",
                                            "--disable-usage-stats", *args],
                                        stdout=log, stderr=subprocess.STDOUT, env=self.env)

    def _log(self, i: int) -> str:
        return os.path.join(self.temp_dir, f"node{i}.log")

    def _wait_started(self, hosts: list[int], deadline: float) -> None:
        """Wait until each node's ``ray start`` says it runs (it does once the GCS knows the node)."""
        starts = {i: 1 for i in hosts}
        waiting = list(hosts)
        while waiting:  # bounded by the deadline
            for i in list(waiting):
                with open(self._log(i), errors="replace") as f:
                    if "Ray runtime started" in f.read():
                        waiting.remove(i)
                        continue
                if self._nodes[i].poll() is not None:
                    if starts[i] >= START_TRIES:
                        raise RuntimeError(f"ray start in host {i} exited with {self._nodes[i].returncode}:\n{self.logs()}")
                    self.kill_host(i)  # what the failed start left behind (only Ray's processes live there yet)
                    os.rename(self._log(i), f"{self._log(i)}.{starts[i]}")
                    starts[i] += 1
                    self._start_node(i, self._num_cpus)
            if waiting and time.monotonic() > deadline:
                raise RuntimeError(f"Ray nodes in hosts {waiting} did not start in time:\n{self.logs()}")
            time.sleep(0.3)

    def run(self, i: int, argv: list[str], timeout: float, extra_env: Optional[dict] = None):
        """Run ``argv`` in host ``i`` against the cluster; kill its process group at the timeout."""
        env = dict(self.env, RAY_ADDRESS=self.address, **(extra_env or {}))
        proc = self.popen(i, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate(timeout=30)
            err += f"\n[killed after {timeout} s]"
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def logs(self) -> str:
        """Every start's log (earlier tries too: ``nodeN.log.K``), and the raylets' own logs."""
        import glob

        text = []
        for name in sorted(os.listdir(self.temp_dir)):
            if ".log" in name:
                with open(os.path.join(self.temp_dir, name), errors="replace") as f:
                    body = f.read()
                text.append(f"--- {name}\n{body[:1200]}\n[...]\n{body[-1200:]}" if len(body) > 2400
                            else f"--- {name}\n{body}")
        for path in sorted(glob.glob(os.path.join(self.temp_dir, "session_*", "logs", "raylet*.out")))[-6:]:
            with open(path, errors="replace") as f:
                text.append(f"--- {os.path.relpath(path, self.temp_dir)}\n{f.read()[-1500:]}")
        return "\n".join(text)

    def stop(self) -> None:
        """Kill every process in our namespaces, delete the namespaces (and with them the links)."""
        for i in range(len(self.names)):
            if self.names[i] in self._made:
                self.kill_host(i)
        for proc in self._nodes.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        for ns in reversed(self._made):
            for _ in range(3):  # a namespace whose last process is still exiting may refuse at first
                if subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30).returncode == 0:
                    break
                time.sleep(0.5)
        self._made.clear()
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
