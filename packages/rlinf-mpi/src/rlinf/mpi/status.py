"""How ``python -m rlinf.scheduler status`` finds a running MPI job: a file rank 0 keeps current.

There is no cluster service to ask, so rank 0 writes its group registry
(names, classes, each worker's info and status listener) as JSON to
``<status dir>/mpi-<host>-<pid>.json`` whenever a group is registered or
released, touches it every ``RLINF_STATUS_REFRESH`` seconds (30) while the
job runs, and removes it when the program ends.  The directory is the user's
own (mode 0700, see ``rlinf.scheduler.tools.status_dir``) and the file mode 0600:
the workers' status tokens in it stay the user's.  A status process reads
the files of jobs whose rank 0 still runs, if on this machine (its pid, and
the process's start time, so that a pid reused since a job was killed does
not bring that job back; rank 0 of a new job removes such leftovers); a directory
on a filesystem the nodes share (``RLINF_STATUS_DIR``) also shows the jobs
whose rank 0 runs on another one, whose pid cannot be checked from here:
there a file not touched for ten of its job's refresh intervals is a job
that ended without removing it (killed with its node, say), skipped with a
note.
JSON only, nothing is unpickled.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Optional

from rlinf.scheduler.base.address import WorkerAddress
from rlinf.scheduler.base.info import WorkerInfo
from rlinf.scheduler.plugins.launcher import GroupRecord, WorkerRecord
from rlinf.scheduler.tools.status_dir import process_mark, published, runs_here, status_dir
from rlinf.scheduler.tools.status_dir import PublishedFile

_file = PublishedFile("mpi")
_refresher: Optional[threading.Thread] = None
_stop = threading.Event()

#: seconds between touches of a running job's file
REFRESH_ENV = "RLINF_STATUS_REFRESH"
DEFAULT_REFRESH = 30.0
#: a file on another host not touched for this many refresh intervals belongs to a job that is gone
STALE_AFTER_REFRESHES = 10


def _interval(raw) -> float:
    """A positive number of seconds, else the default."""
    try:
        value = float(raw) if raw else DEFAULT_REFRESH
    except (TypeError, ValueError):
        return DEFAULT_REFRESH
    return value if value > 0 else DEFAULT_REFRESH


def refresh_interval() -> float:
    return _interval(os.environ.get(REFRESH_ENV))


def _refresh() -> None:
    """Touch the job's file while it runs (bounded sleeps; ``unpublish`` ends it at once)."""
    interval = refresh_interval()
    while not _stop.wait(interval):
        path = _file.path
        if path is None:
            return
        try:
            os.utime(path)
        except OSError:
            pass


def _worker(record) -> dict:
    i = record.info
    return {"rank": i.rank, "node_id": i.node_id, "gpu_id": i.gpu_id, "node_ip": i.node_ip,
            "available_gpus": list(i.available_gpus or []), "pid": i.pid, "hostname": i.hostname,
            "status": getattr(record, "status", None)}


def publish(records) -> None:
    """Rank 0: write the job's groups (called with the registry's lock held, so writes do not interleave)."""
    global _refresher
    body = {"launcher": "mpi", **process_mark(), "refresh": refresh_interval(),
            "groups": [{"name": r.name, "class": r.class_name, "workers": [_worker(w) for w in r.workers]}
                       for r in records]}
    if not _file.write(body):
        return
    if _refresher is None:
        _stop.clear()
        _refresher = threading.Thread(target=_refresh, name="rlinf-status-refresh", daemon=True)
        _refresher.start()


def unpublish() -> None:
    global _refresher
    _stop.set()
    _refresher = None
    _file.remove()


def _job_refresh(body: dict) -> float:
    """The refresh interval the job's rank 0 uses (older files: the default)."""
    return _interval(body.get("refresh"))


def running_groups(timeout: float) -> Optional[dict]:
    """The groups of the MPI jobs of this user that the status directory shows; None if there is none."""
    files = published("mpi-*.json")
    if files is None:
        return None
    groups, jobs, notes = [], [], []
    here = socket.gethostname()
    for path, body, mtime in files:
        age = time.time() - mtime
        host = body.get("host", here)
        if host == here:
            if not runs_here(body):
                continue  # a job that ended without cleaning up (its pid may be another process's now)
            jobs.append(str(body["pid"]))
        elif age > STALE_AFTER_REFRESHES * _job_refresh(body):  # rank 0 stopped touching it: gone with its node
            notes.append(f"skipped {os.path.basename(path)}: rank 0 (pid {body.get('pid')} on {host}) has not "
                         f"refreshed it for {age:.0f} s (every {_job_refresh(body):g} s while a job runs); "
                         f"that job ended without removing it")
            continue
        else:  # a shared directory: its workers' listeners say whether it still runs
            jobs.append(f"{body['pid']} on {host}")
        for g in body.get("groups", []):
            workers = []
            for w in g["workers"]:
                status = w.pop("status", None)
                info = WorkerInfo(address=WorkerAddress(g["name"]).get_child_address(w["rank"]), **w)
                workers.append(WorkerRecord(info=info, status=status))
            groups.append(GroupRecord(g["name"], g["class"], workers, "mpi"))
    if not jobs:
        if notes:  # say why nothing is listed
            raise RuntimeError("no MPI job running; " + "; ".join(notes))
        return None
    return {"launcher": "mpi", "address": f"job(s) with rank 0 pid {', '.join(jobs)} ({status_dir()})", "groups": groups,
            "notes": notes}
