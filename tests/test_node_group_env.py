"""A node group's ``env_configs`` reach the workers on its nodes: variables, path-like variables merged per
``RLINF_PATH_ENV_MERGE_MODE`` (RLinf's ``append``, the default, and ``override``) and the Python interpreter.

On the shared Ray cluster (one node, node 0, in a node group with ``env_configs``), and under ``mpiexec``:
there every rank runs one interpreter, so another ``python_interpreter_path`` is refused with the reason.
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from rlinf.scheduler import Cluster, LaunchError, NodePlacementStrategy, Worker, WorkerGroup
from rlinf.scheduler.base.errors import ClusterConfigError
from rlinf.scheduler.plugins import node_env
from rlinf.scheduler.plugins.cluster_config import ClusterConfig

from launcher_marks import TEST_LAUNCHER

NG_PATH = os.pathsep.join(["/opt/ng_bin", "/usr/bin", "/bin"])  # keeps the worker's own tools reachable
NG_PYTHONPATH = "/tmp/rlinf_ng_site"


class EnvProbe(Worker):
    def __init__(self):
        super().__init__()

    def seen(self, names):
        return {n: os.environ.get(n) for n in names}

    def python(self):
        return sys.executable, sys.prefix, NG_PYTHONPATH in sys.path


def section(env_vars, python=None, extra_groups=()):
    entry = {"node_ranks": 0, "env_vars": [{k: v} for k, v in env_vars.items()]}
    if python is not None:
        entry["python_interpreter_path"] = python
    return {"num_nodes": 1, "node_groups": [{"label": "envg", "node_ranks": 0, "env_configs": [entry]},
                                            *extra_groups]}


# -- what the launch hands on (no processes) ------------------------------------------------------------
def test_node_env_of_a_node_and_its_groups():
    cfg = ClusterConfig.from_dict_cfg({"num_nodes": 2, "node_groups": [
        {"label": "a", "node_ranks": "0-1", "env_configs": [
            {"node_ranks": 0, "env_vars": [{"X": "1"}], "python_interpreter_path": "/opt/py"}]},
        {"label": "b", "node_ranks": 0, "env_configs": [{"node_ranks": 0, "env_vars": [{"Y": "2"}]}]},
        {"label": "c", "node_ranks": 0, "env_configs": [{"node_ranks": 0, "env_vars": [{"X": "3"}]}]}]})
    assert node_env.for_node(cfg, 1) is None and node_env.for_node(None, 0) is None
    assert node_env.for_node(cfg, 0, ["a", "b"]) == node_env.NodeEnv({"X": "1", "Y": "2"}, "/opt/py", ("a", "b"))
    assert node_env.for_node(cfg, 0, ["c"]).env_vars == {"X": "3"}
    with pytest.raises(ClusterConfigError, match=r"node groups 'a' and 'c'.*set X to '1' and '3'.*node_group_label"):
        node_env.for_node(cfg, 0)
    found = node_env.for_node(cfg, 0, ["a"])
    assert node_env.NodeEnv.from_json(found.to_json()) == found


def test_path_merge_modes_as_rlinf_defines_them(caplog):
    assert node_env.merge_mode({}) == "append"
    assert node_env.merge_mode({}, {"RLINF_PATH_ENV_MERGE_MODE": "OVERRIDE"}) == "override"
    assert node_env.merge_mode({"RLINF_PATH_ENV_MERGE_MODE": "append"}, {"RLINF_PATH_ENV_MERGE_MODE": "override"}) \
        == "append"
    assert node_env.merge_mode({"RLINF_PATH_ENV_MERGE_MODE": "prepend"}) == "append"  # RLinf: error, then append
    assert "Invalid RLINF_PATH_ENV_MERGE_MODE=prepend" in caplog.text
    # append: the configured entries first, then the node's, each once; empty entries dropped
    assert node_env.merge_value("PATH", "/usr/bin::/x", "/a:/usr/bin", "append") == "/a:/usr/bin:/x"
    assert node_env.merge_value("PATH", "/usr/bin", "/a", "override") == "/a"
    assert node_env.merge_value("PATH", None, "/a", "append") == "/a"
    assert node_env.merge_value("NOT_A_PATH", "/b", "/a", "append") == "/a"


# -- on Ray: the shared cluster's node 0 is in the node group ------------------------------------------
pytestmark_ray = pytest.mark.skipif(TEST_LAUNCHER == "mpi", reason="needs Ray (the MPI case runs its own job)")


@pytest.fixture
def cfg_cluster(cluster):
    """A ``Cluster(cluster_cfg=...)`` maker on the shared cluster; the session's own config is put back after."""
    before = cluster.session.cluster_cfg
    yield lambda cfg: Cluster(cluster_cfg=cfg)
    cluster.session.cluster_cfg = before


def _probe(cluster, names, placement=None, name="ng_probe"):
    group = EnvProbe.create_group().launch(cluster, placement, name=name)
    try:
        return group.seen(names).wait(timeout=60), group.python().wait(timeout=60)
    finally:
        WorkerGroup.stop(group)


@pytestmark_ray
def test_env_vars_and_paths_reach_workers_on_the_groups_nodes_under_ray(cluster, cfg_cluster, monkeypatch):
    monkeypatch.delenv("RLINF_PATH_ENV_MERGE_MODE", raising=False)
    monkeypatch.setenv("RLINF_NG_FORWARDED", "from-driver")  # forwarded RLINF_* setting: the node group's wins
    names = ["RLINF_NG_VAR", "RLINF_NG_FORWARDED", "PATH", "PYTHONPATH", "RANK"]
    (plain, *_), _ = _probe(cluster, names, name="ng_plain")  # no cluster config: nothing of the group's
    assert plain["RLINF_NG_VAR"] is None and plain["RLINF_NG_FORWARDED"] == "from-driver"
    node_path = plain["PATH"].split(os.pathsep)

    cfg = section({"RLINF_NG_VAR": "v1", "RLINF_NG_FORWARDED": "from-config", "PATH": NG_PATH,
                   "PYTHONPATH": NG_PYTHONPATH, "RANK": "99"},
                  extra_groups=[{"label": "bare", "node_ranks": 0}])
    c = cfg_cluster(cfg)
    seen, pythons = _probe(c, names, NodePlacementStrategy([0, 0]), name="ng_env")
    first = NG_PATH.split(os.pathsep)
    for env in seen:
        assert env["RLINF_NG_VAR"] == "v1" and env["RLINF_NG_FORWARDED"] == "from-config"
        # append (the default): the group's entries in front of the node's, each once (RLinf's merge)
        assert env["PATH"].split(os.pathsep) == list(dict.fromkeys(first + node_path))
        assert env["PYTHONPATH"].split(os.pathsep)[0] == NG_PYTHONPATH
    assert [env["RANK"] for env in seen] == ["0", "1"]  # what the launch sets itself wins over the group's
    assert all(on_path for _, _, on_path in pythons)  # the worker started with it: it is on sys.path

    # placed through another group of the same node: that group's environment (none), not envg's
    (bare, *_), _ = _probe(c, names, NodePlacementStrategy([0], node_group_label="bare"), name="ng_bare")
    assert bare["RLINF_NG_VAR"] is None and bare["PATH"] == plain["PATH"]


@pytestmark_ray
def test_override_mode_replaces_path_variables_under_ray(cluster, cfg_cluster, monkeypatch):
    monkeypatch.setenv("RLINF_PATH_ENV_MERGE_MODE", "override")
    c = cfg_cluster(section({"PATH": NG_PATH, "RLINF_NG_VAR": "v2"}))
    (env,), _ = _probe(c, ["PATH", "RLINF_NG_VAR"], name="ng_override")
    assert env == {"PATH": NG_PATH, "RLINF_NG_VAR": "v2"}


@pytestmark_ray
def test_python_interpreter_path_under_ray(cluster, cfg_cluster, tmp_path):
    # the same interpreter and site-packages, seen from another path: a virtualenv made of links
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / "pyvenv.cfg").symlink_to(os.path.join(sys.prefix, "pyvenv.cfg"))
    (venv / "lib").symlink_to(os.path.join(sys.prefix, "lib"))
    python = str(venv / "bin" / "python")
    c = cfg_cluster(section({"RLINF_NG_VAR": "v3"}, python=python))
    (env,), ((executable, prefix, _),) = _probe(c, ["RLINF_NG_VAR"], name="ng_python")
    assert executable == python and prefix == str(venv) and env["RLINF_NG_VAR"] == "v3"

    missing = str(tmp_path / "nowhere" / "python")
    c = cfg_cluster(section({}, python=missing))
    with pytest.raises(LaunchError, match=r"python_interpreter_path '.*nowhere/python' \(env_configs of node "
                                          r"group\(s\) envg\) is not an executable file"):
        EnvProbe.create_group().launch(c, name="ng_missing")


# -- under MPI: the ranks run the job's interpreter ---------------------------------------------------
MPI_PROGRAM = """
import os, sys
from rlinf.scheduler import Cluster, LaunchError, NodePlacementStrategy, Worker

plain = Cluster()  # made before any config: the cluster without node groups
two = NodePlacementStrategy([0, 0])
class EnvProbe(Worker):
    def seen(self):
        return os.environ.get("RLINF_NG_VAR"), os.environ.get("PATH").split(os.pathsep)[:2], "{site}" in sys.path

def cfg(python):
    return {{"num_nodes": 1, "node_groups": [{{"label": "envg", "node_ranks": 0, "env_configs": [
        {{"node_ranks": 0, "python_interpreter_path": python,
          "env_vars": [{{"RLINF_NG_VAR": "mpi"}}, {{"PATH": "/opt/ng_bin"}}, {{"PYTHONPATH": "{site}"}}]}}]}}]}}

group = EnvProbe.create_group().launch(Cluster(cluster_cfg=cfg(sys.executable)), two, name="ng_same")
print("SEEN", group.seen().wait(timeout=60))
group.stop()
try:
    EnvProbe.create_group().launch(Cluster(cluster_cfg=cfg("/opt/other/bin/python")), two, name="ng_other")
except LaunchError as exc:
    print("REFUSED", exc)
group = EnvProbe.create_group().launch(plain, two, name="ng_after")  # the ranks were freed, their env restored
print("AFTER", group.seen().wait(timeout=60))
"""


@pytest.mark.timeout(120)
@pytest.mark.skipif(TEST_LAUNCHER == "mpi", reason="starts its own MPI job")
def test_env_configs_under_mpi_and_another_interpreter_refused(tmp_path):
    from test_mpi import MPIEXEC, leftovers, mpirun, program

    if MPIEXEC is None:
        pytest.skip("needs mpi4py and an mpiexec")
    path = program(tmp_path, MPI_PROGRAM.format(site=NG_PYTHONPATH))
    code, out, took = mpirun(3, [path], timeout=90)
    assert code == 0, out
    assert "SEEN [('mpi', ['/opt/ng_bin', " in out and "True), ('mpi', ['/opt/ng_bin', " in out, out
    assert "python_interpreter_path '/opt/other/bin/python' (env_configs of node group(s) envg) cannot be used " \
           "under MPI: mpiexec started this rank with" in out, out
    assert "mpiexec -n N /opt/other/bin/python -m rlinf.mpi" in out
    assert "AFTER [(None, " in out and "False), (None, " in out, out
    assert took < 60 and not leftovers(path)
