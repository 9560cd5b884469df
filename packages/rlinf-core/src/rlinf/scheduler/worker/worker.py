"""``Worker``: the base class of every user worker.

A subclass runs in its own process, started by a launcher as part of a
``WorkerGroup``.  It knows its rank, world size, address and placement, has
``MASTER_ADDR``/``RANK``/... set for ``torch.distributed``, times its code with
``worker_timer``, and talks to any other worker with ``send``/``recv`` and
channels.  Communication is delegated to the process's communicator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from ..plugins import accelerator
from ..base import context, timing, worker_logging
from ..base.address import RankPath, WorkerAddress
from ..base.info import WorkerInfo
from .routed_exchange import RoutedExchange
from .worker_utilities import WorkerUtilities

if TYPE_CHECKING:
    from ..runtime.group import WorkerGroup
    from ..plugins.options import CollectiveGroupOptions


_api = None
#: ``(create_from_worker, connect)`` of the channel API, which sits above workers: registered by
#: ``rlinf.scheduler.channel`` when it is imported (``provide_channels``)
_channels = None


def provide_channels(create_from_worker, connect) -> None:
    """Register the channel API that ``Worker.create_channel`` and ``connect_channel`` call."""
    global _channels
    _channels = (create_from_worker, connect)


def _channel_api() -> tuple:
    if _channels is None:
        raise RuntimeError("channels are not loaded in this process: import rlinf.scheduler.channel first")
    return _channels


def _p2p():
    """The point-to-point module, imported on first use (driver processes never need it)."""
    global _api
    if _api is None:
        from ..messaging.p2p import api

        _api = api
    return _api


class Worker(RoutedExchange, WorkerUtilities):
    """A remote process that runs the methods of a worker group."""

    #: RLinf's handle on its manager process, which RLinf code passes to ``get_group_world_size``; there is
    #: no manager process here, and ``None`` makes the routing helpers ask this process's cluster
    _manager_proxy = None

    #: decorator that times a method under a tag: ``@Worker.timer("train_step")``
    timer = staticmethod(timing.timer)
    """Decorator that records each call's wall time under a tag (``timing.timer``).

    ``@Worker.timer("tag")``, ``@Worker.timer()`` and a bare ``@Worker.timer``
    all work, on plain and ``async`` methods; without a tag the method's name
    is used.  Calls under one tag add up; the group call's result reports
    them (``WorkerGroupFuncResult.consume_duration``) and
    ``pop_execution_time(tag)`` drains them.

    Args:
        tag (str | None): the name the time is recorded under (default: the function's name).

    Raises:
        ValueError: ``tag`` is not a non-empty str.

    Example:
        ```python
        class Trainer(Worker):
            @Worker.timer("train_step")
            def train(self, batch):
                ...
        ```
    """

    # -- accelerator (RLinf class attributes; valid in the driver and every worker) --
    @accelerator.lazy_class_attribute
    def torch_platform():
        """The torch module of this process's accelerator (``torch.cuda``); ``None`` without one, as in RLinf."""
        return accelerator.torch_platform()

    @accelerator.lazy_class_attribute
    def torch_device_type():
        """``"cuda"``, ``"npu"``, ...: what ``torch.device(...)`` takes for this process's accelerator; ``None``
        without one, as in RLinf."""
        return accelerator.detect()[1]

    @accelerator.lazy_class_attribute
    def accelerator_type():
        """``"NV_GPU"`` or ``"NO_ACCEL"``."""
        return accelerator.detect()[0]

    @property
    def has_accelerator(self) -> bool:
        """Whether this worker was given an accelerator (RLinf's ``Worker.has_accelerator``)."""
        return accelerator.detect()[0] != "NO_ACCEL"

    def __init__(self, parent_address: Optional[WorkerAddress] = None, world_size: Optional[int] = None,
                 rank: Optional[int] = None):
        """Set up the worker's identity: rank, world size, address, info and logger.

        A worker launched in a group takes all of it from its launcher; subclasses call
        ``super().__init__()``.  RLinf's optional arguments describe a worker that another worker started
        itself (a process it spawned, as RLinf's SGLang/vLLM schedulers are): given all three, this
        worker is rank ``rank`` of ``world_size`` with address ``parent_address.get_child_address(rank)``,
        on its parent's node when built inside a worker process.  Such a worker is an identity for
        logging and ``worker_address``; it is not registered for ``send``/``recv``.  Given only some of
        them, they are ignored, as in RLinf (a launched worker keeps its launcher's identity).

        Args:
            parent_address: the address of the worker that started this one.
            world_size: how many such workers the parent started.
            rank: this worker's rank among them.

        Raises:
            TypeError: ``parent_address`` is not a ``WorkerAddress``, or ``world_size``/``rank`` not ints.
            ValueError: ``world_size < 1`` or ``rank`` outside ``0..world_size-1``.
        """
        own = parent_address is not None and world_size is not None and rank is not None
        if own:
            if not isinstance(parent_address, WorkerAddress):
                raise TypeError(f"parent_address must be a WorkerAddress, got {type(parent_address).__name__}")
            for name, value in (("world_size", world_size), ("rank", rank)):
                if isinstance(value, bool) or not isinstance(value, int):
                    raise TypeError(f"{name} must be an int, got {value!r}")
            if world_size < 1 or not 0 <= rank < world_size:
                raise ValueError(f"rank {rank} and world_size {world_size}: need 0 <= rank < world_size")
        ctx = context.current()
        if own:
            import dataclasses
            import os

            address = parent_address.get_child_address(rank)
            self._rank, self._world_size, self._worker_address = rank, world_size, address
            base = ctx.info if ctx is not None else WorkerInfo(
                address=address, rank=rank, node_id=0, gpu_id=None, node_ip="127.0.0.1")
            self._worker_info = dataclasses.replace(base, address=address, rank=rank, group_world_size=world_size,
                                                    pid=os.getpid())
        elif ctx is None:  # built outside a group (a unit test, the driver): a group of one
            address = WorkerAddress(f"Local_{type(self).__name__}", 0)
            self._rank, self._world_size = 0, 1
            self._worker_address = address
            self._worker_info = WorkerInfo(address=address, rank=0, node_id=0, gpu_id=None, node_ip="127.0.0.1")
        else:
            self._rank, self._world_size = ctx.rank, ctx.world_size
            self._worker_address = ctx.address
            self._worker_info = ctx.info
        self._group_name = self._worker_address.group_key
        self._logger = worker_logging.worker_logger(self._worker_address.get_name())

    # -- group creation ---------------------------------------------------------
    @classmethod
    def create_group(cls, *args, **kwargs) -> "WorkerGroup":
        """An unlaunched group of this class; ``.launch(cluster, ...)`` starts it.

        Nothing starts yet: the arguments are kept and every worker of the
        group is constructed with them when the group launches.

        Args:
            *args (Any): positional arguments for each worker's ``__init__``.
            **kwargs (Any): keyword arguments for each worker's ``__init__``.

        Returns:
            A ``WorkerGroup``; ``launch`` starts its workers and returns it.

        Example:
            ```python
            group = MyWorker.create_group(lr=1e-3).launch(
                cluster, placement_strategy=PackedPlacementStrategy(0, 1), name="actor"
            )
            ```
        """
        from ..runtime.group import WorkerGroup

        return WorkerGroup(cls, args, kwargs)

    # -- identity ---------------------------------------------------------------
    @property
    def worker_address(self) -> WorkerAddress:
        """This worker's address: its group's name and its rank path (``WorkerAddress``)."""
        return self._worker_address

    @property
    def worker_info(self) -> WorkerInfo:
        """Where this worker runs: node, IP, pid, accelerator and ranks (``WorkerInfo``)."""
        return self._worker_info

    @property
    def worker_group_name(self) -> str:
        """The name of the group this worker belongs to, as given to ``launch(name=...)``."""
        return self._group_name

    # -- timing -------------------------------------------------------------------
    def worker_timer(self, tag: Optional[str] = None):
        """Context manager recording the body's wall time under ``tag``.

        Repeated tags add up; the times travel back with the group call's
        result (``WorkerGroupFuncResult.consume_duration``) and stay poppable
        with ``pop_execution_time``.

        Args:
            tag: the name the time is recorded under (default: the name of the
                function that opens the timer).

        Raises:
            ValueError: ``tag`` is given but is not a non-empty str.

        Example:
            ```python
            with self.worker_timer("rollout"):
                self.generate()
            ```
        """
        return timing.worker_timer(tag, _depth=2)

    def pop_execution_time(self, tag: str) -> float:
        """Seconds recorded under ``tag`` in this worker since it was last popped.

        Args:
            tag: a tag of ``worker_timer``/``timer``.

        Returns:
            The seconds summed over every timing of ``tag`` since the last pop; the tag is forgotten.

        Raises:
            ValueError: nothing was recorded under ``tag`` since it was last popped.
        """
        return timing.pop_execution_time(tag)

    def pop_execution_times(self) -> dict:
        """All timings recorded in this worker since the last pop, ``{tag: seconds}``; clears them."""
        return timing.pop_execution_times()

    def _rlinf_trace(self, op: str, drain: bool = False):
        """Tracing control from the driver (switch on/off, clock, collect): see ``tracing.collect``."""
        from ..tracing import collect

        return collect.handle(op, drain)

    # -- logging ------------------------------------------------------------------
    #: the worker's logger (``Worker.logger`` on the class: the logger all workers share)
    logger = worker_logging.LoggerAttribute()

    def log_debug(self, msg: str) -> None:
        """Log ``msg`` at DEBUG level with this worker's name and rank.

        Args:
            msg: the message; shown when ``RLINF_LOG_LEVEL`` is ``DEBUG``.
        """
        self._logger.debug(msg, stacklevel=2)

    def log_info(self, msg: str) -> None:
        """Log ``msg`` at INFO level with this worker's name and rank.

        Args:
            msg: the message; it reaches the driver's output (and the worker's
                file under ``RLINF_DISTRIBUTED_LOG_DIR`` when set).
        """
        self._logger.info(msg, stacklevel=2)

    def log_warning(self, msg: str) -> None:
        """Log ``msg`` at WARNING level with this worker's name and rank.

        Args:
            msg: the message.
        """
        self._logger.warning(msg, stacklevel=2)

    def log_error(self, msg: str) -> None:
        """Log ``msg`` at ERROR level with this worker's name and rank (raises nothing).

        Args:
            msg: the message.
        """
        self._logger.error(msg, stacklevel=2)

    def log_on_first_rank(self, msg: str) -> None:
        """Log ``msg`` at INFO level on rank 0 only; the other ranks do nothing.

        Args:
            msg: the message.
        """
        if self._rank == 0:
            self._logger.info(msg, stacklevel=2)

    def log_on_last_rank(self, msg: str) -> None:
        """Log ``msg`` at INFO level on the last rank (``world_size - 1``) only.

        Args:
            msg: the message.
        """
        if self._rank == self._world_size - 1:
            self._logger.info(msg, stacklevel=2)

    # -- point-to-point -----------------------------------------------------------
    def send(
        self,
        object: Any,
        dst_group_name: str,
        dst_rank: RankPath,
        async_op: bool = False,
        options: Optional["CollectiveGroupOptions"] = None,
        timeout: Optional[float] = None,
    ):
        """Send any picklable object to one worker; tensors inside travel as raw bytes.

        The receiver calls ``recv(this worker's group name, this worker's rank)``;
        messages between one pair of workers arrive in the order sent.

        Args:
            object: what to send: any picklable object (tensors, nested in
                dicts/lists/tuples or not, are sent without pickling).
            dst_group_name: the receiver's group name.
            dst_rank: the receiver's rank in that group (an int, or a tuple rank path).
            async_op: return an ``AsyncWork`` at once instead of waiting; its
                ``wait()``/``async_wait()`` give the result.
            options: a ``CollectiveGroupOptions`` tuning the link (transport,
                device path); ``None``: the defaults.
            timeout: seconds to wait; ``None``: the configured default
                (``RLINF_TIMEOUT``), never an unbounded wait.

        Returns ``None``, or with ``async_op`` an ``AsyncWork``.

        Raises:
            CommTimeoutError: the peer did not take part within ``timeout``.
            PeerDiedError: the peer's process died during the exchange.
            CommunicationError: the peer cannot be reached or the link failed.
            UnpicklableError: a part of ``object`` cannot be pickled (the message names it).

        Example:
            ```python
            self.send({"step": 3}, "learner", 0)    # in the rollout worker
            data = self.recv("rollout", 0)          # in learner rank 0
            ```
        """
        return _p2p().send(object, dst_group_name, dst_rank, async_op=async_op, options=options, timeout=timeout)

    def recv(
        self,
        src_group_name: str,
        src_rank: RankPath,
        async_op: bool = False,
        options: Optional["CollectiveGroupOptions"] = None,
        timeout: Optional[float] = None,
    ):
        """Receive the next object the source sent to this worker with ``send``.

        Args:
            src_group_name: the sender's group name.
            src_rank: the sender's rank in that group (an int, or a tuple rank path).
            async_op: return an ``AsyncWork`` at once instead of waiting; its
                ``wait()``/``async_wait()`` give the result.
            options: a ``CollectiveGroupOptions`` tuning the link (transport,
                device path); ``None``: the defaults.
            timeout: seconds to wait; ``None``: the configured default
                (``RLINF_TIMEOUT``), never an unbounded wait.

        Returns the object, or with ``async_op`` an ``AsyncWork`` whose ``wait()`` returns it.

        Raises:
            CommTimeoutError: the peer did not take part within ``timeout``.
            PeerDiedError: the peer's process died during the exchange.
            CommunicationError: the peer cannot be reached or the link failed.
        """
        return _p2p().recv(src_group_name, src_rank, async_op=async_op, options=options, timeout=timeout)

    def send_tensor(
        self,
        tensor,
        dst_group_name: str,
        dst_rank: RankPath,
        async_op: bool = False,
        options: Optional["CollectiveGroupOptions"] = None,
        timeout: Optional[float] = None,
    ):
        """Send one contiguous tensor with no metadata; the receiver preallocates.

        The receiver calls ``recv_tensor`` with a tensor of the same shape and dtype.

        Args:
            tensor (torch.Tensor): a contiguous ``torch.Tensor`` (CPU or accelerator).
            dst_group_name: the receiver's group name.
            dst_rank: the receiver's rank in that group (an int, or a tuple rank path).
            async_op: return an ``AsyncWork`` at once instead of waiting; its
                ``wait()``/``async_wait()`` give the result.
            options: a ``CollectiveGroupOptions`` tuning the link (transport,
                device path); ``None``: the defaults.
            timeout: seconds to wait; ``None``: the configured default
                (``RLINF_TIMEOUT``), never an unbounded wait.

        Returns ``None``, or with ``async_op`` an ``AsyncWork``.

        Raises:
            CommTimeoutError: the peer did not take part within ``timeout``.
            PeerDiedError: the peer's process died during the exchange.
            CommunicationError: the peer cannot be reached, the link failed, or
                no installed transport serves ``tensor``'s device.
            TypeError: ``tensor`` is not a ``torch.Tensor``.
            ValueError: ``tensor`` is not contiguous.
        """
        return _p2p().send_tensor(tensor, dst_group_name, dst_rank, async_op=async_op, options=options, timeout=timeout)

    def recv_tensor(
        self,
        tensor,
        src_group_name: str,
        src_rank: RankPath,
        async_op: bool = False,
        options: Optional["CollectiveGroupOptions"] = None,
        timeout: Optional[float] = None,
    ):
        """Fill ``tensor`` in place with the next tensor the source sent with ``send_tensor``.

        Args:
            tensor (torch.Tensor): a preallocated ``torch.Tensor`` of the sent tensor's size, filled in place.
            src_group_name: the sender's group name.
            src_rank: the sender's rank in that group (an int, or a tuple rank path).
            async_op: return an ``AsyncWork`` at once instead of waiting; its
                ``wait()``/``async_wait()`` give the result.
            options: a ``CollectiveGroupOptions`` tuning the link (transport,
                device path); ``None``: the defaults.
            timeout: seconds to wait; ``None``: the configured default
                (``RLINF_TIMEOUT``), never an unbounded wait.

        Returns ``None`` once ``tensor`` is filled, or with ``async_op`` an ``AsyncWork``.

        Raises:
            CommTimeoutError: the peer did not take part within ``timeout``.
            PeerDiedError: the peer's process died during the exchange.
            CommunicationError: the peer cannot be reached, the link failed, or
                no installed transport serves ``tensor``'s device.
            TypeError: ``tensor`` is not a ``torch.Tensor``.
            ValueError: ``tensor`` is not contiguous.
        """
        return _p2p().recv_tensor(tensor, src_group_name, src_rank, async_op=async_op, options=options, timeout=timeout)

    def broadcast(
        self,
        object: Any = None,
        groups: Optional[list] = None,
        src: Optional[tuple] = None,
        async_op: bool = False,
        options: Optional["CollectiveGroupOptions"] = None,
        timeout: Optional[float] = None,
        out: Any = None,
        share_memory: bool = False,
    ):
        """Every listed worker calls this; the source's object is returned everywhere.

        Args:
            object: what the source broadcasts (ignored on the other workers).
            groups: the participants, ``[(group_name, ranks), ...]``; ``ranks``
                is an int, a tuple rank path or a list of them.
            src: the source, ``(group_name, rank)``; default: the first listed worker.
            async_op: return an ``AsyncWork`` at once instead of waiting; its
                ``wait()``/``async_wait()`` give the result.
            options: a ``CollectiveGroupOptions`` tuning the link (transport,
                device path); ``None``: the defaults.
            timeout: seconds to wait; ``None``: the configured default
                (``RLINF_TIMEOUT``), never an unbounded wait.
            out: (receivers) a tensor or a dict/list/tuple of tensors to fill in
                place and return; shapes and dtypes are checked first.
            share_memory: (receivers with ``out``) on the source's host, the
                memory behind ``out``'s tensors moves onto the copy the source
                wrote instead of being copied into (see
                ``rlinf.scheduler.messaging.p2p.api.broadcast``).

        Returns the source's object (or ``out``, filled), or with ``async_op`` an ``AsyncWork``.

        Raises:
            ValueError: ``groups`` names no worker, or ``src``/an entry is malformed.
            TypeError: ``options`` is not a ``CollectiveGroupOptions``, or ``share_memory`` not a bool.
            CommTimeoutError: a participant did not take part within ``timeout``.
            PeerDiedError: a participant's process died during the broadcast.

        Example:
            ```python
            weights = self.broadcast(weights, groups=[("actor", [0, 1, 2, 3])], src=("actor", 0))
            ```
        """
        return _p2p().broadcast(object, groups=groups, src=src, async_op=async_op, options=options, timeout=timeout,
                                out=out, share_memory=share_memory)

    # -- channels -----------------------------------------------------------------
    def create_channel(self, name: Optional[str] = None, node_id: Optional[int] = None, maxsize: int = 0, **aliases):
        """Create (or connect to) the FIFO channel ``name`` hosted on node ``node_id``.

        Args:
            name: the channel's name, unique in the cluster.
            node_id: the node whose host process holds the items (default 0).
            maxsize: the most items each key's queue holds; 0: unbounded.
            **aliases (Any): RLinf's spellings and options: ``channel_name`` (for
                ``name``), ``node_rank`` (for ``node_id``), ``local=True`` (an
                in-process channel), ``distributed=True`` (one host per node).

        Returns the ``Channel``.

        Raises:
            TypeError: no name, or an unknown keyword argument.
            ValueError: a bad ``name``, ``maxsize`` or ``node_id``.
            CommunicationError: another process is creating the channel and did not finish in time.

        Example:
            ```python
            channel = self.create_channel("rollouts", maxsize=64)
            channel.put(sample, weight=1)
            ```
        """
        return _channel_api()[0](name, node_id, maxsize, aliases)

    def connect_channel(self, name: Optional[str] = None, **aliases):
        """Connect to the existing channel ``name``, waiting a while for it to be created.

        Args:
            name: the channel's name.
            **aliases (Any): ``channel_name`` (RLinf's spelling of ``name``) and
                ``timeout`` (seconds to wait for the channel to appear).

        Returns the ``Channel``.

        Raises:
            CommunicationError: no channel of that name appeared in time.
        """
        return _channel_api()[1](aliases.pop("channel_name", name), **aliases)
