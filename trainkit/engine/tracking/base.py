"""The tracker contract (:class:`GeneralTracker`, Accelerate's base class) and the value conversions every
tracker shares."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger("trainkit.engine.tracking")


class GeneralTracker:
    """Base class for trackers; subclass it to plug your own into ``Accelerator(log_with=[...])``.

    As in Accelerate, a subclass defines ``name``, ``requires_logging_directory`` and a ``tracker`` property
    (the underlying run object); ``GeneralTracker.__init__`` checks them unless ``_blank=True``. Trackers with
    ``main_process_only`` (the default) are only started and written on the main process.
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
    """Say once per value that ``tracker`` cannot log it (metrics.jsonl still has it)."""
    logger.warning("%s: %r=%r is not a number%s; not logged there (it is in metrics.jsonl).", tracker, key, value,
                   "" if tracker == "mlflow" else ", string or dict of numbers")
