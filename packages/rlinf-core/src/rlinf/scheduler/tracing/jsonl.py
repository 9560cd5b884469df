"""The timeline as RLinf's JSONL trace file: one Chrome trace event per line.

RLinf's tracer appends events to ``trace_events.jsonl`` as they happen, each a
JSON object with ``name``, ``cat``, ``ph`` (``B``/``E`` pairs for spans, ``M``
to name a process), ``ts`` (microseconds since the Unix epoch), ``pid`` (the
worker's name ``group:rank``, or ``driver``) and ``tid``; ``jq -s .`` turns
it into a file Perfetto opens.  ``to_lines`` writes this project's merged
timeline (``export.chrome_trace``) that way: the same events and tracks as the
JSON file, spans as ``B``/``E`` pairs, async spans as ``b``/``e`` with their
id, instants as ``i``.
"""

from __future__ import annotations

import json
import os

from ..base import jsonfile


def _process_name(label: str) -> str:
    """``"group:0 @ node 0"`` -> ``"group:0"``; ``"driver @ host"`` -> ``"driver"`` (RLinf's pid labels)."""
    return label.split(" @ ", 1)[0]


def to_lines(trace: dict) -> list:
    """The events of ``trace`` (``export.chrome_trace``'s dict) as RLinf JSONL events, in time order."""
    origin_us = trace.get("otherData", {}).get("rlinf", {}).get("start_unix_ns", 0) / 1000.0
    processes, threads = {}, {}
    for ev in trace["traceEvents"]:
        if ev["ph"] == "M" and ev["name"] == "process_name":
            processes[ev["pid"]] = _process_name(ev["args"]["name"])
        elif ev["ph"] == "M" and ev["name"] == "thread_name":
            threads[(ev["pid"], ev["tid"])] = ev["args"]["name"]
    meta, timed = [], []
    for pid, name in processes.items():
        meta.append({"name": "process_name", "ph": "M", "ts": origin_us, "pid": name, "tid": "main", "args": {"name": name}})
    for (pid, tid), name in threads.items():
        meta.append({"name": "thread_name", "ph": "M", "ts": origin_us, "pid": processes.get(pid, str(pid)),
                     "tid": name, "args": {"name": name}})
    for ev in trace["traceEvents"]:
        ph = ev["ph"]
        if ph == "M":
            continue
        pid = processes.get(ev["pid"], str(ev["pid"]))
        tid = threads.get((ev["pid"], ev["tid"]), "main")
        base = {"name": ev["name"], "cat": ev.get("cat", "default"), "pid": pid, "tid": tid}
        ts = origin_us + ev["ts"]
        if ph == "X":
            timed.append({**base, "ph": "B", "ts": ts, **({"args": ev["args"]} if ev.get("args") else {})})
            timed.append({**base, "ph": "E", "ts": ts + ev.get("dur", 0)})
        else:
            out = {**base, "ph": ph, "ts": ts}
            for extra in ("id", "s", "args"):
                if ev.get(extra):
                    out[extra] = ev[extra]
            timed.append(out)
    timed.sort(key=lambda e: (e["ts"], e["ph"] != "E"))  # at a tie an end goes first: spans stay nested
    return meta + timed


def write(path, trace: dict) -> str:
    """Write ``trace`` to ``path`` as JSONL, atomically; returns the path.  Raises ``OSError`` if it cannot."""
    path = os.fspath(path)
    text = "".join(json.dumps(e) + "\n" for e in to_lines(trace))

    def fill(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(text)

    return jsonfile.replace_by(path, fill, ".rlinf-trace-", ".jsonl")
