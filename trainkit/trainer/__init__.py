"""The transformers-compatible Trainer: ``from trainkit import Trainer, TrainingArguments`` (names load lazily)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {
    "Trainer": "trainkit.trainer.trainer",
    "TrainOutput": "trainkit.trainer.trainer",
    "TrainingArguments": "trainkit.trainer.training_arguments.arguments",
    "Seq2SeqTrainer": "trainkit.trainer.seq2seq.trainer",
    "Seq2SeqTrainingArguments": "trainkit.trainer.seq2seq.arguments",
    "TrainerCallback": "trainkit.trainer.callbacks",
    "TrainerState": "trainkit.trainer.callbacks",
    "TrainerControl": "trainkit.trainer.callbacks",
    "CallbackHandler": "trainkit.trainer.callbacks",
    "DefaultFlowCallback": "trainkit.trainer.callbacks",
    "ProgressCallback": "trainkit.trainer.callbacks",
    "PrinterCallback": "trainkit.trainer.callbacks",
    "EarlyStoppingCallback": "trainkit.trainer.callbacks",
    "ExportableState": "trainkit.trainer.callbacks",
    "EvalPrediction": "trainkit.trainer.evaluation",
    "PredictionOutput": "trainkit.trainer.evaluation",
    "EvalLoopOutput": "trainkit.trainer.evaluation",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'trainkit.trainer' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)


if TYPE_CHECKING:
    from .training_arguments.arguments import TrainingArguments
    from .callbacks import (
        CallbackHandler,
        DefaultFlowCallback,
        EarlyStoppingCallback,
        ExportableState,
        PrinterCallback,
        ProgressCallback,
        TrainerCallback,
        TrainerControl,
        TrainerState,
    )
    from .evaluation import EvalLoopOutput, EvalPrediction, PredictionOutput
    from .seq2seq.arguments import Seq2SeqTrainingArguments
    from .seq2seq.trainer import Seq2SeqTrainer
    from .trainer import Trainer, TrainOutput
