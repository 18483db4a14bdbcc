"""Which trackers ``log_with=`` and ``TrainingArguments(report_to=...)`` can name: one table, built-in and registered.

Adding a tracker is one file with a :class:`~trainkit.engine.tracking.base.GeneralTracker` subclass (import its
library inside the constructor, so ``import trainkit`` stays light) and one entry in :data:`OPTIONAL_TRACKERS`
with its availability check; ``"all"``, :func:`tracker_names` and the Trainer's ``report_to`` follow from it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trainkit.config.errors import check_choice
from trainkit.engine.tracking.base import GeneralTracker
from trainkit.engine.tracking.jsonl import JSONLTracker
from trainkit.engine.tracking.mlflow import MLflowTracker
from trainkit.engine.tracking.tensorboard import TensorBoardTracker
from trainkit.engine.tracking.wandb import WandBTracker
from trainkit.utils.imports import is_mlflow_available, is_tensorboard_available, is_wandb_available

OPTIONAL_TRACKERS: dict[str, tuple[type[GeneralTracker], Callable[[], bool]]] = {
    "tensorboard": (TensorBoardTracker, is_tensorboard_available),
    "wandb": (WandBTracker, is_wandb_available),
    "mlflow": (MLflowTracker, is_mlflow_available),
}
"""Name -> (class, is its library installed) for every tracker besides the JSONL log; scripts add theirs with
:func:`register_tracker`."""


def tracker_names() -> tuple[str, ...]:
    """Every tracker name the engine accepts now: the built-in ones and those a script registered
    (``trainkit.tracking.register_tracker_class``). ``log_with`` and ``TrainingArguments(report_to=...)`` both
    check against it, so the Trainer and the engine cannot disagree."""
    return ("jsonl", *OPTIONAL_TRACKERS)


def resolve_log_with(log_with: str | GeneralTracker | Sequence[str | GeneralTracker] | None) -> list[str | GeneralTracker]:
    """Validate ``log_with`` and expand "all" into the installed trackers (the JSONL log is written only when named:
    ``"all"`` means Accelerate's trackers, so it writes the files Accelerate's would)."""
    if log_with is None:
        return []
    items = list(log_with) if isinstance(log_with, (list, tuple)) else [log_with]  # one name, LoggerType or tracker
    resolved: list[str | GeneralTracker] = []
    for item in items:
        if isinstance(item, GeneralTracker):
            resolved.append(item)
            continue
        name = check_choice("log_with", str(item), ["all", *tracker_names()], where="Accelerator(log_with=...)")
        if name == "all":
            resolved.extend(n for n, (_, available) in OPTIONAL_TRACKERS.items() if available())
        elif name in OPTIONAL_TRACKERS and not OPTIONAL_TRACKERS[name][1]():
            raise ImportError(f"log_with={name!r} needs the {name} package: pip install 'trainkit[{name}]'.")
        else:
            resolved.append(name)
    return resolved


def start_trackers(run_name: str, logging_dir: str, log_with: list[str | GeneralTracker],
                   init_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
                   config: Mapping[str, Any] | None = None) -> list[GeneralTracker]:
    """Build every requested tracker (the JSONL log only when named: no file Accelerate would not write),
    ``start()`` each (tracker instances given in ``log_with`` too), then store ``config`` in each (main process
    only), in Accelerate's order."""
    init_kwargs = init_kwargs or {}
    trackers: list[GeneralTracker] = []
    for item in log_with:
        if isinstance(item, GeneralTracker):
            trackers.append(item)
        else:
            trackers.append(_build_one(item, run_name, logging_dir, dict(init_kwargs.get(item, {}))))
    for tracker in trackers:
        tracker.start()
    if config is not None:
        for tracker in trackers:
            tracker.store_init_configuration(dict(config))
    return trackers


def _build_one(name: str, run_name: str, logging_dir: str, kwargs: dict[str, Any]) -> GeneralTracker:
    """Accelerate's convention: the run name first, then the logging folder for trackers that need one."""
    tracker_cls: Any = JSONLTracker if name == "jsonl" else OPTIONAL_TRACKERS[name][0]
    if name == "wandb":
        kwargs.setdefault("dir", logging_dir)  # W&B's files beside the other trackers'
    if getattr(tracker_cls, "requires_logging_directory", False):
        return tracker_cls(run_name, logging_dir, **kwargs)
    return tracker_cls(run_name, **kwargs)


def check_logging_directory(log_with: list[str | GeneralTracker], logging_dir: Any) -> list[str | GeneralTracker]:
    """``log_with`` itself, once every tracker named there that writes into a folder has one (Accelerate refuses
    ``log_with="tensorboard"`` without ``project_dir``/``logging_dir`` when the Accelerator is made)."""
    if logging_dir is None:
        for item in log_with:
            cls = {"jsonl": JSONLTracker, **tracker_classes()}.get(item) if isinstance(item, str) else None
            if cls is not None and getattr(cls, "requires_logging_directory", False):
                raise ValueError(f"Logging with `{item}` requires a `logging_dir`: pass project_dir=... (or "
                                 "project_config=ProjectConfiguration(logging_dir=...)) to the Accelerator.")
    return log_with


def register_tracker(tracker_class: type[GeneralTracker]) -> None:
    """Make ``log_with=tracker_class.name`` start ``tracker_class`` (see ``trainkit.tracking.register_tracker_class``)."""
    OPTIONAL_TRACKERS[tracker_class.name] = (tracker_class, lambda: True)


def tracker_classes() -> dict[str, type[GeneralTracker]]:
    """Name -> class of every tracker ``log_with`` can name (built-in and registered)."""
    return {name: cls for name, (cls, _) in OPTIONAL_TRACKERS.items()}


def available_trackers() -> list[str]:
    """The names ``log_with="all"`` starts here: the installed trackers."""
    return [name for name, (_, available) in OPTIONAL_TRACKERS.items() if available()]


def find_tracker(trackers: list[GeneralTracker], name: str) -> GeneralTracker:
    """The started tracker called ``name`` (an error listing the started ones otherwise)."""
    for tracker in trackers:
        if tracker.name == name:
            return tracker
    raise ValueError(f"No tracker {name!r}; started: {[t.name for t in trackers]}.")
