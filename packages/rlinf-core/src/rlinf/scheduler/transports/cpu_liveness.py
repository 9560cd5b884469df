"""Whether a CPU-transport peer still runs: its host, its process identity, and a probe of its listener.

An endpoint names its process by pid, pid namespace and start time (a pid
alone is reused once the process ends); on the same host and in the same pid
namespace that settles it.  Elsewhere the peer's listener must prove itself
with the cluster secret and its listener id, so a process that took over a
dead peer's port (or pid) does not make it look alive.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Optional

from ..base import security


def _host_id() -> str:
    """Who can reach this process's abstract Unix socket: same boot, same hostname, same network namespace.

    Abstract Unix sockets belong to a network namespace, so containers or
    namespaces on one machine are different hosts here: their links go over
    TCP (and their liveness is probed through it) rather than failing over.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    try:
        netns = os.readlink("/proc/self/ns/net")  # "net:[4026531840]"
    except OSError:
        netns = "?"
    return f"{socket.gethostname()}/{boot}/{netns}"



#: seconds a probe of a peer's listener may take, connection and handshake together
PROBE_TIMEOUT = 2.0


def _pid_namespace() -> Optional[str]:
    """This process's pid namespace (``"pid:[4026531836]"``): where a published pid means the same process."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _start_ticks(pid: int) -> Optional[int]:
    """When process ``pid`` started (clock ticks since boot, ``/proc/<pid>/stat`` field 22); None if it has
    ended (a zombie included); ``-1`` if it runs but its start cannot be read (``/proc`` mounted hidepid)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the name, in parentheses, may hold anything
    except FileNotFoundError:
        try:  # hidden (hidepid), or really gone
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except OSError:
            pass
        return -1
    except OSError:
        return -1
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _process_identity() -> dict:
    """The endpoint's fields that name this process on its host: pid, pid namespace, start time.

    A pid alone is reused once the process ends; with its start time it is not.
    """
    ident = {"pid": os.getpid()}
    started = _start_ticks(os.getpid())
    if started is not None and started >= 0:
        ident["started"] = started
        ident["pidns"] = _pid_namespace()
    return ident


def _process_alive(endpoint: dict) -> Optional[bool]:
    """Whether the endpoint's process still runs, told by its pid: None where the pid cannot tell.

    It can on the same host (``_host_id``) and in the same pid namespace, where the pid names
    the process only together with its start time: a process that got the pid since is
    another.  Elsewhere (another host, network or pid namespace, or a start time that cannot be
    read) only the listener can say (``_listener_proves_itself``).
    """
    if endpoint.get("host") != _host_id() or endpoint.get("pidns", _pid_namespace()) != _pid_namespace():
        return None
    try:
        started = _start_ticks(int(endpoint["pid"]))
    except (KeyError, TypeError, ValueError):
        return None
    if started is None:
        return False
    if started < 0:
        return None
    return "started" not in endpoint or endpoint["started"] == started  # without it (an older rlinf): the pid alone


def _listener_proves_itself(endpoint: dict) -> bool:
    """Run the client handshake with the endpoint's TCP listener, sending no hello, within ``PROBE_TIMEOUT``.

    The peer is alive if the listener proves it holds the cluster secret and is the listener
    the endpoint named (its id is in the proofs), and dead if it refuses the connection,
    answers as something else, or proves itself wrongly: a process (rlinf or not) that took
    over a dead peer's port is not the peer.  Where the truth is unknown the peer counts as
    alive and the caller probes again later, as it did when any accepted connection counted:
    a connection or handshake that times out, is reset, or ends before the handshake began
    (a busy listener sheds connections that way, and may be slower than the probe to begin).
    So a process on another host that holds a dead peer's port and never speaks still looks
    alive until the waiting operation's own deadline.  The listener drops the connection once
    no hello follows; it logs that at DEBUG level.
    """
    deadline = time.monotonic() + PROBE_TIMEOUT
    try:
        sock = socket.create_connection(tuple(endpoint["tcp"]), timeout=PROBE_TIMEOUT)
    except ConnectionRefusedError:
        return False
    except OSError:  # unreachable, or no answer in time: unknown
        return True
    try:
        security.client_handshake(sock, deadline, listener=endpoint.get("listener", ""))
        return True
    except security.NotTaken:  # silent, shed, or slow: unknown
        return True
    except security.HandshakeError:  # refused us, another program, or another secret: not the peer
        return False
    except OSError:
        return True
    finally:
        sock.close()


def _gone(endpoint: dict) -> None:
    """Raise ``ConnectionError`` (not ``NotTaken``, which is tried again) if the pid says the peer has ended."""
    if _process_alive(endpoint) is False:
        raise ConnectionError(f"the peer's process (pid {endpoint.get('pid')}) is gone")


def probe(endpoint: dict) -> bool:
    """Whether the peer still runs: by its pid and start time where they tell, else by its listener."""
    alive = _process_alive(endpoint)
    return _listener_proves_itself(endpoint) if alive is None else alive
