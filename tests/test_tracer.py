"""RLinf's ``Tracer``: spans a program marks, on rlinf's timeline and in RLinf's JSONL file, on a real local Ray."""

import asyncio
import json
import time

import pytest

from rlinf.scheduler import NodePlacementStrategy, Worker
from rlinf.scheduler import tracing
from rlinf.scheduler.manager import Tracer
from rlinf.scheduler.manager.tracer import Tracer as TracerAtModule
from rlinf.scheduler.tracing import collect, recorder


class Traced(Worker):
    @Tracer.trace_func(cat="compute")
    def inner(self, x):
        return x * 2

    def step(self, x):
        with Tracer.trace_span("prep", cat="actor", args={"x": x}):
            y = self.inner(x)
        Tracer.trace_begin("manual", cat="actor")
        Tracer.trace_end("manual")
        return y


class AsyncTraced(Worker):
    @Tracer.trace_func
    async def fetch(self, n):
        await asyncio.sleep(0.01)
        return n


def _names(events):
    return [e[1] for e in events]


def test_calls_are_no_ops_until_tracing_is_on():
    assert Tracer is TracerAtModule
    assert not recorder.is_on() and not Tracer.is_enabled()
    before = len(recorder.dump(drain=False)["events"])

    @Tracer.trace_func
    def plain(a):
        return a + 1

    with Tracer.trace_span("off", args={"k": 1}):
        Tracer.trace_begin("off2")
        Tracer.trace_end("off2")
        assert plain(1) == 2
    assert asyncio.run(Tracer.trace_func("cat")(asyncio.sleep)(0, result=5)) == 5
    assert len(recorder.dump(drain=False)["events"]) == before
    assert tracing.spans.end("never-opened") is False  # nothing was kept open either


@pytest.fixture(scope="module")
def traced(cluster):
    g = Traced.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name="tr_sync")
    a = AsyncTraced.create_group().launch(cluster, NodePlacementStrategy([0]), name="tr_async")
    yield g, a
    g.stop()
    a.stop()


def _processes(trace):
    return {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}


def test_worker_spans_land_on_their_tracks(traced, cluster, tmp_path):
    g, a = traced
    path = tmp_path / "run.json"
    with cluster.trace(str(path)):
        assert g.step(3).wait() == [6, 6]
        assert a.fetch(7).wait() == [7]
        with Tracer.trace_span("driver-span", cat="runner"):
            pass
    trace = json.loads(path.read_text())
    procs = _processes(trace)
    events = [e for e in trace["traceEvents"] if e["ph"] != "M"]
    for rank in (0, 1):
        mine = [e for e in events if procs[e["pid"]].startswith(f"tr_sync:{rank} ")]
        by_name = {e["name"]: e for e in mine}
        assert {"prep", "inner", "manual", "step"} <= set(by_name), sorted(by_name)
        prep, inner, run = by_name["prep"], by_name["inner"], by_name["step"]
        assert prep["cat"] == "actor" and prep["args"] == {"x": 3} and inner["cat"] == "compute"
        # on the thread that ran the call, nested inside it: prep inside the run, inner inside prep
        assert prep["tid"] == run["tid"] == inner["tid"]
        assert run["ts"] <= prep["ts"] <= inner["ts"]
        assert inner["ts"] + inner["dur"] <= prep["ts"] + prep["dur"] + 1e-3
    fetch = [e for e in events if e["name"] == "fetch" and e.get("cat") == "default"]
    assert [procs[e["pid"]].split(" ")[0] for e in fetch] == ["tr_async:0", "tr_async:0"]
    assert {e["ph"] for e in fetch} == {"b", "e"}  # a coroutine's span is an async slice
    driver = [e for e in events if e["name"] == "driver-span"]
    assert len(driver) == 1 and procs[driver[0]["pid"]].startswith("driver")
    assert not recorder.is_on()  # off again after the block: spans are no-ops once more


def test_jsonl_output_is_rlinfs_format(traced, cluster, tmp_path):
    g, _ = traced
    path = tmp_path / "trace_events.jsonl"
    t0 = time.time()
    with cluster.trace(str(path)):
        g.execute_on(1).step(5).wait()
    lines = path.read_text().splitlines()
    events = [json.loads(line) for line in lines]  # every line one JSON object
    assert all(isinstance(e, dict) and {"name", "ph", "ts", "pid", "tid"} <= set(e) for e in events)
    prep = [e for e in events if e["name"] == "prep"]
    assert [e["ph"] for e in prep] == ["B", "E"]
    assert {e["pid"] for e in prep} == {"tr_sync:1"} and prep[0]["cat"] == "actor"
    assert prep[0]["args"] == {"x": 5}
    assert t0 * 1e6 - 1e6 <= prep[0]["ts"] <= prep[1]["ts"] <= time.time() * 1e6 + 1e6  # epoch microseconds
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert "tr_sync:1" in names and "driver" in names
    # B/E pairs nest per (pid, tid), as a reader pairing them expects
    stacks = {}
    for e in events:
        if e["ph"] == "B":
            stacks.setdefault((e["pid"], e["tid"]), []).append(e["name"])
        elif e["ph"] == "E":
            assert stacks[(e["pid"], e["tid"])].pop() == e["name"]


def test_cluster_config_tracer_section(traced, cluster, tmp_path):
    g, _ = traced
    with pytest.raises(ValueError, match="enable"):
        tracing.on_cluster_config(cluster, {"tracer": {"enable": "yes"}})
    with pytest.raises(FileNotFoundError):
        tracing.on_cluster_config(cluster, {"tracer": {"enable": True, "output_file": str(tmp_path / "no" / "t.jsonl")}})
    tracing.on_cluster_config(cluster, {"tracer": {"enable": False}})
    assert not recorder.is_on()
    path = tmp_path / "cfg.jsonl"
    tracing.on_cluster_config(cluster, {"tracer": {"enable": True, "output_file": str(path)}})
    try:
        assert recorder.is_on()
        g.execute_on(0).step(1).wait()
        tracing.write_before_exit()  # what the driver's exit does
    finally:
        collect.stop_everywhere(cluster.session)
        recorder.disable()
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["ph"] for e in events if e["name"] == "prep" and e["pid"] == "tr_sync:0"] == ["B", "E"]


PROGRAM = """
import json, sys
from rlinf.scheduler import Cluster, NodePlacementStrategy, Tracer, Worker

class W(Worker):
    def step(self):
        with Tracer.trace_span("from_config", cat="actor"):
            return 1

cfg = {"num_nodes": 1, "component_placement": {"w": "0"},
       "tracer": {"enable": True, "output_file": sys.argv[1]}}
cluster = Cluster(cluster_cfg=cfg, num_cpus=1)
g = W.create_group().launch(cluster, NodePlacementStrategy([0]), name="cfg_traced")
print(json.dumps(g.step().wait()))
"""


@pytest.mark.timeout(120)
def test_cluster_cfg_tracer_section_writes_the_jsonl_at_exit(tmp_path):
    """RLinf's ``cluster.tracer: {enable, output_file}`` through ``Cluster(cluster_cfg=...)`` of a program of its
    own (its own embedded cluster): the worker's span is in the JSONL file written when the driver exits."""
    import os
    import shutil
    import subprocess
    import sys
    import tempfile

    out = tmp_path / "events.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RLINF_TRACE"))}
    env["RLINF_RAY_TEMP_DIR"] = ray_dir = tempfile.mkdtemp(prefix="rlt")  # short: socket paths fit in 107 bytes
    try:
        proc = subprocess.run([sys.executable, "-c", PROGRAM, str(out)], capture_output=True, text=True, env=env,
                              timeout=110)
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    assert any(e.get("name") == "from_config" for e in events), events[:20]
