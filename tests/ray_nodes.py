"""A private multi-node Ray cluster on this machine, for tests that need ``ray start``.

Every node is a ``ray start ... --block`` process in its own process group,
with its own ports and the cluster's own temp dir.  A one-node cluster stays
on 127.0.0.1; with ``multi_node=True`` Ray runs in cluster mode, which
advertises this machine's own address instead of loopback (as
``ray.cluster_utils.Cluster`` does too).  ``stop()``
kills exactly those process groups, then any process left that names the
temp dir (Ray's daemons and workers do), and nothing else.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from rlinf.ray.watchdog import kill_session

_PORT_OPTIONS = (
    "--node-manager-port", "--object-manager-port", "--metrics-export-port", "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port", "--runtime-env-agent-port",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RayNodes:
    def __init__(self, multi_node: bool = False):
        self.multi_node = multi_node
        self.temp_dir = tempfile.mkdtemp(prefix="rln")  # short: Ray's socket paths must fit in 107 bytes
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self._procs: list[subprocess.Popen] = []
        self.env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="1" if multi_node else "0")
        for key in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_MODE"):
            self.env.pop(key, None)
        # said explicitly: a token file some other Ray left in ~/.ray would otherwise turn token auth on for
        # the head (which reads it) but not for the nodes joining it, which are then refused
        self.env["RAY_AUTH_MODE"] = "disabled"

    def _start(self, args: list[str]) -> None:
        # Ray refuses to start when two of its ports coincide: pick them all while holding each
        # one open (so they differ), then a worker-port range that contains none of them
        held = []
        try:
            for _ in _PORT_OPTIONS:
                s = socket.socket()
                s.bind(("127.0.0.1", 0))
                held.append(s)
            picked = [s.getsockname()[1] for s in held]
        finally:
            for s in held:
                s.close()
        taken = set(picked) | {self.port}
        ports = [f"{opt}={port}" for opt, port in zip(_PORT_OPTIONS, picked)]
        for _ in range(100):  # bounded: a 41-port range clear of 7 ports is found within a few tries
            low = free_port()
            if low + 40 < 65536 and not any(low <= p <= low + 40 for p in taken):
                break
        cmd = [
            sys.executable, "-m", "ray.scripts.scripts", "start", "--block",
            *([] if self.multi_node else ["--node-ip-address=127.0.0.1"]), f"--temp-dir={self.temp_dir}", "--disable-usage-stats", f"--min-worker-port={low}",
            f"--max-worker-port={low + 40}", *ports, *args,
        ]
        log = open(os.path.join(self.temp_dir, f"node{len(self._procs)}.log"), "w")
        self._procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=self.env, start_new_session=True))

    def start_head(self, num_cpus: int, num_gpus: int = 0) -> None:
        self._start(["--head", f"--port={self.port}", "--include-dashboard=false",
                     f"--num-cpus={num_cpus}", f"--num-gpus={num_gpus}"])
        deadline = time.monotonic() + 90
        while True:  # bounded: the head's GCS port accepts connections once it is up
            if self._procs[0].poll() is not None:
                raise RuntimeError(f"ray start --head exited with {self._procs[0].returncode}:\n{self.logs()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the Ray head did not come up within 90 s:\n{self.logs()}") from None
                time.sleep(0.3)

    def add_node(self, num_cpus: int, num_gpus: int = 0, wait: float = 0.0) -> None:
        """Start a worker node; with ``wait``, return only once it is up (or raise after ``wait`` seconds).

        Nodes started together on one machine share its session directory, and
        their raylets can miss Ray's registration window: start them one by one."""
        assert self.multi_node, "RayNodes(multi_node=True) is needed to add nodes"
        self._start([f"--address={self.address}", f"--num-cpus={num_cpus}", f"--num-gpus={num_gpus}"])
        if not wait:
            return
        proc, log = self._procs[-1], os.path.join(self.temp_dir, f"node{len(self._procs) - 1}.log")
        deadline = time.monotonic() + wait
        while True:  # bounded by ``wait``
            with open(log, errors="replace") as f:
                if "Ray runtime started" in f.read():
                    return
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray start (node {len(self._procs) - 1}) did not come up within {wait:g} s:\n"
                                   f"{self.logs()}")
            time.sleep(0.3)

    def run_driver(self, program: str, *args: str, timeout: float = 150, extra_env: dict | None = None):
        """Run ``program`` as a driver joining this cluster (through RAY_ADDRESS); return the CompletedProcess."""
        env = dict(self.env, RAY_ADDRESS=self.address, **(extra_env or {}))
        proc = subprocess.Popen([sys.executable, program, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate(timeout=30)
            err += f"\n[driver killed after {timeout} s]"
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def logs(self) -> str:
        text = []
        for name in sorted(os.listdir(self.temp_dir)):
            if name.endswith(".log"):
                with open(os.path.join(self.temp_dir, name), errors="replace") as f:
                    text.append(f"--- {name}\n{f.read()[-2000:]}")
        return "\n".join(text)

    def stop(self) -> None:
        """Stop every node: SIGTERM to each node's process group, then SIGKILL.

        ``ray start --block`` itself, and Ray's autoscaler monitor, never exit on
        SIGTERM, so waiting for the whole group would only wait out a deadline:
        the daemons that do exit (GCS, raylet, workers) get 2 s, then whatever
        is left is killed."""
        import psutil

        for proc in self._procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

        def daemons_left() -> bool:
            for proc in self._procs:
                try:
                    children = psutil.Process(proc.pid).children(recursive=True)
                except psutil.NoSuchProcess:
                    continue
                for child in children:
                    try:
                        if child.status() != psutil.STATUS_ZOMBIE and "monitor.py" not in " ".join(child.cmdline()):
                            return True
                    except psutil.NoSuchProcess:
                        pass
            return False

        deadline = time.monotonic() + 2
        while daemons_left() and time.monotonic() < deadline:  # bounded by the deadline
            time.sleep(0.1)
        for proc in self._procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(10)
        kill_session(self.temp_dir)  # Ray daemons and workers that left the process groups
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
