"""Hierarchical worker names.

A worker is named by the name of its root group plus a path of ranks: rank 2
of group ``"actor"`` is ``"actor:2"``, and child 1 of that worker (in a group the
worker launched itself) is ``"actor:2:1"``.  Every worker in a cluster can be
reached through such a name, so the address is the unit that point-to-point
communication and the group registry key on.
"""

from __future__ import annotations

from typing import Sequence, Union

RankPath = Union[int, Sequence[int]]

_SEP = ":"


def _normalize_ranks(ranks: RankPath | None) -> tuple[int, ...]:
    if ranks is None:
        return ()
    if isinstance(ranks, bool):
        raise TypeError(f"a rank must be an int, got {ranks!r}")
    if isinstance(ranks, int):
        ranks = (ranks,)
    try:
        path = tuple(ranks)
    except TypeError:
        raise TypeError(f"ranks must be an int or a sequence of ints, got {ranks!r}") from None
    for r in path:
        if isinstance(r, bool) or not isinstance(r, int):
            raise TypeError(f"a rank must be an int, got {r!r} in {ranks!r}")
        if r < 0:
            raise ValueError(f"a rank must be >= 0, got {r} in {ranks!r}")
    return path


def validate_group_name(name: str) -> str:
    """Return ``name`` if it can serve as a root group name, else raise."""
    if not isinstance(name, str):
        raise TypeError(f"a group name must be a str, got {type(name).__name__}")
    if not name or _SEP in name or name != name.strip():
        raise ValueError(
            f"invalid group name {name!r}: it must be non-empty, have no surrounding "
            f"whitespace and contain no {_SEP!r}"
        )
    return name


#: the group that hosts channel ``name`` is named ``CHANNEL_HOST_PREFIX + name``
CHANNEL_HOST_PREFIX = "Channel."


def describe_running(names) -> str:
    """The running groups as a person reads them: the user's groups, then the channels (whose hosts are
    groups only inside rlinf), e.g. ``groups ['actor', 'rollout'], channels ['queue']``."""
    names = sorted(names)
    groups = [n for n in names if not n.startswith(CHANNEL_HOST_PREFIX)]
    channels = [n[len(CHANNEL_HOST_PREFIX):] for n in names if n.startswith(CHANNEL_HOST_PREFIX)]
    return f"groups {groups}" + (f", channels {channels}" if channels else "")


class WorkerAddress:
    """The cluster-wide name of one worker: a root group name and a rank path.

    Rank 2 of group ``"actor"`` is ``WorkerAddress("actor", 2)``, named
    ``"actor:2"``; a worker that rank 2 started as its rank 0 is
    ``WorkerAddress("actor", [2, 0])``, ``"actor:2:0"``.  Addresses compare,
    sort and hash by value.

    Args:
        root_group_name: the name of the top-level group.
        ranks: the rank path: an int, a list/tuple of ints, or None (the group itself).

    Raises:
        ValueError: an invalid group name or a negative rank.
        TypeError: a rank that is not an int.

    Example:
        ```python
        >>> WorkerAddress("actor", 2).get_child_address(0).get_name()
        'actor:2:0'
        ```
    """

    __slots__ = ("_root", "_ranks", "_name")

    def __init__(self, root_group_name: str, ranks: RankPath | None = None):
        self._root = validate_group_name(root_group_name)
        self._ranks = _normalize_ranks(ranks)
        self._name = _SEP.join([self._root, *map(str, self._ranks)])

    # -- construction -----------------------------------------------------
    @classmethod
    def from_name(cls, name: str) -> "WorkerAddress":
        """Parse a name such as ``"group:0:1"`` back into an address.

        Args:
            name: what ``get_name()`` returned.

        Raises:
            ValueError: ``name`` is empty, not a str, or has ranks that are not integers.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"invalid worker address name {name!r}")
        root, *parts = name.split(_SEP)
        try:
            ranks = [int(p) for p in parts]
        except ValueError:
            raise ValueError(f"invalid worker address name {name!r}: ranks must be integers") from None
        return cls(root, ranks)

    @classmethod
    def from_parent_name(cls, parent_name: str, rank: int) -> "WorkerAddress":
        """The address of rank ``rank`` among the workers that ``parent_name`` started.

        Args:
            parent_name: the parent worker's name (``get_name()``).
            rank: the child's rank.

        Raises:
            ValueError: ``parent_name`` is not a valid address name.
        """
        return cls.from_name(parent_name).get_child_address(rank)

    @classmethod
    def from_parent_name_rank(cls, parent_name: str, rank: int) -> "WorkerAddress":
        """RLinf's name for ``from_parent_name``: the address of rank ``rank`` among ``parent_name``'s workers.

        Args:
            parent_name: the parent worker's name (``get_name()``).
            rank: the child's rank.

        Raises:
            ValueError: ``parent_name`` is not a valid address name.
        """
        return cls.from_parent_name(parent_name, rank)

    # -- attributes -------------------------------------------------------
    @property
    def root_group_name(self) -> str:
        """The name of the top-level group this address lies in."""
        return self._root

    @property
    def rank_path(self) -> list[int]:
        """The ranks from the root group down to this worker (a copy; ``[]`` for a group)."""
        return list(self._ranks)

    @property
    def rank(self) -> int:
        """The rank within the worker's own group (the last element of the path)."""
        if not self._ranks:
            raise ValueError(f"address {self.get_name()!r} names a group, not a worker")
        return self._ranks[-1]

    @property
    def group_key(self) -> str:
        """Name of the group this worker belongs to (the address minus its last rank)."""
        return self.get_parent_address().get_name() if len(self._ranks) > 1 else self._root

    # -- navigation -------------------------------------------------------
    def get_name(self) -> str:
        """The address as one string, ``"group:rank:rank..."``, as ``from_name`` reads it."""
        return self._name

    def get_parent_rank(self) -> int:
        """The rank of the worker that started this one (the second-to-last of the path).

        Returns:
            That rank, or 0 for a worker no other worker started (a group's own rank), as in RLinf:
            RLinf's SGLang and vLLM schedulers print it as their data-parallel rank either way.
        """
        return self._ranks[-2] if len(self._ranks) > 1 else 0

    def get_parent_address(self) -> "WorkerAddress":
        """The address with the last rank removed: the parent worker's, or the root group's.

        Raises:
            ValueError: this address names a group, which has no parent.
        """
        if not self._ranks:
            raise ValueError(f"group address {self.get_name()!r} has no parent")
        return WorkerAddress(self._root, self._ranks[:-1])

    def get_child_address(self, rank: int) -> "WorkerAddress":
        """The address of rank ``rank`` among the workers this one started.

        Args:
            rank: the child's rank (an int, or a rank path appended as a whole).
        """
        return WorkerAddress(self._root, self._ranks + _normalize_ranks(rank))

    # -- value semantics --------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WorkerAddress):
            return NotImplemented
        return self._root == other._root and self._ranks == other._ranks

    def __lt__(self, other: "WorkerAddress") -> bool:
        if not isinstance(other, WorkerAddress):
            return NotImplemented
        return (self._root, self._ranks) < (other._root, other._ranks)

    def __le__(self, other: "WorkerAddress") -> bool:
        return self == other or self < other

    def __gt__(self, other: "WorkerAddress") -> bool:
        if not isinstance(other, WorkerAddress):
            return NotImplemented
        return other < self

    def __ge__(self, other: "WorkerAddress") -> bool:
        return self == other or self > other

    def __hash__(self) -> int:
        return hash((self._root, self._ranks))

    def __reduce__(self):
        return (WorkerAddress, (self._root, list(self._ranks)))

    def __repr__(self) -> str:
        return f"WorkerAddress({self.get_name()!r})"

    __str__ = get_name


def resolve_address(group_name: str, rank: RankPath) -> WorkerAddress:
    """Address of ``rank`` (an int or a rank path) in the group named ``group_name``.

    ``group_name`` may itself be a worker address name (``"g:0"``), in which case
    ``rank`` indexes that worker's child group.
    """
    base = WorkerAddress.from_name(group_name)
    path = _normalize_ranks(rank)
    if not path:
        raise ValueError(f"no rank given for group {group_name!r}")
    return WorkerAddress(base.root_group_name, base.rank_path + list(path))
