"""Group route binding: which rollout worker serves which env worker's requests.

RLinf's ``GroupRouteBinding`` and ``balanced_group_id`` (``rlinf.scheduler.worker.routing``).
With binding on, the env ranks are cut into ``rollout_world_size`` contiguous groups as
even as can be (the first ``env_world_size % rollout_world_size`` groups hold one more
rank), and every request and reply of group ``g`` travels under the channel key
``"grp{g}"``, so rollout rank ``g`` serves exactly the env ranks of group ``g``.  With
binding off, ``route_key`` is ``None``: every request goes to the shared default queue.
Binding needs decoupled mode (each rollout worker reading its own key); asking for it
without decoupled mode raises ``ValueError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["GroupRouteBinding", "balanced_group_id"]

ROUTE_KEY_PREFIX = "grp"


def _check_sizes(env_world_size: int, rollout_world_size: int) -> None:
    for name, value in (("env_world_size", env_world_size), ("rollout_world_size", rollout_world_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def _check_rank(name: str, rank: int, world_size: int) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"{name} must be an int in [0, {world_size}), got {rank!r}")


def balanced_group_id(env_rank: int, env_world_size: int, rollout_world_size: int) -> int:
    """Return the group (= the rollout rank) that env rank ``env_rank`` belongs to.

    The env ranks are split into ``rollout_world_size`` contiguous groups whose sizes
    differ by at most one, larger groups first: 4 env ranks over 3 rollouts give groups
    ``[0, 0, 1, 2]``.  Every rollout rank gets at least one env rank.

    Args:
        env_rank: rank of the env worker, in ``[0, env_world_size)``.
        env_world_size: number of env workers.
        rollout_world_size: number of rollout workers (groups).

    Raises:
        ValueError: a size below 1, a rank out of range, or fewer env workers than rollout
            workers (a group would be empty; the message says ``env_world_size >= rollout_world_size``).
    """
    _check_sizes(env_world_size, rollout_world_size)
    if env_world_size < rollout_world_size:
        raise ValueError(
            f"group route binding needs env_world_size >= rollout_world_size so that no rollout group is empty, "
            f"got env_world_size={env_world_size}, rollout_world_size={rollout_world_size}"
        )
    _check_rank("env_rank", env_rank, env_world_size)
    base, extra = divmod(env_world_size, rollout_world_size)
    big = extra * (base + 1)  # ranks held by the larger groups, which come first
    if env_rank < big:
        return env_rank // (base + 1)
    return extra + (env_rank - big) // base


def _check_mode(enabled: bool, decoupled_mode: bool) -> None:
    if enabled and not decoupled_mode:
        raise ValueError(
            "enable_group_route_binding=true requires the rollout to run with enable_decoupled_mode=true "
            "(each rollout worker must read its own group's key)"
        )


@dataclass(frozen=True)
class GroupRouteBinding:
    """The route of one env or rollout worker: its group and the channel key it uses.

    Build it with ``for_env`` or ``for_rollout``.  ``group_id`` is ``None`` when binding
    is off; ``route_key`` is then ``None`` too (the shared default queue), else ``"grp{group_id}"``.
    """

    enabled: bool
    group_id: Optional[int]

    @property
    def route_key(self) -> Optional[str]:
        """The channel key of this worker's requests and replies, or ``None`` when binding is off."""
        if not self.enabled or self.group_id is None:
            return None
        return f"{ROUTE_KEY_PREFIX}{self.group_id}"

    @classmethod
    def for_env(cls, *, enabled: bool, decoupled_mode: bool, env_rank: int, env_world_size: int,
                rollout_world_size: int) -> "GroupRouteBinding":
        """The binding of env rank ``env_rank``: its group is ``balanced_group_id(...)``.

        Args:
            enabled: whether group route binding is on.
            decoupled_mode: whether the rollout runs decoupled (required when ``enabled``).
            env_rank: this env worker's rank.
            env_world_size: number of env workers.
            rollout_world_size: number of rollout workers.

        Raises:
            ValueError: ``enabled`` without ``decoupled_mode``, or sizes/ranks ``balanced_group_id`` refuses.
        """
        _check_mode(enabled, decoupled_mode)
        if not enabled:
            return cls(enabled=False, group_id=None)
        return cls(enabled=True, group_id=balanced_group_id(env_rank, env_world_size, rollout_world_size))

    @classmethod
    def for_rollout(cls, *, enabled: bool, decoupled_mode: bool, rollout_rank: int, env_world_size: int,
                    rollout_world_size: int) -> "GroupRouteBinding":
        """The binding of rollout rank ``rollout_rank``: it serves group ``rollout_rank``.

        Args:
            enabled: whether group route binding is on.
            decoupled_mode: whether the rollout runs decoupled (required when ``enabled``).
            rollout_rank: this rollout worker's rank.
            env_world_size: number of env workers.
            rollout_world_size: number of rollout workers.

        Raises:
            ValueError: ``enabled`` without ``decoupled_mode``, a rank out of range, or fewer
                env workers than rollout workers.
        """
        _check_mode(enabled, decoupled_mode)
        if not enabled:
            return cls(enabled=False, group_id=None)
        _check_sizes(env_world_size, rollout_world_size)
        if env_world_size < rollout_world_size:
            balanced_group_id(0, env_world_size, rollout_world_size)  # raises with the shared message
        _check_rank("rollout_rank", rollout_rank, rollout_world_size)
        return cls(enabled=True, group_id=rollout_rank)
