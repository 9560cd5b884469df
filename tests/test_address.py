import pickle

import pytest

from rlinf.scheduler import WorkerAddress
from rlinf.scheduler.base.address import resolve_address


def test_names_and_navigation():
    a = WorkerAddress("group", [0, 1])
    assert a.get_name() == "group:0:1"
    assert a.rank == 1 and a.rank_path == [0, 1] and a.root_group_name == "group"
    assert a.get_parent_rank() == 0
    assert a.get_parent_address() == WorkerAddress("group", 0)
    assert WorkerAddress("group", 0).get_child_address(1) == a
    assert WorkerAddress.from_name("group:0:1") == a
    assert a.group_key == "group:0"
    assert WorkerAddress("g", 3).group_key == "g"


def test_value_semantics():
    a, b = WorkerAddress("g", 1), WorkerAddress("g", [1])
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert WorkerAddress("g", 0) < WorkerAddress("g", 1) < WorkerAddress("h", 0)
    assert pickle.loads(pickle.dumps(a)) == a


def test_resolve_rank_path():
    assert resolve_address("g", [0, 2]).get_name() == "g:0:2"
    assert resolve_address("g:0", 2).get_name() == "g:0:2"


@pytest.mark.parametrize("bad", ["", "a:b", " g", None, 3])
def test_bad_group_names(bad):
    with pytest.raises((TypeError, ValueError)):
        WorkerAddress(bad, 0)


@pytest.mark.parametrize("bad", [-1, "1", 1.0, [0, -2], True])
def test_bad_ranks(bad):
    with pytest.raises((TypeError, ValueError)):
        WorkerAddress("g", bad)


def test_parent_rank_of_a_root_worker_is_0_as_in_rlinf_and_a_bad_name_is_an_error():
    assert WorkerAddress("g", 3).get_parent_rank() == 0 and WorkerAddress("g").get_parent_rank() == 0
    assert WorkerAddress("g", 3).get_child_address(1).get_parent_rank() == 3
    assert WorkerAddress.from_parent_name_rank("g:3", 1) == WorkerAddress("g", [3, 1])
    with pytest.raises(ValueError):
        WorkerAddress.from_name("g:x")
