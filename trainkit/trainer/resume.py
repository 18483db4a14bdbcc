"""Resuming the Trainer from a ``checkpoint-N`` folder: which one, loading it, and where the data continues.

``train(resume_from_checkpoint=True)`` takes the newest complete checkpoint in ``output_dir`` (newer
incomplete ones are skipped, with a warning). When torchelastic restarts the workers after a failure
(``trainkit launch --max_restarts K``, ``torchrun --max-restarts K``), ``train()`` with no
``resume_from_checkpoint`` does the same by itself and says so, so the script needs no change.

The engine restores the training loader's position (a cursor in the global sample stream), so the
next batch is read directly: nothing is skipped by loading. Only a checkpoint without the engine's
state (``save_only_model``) makes the loop skip the epoch's consumed batches itself.
"""

from __future__ import annotations

import logging
import os
from typing import Any, NamedTuple

from trainkit.engine.checkpoint.accelerator_state import restart_count
from trainkit.engine.checkpoint.atomic import decide_on_rank0
from trainkit.engine.data import PreparedDataLoader

from .checkpoints import (
    TRAINER_STATE_NAME,
    has_engine_state,
    latest_checkpoint,
    load_model_weights,
    training_loaders,
)
from .preemption import was_preempted

logger = logging.getLogger(__name__)

class ResumePoint(NamedTuple):
    """Where the training loop picks up in its first epoch."""

    steps_done_in_epoch: int
    """Optimizer steps of the current epoch already taken (for ``state.epoch``)."""
    batches_to_skip: int
    """Micro-batches the loop must skip itself; 0 when the loader's position was restored."""


START = ResumePoint(0, 0)


def resolve_resume_folder(trainer: Any, resume_from_checkpoint: str | os.PathLike | bool | None) -> str | None:
    """Collective: the checkpoint folder ``train()`` resumes from, or None to start from the beginning.

    ``True`` means the newest complete checkpoint in ``output_dir`` (an error when there is none); None
    means the same after a torchelastic restart, and nothing otherwise; ``False`` never resumes. Rank 0
    chooses, so every rank loads the same folder.
    """
    restarts = restart_count()
    preempted = resume_from_checkpoint is None and not restarts and decide_on_rank0(
        "look for a preemption marker", lambda: was_preempted(trainer.args.output_dir))
    automatic = resume_from_checkpoint is None and (restarts > 0 or preempted)
    if resume_from_checkpoint is True or automatic:
        output_dir = trainer.args.output_dir
        latest = decide_on_rank0("find the latest checkpoint", lambda: latest_checkpoint(output_dir))
        if resume_from_checkpoint is True and latest is None:
            raise ValueError(f"resume_from_checkpoint=True but {output_dir} has no complete checkpoint.")
        if preempted and trainer.accelerator.is_main_process and latest is not None:
            logger.warning("The previous run in %s was stopped by a preemption signal: resuming automatically from %s.",
                           output_dir, latest)
        elif automatic and trainer.accelerator.is_main_process:
            if latest is None:
                logger.warning("Restart %d of this job: no complete checkpoint in %s yet, so training starts from "
                               "the beginning.", restarts, output_dir)
            else:
                logger.warning("Restart %d of this job: resuming automatically from %s, the latest complete "
                               "checkpoint.", restarts, latest)
        return latest
    if resume_from_checkpoint is None or resume_from_checkpoint is False:
        return None
    folder = os.path.normpath(os.fspath(resume_from_checkpoint))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"resume_from_checkpoint={folder!r}: no such folder.")
    return folder


def resume_training(trainer: Any, folder: str, train_dataloader: Any, steps_per_epoch: int | None) -> ResumePoint:
    """Collective: load ``folder`` into ``trainer`` (weights, optimizer, schedule, RNG, data position, state)."""
    from .callbacks import TrainerState

    if trainer.accelerator.is_main_process:
        logger.info("Resuming from %s", folder)
    position_restored = False
    if has_engine_state(folder):
        # Verifies the manifest first; nothing is half-loaded.
        trainer.accelerator.load_state(folder, dataloaders=training_loaders(train_dataloader))
        position_restored = isinstance(train_dataloader, PreparedDataLoader)
    else:
        if trainer.accelerator.is_main_process:
            logger.warning("%s holds the weights only (save_only_model): the optimizer, schedule and random "
                           "states start afresh, so the run will not continue exactly.", folder)
        load_model_weights(trainer, folder)
    loaded = TrainerState.load_from_json(os.path.join(folder, TRAINER_STATE_NAME))
    _adopt_state(trainer, loaded)
    trainer._resumed_from = folder

    if trainer.args.ignore_data_skip:  # transformers' meaning: the current epoch starts again from its first batch
        if position_restored:
            train_dataloader.progress.move_to(train_dataloader.progress.epoch)
        return START
    steps_done = loaded.global_step % steps_per_epoch if steps_per_epoch else 0
    if position_restored or not steps_per_epoch:
        return ResumePoint(steps_done, 0)  # the loader continues at its next sample by itself
    return ResumePoint(steps_done, steps_done * trainer.args.gradient_accumulation_steps)


def _adopt_state(trainer: Any, loaded: Any) -> None:
    """Take the checkpoint's TrainerState, keeping what describes this run (its plan, its process)."""
    for name in ("max_steps", "num_train_epochs", "train_batch_size", "logging_steps", "eval_steps", "save_steps",
                 "is_local_process_zero", "is_world_process_zero"):
        setattr(loaded, name, getattr(trainer.state, name))
    trainer.state = loaded
    for callback in trainer.callback_handler.callbacks:
        saved = loaded.stateful_callbacks.get(type(callback).__name__)
        if isinstance(saved, dict):
            for key, value in saved.get("attributes", {}).items():
                setattr(callback, key, value)
