"""``accelerate.optimizer``'s names: the prepared optimizer's class and its two helpers.

``AcceleratedOptimizer`` is trainkit's :class:`~trainkit.engine.step.wrappers.PreparedOptimizer`, so
``isinstance(opt, AcceleratedOptimizer)`` holds for what ``Accelerator.prepare`` returns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from trainkit.engine.step.wrappers import PreparedOptimizer as AcceleratedOptimizer
from trainkit.utils.structures import honor_type

__all__ = ["AcceleratedOptimizer", "move_to_device", "patch_optimizer_step"]


def move_to_device(state: Any, device: Any) -> Any:
    """Every tensor of an optimizer state (nested lists, tuples, dicts) on ``device``."""
    if isinstance(state, (list, tuple)):
        return honor_type(state, (move_to_device(item, device) for item in state))
    if isinstance(state, dict):
        return type(state)({key: move_to_device(value, device) for key, value in state.items()})
    return state.to(device) if isinstance(state, torch.Tensor) else state


def patch_optimizer_step(accelerated_optimizer: AcceleratedOptimizer, method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` wrapped to record, on ``accelerated_optimizer``, that a step was really called."""

    def patched_step(*args: Any, **kwargs: Any) -> Any:
        accelerated_optimizer._accelerate_step_called = True  # type: ignore[attr-defined]  # Accelerate's marker, read by its scripts
        return method(*args, **kwargs)

    return patched_step
