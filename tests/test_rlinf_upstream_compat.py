"""Names RLinf programs import from the scheduler, used the way those programs use them.

Group route binding (``rlinf.scheduler.worker.routing``): an env/rollout pipeline whose
env ranks each talk to one rollout rank over a per-group channel key.
"""

import pytest

from rlinf.scheduler.worker import routing
from rlinf.scheduler.worker.routing import GroupRouteBinding, balanced_group_id


def _groups(envs: int, rollouts: int) -> list[int]:
    return [balanced_group_id(r, envs, rollouts) for r in range(envs)]


def test_groups_are_contiguous_even_and_larger_first():
    assert _groups(5, 2) == [0, 0, 0, 1, 1]
    assert _groups(7, 3) == [0, 0, 0, 1, 1, 2, 2]
    assert _groups(3, 3) == [0, 1, 2]
    assert _groups(6, 1) == [0] * 6
    for envs in range(1, 13):
        for rollouts in range(1, envs + 1):
            ids = _groups(envs, rollouts)
            sizes = [ids.count(g) for g in range(rollouts)]
            assert ids == sorted(ids) and min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
            assert sizes == sorted(sizes, reverse=True)


def test_more_rollouts_than_envs_and_bad_ranks_are_refused():
    with pytest.raises(ValueError, match="env_world_size >= rollout_world_size"):
        balanced_group_id(1, 3, 5)
    with pytest.raises(ValueError, match="env_rank"):
        balanced_group_id(4, 4, 2)
    with pytest.raises(ValueError, match="rollout_rank"):
        GroupRouteBinding.for_rollout(enabled=True, decoupled_mode=True, rollout_rank=2,
                                      env_world_size=4, rollout_world_size=2)


def test_every_env_request_reaches_the_rollout_that_serves_its_group():
    envs, rollouts = 6, 4
    served = {
        GroupRouteBinding.for_rollout(enabled=True, decoupled_mode=True, rollout_rank=r,
                                      env_world_size=envs, rollout_world_size=rollouts).route_key: r
        for r in range(rollouts)
    }
    assert sorted(served) == ["grp0", "grp1", "grp2", "grp3"]
    owners = [served[GroupRouteBinding.for_env(enabled=True, decoupled_mode=True, env_rank=e,
                                               env_world_size=envs, rollout_world_size=rollouts).route_key]
              for e in range(envs)]
    assert owners == [0, 0, 1, 1, 2, 3]


def test_binding_off_uses_the_shared_queue_and_needs_no_valid_sizes():
    env = GroupRouteBinding.for_env(enabled=False, decoupled_mode=True, env_rank=0,
                                    env_world_size=1, rollout_world_size=8)
    rollout = GroupRouteBinding.for_rollout(enabled=False, decoupled_mode=False, rollout_rank=5,
                                            env_world_size=1, rollout_world_size=8)
    assert env.route_key is None and rollout.route_key is None


@pytest.mark.parametrize("maker", ["for_env", "for_rollout"])
def test_binding_without_decoupled_mode_is_refused(maker):
    rank = {"for_env": {"env_rank": 0}, "for_rollout": {"rollout_rank": 0}}[maker]
    with pytest.raises(ValueError, match="enable_group_route_binding=true requires .*enable_decoupled_mode=true"):
        getattr(GroupRouteBinding, maker)(enabled=True, decoupled_mode=False, env_world_size=2,
                                          rollout_world_size=1, **rank)


def test_names_are_exported_where_rlinf_has_them():
    assert {"GroupRouteBinding", "balanced_group_id"} <= set(routing.__all__)
