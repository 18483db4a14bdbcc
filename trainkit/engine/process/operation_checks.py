"""Debug-mode checks before a collective: every process passes tensors of the same shapes, on the right device.

Off by default (a check costs one extra ``all_gather_object``); on when ``TRAINKIT_DEBUG_MODE`` or
``ACCELERATE_DEBUG_MODE`` is "1"/"true", or after ``PartialState().debug = True`` — then a mismatch raises
:class:`DistributedOperationException` naming each process's shapes instead of hanging or failing inside the
backend. ``pad_across_processes`` exists for sizes that differ, so its check compares numbers of dimensions.
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


_debug_override: bool | None = None
"""What ``PartialState().debug = ...`` set in this process (None: follow the environment variable)."""


def debug_mode() -> bool:
    """True when debug mode was switched on by ``state.debug = True`` or else by the environment variable."""
    if _debug_override is not None:
        return _debug_override
    value = os.environ.get("TRAINKIT_DEBUG_MODE", os.environ.get("ACCELERATE_DEBUG_MODE", ""))
    return value.strip().lower() in _TRUE


def set_debug_mode(enabled: bool | None) -> None:
    """Switch the checks on or off for this process (None: back to the environment variable).

    Accelerate scripts flip ``PartialState().debug`` around a block of collectives to check them.
    """
    global _debug_override
    _debug_override = None if enabled is None else bool(enabled)


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


def _ndims(data: Any) -> Any:
    if isinstance(data, torch.Tensor):
        return data.ndim
    if isinstance(data, dict):
        return {key: _ndims(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [_ndims(value) for value in data]
    return None


def _checking() -> bool:
    return debug_mode() and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _same_on_every_process(name: str, summary: Any, what: str) -> None:
    """Raise :class:`DistributedOperationException` naming each process's ``summary`` when they differ."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, summary)
    if any(item != gathered[0] for item in gathered):
        listing = "\n".join(f"  - process {rank}: {item}" for rank, item in enumerate(gathered))
        raise DistributedOperationException(
            f"{name}: the tensors' {what} differ across processes, so the operation cannot run:\n{listing}")


def verify_padding(function: Callable) -> Callable:
    """Decorator for ``pad_across_processes`` in debug mode: sizes may differ, but every process must pass
    tensors with the same numbers of dimensions (otherwise there is no common padded shape)."""

    @functools.wraps(function)
    def wrapper(data: Any, *args: Any, **kwargs: Any) -> Any:
        if _checking():
            _same_on_every_process(function.__name__, _ndims(data), "numbers of dimensions")
        return function(data, *args, **kwargs)

    return wrapper


def verify_operation(function: Callable) -> Callable:
    """Decorator for collectives taking the data as first argument: check it across processes in debug mode."""

    @functools.wraps(function)
    def wrapper(data: Any, *args: Any, **kwargs: Any) -> Any:
        if not _checking():
            return function(data, *args, **kwargs)
        name = function.__name__
        expected = "cuda" if dist.get_backend() == "nccl" else "cpu"
        wrong = _devices(data) - {expected}
        if wrong:
            raise DistributedOperationException(
                f"{name}: tensors on {sorted(wrong)} but the process group ({dist.get_backend()}) needs {expected}; "
                f"move them to the Accelerator's device first.")
        _same_on_every_process(name, _shapes(data), "shapes")
        return function(data, *args, **kwargs)

    return wrapper
