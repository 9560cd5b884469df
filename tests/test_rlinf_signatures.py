"""RLinf's public names keep RLinf's signatures.

Every name of RLinf's ``rlinf.scheduler.__all__`` (``NAMES_FROM_RLINF``) is
imported from ``rlinf.scheduler`` and its signature compared with RLinf's,
written down below from RLinf's source (0.3.0; ``Tracer`` from its main
branch): the parameter names of functions and constructors in order, and the
``__init__`` fields of dataclasses, inherited ones included.  Ours may add
parameters after RLinf's, each with a default; never drop, rename or reorder
one, nor make one of RLinf's keyword-only (``"*"`` marks where RLinf's
keyword-only parameters start).  ``None`` means RLinf's class has
no constructor of its own (an enum, static helpers, a class built through
class methods): only its presence is checked.
"""

import dataclasses
import inspect

import pytest

import rlinf.scheduler as scheduler

#: kind and parameter names, from RLinf's source
RLINF = {
    'AcceleratorType': ('class', None),
    'AcceleratorUtil': ('class', None),
    'Channel': ('class', None),
    'ChannelWorker': ('class', ('maxsize',)),
    'Cluster': ('class', ('num_nodes', 'cluster_cfg', 'distributed_log_dir')),
    'ClusterConfig': ('dataclass', ('num_nodes', 'component_placement', 'node_groups', 'profiling')),
    'CollectiveGroupOptions': ('dataclass', ('accel_cluster_size', 'accel_max_ctas', 'accel_min_ctas', 'is_high_priority_stream', 'use_ring_broadcast')),
    'CommMapper': ('class', None),
    'ComponentPlacement': ('class', ('config', 'cluster')),
    'DOSW1HWInfo': ('dataclass', ('type', 'model', 'config')),
    'DualFrankaHWInfo': ('dataclass', ('type', 'model', 'config')),
    'FlexiblePlacementStrategy': ('class', ('hardware_ranks_list', 'node_group_label')),
    'FrankaHWInfo': ('dataclass', ('type', 'model', 'config')),
    'GimArmHWInfo': ('dataclass', ('type', 'model', 'config')),
    'HardwareInfo': ('dataclass', ('type', 'model')),
    'NodePlacementStrategy': ('class', ('node_ranks', 'node_group_label')),
    'PackedPlacementStrategy': ('class', ('start_hardware_rank', 'end_hardware_rank', 'num_hardware_per_process', 'stride', 'node_group')),
    'PlacementStrategy': ('class', ()),
    'Tracer': ('class', None),
    'Turtle2HWInfo': ('dataclass', ('type', 'model', 'config')),
    'WeightedItem': ('dataclass', ('weight', 'item')),
    'Worker': ('class', ('parent_address', 'world_size', 'rank')),
    'WorkerAddress': ('class', ('root_group_name', 'ranks')),
    'WorkerGroupFuncResult': ('class', ('worker_group', 'results', 'func_name', 'cls_name')),
    'WorkerInfo': ('dataclass', ('address', 'rank', 'group_world_size', 'cluster_node_rank', 'accelerator_type', 'accelerator_model', 'accelerator_rank', 'node_ip', 'node_port', 'available_accelerators', 'hardware_infos')),
    'build_recv_plan': ('function', ('*', 'src_group_name', 'dst_group_name', 'dst_rank', 'src_world_size', 'dst_world_size', 'tag', 'route_key', 'batch_size')),
    'build_route_channel_key': ('function', ('src_group_name', 'dst_group_name', 'src_rank', 'dst_rank', 'tag', 'route_key')),
    'build_send_key': ('function', ('*', 'src_group_name', 'dst_group_name', 'src_rank', 'dst_rank', 'tag', 'route_key')),
    'build_send_plan': ('function', ('*', 'src_group_name', 'dst_group_name', 'src_rank', 'src_world_size', 'dst_world_size', 'tag', 'route_key', 'batch_size')),
    'decoupled_build_recv_plan': ('function', ('*', 'src_group_name', 'dst_group_name', 'recv_rank', 'src_world_size', 'dst_world_size', 'tag', 'route_key', 'batch_size', 'recv_queue_size')),
    'get_batch_size': ('function', ('data', 'infer_batch_size_fn')),
    'get_group_world_size': ('function', ('manager_proxy', 'group_name')),
    'infer_batch_size': ('function', ('data',)),
    'merge_batches': ('function', ('batches',)),
    'split_batch': ('function', ('data', 'split_sizes')),
    'split_channel_message': ('function', ('channel_message',)),
}

#: names whose constructor differs on purpose: why, and the RLinf attributes each must still have
EXCEPTIONS = {
    "WorkerInfo": (
        "built by the framework only (the worker host, the MPI status reader), never by programs; ours keeps "
        "the seed's field order (address, rank, node_id, gpu_id, node_ip, ...) and answers RLinf's "
        "cluster_node_rank and available_accelerators as properties",
        RLINF["WorkerInfo"][1],
    ),
    "WorkerGroupFuncResult": (
        "built by the framework only, as the result of a group call; programs wait on it and read its timings",
        ("wait", "done", "consume_durations"),
    ),
}

def _parameters(obj) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(obj).parameters.values()]


def _ours(kind: str, obj) -> list[tuple[str, bool, bool]]:
    """(name, has a default, may be passed by position) of each constructor or function parameter."""
    if kind == "dataclass":
        assert dataclasses.is_dataclass(obj), f"{obj.__name__} is not a dataclass in rlinf"
        return [(f.name, f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING,
                 not f.kw_only) for f in dataclasses.fields(obj) if f.init]
    out = []
    for p in _parameters(obj):
        name = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name
        out.append((name, p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD),
                    p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)))
    return out


def test_the_table_covers_every_rlinf_name():
    assert sorted(RLINF) == sorted(scheduler.NAMES_FROM_RLINF)
    assert set(EXCEPTIONS) <= set(RLINF)


@pytest.mark.parametrize("name", sorted(RLINF))
def test_signature_matches_rlinf(name):
    assert name in scheduler.__all__, f"{name} is not exported by rlinf.scheduler"
    obj = getattr(scheduler, name)
    kind, theirs = RLINF[name]
    if kind == "function":
        assert inspect.isfunction(obj), f"{name} is not a function"
    else:
        assert inspect.isclass(obj), f"{name} is not a class"
    if theirs is None:
        return
    if name in EXCEPTIONS:
        declared = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
        declared |= set(inspect.signature(obj).parameters)
        missing = [n for n in EXCEPTIONS[name][1] if not hasattr(obj, n) and n not in declared]
        assert not missing, f"{name} lacks RLinf's {missing}"
        return
    ours = _ours(kind, obj)
    names = [n for n, _, _ in ours]
    star = theirs.index("*") if "*" in theirs else len(theirs)
    wanted = [n for n in theirs if n != "*"]
    assert names[: len(wanted)] == wanted, f"{name}: RLinf's parameters {list(theirs)}, ours {names}"
    for n, _, positional in ours[:star]:
        assert positional or n.startswith("*"), f"{name}: RLinf's {n!r} must stay positional"
    extra = [n for n, has_default, _ in ours[len(wanted):] if not has_default]
    assert not extra, f"{name}: parameters added after RLinf's need defaults: {extra}"


def test_func_result_consume_duration():
    """RLinf's ``WorkerGroupFuncResult.consume_duration(reduction_type="max")`` and ``WorkerGroup._close()``."""
    import inspect

    assert list(inspect.signature(scheduler.WorkerGroupFuncResult.consume_duration).parameters) == [
        "self", "reduction_type"]
    assert callable(scheduler.WorkerGroup._close)


def test_a_changed_signature_is_caught():
    """The check itself: a dropped, reordered or undefaulted parameter fails."""
    def rlinf_like(data, split_sizes): ...
    def reordered(split_sizes, data): ...
    def added(data, split_sizes, extra): ...

    theirs = ["data", "split_sizes"]
    assert [n for n, *_ in _ours("function", rlinf_like)] == theirs
    assert [n for n, *_ in _ours("function", reordered)] != theirs
    assert not _ours("function", added)[2][1]  # 'extra' has no default: refused by the rule above


class _Spawned(scheduler.Worker):
    def __init__(self, parent, world_size, rank):
        super().__init__(parent_address=parent, world_size=world_size, rank=rank)  # as RLinf's spawned schedulers


def test_worker_started_by_a_worker_takes_rlinf_identity_arguments():
    w = _Spawned(scheduler.WorkerAddress("rollout", 1), 4, 2)
    assert (w.worker_address.get_name(), w._rank, w._world_size) == ("rollout:1:2", 2, 4)
    assert w.worker_group_name == "rollout:1" and w.worker_info.group_world_size == 4
    with pytest.raises(ValueError, match="rank 4 and world_size 4"):
        _Spawned(scheduler.WorkerAddress("rollout", 1), 4, 4)
    with pytest.raises(TypeError, match="parent_address must be a WorkerAddress"):
        _Spawned("rollout:1", 4, 0)


def test_worker_info_rlinf_fields_default():
    info = scheduler.WorkerInfo(address=scheduler.WorkerAddress("g", 0), rank=0, node_id=0, gpu_id=None, node_ip="x")
    assert (info.accelerator_model, info.accelerator_rank, info.node_port, info.hardware_infos) == ("", -1, 0, [])
