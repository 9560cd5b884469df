"""How a worker process ended, for the driver's ``WorkerDiedError``.

Ray tells the driver only that an actor's process died ("connection error
code 2. End of file"): its exit status goes to the raylet that reaps it and
is not logged.  A worker that ends itself with ``os._exit(code)`` (Python's
``sys.exit`` in a call is reported as the call's error instead) records the
code in the cluster's key-value store first (``install``, in the worker
process; at most ``RECORD_TIMEOUT`` seconds, in a thread, so an exit never
hangs), and the driver reads it when it finds the worker dead
(``exit_of``).  A process killed by a signal (SIGKILL, the OOM killer) or
one that crashed records nothing; the driver says so.

Records are keyed by the actor's id, which Ray never gives twice in a
cluster, so a record outlives its process harmlessly: a later worker that
happens to get the same pid on the same node does not inherit it (keyed by
node and pid, a worker killed by a signal would have been said to exit with
an earlier process's code).  Node and pid key a record only where no actor
id is known.
"""

from __future__ import annotations

import os
import threading
from typing import Optional

#: seconds an exiting worker waits at most for its exit code to be recorded
RECORD_TIMEOUT = 2.0
_NAMESPACE = "rlinf_exits"
_installed = False


def _key(actor_id: Optional[str], ip: Optional[str], pid) -> bytes:
    return (f"actor:{actor_id}" if actor_id else f"{ip}:{pid}").encode()


def _own_key() -> bytes:
    import ray

    try:
        actor_id = ray.get_runtime_context().get_actor_id()
    except Exception:
        actor_id = None
    return _key(actor_id, ray.util.get_node_ip_address(), os.getpid())


def install() -> None:
    """In a worker process: ``os._exit`` records its code before the process ends (once; idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    real_exit = os._exit
    worker_pid = os.getpid()
    key = _own_key()

    def _exit(code):
        if os.getpid() != worker_pid:  # a child forked from the worker (a DataLoader worker, a pool) ends as it would
            real_exit(code)

        def record():
            try:
                from ray.experimental.internal_kv import _internal_kv_put

                _internal_kv_put(key, str(int(code)).encode(), overwrite=True, namespace=_NAMESPACE)
            except Exception:
                pass

        recorder = threading.Thread(target=record, daemon=True)
        recorder.start()
        recorder.join(RECORD_TIMEOUT)
        real_exit(code)

    os._exit = _exit


def exit_of(ip: Optional[str], pid, actor_id: Optional[str] = None) -> Optional[int]:
    """The code the worker passed to ``os._exit``, or None: the worker of actor ``actor_id``, or where no id is
    known, worker ``pid`` on the node at ``ip``."""
    if not actor_id and (not ip or not pid):
        return None
    found: list = []

    def read():  # a GCS request has no timeout of its own: asked in a thread, waited for at most RECORD_TIMEOUT
        try:
            from ray.experimental.internal_kv import _internal_kv_get

            raw = _internal_kv_get(_key(actor_id, ip, pid), namespace=_NAMESPACE)
            found.append(int(raw) if raw is not None else None)
        except Exception:
            pass

    reader = threading.Thread(target=read, name="rlinf-exit-code", daemon=True)
    reader.start()
    reader.join(RECORD_TIMEOUT)
    return found[0] if found else None


def death_reason(exc) -> str:
    """How the worker ended, from Ray's error: the exit code it gave ``os._exit`` (``exits``), else what Ray
    says (a process that ended unexpectedly without recording a code was killed by a signal or crashed)."""
    text = str(exc).strip()
    fields = dict(line.strip().split(": ", 1) for line in text.splitlines() if line.startswith("\t") and ": " in line)
    code = exit_of(fields.get("ip"), fields.get("pid"), fields.get("actor_id"))
    if code is not None:
        return f"it exited with code {code} (os._exit)"
    if "connection error code" in text or "unexpectedly exits" in text:
        return ("its process ended without an exit code of its own: killed by a signal (SIGKILL, the OOM killer) "
                "or crashed")
    lines = text.splitlines()
    detail = next((line.strip() for line in lines if "died" in line.lower() or "killed" in line.lower()), "")
    return f"{type(exc).__name__}{': ' + detail if detail else ''}"
