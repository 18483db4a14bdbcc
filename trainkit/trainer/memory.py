"""The Trainer and device memory: transformers' memory metrics (``skip_memory_metrics``), emptying the
device cache every ``torch_empty_cache_steps``, and ``auto_find_batch_size``'s search for a batch that fits."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from trainkit.trainer.training_arguments.arguments import TrainingArguments

logger = logging.getLogger(__name__)


def maybe_empty_cache(args: TrainingArguments, global_step: int, device: torch.device) -> None:
    """Every ``torch_empty_cache_steps`` optimizer steps, release the accelerator's cached memory."""
    steps = args.torch_empty_cache_steps
    if not steps or global_step % steps or device.type == "cpu":
        return
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "empty_cache"):
        accelerator.empty_cache()
    elif device.type == "cuda":
        torch.cuda.empty_cache()


def batch_size_to_resume(trainer: Any, folder: str | None) -> None:
    """With auto_find_batch_size, a resume starts from the batch size the interrupted run had found."""
    if folder and trainer.args.auto_find_batch_size:
        from .checkpointing.resume import saved_train_batch_size

        trainer._train_batch_size = saved_train_batch_size(trainer, folder) or trainer._train_batch_size


def train_with_batch_size_search(trainer: Any, run: Callable[..., Any], batch_size: int) -> Any:
    """``run(batch_size=...)``; on an out-of-memory error take 90% of the batch size (rounded down) and start
    again, as transformers' auto_find_batch_size does (accelerate's find_executable_batch_size; every process
    must hit the error together, as on equal GPUs). The arguments keep the batch size the script gave; the
    Trainer trains with ``trainer._train_batch_size`` (also ``state.train_batch_size``, so a resume starts from it)."""
    from trainkit.engine import is_out_of_memory, release_memory

    while True:
        try:
            return run(batch_size=batch_size)
        except Exception as error:  # noqa: BLE001 - only out-of-memory errors are retried
            smaller = int(batch_size * 0.9)
            if not is_out_of_memory(error) or smaller < 1:
                raise
            if trainer.optimizer is not None:
                trainer.optimizer.zero_grad(set_to_none=True)
            release_memory()
            batch_size = smaller
            logger.warning("Out of memory: training again with a training batch size of %d per process.", batch_size)


class SkippedMemoryMetrics:
    """What transformers' TrainerMemoryTracker does under ``skip_memory_metrics=True`` (the default): nothing, with
    its methods, so subclasses that call ``self._memory_tracker.start()`` work; built without importing
    transformers."""

    skip_memory_metrics = True

    def start(self) -> None:
        """Nothing to measure."""

    def stop(self, stage: str) -> None:
        """Nothing to measure."""

    def update_metrics(self, stage: str, metrics: dict[str, Any]) -> None:
        """No metric to add."""

    def stop_and_update_metrics(self, metrics: dict[str, Any] | None = None) -> None:
        """No metric to add."""


def memory_tracker(args: TrainingArguments) -> Any:
    """transformers' TrainerMemoryTracker: with skip_memory_metrics=False it adds ``*_mem_*_delta`` metrics
    to train/evaluate results (CPU through psutil, plus the GPU where there is one)."""
    if args.skip_memory_metrics:
        return SkippedMemoryMetrics()
    from transformers.trainer_utils import TrainerMemoryTracker

    tracker = TrainerMemoryTracker(args.skip_memory_metrics)
    # It names the stage after its caller; releases before the loop was split (5.1) do not know _finalize_training.
    tracker.stages = {**tracker.stages, "_finalize_training": "train"}
    return tracker
