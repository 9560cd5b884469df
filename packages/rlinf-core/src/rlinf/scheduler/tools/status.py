"""``python -m rlinf.scheduler status``: what a running cluster is doing.

The launcher plugins find the running cluster and its groups
(``Launcher.running_groups``: Ray reads its registries at ``RAY_ADDRESS``,
MPI the file its job publishes); then every worker is asked, all at once and
each within a short timeout, through its status listener
(``status_server``), which answers from a thread of its own even while the
worker runs a long call.  A worker that refuses the connection is reported
dead, one that does not answer in time as such: nobody is waited on for
longer than the command's timeout.  Read-only: nothing is started, changed or
unpickled from a worker.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import json
import os
import socket
import sys
import threading
import time
from typing import Optional

from ..runtime import status_server

#: seconds the whole command may take by default
DEFAULT_TIMEOUT = 5.0
#: seconds one worker may take to answer at most
WORKER_TIMEOUT = 2.0
CHANNEL_CLASS = "ChannelHostWorker"
_CHANNEL_PREFIX = "Channel."


#: what the command is doing, for the message if it runs out of time
_phase = {"now": "looking for a running cluster"}


class NothingRunning(RuntimeError):
    """No launcher sees a running cluster from here (or the one named cannot be reached)."""


def _ask_launcher(finder, timeout: float, pid: Optional[int]):
    """``finder(timeout)``, or with ``pid=`` (the program whose cluster to show) where one is asked for; a
    finder that cannot pick a program (no ``pid`` parameter) is not asked then."""
    if pid is None:
        return finder(timeout)
    try:
        takes_pid = "pid" in inspect.signature(finder).parameters
    except (TypeError, ValueError):
        takes_pid = False
    return finder(timeout, pid=pid) if takes_pid else None


def _find(timeout: float, launcher: Optional[str], pid: Optional[int] = None) -> dict:
    """The running cluster the first launcher (by priority) sees; the launchers after it are asked too (a
    cheap look: they come after the one that found a cluster) and what they see is named in a note."""
    from ..plugins import get_registry

    registry = get_registry()
    entries = [registry.launcher(launcher)] if launcher else sorted(
        (p for p in registry.provided["launcher"].values() if not p.unusable_reason()),
        key=lambda p: -p.descriptor.priority)
    reasons = []
    found = None
    for entry in entries:
        try:
            backend = entry.descriptor.factory()
        except Exception as exc:  # one broken launcher must not hide the others' clusters
            reasons.append(f"{entry.name}: {type(exc).__name__}: {exc}")
            continue
        finder = getattr(backend, "running_groups", None)
        if finder is None:
            continue
        if found is not None:  # one is shown already: only say that this launcher sees another
            if _sees_another(finder, entry.name, found):
                break
            continue
        hint = getattr(backend, "status_hint", "")
        _phase["now"] = f"asking the {entry.name} launcher for the running cluster{'; ' + hint if hint else ''}"
        try:
            found = _ask_launcher(finder, timeout, pid)
        except RuntimeError as exc:
            if not any(str(exc) in reason for reason in reasons):  # one refused directory, said once
                reasons.append(f"{entry.name}: {exc}")
            continue
    if found is not None:
        return found
    if reasons:
        raise NothingRunning("; ".join(reasons))
    if pid is not None:
        raise NothingRunning(f"no running rlinf cluster of pid {pid} found on this machine")
    raise NothingRunning("no running rlinf cluster found (set RAY_ADDRESS for a Ray cluster; an MPI job "
                         "publishes itself in " + _mpi_hint() + ")")


#: launchers whose look for a cluster is cheap enough to make after another launcher found one
_CHEAP_SECOND_LOOK = ("mpi",)


def _sees_another(finder, name: str, found: dict) -> bool:
    """Add a note to ``found`` if launcher ``name`` (one that only reads files) sees a cluster too."""
    if name not in _CHEAP_SECOND_LOOK:
        return False
    try:
        other = finder(0.5)
    except Exception:
        return False
    if other is None:
        return False
    found.setdefault("notes", []).append(
        f"the {name} launcher sees a running cluster too ({other.get('address', '')}): "
        f"python -m rlinf.scheduler status --launcher {name}")
    return True


def _mpi_hint() -> str:
    from .status_dir import status_dir

    return status_dir()


def _ask(endpoint: Optional[dict], timeout: float) -> tuple[str, Optional[dict], str]:
    """(state, snapshot, detail): ``alive``, ``dead`` (refused: the process or its listener is gone) or ``no answer``."""
    if not endpoint:
        return "unknown", None, "the worker publishes no status listener"
    try:
        return "alive", status_server.query(endpoint, timeout), ""
    except (ConnectionRefusedError, ConnectionResetError) as exc:
        return "dead", None, type(exc).__name__
    except (socket.timeout, TimeoutError) as exc:
        return "no answer", None, f"no answer within {timeout:.1f} s"
    except Exception as exc:
        return "no answer", None, f"{type(exc).__name__}: {exc}"


def _worker_row(record, state: str, snap: Optional[dict], detail: str) -> dict:
    info = record.info
    row = {"rank": info.rank, "node": info.node_id, "node_ip": info.node_ip, "hostname": info.hostname,
           "gpus": list(info.available_gpus or []), "pid": info.pid, "state": state,
           "alive": {"alive": True, "dead": False}.get(state), "calls": (snap or {}).get("calls", [])}
    if detail:
        row["detail"] = detail
    return row


def collect(timeout: float = DEFAULT_TIMEOUT, launcher: Optional[str] = None, pid: Optional[int] = None) -> dict:
    """The cluster's groups, workers and channels (JSON-able); raises ``NothingRunning``.  ``pid``: the
    program whose cluster to show, where several run on this machine."""
    start = time.monotonic()
    found = _find(timeout, launcher, pid)
    records = found.get("groups", [])
    jobs = [(g, w) for g in records for w in g.workers]
    per_worker = max(0.2, min(WORKER_TIMEOUT, timeout - (time.monotonic() - start)))
    answers: list = [("no answer", None, "not asked")] * len(jobs)
    if jobs:
        _phase["now"] = f"asking {len(jobs)} worker(s)"
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(jobs)), thread_name_prefix="rlinf-status")
        futures = [pool.submit(_ask, w.status, per_worker) for _, w in jobs]
        # each query is bounded by per_worker (connect, handshake and reply); the margin covers thread start-up
        done, _ = concurrent.futures.wait(futures, timeout=per_worker + 1.0)
        answers = [f.result() if f in done else ("no answer", None, "not answered in time") for f in futures]
        pool.shutdown(wait=False)
    rows = {}
    for (g, w), (state, snap, detail) in zip(jobs, answers):
        rows.setdefault(g.name, []).append((w, state, snap, detail))
    groups, channels = [], []
    for g in records:
        workers = rows.get(g.name, [])
        if g.class_name == CHANNEL_CLASS:
            for w, state, snap, detail in workers:
                chan = dict((snap or {}).get("channel") or {})
                chan.setdefault("name", g.name[len(_CHANNEL_PREFIX):] if g.name.startswith(_CHANNEL_PREFIX) else g.name)
                chan.update(group=g.name, host=_worker_row(w, state, snap, detail))
                chan.setdefault("keys", [])
                channels.append(chan)
            continue
        groups.append({
            "name": g.name, "class": g.class_name, "size": len(g.workers),
            "nodes": sorted({w.info.node_id for w in g.workers}),
            "gpus": sum(len(w.info.available_gpus or []) for w in g.workers),
            "workers": [_worker_row(w, state, snap, detail) for w, state, snap, detail in workers],
        })
    return {"launcher": found.get("launcher", ""), "address": found.get("address", ""), "time": time.time(),
            "groups": groups, "channels": channels, "notes": list(found.get("notes", []))}


def _table(rows: list[tuple]) -> list[str]:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def _calls(calls: list) -> str:
    return ", ".join(f"{c['method']} ({c['running_s']:.1f} s)" for c in calls) or "-"


def render(snap: dict) -> str:
    """A readable report of ``collect``'s result."""
    out = [f"{snap['launcher']} cluster at {snap['address'] or 'this machine'}: "
           f"{len(snap['groups'])} group(s), {len(snap['channels'])} channel(s)"]
    if snap["groups"]:
        out += ["", *_table([("GROUP", "CLASS", "SIZE", "NODES", "GPUS")] + [
            (g["name"], g["class"], g["size"], ",".join(map(str, g["nodes"])), g["gpus"]) for g in snap["groups"]])]
        rows = [("WORKER", "NODE", "GPU", "PID", "STATE", "CALLS (RUNNING FOR)")]
        for g in snap["groups"]:
            for w in g["workers"]:
                rows.append((f"{g['name']}/{w['rank']}", f"{w['node']} ({w['node_ip']})",
                             ",".join(map(str, w["gpus"])) or "-", w["pid"],
                             w["state"] + (f": {w['detail']}" if w.get("detail") and w["state"] != "alive" else ""),
                             _calls(w["calls"])))
        out += ["", *_table(rows)]
    if snap["channels"]:
        rows = [("CHANNEL", "HOST", "STATE", "CLIENTS", "KEY", "ITEMS", "PARKED GETS", "PARKED PUTS")]
        for c in snap["channels"]:
            h = c["host"]
            first = (c["name"], f"node {h['node']} pid {h['pid']}", h["state"], c.get("clients", "-"))
            keys = c.get("keys") or [{"key": "-", "items": 0, "getters": 0, "putters": 0}]
            for i, k in enumerate(keys):
                rows.append((*(first if i == 0 else ("", "", "", "")), k["key"], k["items"], k["getters"], k["putters"]))
            if c.get("num_keys", 0) > len(keys):
                rows.append(("", "", "", "", f"... {c['num_keys'] - len(keys)} more key(s)", "", "", ""))
        out += ["", *_table(rows)]
    out += [f"note: {n}" for n in snap.get("notes", [])]
    return "\n".join(out)


def main(args) -> int:
    """The ``status`` command: 0 and the report, or 1 and one line saying why there is none.

    Bounded: a timer ends the process if the launcher's client (``ray.init``, say)
    has not come back by ``--timeout`` plus a second.  The process ends with
    ``os._exit`` once the report is out, so a launcher client's own shutdown
    cannot hold it either."""
    if not args.timeout > 0:
        print(f"rlinf status: --timeout must be a positive number of seconds, got {args.timeout}", file=sys.stderr)
        return 2

    def expire():
        print(f"rlinf status: the cluster did not answer within {args.timeout:g} s ({_phase['now']})",
              file=sys.stderr, flush=True)
        os._exit(1)

    timer = threading.Timer(args.timeout + 2.0, expire)  # collect() keeps within timeout + 1 s
    timer.daemon = True
    timer.start()
    try:
        snap = collect(args.timeout, args.launcher, getattr(args, "pid", None))
        text = json.dumps(snap, indent=1) if args.json else render(snap)
        code = 0
    except NothingRunning as exc:
        text, code = f"rlinf status: {str(exc).splitlines()[0]}", 1
    except Exception as exc:
        text, code = f"rlinf status: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", 1
    timer.cancel()
    print(text, file=sys.stdout if code == 0 else sys.stderr, flush=True)
    sys.stderr.flush()
    os._exit(code)
