"""How long training runs: optimizer steps per epoch, epochs and total steps."""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Iterator
from typing import Any, NamedTuple

logger = logging.getLogger(__name__)


class TrainingPlan(NamedTuple):
    """The length of a run, decided once before the first step."""

    max_steps: int
    num_epochs: int
    steps_per_epoch: int | None
    """Optimizer steps per epoch; None when the dataset has no length."""


def training_plan(train_dataloader: Any, accumulation_steps: int, max_steps: int, num_train_epochs: float) -> TrainingPlan:
    """``max_steps`` when positive, else ``num_train_epochs`` of the dataloader's optimizer steps."""
    try:
        batches = len(train_dataloader)
    except TypeError:
        batches = None
    if batches is None:
        if max_steps <= 0:
            raise ValueError("The training dataset has no length: set max_steps to say how long to train.")
        return TrainingPlan(max_steps, sys.maxsize, None)
    steps_per_epoch = max(math.ceil(batches / accumulation_steps), 1)
    if max_steps > 0:
        return TrainingPlan(max_steps, math.ceil(max_steps / steps_per_epoch), steps_per_epoch)
    total = max(math.ceil(num_train_epochs * steps_per_epoch), 1)
    return TrainingPlan(total, math.ceil(num_train_epochs), steps_per_epoch)


def length_or_none(dataloader: Any) -> int | None:
    """``len(dataloader)``, or None for a stream without a length."""
    try:
        return len(dataloader)
    except TypeError:
        return None


def loader_epoch(dataloader: Any) -> int:
    """The epoch a loader stands in (a restored stream's), where steps per epoch are unknown."""
    progress = getattr(dataloader, "progress", None)
    return progress.epoch if progress is not None else 0


def window_sizes(train_dataloader: Any, accumulation_steps: int, plan: TrainingPlan, steps_done: int) -> Iterator[int]:
    """How many micro-batches each remaining window of an epoch reads (what transformers asks ``get_batch_samples``
    for): ``accumulation_steps``, the last window of the epoch the rest; unbounded for a stream without a length."""
    if plan.steps_per_epoch is None:
        while True:
            yield accumulation_steps
    last = len(train_dataloader) % accumulation_steps or accumulation_steps
    for step in range(steps_done, plan.steps_per_epoch):
        yield accumulation_steps if step < plan.steps_per_epoch - 1 else last


def log_plan(trainer: Any, plan: TrainingPlan, train_dataloader: Any) -> None:
    """The run's shape at INFO level when training starts, on the main process (``log_level="info"`` shows it,
    as transformers' "Running training" block)."""
    if not trainer.is_world_process_zero():
        return
    try:
        examples = f"{len(train_dataloader.dataset):,}"
    except (AttributeError, TypeError):
        examples = "unknown (a stream)"
    batch, accumulation = trainer._train_batch_size, trainer._accumulation_steps
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    logger.info("***** Running training *****\n  examples: %s\n  epochs: %s\n  optimizer steps per epoch: %s\n"
                "  batch size per process: %d\n  accumulation steps: %d\n  global batch size: %d\n"
                "  optimizer steps: %d\n  trainable parameters: %s",
                examples, "until max_steps" if plan.steps_per_epoch is None else f"{plan.num_epochs:,}",
                plan.steps_per_epoch if plan.steps_per_epoch is not None else "unknown", batch, accumulation,
                batch * accumulation * trainer.accelerator.strategy.data_parallel_size, plan.max_steps, f"{trainable:,}")
