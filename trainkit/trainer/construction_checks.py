"""What the Trainer can check when it is built: its datasets and functions against the arguments' strategies.

A combination that would fail at the first evaluation (after an epoch of training) or at the start of
``train()`` fails here instead, naming the argument and the fix, as transformers' Trainer does for a
missing ``eval_dataset``. Checks need only what ``Trainer.__init__`` was given; a subclass that supplies
the missing piece itself (overriding ``get_eval_dataloader``, ``evaluate`` ...) is not refused.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from trainkit.config.errors import ConfigError

if TYPE_CHECKING:
    from trainkit.trainer.training_arguments.arguments import TrainingArguments


def check_trainer_inputs(trainer_cls: type, args: TrainingArguments, *, train_dataset: Any, eval_dataset: Any,
                         compute_metrics: Any, data_collator: Any) -> None:
    """Raise for datasets or functions given to ``trainer_cls(...)`` that cannot serve the arguments' strategies
    (called first in ``Trainer.__init__``, before any model is built)."""
    _check_evaluation_inputs(trainer_cls, args, eval_dataset, compute_metrics)
    _check_training_inputs(args, train_dataset)
    if data_collator is not None and not callable(data_collator):
        raise TypeError(f"data_collator must be a callable that turns a list of samples into a batch, got "
                        f"{type(data_collator).__name__}" + (" (pass its collate_batch method)"
                                                            if callable(getattr(data_collator, "collate_batch", None)) else "") + ".")


def _overrides(trainer_cls: type, *names: str) -> bool:
    """Whether a Trainer subclass defines one of ``names`` itself."""
    from_base = [base for base in trainer_cls.__mro__ if base.__module__ == __name__.rsplit(".", 1)[0] + ".trainer"]
    base = from_base[-1] if from_base else trainer_cls
    return any(getattr(trainer_cls, name) is not getattr(base, name) for name in names)


def _check_evaluation_inputs(trainer_cls: type, args: TrainingArguments, eval_dataset: Any, compute_metrics: Any) -> None:
    evaluates = args.eval_strategy != "no" or args.eval_on_start
    if evaluates and eval_dataset is None and not _overrides(trainer_cls, "get_eval_dataloader", "evaluate"):
        reason = f"eval_strategy={args.eval_strategy!r}" if args.eval_strategy != "no" else "eval_on_start=True"
        if args.load_best_model_at_end:
            reason += " with load_best_model_at_end=True"
        raise ConfigError(f"{reason} evaluates during training, but the Trainer got no eval_dataset: pass "
                          "eval_dataset=..., or set eval_strategy='no'.")
    metric = args.metric_for_best_model
    if (evaluates and metric is not None and metric.removeprefix("eval_") != "loss" and compute_metrics is None
            and not _overrides(trainer_cls, "evaluate", "prediction_step")):
        raise ConfigError(f"metric_for_best_model={metric!r} needs a compute_metrics function that returns it; "
                          "without one, evaluations report only eval_loss (use metric_for_best_model='loss').")
    if args.batch_eval_metrics and compute_metrics is not None:
        try:
            parameters = inspect.signature(compute_metrics).parameters
        except (TypeError, ValueError):  # a builtin or C callable: nothing to inspect
            return
        takes_keywords = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
        if "compute_result" not in parameters and not takes_keywords:
            raise ConfigError("batch_eval_metrics=True calls compute_metrics(prediction, compute_result=...) after "
                              "every batch; this compute_metrics takes no compute_result argument.")


def _check_training_inputs(args: TrainingArguments, dataset: Any) -> None:
    if dataset is None or args.max_steps > 0:
        return
    try:
        len(dataset)
    except TypeError:
        raise ConfigError(f"The train_dataset ({type(dataset).__name__}) has no length, so num_train_epochs cannot "
                          "say how many steps to take: set max_steps > 0.") from None
