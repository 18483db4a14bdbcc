"""Memory helpers: retrying with a smaller batch after an out-of-memory error, freeing references."""

from __future__ import annotations

import functools
import gc
import inspect
import logging
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger(__name__)

_OOM_MESSAGES = ("CUDA out of memory", "out of memory", "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED", "DefaultCPUAllocator: can't allocate memory")


def is_out_of_memory(error: BaseException) -> bool:
    """True when ``error`` is an out-of-memory error of any device."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and any(m in str(error) for m in _OOM_MESSAGES)


def should_reduce_batch_size(exception: Exception) -> bool:
    """True when ``exception`` is an out-of-memory error (Accelerate's name for :func:`is_out_of_memory`)."""
    return is_out_of_memory(exception)


def clear_device_cache(garbage_collection: bool = False) -> None:
    """Return the device's cached blocks to the driver (``torch.cuda.empty_cache()`` where CUDA is used), after
    a garbage collection when ``garbage_collection`` (slow: use it sparingly)."""
    if garbage_collection:
        gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def release_memory(*objects: Any) -> list[None]:
    """Collect garbage and empty the device cache; returns one ``None`` per object, so that
    ``a, b = release_memory(a, b)`` drops the caller's references."""
    count = len(objects)
    del objects
    clear_device_cache(garbage_collection=True)
    return [None] * count


def find_executable_batch_size(function: Callable | None = None, starting_batch_size: int = 128,
                               reduce_batch_size_fn: Callable[[int], int] | None = None) -> Callable:
    """Decorate ``function(batch_size, ...)`` to retry with a smaller batch size after out-of-memory errors:
    ``reduce_batch_size_fn(batch_size)`` when given, else 90 % of it (rounded down), as in Accelerate.

    The decorated function is called without its first argument, as in Accelerate.
    """
    if function is None:
        return functools.partial(find_executable_batch_size, starting_batch_size=starting_batch_size,
                                 reduce_batch_size_fn=reduce_batch_size_fn)
    reduce = reduce_batch_size_fn or (lambda size: int(size * 0.9))

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        batch_size = starting_batch_size
        params = list(inspect.signature(function).parameters)
        if len(params) < len(args) + 1:
            raise TypeError(
                f"{function.__name__} received its batch size from the decorator; call it without "
                f"that first argument (got {args!r})."
            )
        while True:
            if batch_size == 0:
                raise RuntimeError("No executable batch size found: reached zero.")
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as error:  # noqa: BLE001 - only out-of-memory errors are retried
                if not is_out_of_memory(error):
                    raise
                clear_device_cache(garbage_collection=True)
                smaller = reduce(batch_size)
                logger.warning("Out of memory with batch size %d; retrying with %d.", batch_size, smaller)
                batch_size = smaller

    return wrapper
