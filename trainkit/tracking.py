"""``accelerate.tracking``'s names: the tracker base class to subclass, trainkit's built-in trackers, and the
registry that lets ``Accelerator(log_with="my_tracker")`` start a tracker class of your own.

Accelerate's other built-in trackers (Aim, ClearML, Comet ML, DVCLive, SwanLab, Trackio) are named here and
raise when constructed: subclass :class:`GeneralTracker` for them and pass an instance in ``log_with``.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from trainkit.engine.tracking.base import on_main_process
from trainkit.engine.tracking import (
    GeneralTracker,
    JSONLTracker,
    MLflowTracker,
    TensorBoardTracker,
    WandBTracker,
    available_trackers,
    check_logging_directory,
    register_tracker,
    resolve_log_with,
    tracker_classes,
)

__all__ = ["LOGGER_TYPE_TO_CLASS", "GeneralTracker", "JSONLTracker", "MLflowTracker", "TensorBoardTracker",
           "WandBTracker", "filter_trackers", "get_available_trackers", "on_main_process", "register_tracker_class"]

LOGGER_TYPE_TO_CLASS: dict[str, type[GeneralTracker]] = tracker_classes()
"""Tracker name -> class, for the names ``log_with`` accepts (``register_tracker_class`` adds to it)."""

_NOT_BUILT_IN = {"AimTracker": "aim", "ClearMLTracker": "clearml", "CometMLTracker": "comet_ml",
                 "DVCLiveTracker": "dvclive", "SwanLabTracker": "swanlab", "TrackioTracker": "trackio"}


def get_available_trackers() -> list[str]:
    """The trackers installed here, by the names ``log_with`` takes ("all" starts every one of them)."""
    return available_trackers()


def filter_trackers(log_with: Any, logging_dir: str | os.PathLike | None = None) -> list[Any]:
    """``log_with`` checked and expanded: "all" becomes every installed tracker, repeats go, unknown names and
    trackers that need a ``logging_dir`` without one are errors."""
    return check_logging_directory(list(dict.fromkeys(resolve_log_with(log_with))), logging_dir)


def register_tracker_class(tracker_class: type[GeneralTracker]) -> None:
    """Let ``log_with`` name ``tracker_class`` by its ``name``; it is built as ``cls(project_name, logging_dir,
    **init_kwargs)`` when ``requires_logging_directory`` is true, else ``cls(project_name, **init_kwargs)``."""
    if not (isinstance(tracker_class, type) and issubclass(tracker_class, GeneralTracker)):
        raise ValueError(f"register_tracker_class needs a GeneralTracker subclass, got {tracker_class!r}.")
    if not getattr(tracker_class, "name", None):
        raise ValueError(f"{tracker_class.__name__} must define a non-empty `name` class attribute.")
    if not hasattr(tracker_class, "requires_logging_directory"):
        raise ValueError(f"{tracker_class.__name__} must define `requires_logging_directory` (True or False).")
    if tracker_class.name in LOGGER_TYPE_TO_CLASS:
        warnings.warn(f"A tracker named {tracker_class.name!r} is already registered; {tracker_class.__name__} "
                      "replaces it.", stacklevel=2)
    register_tracker(tracker_class)
    LOGGER_TYPE_TO_CLASS[tracker_class.name] = tracker_class


def __getattr__(name: str) -> Any:
    if name in _NOT_BUILT_IN:
        from trainkit.utils.unsupported import NOT_DRIVEN, accelerate_signature

        def refuse(self: Any, *args: Any, **kwargs: Any) -> None:
            raise NotImplementedError(f"{name}: {NOT_DRIVEN[name]}.")

        refuse.__signature__ = accelerate_signature(name, method=True)  # type: ignore[attr-defined]  # Accelerate's signature, for inspect

        placeholder = type(name, (GeneralTracker,), {"__init__": refuse, "name": _NOT_BUILT_IN[name],
                                                     "requires_logging_directory": False, "__module__": __name__})
        globals()[name] = placeholder
        return placeholder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
