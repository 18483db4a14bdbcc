"""The tracker contract (:class:`GeneralTracker`, Accelerate's base class) and the value conversions every
tracker shares."""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger("trainkit.engine.tracking")


def on_main_process(function: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for tracker methods: run on the main process only when the tracker's ``main_process_only`` is
    true (read at call time, so building a tracker never creates the process state)."""

    @functools.wraps(function)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "main_process_only", False):
            from trainkit.engine.process.state import ProcessState

            if not ProcessState.get().is_main_process:
                return None
        return function(self, *args, **kwargs)

    return wrapper


class GeneralTracker:
    """Base class for trackers; subclass it to plug your own into ``Accelerator(log_with=[...])``.

    As in Accelerate, a subclass defines ``name``, ``requires_logging_directory`` and a ``tracker`` property
    (the underlying run object); ``GeneralTracker.__init__`` checks them unless ``_blank=True``. Every process
    builds the trackers and calls ``start()``; methods decorated with :func:`on_main_process` (all of the built-in
    trackers') do their work on the main process only while ``main_process_only`` (the default) is true.
    """

    name: str
    """The name ``log_with`` and ``get_tracker`` use (each subclass sets it)."""
    requires_logging_directory: bool
    """True when the tracker is built with a logging folder as its second argument."""
    main_process_only = True
    """Only the main process creates and writes this tracker."""

    def __init__(self, _blank: bool = False) -> None:
        if _blank:
            return
        missing = [attribute for attribute in ("name", "requires_logging_directory", "tracker")
                   if not hasattr(type(self), attribute)]
        if missing:
            raise NotImplementedError(f"{type(self).__name__} must define {', '.join(missing)} in its class body "
                                      "(name: str, requires_logging_directory: bool, tracker: a property).")

    def start(self) -> None:
        """Create the underlying run (for trackers that defer it until the main process is known)."""

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        """Record the run's hyper-parameters."""

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Record scalar values at ``step``."""

    def finish(self) -> None:
        """Flush and close."""


class LibraryTracker(GeneralTracker):
    """A built-in tracker around a library's own object (``writer``, ``run``, ``active_run``): an attribute the
    tracker does not have is read from that object, so ``get_tracker("tensorboard").add_images(...)`` works as
    ``get_tracker("tensorboard", unwrap=True).add_images(...)`` does (Accelerate before 0.17 returned the object
    itself, and scripts that gate on the installed Accelerate's version still call it that way)."""

    library_attribute: str = ""
    """The name of the attribute holding the library's object (set by :meth:`start`)."""

    def __getattr__(self, name: str) -> Any:
        target = None if name.startswith("_") else self.__dict__.get(self.library_attribute)
        if target is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(target, name)


def jsonable(value: Any) -> Any:
    """``value`` as JSON can hold it: 0-d tensors as numbers, non-finite floats and unknown objects as text."""
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return str(value)


def warn_skipped(tracker: str, key: str, value: Any) -> None:
    """Say once per value that ``tracker`` cannot log it (the JSONL log, ``"jsonl"``, keeps any value)."""
    logger.warning("%s: %r=%r is not a number%s; not logged there (the 'jsonl' tracker keeps it).", tracker, key, value,
                   "" if tracker == "mlflow" else ", string or dict of numbers")
