"""Experiment trackers: a JSONL file always; TensorBoard, Weights & Biases and MLflow when installed.

Only the main process writes. ``log_with="all"`` means every installed tracker.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from trainkit.config.errors import check_choice
from trainkit.utils.imports import is_mlflow_available, is_tensorboard_available, is_wandb_available

logger = logging.getLogger(__name__)


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


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)


class JSONLTracker(GeneralTracker):
    """One JSON object per ``log`` call appended to ``<logging_dir>/<run_name>/metrics.jsonl``.

    The file is opened for each record and closed at once: no handle outlives a call, so a Trainer that
    evaluates after ``train()`` ended (the trackers restart for that log) leaves nothing open, and every
    line is on disk as soon as ``log`` returns.
    """

    name = "jsonl"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str) -> None:
        self.directory = os.path.join(logging_dir, run_name)
        os.makedirs(self.directory, exist_ok=True)
        self.path = os.path.join(self.directory, "metrics.jsonl")

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        with open(os.path.join(self.directory, "config.json"), "w", encoding="utf-8") as handle:
            json.dump(_jsonable(dict(values)), handle, indent=2)

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        record = {"step": step, "time": round(time.time(), 3), **_jsonable(dict(values))}
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    def finish(self) -> None:
        """Nothing to close: every record was written and closed by :meth:`log`."""


class TensorBoardTracker(GeneralTracker):
    """Scalars to TensorBoard event files in ``<logging_dir>/<run_name>``.

    Numbers become scalars, strings text, and a dict of numbers one ``add_scalars`` group (each entry in
    its own ``<run>/<key>_<entry>`` sub-run, plotted together), as Accelerate writes them.
    """

    name = "tensorboard"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str, **kwargs: Any) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(os.path.join(logging_dir, run_name), **kwargs)

    @property
    def tracker(self) -> Any:
        """The ``SummaryWriter``."""
        return self.writer

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        self.writer.add_text("config", json.dumps(_jsonable(dict(values)), indent=2))

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        for key, value in values.items():
            value = _jsonable(value)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, global_step=step)
            elif isinstance(value, str):
                self.writer.add_text(key, value, global_step=step)
            elif isinstance(value, dict):
                self.writer.add_scalars(key, _numbers_only(key, value), global_step=step)
            else:
                _warn_skipped(self.name, key, value)
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()


class WandBTracker(GeneralTracker):
    """Logs to Weights & Biases (``wandb.init`` receives ``init_kwargs['wandb']``)."""

    name = "wandb"
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        import wandb

        self.run = wandb.init(project=run_name, **kwargs)

    @property
    def tracker(self) -> Any:
        """The W&B run."""
        return self.run

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        self.run.config.update(_jsonable(dict(values)), allow_val_change=True)

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.run.log(dict(values), step=step, **kwargs)

    def finish(self) -> None:
        self.run.finish()


class MLflowTracker(GeneralTracker):
    """Logs to MLflow: the run's name is the experiment; the tracking URI is ``MLFLOW_TRACKING_URI``
    (MLflow's default otherwise); ``init_kwargs['mlflow']`` may give ``run_name``, ``run_id``, ``tags``,
    ``nested_run``, ``description``. Numbers become metrics; other values are skipped with a warning.
    """

    name = "mlflow"
    requires_logging_directory = False

    def __init__(self, experiment_name: str | None = None, logging_dir: str | None = None, run_id: str | None = None,
                 tags: Any = None, nested_run: bool = False, run_name: str | None = None,
                 description: str | None = None) -> None:
        import mlflow

        experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", experiment_name)
        tags = os.environ.get("MLFLOW_TAGS", tags)
        if isinstance(tags, str):
            tags = json.loads(tags)
        experiment_id = None  # no name: MLflow's active (or default) experiment
        if experiment_name is not None:
            experiment = mlflow.get_experiment_by_name(experiment_name)
            experiment_id = (experiment.experiment_id if experiment is not None
                             else mlflow.create_experiment(experiment_name, tags=tags))
        self.run = mlflow.start_run(run_id=os.environ.get("MLFLOW_RUN_ID", run_id), experiment_id=experiment_id,
                                    run_name=run_name, tags=tags,
                                    nested=bool(os.environ.get("MLFLOW_NESTED_RUN", nested_run)),
                                    description=description)
        self._mlflow = mlflow

    @property
    def tracker(self) -> Any:
        """The active MLflow run."""
        return self.run

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        params = {str(k): v for k, v in _jsonable(dict(values)).items()}
        limit = self._mlflow.utils.validation.MAX_PARAM_VAL_LENGTH
        too_long = [k for k, v in params.items() if len(str(v)) > limit]
        if too_long:
            logger.warning("MLflow keeps parameters up to %d characters; not stored: %s", limit, too_long)
        self._mlflow.log_params({k: v for k, v in params.items() if k not in too_long})

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        metrics = {}
        for key, value in values.items():
            value = _jsonable(value)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                metrics[key] = value
            else:
                _warn_skipped(self.name, key, value)
        self._mlflow.log_metrics(metrics, step=step)

    def finish(self) -> None:
        self._mlflow.end_run()


def _numbers_only(key: str, values: Mapping[str, Any]) -> dict[str, float]:
    numbers = {}
    for name, value in values.items():
        value = _jsonable(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            numbers[str(name)] = value
        else:
            _warn_skipped("tensorboard", f"{key}/{name}", value)
    return numbers


def _warn_skipped(tracker: str, key: str, value: Any) -> None:
    logger.warning("%s: %r=%r is not a number%s; not logged there (it is in metrics.jsonl).", tracker, key, value,
                   "" if tracker == "mlflow" else ", string or dict of numbers")


_OPTIONAL: dict[str, tuple[type[GeneralTracker], Any]] = {
    "tensorboard": (TensorBoardTracker, is_tensorboard_available),
    "wandb": (WandBTracker, is_wandb_available),
    "mlflow": (MLflowTracker, is_mlflow_available),
}


TRACKER_NAMES: tuple[str, ...] = ("jsonl", *_OPTIONAL)
"""The trackers built into the engine (``log_with=`` / ``report_to=``; "all" adds the installed optional ones)."""


def tracker_names() -> tuple[str, ...]:
    """Every tracker name the engine accepts now: the built-in ones and those a script registered
    (``trainkit.tracking.register_tracker_class``). ``log_with`` and ``TrainingArguments(report_to=...)`` both
    check against it, so the Trainer and the engine cannot disagree."""
    return ("jsonl", *_OPTIONAL)


def resolve_log_with(log_with: str | GeneralTracker | Sequence[str | GeneralTracker] | None) -> list[str | GeneralTracker]:
    """Validate ``log_with`` and expand "all" into the installed trackers."""
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
            resolved.extend(n for n, (_, available) in _OPTIONAL.items() if available())
        elif name in _OPTIONAL and not _OPTIONAL[name][1]():
            raise ImportError(f"log_with={name!r} needs the {name} package: pip install 'trainkit[{name}]'.")
        elif name != "jsonl":
            resolved.append(name)
    return resolved


def start_trackers(run_name: str, logging_dir: str, log_with: list[str | GeneralTracker],
                   init_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
                   config: Mapping[str, Any] | None = None) -> list[GeneralTracker]:
    """Create the JSONL tracker plus every requested one, each storing ``config`` (main process only)."""
    init_kwargs = init_kwargs or {}
    trackers: list[GeneralTracker] = [JSONLTracker(run_name, logging_dir)]
    for item in log_with:
        if isinstance(item, GeneralTracker):
            trackers.append(item)
        else:
            trackers.append(_start_one(item, run_name, logging_dir, dict(init_kwargs.get(item, {}))))
    if config is not None:
        for tracker in trackers:
            tracker.store_init_configuration(dict(config))
    return trackers


def _start_one(name: str, run_name: str, logging_dir: str, kwargs: dict[str, Any]) -> GeneralTracker:
    """Accelerate's convention: the run name first, then the logging folder for trackers that need one."""
    tracker_cls: Any = _OPTIONAL[name][0]
    if name == "wandb":
        kwargs.setdefault("dir", logging_dir)  # W&B's files beside the other trackers'
    if name == "mlflow":
        return tracker_cls(run_name, logging_dir, **kwargs)
    if getattr(tracker_cls, "requires_logging_directory", False):
        return tracker_cls(run_name, logging_dir, **kwargs)
    return tracker_cls(run_name, **kwargs)


def register_tracker(tracker_class: type[GeneralTracker]) -> None:
    """Make ``log_with=tracker_class.name`` start ``tracker_class`` (see ``trainkit.tracking.register_tracker_class``)."""
    _OPTIONAL[tracker_class.name] = (tracker_class, lambda: True)


def tracker_classes() -> dict[str, type[GeneralTracker]]:
    """Name -> class of every tracker ``log_with`` can name (built-in and registered)."""
    return {name: cls for name, (cls, _) in _OPTIONAL.items()}


def available_trackers() -> list[str]:
    """The names ``log_with="all"`` starts here: the installed trackers."""
    return [name for name, (_, available) in _OPTIONAL.items() if available()]


def find_tracker(trackers: list[GeneralTracker], name: str) -> GeneralTracker:
    """The started tracker called ``name`` (an error listing the started ones otherwise)."""
    for tracker in trackers:
        if tracker.name == name:
            return tracker
    raise ValueError(f"No tracker {name!r}; started: {[t.name for t in trackers]}.")
