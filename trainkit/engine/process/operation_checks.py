"""Debug-mode checks before a collective: every process passes tensors of the same shapes, on the right device.

Off by default (a check costs one extra ``all_gather_object``); on when ``TRAINKIT_DEBUG_MODE`` or
``ACCELERATE_DEBUG_MODE`` is "1"/"true" — then a mismatch raises :class:`DistributedOperationException`
naming each process's shapes instead of hanging or failing inside the backend.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

_TRUE = ("1", "true", "yes", "on")


class DistributedOperationException(Exception):
    """A collective was called with inputs that cannot work together across processes."""


def debug_mode() -> bool:
    """True when the debug-mode environment variable is set."""
    value = os.environ.get("TRAINKIT_DEBUG_MODE", os.environ.get("ACCELERATE_DEBUG_MODE", ""))
    return value.strip().lower() in _TRUE


def _shapes(data: Any) -> Any:
    if isinstance(data, torch.Tensor):
        return list(data.shape)
    if isinstance(data, dict):
        return {key: _shapes(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [_shapes(value) for value in data]
    return None


def _devices(data: Any) -> set[str]:
    if isinstance(data, torch.Tensor):
        return {data.device.type}
    values = data.values() if isinstance(data, dict) else data if isinstance(data, (list, tuple)) else []
    return set().union(*(_devices(value) for value in values)) if values else set()


def verify_operation(function: Callable) -> Callable:
    """Decorator for collectives taking the data as first argument: check it across processes in debug mode."""

    @functools.wraps(function)
    def wrapper(data: Any, *args: Any, **kwargs: Any) -> Any:
        if not (debug_mode() and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return function(data, *args, **kwargs)
        name = function.__name__
        expected = "cuda" if dist.get_backend() == "nccl" else "cpu"
        wrong = _devices(data) - {expected}
        if wrong:
            raise DistributedOperationException(
                f"{name}: tensors on {sorted(wrong)} but the process group ({dist.get_backend()}) needs {expected}; "
                f"move them to the Accelerator's device first.")
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, _shapes(data))
        if any(shape != gathered[0] for shape in gathered):
            listing = "\n".join(f"  - process {rank}: {shape}" for rank, shape in enumerate(gathered))
            raise DistributedOperationException(
                f"{name}: the tensors' shapes differ across processes, so the operation cannot run:\n{listing}")
        return function(data, *args, **kwargs)

    return wrapper
