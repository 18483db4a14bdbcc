"""``accelerate.state``'s names: ``PartialState``, ``AcceleratorState``, ``GradientState``.

trainkit keeps one process state (:class:`trainkit.engine.process.state.ProcessState`); ``PartialState()`` and
``AcceleratorState()`` both return it, so their attributes and methods (``distributed_type``,
``print``, ``wait_for_everyone``, ``split_between_processes``, ``destroy_process_group``...) are the
same object's. ``GradientState()`` returns the accumulation state of the newest Accelerator.
``isinstance(obj, PartialState)`` holds for the process state.
"""

from __future__ import annotations

import threading
from typing import Any

from trainkit.engine.step.accumulation import GradientState as _EngineGradientState
from trainkit.engine.process.state import ProcessState
from trainkit.utils.enums import DistributedType

__all__ = ["AcceleratorState", "DistributedType", "GradientState", "PartialState", "ProcessState",
           "ThreadLocalSharedDict", "do_nothing", "is_initialized"]


def is_initialized() -> bool:
    """True once an Accelerator has set up the state (and no ``AcceleratorState._reset_state()`` since)."""
    state = ProcessState._instance
    return state is not None and state.accelerator is not None and not state.accelerator_state_cleared


def do_nothing(*args: Any, **kwargs: Any) -> None:
    """Accept anything, do nothing (a placeholder callback)."""
    return None


class ThreadLocalSharedDict(threading.local):
    """A class-level dict, one per thread, used as a descriptor: every instance of the owning class reads and
    writes the same dict (Accelerate's shared-state pattern for thread-per-device setups)."""

    def __init__(self, thread_local: bool = False) -> None:
        self._storage: dict[str, Any] = {}

    def __get__(self, obj: Any, objtype: Any = None) -> dict[str, Any]:
        return self._storage

    def __set__(self, obj: Any, value: dict[str, Any]) -> None:
        self._storage = value


class _SharedStateAlias(type):
    """Calling the alias returns the shared object; ``isinstance`` checks against its real class."""

    target: type

    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, cls.target)


class PartialState(metaclass=_SharedStateAlias):
    """Accelerate's ``PartialState()``: the process's state, created on first use (``cpu=True`` forces CPU)."""

    target = ProcessState

    def __new__(cls, cpu: bool = False, **kwargs: Any) -> ProcessState:  # type: ignore[misc]  # Accelerate's class is a view of the engine's object
        return ProcessState.get(cpu=cpu or None)  # False is Accelerate's default, not a request: --cpu applies

    @staticmethod
    def _reset_state() -> None:
        """Forget the state and tear down the process group trainkit created (for tests)."""
        ProcessState.reset()


class AcceleratorState(PartialState):
    """Accelerate's ``AcceleratorState()``: the same process state; Accelerator-level values come from
    the newest Accelerator (``distributed_type``, ``mixed_precision``, ``fsdp_plugin``)."""

    def __new__(cls, mixed_precision: str | None = None, cpu: bool = False, dynamo_plugin: Any = None,  # type: ignore[misc]  # a view of the engine's object
                deepspeed_plugin: Any = None, fsdp_plugin: Any = None, torch_tp_plugin: Any = None,
                megatron_lm_plugin: Any = None, parallelism_config: Any = None, _from_accelerator: bool = False,
                **kwargs: Any) -> ProcessState:
        # The plugins belong to the Accelerator that owns them (Accelerator(fsdp_plugin=...)); the state only
        # reports them, so they are accepted here and read back from the newest Accelerator.
        state = ProcessState.get(cpu=cpu or None)
        if mixed_precision is not None and mixed_precision != state.mixed_precision:
            raise ValueError(f"AcceleratorState(mixed_precision={mixed_precision!r}): the Accelerator already uses "
                             f"{state.mixed_precision!r}; set it with Accelerator(mixed_precision=...).")
        return state

    @staticmethod
    def _reset_state(reset_partial_state: bool = False) -> None:
        """Forget the Accelerator-level state (and, with ``reset_partial_state``, the process state too).

        Until a new ``Accelerator()`` is made, an existing Accelerator's ``prepare`` and ``distributed_type``
        raise an ``AttributeError`` that says so, as Accelerate's do (for test harnesses and notebooks).
        """
        if ProcessState._instance is not None:
            ProcessState._instance.clear_accelerator_state()
        if reset_partial_state:
            ProcessState.reset()


class GradientState(metaclass=_SharedStateAlias):
    """Accelerate's ``GradientState()``: the newest Accelerator's accumulation state (a fresh one before any)."""

    target = _EngineGradientState

    def __new__(cls, gradient_accumulation_plugin: Any = None) -> _EngineGradientState:  # type: ignore[misc]  # a view of the engine's object
        state = ProcessState._instance
        accelerator = state.accelerator if state is not None and not state.gradient_state_cleared else None
        if accelerator is not None:
            return accelerator.gradient_state
        steps = getattr(gradient_accumulation_plugin, "num_steps", None) or 1
        return _EngineGradientState(int(steps))

    @staticmethod
    def _reset_state() -> None:
        """Forget the accumulation state: ``GradientState()`` returns a fresh one until a new Accelerator is made."""
        if ProcessState._instance is not None:
            ProcessState._instance.gradient_state_cleared = True
