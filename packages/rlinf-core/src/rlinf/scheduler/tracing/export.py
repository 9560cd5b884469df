"""Merge the processes' dumps into one Chrome trace / Perfetto JSON file.

Format: the "JSON Array/Object" trace event format read by ``ui.perfetto.dev``
and ``chrome://tracing``: one process per worker (named ``group:rank @ node``,
plus the driver), its threads named, ``X`` complete events for spans on a
thread, ``b``/``e`` async events for spans that may overlap (async calls, an
``async_op`` transfer, a group call from submit to result).  Timestamps are
microseconds since the first event; ``otherData.rlinf`` holds the absolute
start, each process's clock offset and what could not be collected.
"""

from __future__ import annotations

import os
import tempfile
from typing import Optional

from ..base import jsonfile


def _sort_key(dump: dict):
    return (dump.get("group") is not None, dump.get("group") or "", dump.get("rank") or 0, dump.get("pid") or 0)


def chrome_trace(dumps: list, notes: Optional[list] = None) -> dict:
    """The trace as a JSON-ready dict (``traceEvents`` + ``otherData``)."""
    notes = list(notes or [])
    dumps = sorted(dumps, key=_sort_key)
    starts = [ev[3] for d in dumps for ev in d["events"]]
    origin = min(starts) if starts else 0
    out = []
    async_id = 0
    offsets, dropped = {}, {}
    for index, dump in enumerate(dumps):
        pid = index + 1
        label = dump["label"]
        out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": index}})
        out.append({"ph": "M", "name": "process_labels", "pid": pid, "tid": 0,
                    "args": {"labels": f"pid {dump.get('pid')} on {dump.get('host')}"}})
        offsets[label] = dump.get("offset_ns", 0)
        if dump.get("dropped") or dump.get("overflowed"):
            dropped[label] = (dump.get("dropped", 0), dump.get("overflowed", False))
        tids: dict = {}
        threads = dump.get("threads", {})
        for ph, name, cat, start, end, ident, args in dump["events"]:
            tid = tids.get(ident)
            if tid is None:
                tid = tids[ident] = len(tids) + 1
                out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                            "args": {"name": threads.get(ident, f"thread {ident}")}})
            ts = (start - origin) / 1000.0
            if ph == "X":
                out.append({"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": max(0, end - start) / 1000.0,
                            "pid": pid, "tid": tid, "args": args or {}})
            elif ph == "A":
                async_id += 1
                ident_hex = hex(async_id)
                out.append({"ph": "b", "name": name, "cat": cat, "id": ident_hex, "ts": ts, "pid": pid, "tid": tid,
                            "args": args or {}})
                out.append({"ph": "e", "name": name, "cat": cat, "id": ident_hex, "ts": (end - origin) / 1000.0,
                            "pid": pid, "tid": tid})
            else:
                out.append({"ph": "i", "s": "t", "name": name, "cat": cat, "ts": ts, "pid": pid, "tid": tid,
                            "args": args or {}})
    for label, (count, overflowed) in dropped.items():
        at_least = "at least " if overflowed else ""
        notes.append(f"{label}: {at_least}{count} oldest event(s) gave way to newer ones (RLINF_TRACE_MAX_EVENTS)")
    for note in notes:  # shown on the timeline too, at its start
        out.append({"ph": "i", "s": "g", "name": "trace note", "cat": "trace", "ts": 0, "pid": 1, "tid": 0,
                    "args": {"note": note}})
    return {
        "traceEvents": out,
        "displayTimeUnit": "ms",
        "otherData": {"rlinf": {"start_unix_ns": origin, "clock_offsets_ns": offsets, "notes": notes,
                                "processes": [d["label"] for d in dumps]}},
    }


class TraceWriteError(OSError):
    """The trace could not be written where asked; ``saved`` is where it was written instead (None: nowhere)."""

    def __init__(self, message: str, saved: Optional[str]):
        super().__init__(message)
        self.saved = saved


def probe_folder(folder: str) -> None:
    """Raise ``OSError`` unless a file can be created (and removed) in ``folder``, as ``write`` does."""
    fd, tmp = tempfile.mkstemp(prefix=".rlinf-trace-", suffix=".json", dir=folder)
    os.close(fd)
    os.unlink(tmp)


def write_elsewhere(trace: dict) -> str:
    """Write ``trace`` to a new file in the temporary folder (readable by its owner only); returns its path."""
    return jsonfile.write_new(trace, None, "rlinf-trace-", ".json", compact=True)


def write(path, trace: dict) -> str:
    """Write ``trace`` to ``path`` atomically (a reader never sees half a file); returns the path."""
    return jsonfile.replace(os.fspath(path), trace, ".rlinf-trace-", ".json", compact=True)
