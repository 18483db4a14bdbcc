"""``accelerate.state``'s names: ``PartialState``, ``AcceleratorState``, ``GradientState``.

trainkit keeps one process state (:class:`trainkit.engine.process.state.ProcessState`); ``PartialState`` and
``AcceleratorState`` are Accelerate's shared-state classes over it (every instance of a class shares one
attribute dictionary; ``_reset_state()`` empties it; see :mod:`trainkit.engine.process.state_views`), and
``accelerator.state`` is an ``AcceleratorState``. ``GradientState()`` returns the accumulation state of the
newest Accelerator.
"""

from __future__ import annotations

import threading
from typing import Any

from trainkit.engine.step.accumulation import GradientState as _EngineGradientState
from trainkit.engine.process.state import ProcessState
from trainkit.engine.process.state_views import AcceleratorState, PartialState
from trainkit.utils.enums import DistributedType

__all__ = ["AcceleratorState", "DistributedType", "GradientState", "PartialState", "ProcessState",
           "ThreadLocalSharedDict", "do_nothing", "is_initialized"]


def is_initialized() -> bool:
    """True once the ``AcceleratorState`` is set up (by an Accelerator; no ``AcceleratorState._reset_state()``
    since), as Accelerate's ``accelerate.state.is_initialized()``."""
    return bool(AcceleratorState._shared_state)


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


class GradientState(metaclass=_SharedStateAlias):
    """Accelerate's ``GradientState()``: the newest Accelerator's accumulation state (a fresh one before any)."""

    target = _EngineGradientState

    def __new__(cls, gradient_accumulation_plugin: Any = None) -> _EngineGradientState:  # type: ignore[misc]  # a view of the engine's object
        state = ProcessState._instance
        accelerator = state.accelerator if state is not None and not state.gradient_state_cleared else None
        if accelerator is not None:
            return accelerator.gradient_state
        steps = getattr(gradient_accumulation_plugin, "num_steps", None) or 1
        given = gradient_accumulation_plugin.to_kwargs() if gradient_accumulation_plugin is not None else {}
        fresh = _EngineGradientState(int(steps), plugin_options={k: v for k, v in given.items() if k != "num_steps"})
        fresh.num_steps_given = "num_steps" in given
        return fresh

    @staticmethod
    def _reset_state() -> None:
        """Forget the accumulation state: ``GradientState()`` returns a fresh one until a new Accelerator is made."""
        if ProcessState._instance is not None:
            ProcessState._instance.gradient_state_cleared = True
