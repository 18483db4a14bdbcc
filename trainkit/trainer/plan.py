"""How long training runs: optimizer steps per epoch, epochs and total steps, and the global batch."""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from trainkit.engine import Accelerator
    from trainkit.trainer.training_arguments.arguments import TrainingArguments

# a Trainer mixin's messages are the Trainer's: one logger for them all, as transformers' come from transformers.trainer
logger = logging.getLogger("trainkit.trainer.trainer")


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


def window_sizes(train_dataloader: Any, accumulation_steps: int, steps_per_epoch: int | None,
                 steps_done: int) -> Iterator[int]:
    """How many micro-batches each remaining window of an epoch reads (what transformers asks ``get_batch_samples``
    for): ``accumulation_steps``, the last window of the epoch the rest; unbounded for a stream without a length
    (``steps_per_epoch`` None)."""
    if steps_per_epoch is None:
        while True:
            yield accumulation_steps
    last = len(train_dataloader) % accumulation_steps or accumulation_steps
    for step in range(steps_done, steps_per_epoch):
        yield accumulation_steps if step < steps_per_epoch - 1 else last


class TrainingValues(NamedTuple):
    """``Trainer.set_initial_training_values``'s answer, in transformers' order (a tuple, as it returns)."""

    num_train_epochs: int
    num_update_steps_per_epoch: int
    num_examples: int
    num_train_samples: float
    total_train_batch_size: int
    steps_in_epoch: int
    max_steps: int


class PlanMethods:
    """transformers' methods that size a run (mixed into :class:`~trainkit.Trainer`): its length, its global batch
    and the parallel degrees that divide the processes."""

    if TYPE_CHECKING:
        accelerator: Accelerator
        model: Any
        _train_batch_size: int

        def num_examples(self, dataloader: Any) -> int: ...

    @property
    def _accumulation_steps(self) -> int:
        """Micro-batches per optimizer step, as the engine resolved it (the arguments > the launcher > 1)."""
        return self.accelerator.gradient_accumulation_steps

    def set_initial_training_values(self, args: TrainingArguments, dataloader: Any) -> TrainingValues:
        """The run's length from ``max_steps`` or ``num_train_epochs`` and the dataloader: (epochs, optimizer steps
        per epoch, examples, samples trained on, global batch, micro-batches per epoch, total optimizer steps)."""
        plan = training_plan(dataloader, self._accumulation_steps, args.max_steps, args.num_train_epochs)
        total_batch = self.get_total_train_batch_size(args)
        batches = length_or_none(dataloader)
        if batches is None:  # a stream: as many passes as max_steps needs
            examples = total_batch * plan.max_steps
            return TrainingValues(plan.num_epochs, plan.max_steps, examples, examples, total_batch,
                                  plan.max_steps * self._accumulation_steps, plan.max_steps)
        examples = self.num_examples(dataloader)
        samples = plan.max_steps * total_batch if args.max_steps > 0 else examples * args.num_train_epochs
        return TrainingValues(plan.num_epochs, plan.steps_per_epoch or 1, examples, samples, total_batch, batches,
                              plan.max_steps)

    def get_total_train_batch_size(self, args: TrainingArguments) -> int:
        """Samples per optimizer step over all processes: micro-batch x accumulation x data-parallel processes."""
        data_parallel = self.accelerator.num_processes // self.get_tp_size() // self.get_cp_size() // self.get_sp_size()
        return self._train_batch_size * self._accumulation_steps * data_parallel

    def get_tp_size(self) -> int:
        """Processes each layer is split across: the model's own (sharded at load time), else the ParallelismConfig's."""
        model_tp = getattr(self.model, "_tp_size", None)
        if model_tp is not None:
            return int(model_tp)
        return self._parallel_degree("tp_size")

    def get_cp_size(self) -> int:
        """The context-parallel degree (1: trainkit refuses cp_size > 1, see ParallelismConfig)."""
        return self._parallel_degree("cp_size")

    def get_sp_size(self) -> int:
        """The sequence-parallel degree (1: trainkit refuses sp_size > 1, see ParallelismConfig)."""
        return self._parallel_degree("sp_size")

    def _parallel_degree(self, name: str) -> int:
        config = getattr(self.accelerator, "parallelism_config", None)
        return int(getattr(config, name, None) or 1) if config is not None else 1


def log_plan(trainer: Any, values: TrainingValues, train_dataloader: Any) -> None:
    """The run's shape at INFO level when training starts, on the main process (``log_level="info"`` shows it,
    as transformers' "Running training" block)."""
    if not trainer.is_world_process_zero() or not logger.isEnabledFor(logging.INFO):
        return
    try:
        examples = f"{len(train_dataloader.dataset):,}"
    except (AttributeError, TypeError):
        examples = "unknown (a stream)"
    sized = length_or_none(train_dataloader) is not None
    from transformers.trainer_pt_utils import get_model_param_count

    trainable = get_model_param_count(trainer.model, trainable_only=True)  # not the hook: transformers does the same
    logger.info("***** Running training *****\n  examples: %s\n  epochs: %s\n  optimizer steps per epoch: %s\n"
                "  batch size per process: %d\n  accumulation steps: %d\n  global batch size: %d\n"
                "  optimizer steps: %d\n  trainable parameters: %s",
                examples, f"{values.num_train_epochs:,}" if sized else "until max_steps",
                values.num_update_steps_per_epoch if sized else "unknown", trainer._train_batch_size,
                trainer._accumulation_steps, values.total_train_batch_size, values.max_steps, f"{trainable:,}")
