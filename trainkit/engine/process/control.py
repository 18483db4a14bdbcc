"""Running code on some processes only, or in turn: decorators and contexts built on the process state."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, Protocol


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
