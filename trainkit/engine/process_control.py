"""Running code on some processes only, or in turn: decorators and contexts built on the process state."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch


class SupportsBarrier(Protocol):
    """Anything with a cross-process barrier (``ProcessState``); typed structurally so this module needs no import of state."""

    def wait_for_everyone(self) -> None:
        """Block until every process reaches this point."""


@contextlib.contextmanager
def first_on(state: SupportsBarrier, is_first: bool) -> Iterator[None]:
    """Let the processes where ``is_first`` holds run the block before the others start it."""
    if not is_first:
        state.wait_for_everyone()
    yield
    if is_first:
        state.wait_for_everyone()


def only_when(condition: Callable[[], bool]) -> Callable[[Callable], Callable]:
    """Decorator: run the function only where ``condition()`` is true (elsewhere it returns None)."""

    def decorator(function: Callable) -> Callable:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return function(*args, **kwargs) if condition() else None

        return wrapper

    return decorator


def _slice_for(length: int, index: int, parts: int) -> slice:
    per, extra = divmod(length, parts)
    start = index * per + min(index, extra)
    return slice(start, start + per + (1 if index < extra else 0))


def split_inputs(inputs: Any, index: int, parts: int, apply_padding: bool = False) -> Any:
    """This process's contiguous share of a list, tuple, tensor or dict of those.

    With ``apply_padding`` every share has the same length (the last item repeated), so results can
    be gathered and the padding cut off afterwards.
    """
    if isinstance(inputs, dict):
        return {k: split_inputs(v, index, parts, apply_padding) for k, v in inputs.items()}
    length = len(inputs)
    part = inputs[_slice_for(length, index, parts)]
    if apply_padding and length:
        longest = math.ceil(length / parts)
        missing = longest - len(part)
        if missing:
            last = inputs[-1:]
            if isinstance(part, torch.Tensor):
                part = torch.cat([part, last.expand(missing, *last.shape[1:])])
            else:
                part = part + type(part)(list(last) * missing)
    return part
