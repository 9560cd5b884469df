"""RLinf's ``dynamic_scheduler.utils``: channel and queue names, valid data-parallel sizes, schedule records."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto
from typing import Any, Optional


class DynamicSchedulerConfigError(ValueError, AssertionError):
    """A config the dynamic scheduler cannot use (an ``AssertionError`` in RLinf, a ``ValueError`` too here)."""


def _field(cfg: Any, dotted: str):
    node = cfg
    for part in dotted.split("."):
        try:
            node = node[part] if isinstance(node, dict) else getattr(node, part)
        except (KeyError, AttributeError):
            raise DynamicSchedulerConfigError(f"the config has no {dotted!r}") from None
    return node


def get_valid_dp_sizes(cfg: Any, total_gpus: int, model_parallel_size_with_cp: int) -> list[int]:
    """The actor's data-parallel sizes that fit the batch: ``dp`` such that ``dp * group_size`` divides the
    per-iteration batch ``rollout_batch_size * group_size / n_minibatches``, up to ``total_gpus // mp``.

    Args:
        cfg: RLinf's config (``algorithm.group_size``, ``algorithm.n_minibatches``, ``data.rollout_batch_size``;
            an OmegaConf object or nested dicts).
        total_gpus: the accelerators the components share.
        model_parallel_size_with_cp: the actor's model-parallel size (times context parallelism).

    Raises:
        DynamicSchedulerConfigError: a missing field, or a global batch the minibatch count does not divide.
    """
    group_size = int(_field(cfg, "algorithm.group_size"))
    n_minibatches = int(_field(cfg, "algorithm.n_minibatches"))
    global_batch = int(_field(cfg, "data.rollout_batch_size")) * group_size
    if n_minibatches <= 0 or global_batch % n_minibatches:
        raise DynamicSchedulerConfigError(
            f"global_step_batch_size={global_batch} must be divisible by train_iter={n_minibatches}")
    if model_parallel_size_with_cp <= 0:
        raise DynamicSchedulerConfigError(f"model_parallel_size_with_cp must be positive, got {model_parallel_size_with_cp}")
    per_iter = global_batch // n_minibatches
    return [dp for dp in range(1, total_gpus // model_parallel_size_with_cp + 1) if per_iter % (dp * group_size) == 0]


def get_scheduler_channel(component: str, instance_id: int = 0) -> str:
    """The name of the channel the scheduler talks to one instance of a component on."""
    return f"dynamic_scheduler_channel_for_{component}_{instance_id}"


def get_scheduler_request_queue() -> str:
    """The name of the scheduler's request queue."""
    return "dynamic_scheduler_request_queue"


def get_scheduler_response_queue() -> str:
    """The name of the scheduler's response queue."""
    return "dynamic_scheduler_response_queue"


@dataclass
class RolloutReport:
    """A rollout instance's progress report."""

    total_requests: Optional[int] = None
    completed_requests: Optional[int] = None
    total_tasks: Optional[int] = None
    completed_tasks: Optional[int] = None
    running_tasks: Optional[int] = None
    timestamp: Optional[float] = None


class RolloutAction(Enum):
    """What the scheduler asks of a rollout instance."""

    Default = auto()
    Report = auto()
    Migrate_In = auto()
    Migrate_Out = auto()
    Finish = auto()
    Wait_For_Finish = auto()
    Offloaded = auto()


@dataclass
class RolloutScheduleInfo:
    """One message between the scheduler and a rollout instance."""

    instance_id: int = -1
    data: Optional[list] = None
    report: Optional[RolloutReport] = None
    action: RolloutAction = RolloutAction.Default


class _DynamicSchedulerState:
    """The accelerators free and each component's instance count and model-parallel size."""

    def __init__(self, cfg: Any, total_gpus: int, component_managers: dict):
        self.total_gpus = total_gpus
        self.available_gpu_num = 0
        self.component_managers = component_managers
        self.components_instance_num = {c: m.current_instance_num for c, m in component_managers.items()}
        self.components_model_parallel_size = {c: m.model_parallel_size for c, m in component_managers.items()}
        self.actor_valid_dp_sizes = get_valid_dp_sizes(cfg, total_gpus, self.components_model_parallel_size["actor"])

    def reset(self) -> None:
        self.available_gpu_num = 0
        for component, manager in self.component_managers.items():
            self.components_instance_num[component] = manager.current_instance_num

    def update(self, component: str, released_gpu_num: int, incremental_gpu_num: int) -> None:
        if released_gpu_num and incremental_gpu_num:
            raise DynamicSchedulerConfigError("a component either releases or takes accelerators, not both")
        self.available_gpu_num += released_gpu_num - incremental_gpu_num
        self.components_instance_num[component] = self.component_managers[component].current_instance_num

    def get_component_instance_num(self, component: str) -> int:
        return self.components_instance_num[component]

    def get_component_model_parallel_size(self, component: str) -> int:
        return self.components_model_parallel_size[component]


DynamicSchedulerState: Optional[_DynamicSchedulerState] = None


def set_global_scheduer_state(cfg: Any, total_gpus: int, component_managers: dict) -> None:
    """Set the process's scheduler state (RLinf's spelling)."""
    global DynamicSchedulerState
    DynamicSchedulerState = _DynamicSchedulerState(cfg, total_gpus, component_managers)


def get_global_scheduer_state() -> _DynamicSchedulerState:
    """The process's scheduler state.

    Raises:
        RuntimeError: it was not set.
    """
    if DynamicSchedulerState is None:
        raise RuntimeError("the dynamic scheduler state is not set (set_global_scheduer_state)")
    return DynamicSchedulerState


__all__ = ["DynamicSchedulerConfigError", "RolloutAction", "RolloutReport", "RolloutScheduleInfo",
           "get_global_scheduer_state", "get_scheduler_channel", "get_scheduler_request_queue",
           "get_scheduler_response_queue", "get_valid_dp_sizes", "set_global_scheduer_state"]
