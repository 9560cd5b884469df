"""RLinf's ``dynamic_scheduler.manager`` path: the component managers and ``RolloutScalingScheduler``.

They are RLinf application logic (they drive its Megatron actor and SGLang/vLLM rollout and read its
data records), so they are not provided: the names import, and building one raises
``NotImplementedError`` saying what it needs.
"""

from __future__ import annotations

NEEDS = ("RLinf's dynamic scheduler is RLinf application logic: it drives RLinf's Megatron actor and SGLang/vLLM "
         "rollout workers and needs rlinf.utils.placement.ModelParallelComponentPlacement and rlinf.data.io_struct "
         "from RLinf's own package (pip install rlinf); this project provides its scheduler-level helpers in "
         "rlinf.scheduler.dynamic_scheduler.utils")


class _NotProvided:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__}: {NEEDS}")


class ComponentManager(_NotProvided):
    """RLinf's base of the component managers (not provided: see the module docstring)."""


class RolloutManager(ComponentManager):
    """RLinf's rollout component manager (not provided)."""


class InferenceManager(ComponentManager):
    """RLinf's inference component manager (not provided)."""


class ActorManager(ComponentManager):
    """RLinf's actor component manager (not provided)."""


class RolloutScalingScheduler(_NotProvided):
    """RLinf's rollout scaling scheduler (not provided: see the module docstring)."""


def create_component_manager(component: str, *args, **kwargs):
    """RLinf's factory of component managers (not provided).

    Raises:
        NotImplementedError: always, naming what it needs.
    """
    raise NotImplementedError(f"create_component_manager({component!r}): {NEEDS}")


__all__ = ["ActorManager", "ComponentManager", "InferenceManager", "RolloutManager", "RolloutScalingScheduler",
           "create_component_manager"]
