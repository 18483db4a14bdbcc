"""Experiment trackers: a JSONL file (``"jsonl"``, when named); TensorBoard, Weights & Biases and MLflow when installed; any
:class:`GeneralTracker` a script registers. The contract is in :mod:`.base`, the one table of names in :mod:`.registry`.
"""

from trainkit.engine.tracking.base import GeneralTracker
from trainkit.engine.tracking.jsonl import JSONLTracker
from trainkit.engine.tracking.mlflow import MLflowTracker
from trainkit.engine.tracking.registry import (
    OPTIONAL_TRACKERS,
    available_trackers,
    check_logging_directory,
    find_tracker,
    register_tracker,
    resolve_log_with,
    start_trackers,
    tracker_classes,
    tracker_names,
)
from trainkit.engine.tracking.tensorboard import TensorBoardTracker
from trainkit.engine.tracking.wandb import WandBTracker

__all__ = ["OPTIONAL_TRACKERS", "GeneralTracker", "JSONLTracker", "MLflowTracker", "TensorBoardTracker",
           "WandBTracker", "available_trackers", "check_logging_directory", "find_tracker", "register_tracker", "resolve_log_with",
           "start_trackers", "tracker_classes", "tracker_names"]
