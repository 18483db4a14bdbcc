"""Resuming the Trainer from a ``checkpoint-N`` folder: loading it, and where the data continues.

Which folder is decided by :func:`trainkit.engine.checkpoint.resume_folder.find_resume_folder` (through
the Trainer's :class:`~trainkit.trainer.checkpointing.manager.CheckpointManager`): ``train(resume_from_checkpoint=True)``
takes the newest complete checkpoint in ``output_dir``, and after a torchelastic restart ``train()`` does the
same by itself, so the script needs no change.

The engine restores the training loader's position (a cursor in the global sample stream: the Trainer's
loader resumes mid-epoch), so the next batch is read directly: nothing is skipped by loading. Only a
checkpoint without the engine's state (``save_only_model``) makes the loop skip the epoch's consumed
batches itself.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from trainkit.engine.checkpoint.global_batch import BatchShape, keep_global_batch, saved_batch_shape
from trainkit.engine.data import PreparedDataLoader

from .files import TRAINER_STATE_NAME, TRAINING_ARGS_NAME, has_engine_state, load_model_weights, training_loaders

if TYPE_CHECKING:  # the Trainer as this module sees it: a Protocol (the Trainer imports this module, not the reverse)
    from .protocol import CheckpointedTrainer as Trainer

logger = logging.getLogger(__name__)


class ResumePoint(NamedTuple):
    """Where the training loop picks up in its first epoch."""

    steps_done_in_epoch: int
    """Optimizer steps of the current epoch already taken (for ``state.epoch``)."""
    batches_to_skip: int
    """Micro-batches the loop must skip itself; 0 when the loader's position was restored."""
    restore_random_states: Callable[[], None] | None = None
    """For a checkpoint transformers wrote: restores its random states where transformers does (at the epoch's
    start, or once the first window is read when batches are skipped); None when loading restored them."""


START = ResumePoint(0, 0)


def resume_training(trainer: Trainer, folder: str, train_dataloader: Any, steps_per_epoch: int | None, *,
                    verify_checksums: bool = True) -> ResumePoint:
    """Collective: load ``folder`` into ``trainer`` (weights, optimizer, schedule, RNG, data position, state).
    ``verify_checksums=False``: sizes only, for a folder the caller has just verified."""
    from ..callbacks import TrainerState

    if trainer.accelerator.is_main_process:
        logger.info("Resuming from %s", folder)
    position_restored = False
    if has_engine_state(folder):
        # Verifies the manifest first; nothing is half-loaded.
        trainer.accelerator.load_state(folder, dataloaders=training_loaders(train_dataloader),
                                       verify_checksums=verify_checksums, keep_global_batch=False)
        position_restored = isinstance(train_dataloader, PreparedDataLoader) and train_dataloader.resume_mid_epoch
    else:
        if trainer.accelerator.is_main_process:
            logger.warning("%s holds the weights only (save_only_model): the optimizer, schedule and random "
                           "states start afresh, so the run will not continue exactly.", folder)
        load_model_weights(trainer, folder, checksums=verify_checksums)
    loaded = TrainerState.load_from_json(os.path.join(folder, TRAINER_STATE_NAME))
    _warn_about_changed_plan(trainer, loaded, folder)
    _adopt_state(trainer, loaded)

    if trainer.args.ignore_data_skip:  # transformers' meaning: the current epoch starts again from its first batch
        if position_restored:
            train_dataloader.progress.move_to(train_dataloader.progress.epoch)
        return START
    steps_done = loaded.global_step % steps_per_epoch if steps_per_epoch else 0
    if position_restored or not steps_per_epoch:
        return ResumePoint(steps_done, 0)  # the loader continues at its next sample by itself
    return ResumePoint(steps_done, steps_done * trainer.accelerator.config.gradient_accumulation_steps)


def keep_global_batch_on_resume(trainer: Trainer, folder: str, train_dataloader: Any) -> None:
    """Before the run is planned: on another world size than ``folder`` was saved on, rescale the run's
    accumulation (``accelerator.config``; the arguments stay as written) so the global batch stays
    (engine/checkpoint/global_batch.py decides, and refuses where it does not divide); says what changed."""
    args_path = os.path.join(folder, TRAINING_ARGS_NAME)
    if not os.path.isfile(args_path):
        return
    with open(args_path, encoding="utf-8") as handle:
        saved_accumulation = json.load(handle).get("gradient_accumulation_steps")
    saved = saved_batch_shape(folder, accumulation=saved_accumulation)
    if saved is None or saved_accumulation is None:
        return
    args, accelerator = trainer.args, trainer.accelerator
    current = BatchShape(accelerator.num_processes, getattr(train_dataloader, "global_batch_size", None),
                         accelerator.config.gradient_accumulation_steps)
    rescale = keep_global_batch(saved, current, folder)
    if rescale is None:
        return
    previous = accelerator.config.gradient_accumulation_steps
    accelerator.config = accelerator.config.replace(rescale.source, gradient_accumulation_steps=rescale.accumulation)
    if accelerator.is_main_process:
        logger.warning("trainkit: %s", rescale.describe(previous, accelerator.num_processes))


def saved_train_batch_size(folder: str) -> int | None:
    """The per-process training batch size ``folder``'s run used (its trainer_state.json), None if unknown."""
    from ..callbacks import TrainerState

    path = os.path.join(folder, TRAINER_STATE_NAME)
    if not os.path.isfile(path):
        return None
    return TrainerState.load_from_json(path).train_batch_size


def _warn_about_changed_plan(trainer: Trainer, loaded: Any, folder: str) -> None:
    """One warning listing the intervals and batch size that differ from the checkpoint's (the run keeps its own)."""
    pairs = [(name, getattr(trainer.state, name), getattr(loaded, name)) for name in ("logging_steps", "eval_steps", "save_steps")]
    pairs.append(("per_device_train_batch_size", trainer.state.train_batch_size, loaded.train_batch_size))
    changed = [f"{name}: {now} (from args) != {saved} (from trainer_state.json)"
               for name, now, saved in pairs if now is not None and saved is not None and now != saved]
    if changed and trainer.accelerator.is_main_process:
        logger.warning("Resuming from %s with settings that differ from the checkpoint's; this run's are used:\n  %s",
                       folder, "\n  ".join(changed))


def _adopt_state(trainer: Trainer, loaded: Any) -> None:
    """Take the checkpoint's TrainerState, keeping what describes this run (its plan, its process)."""
    for name in ("max_steps", "num_train_epochs", "train_batch_size", "logging_steps", "eval_steps", "save_steps",
                 "is_local_process_zero", "is_world_process_zero"):
        setattr(loaded, name, getattr(trainer.state, name))
    trainer.state = loaded
    if not trainer.args.restore_callback_states_from_checkpoint:
        return  # transformers' default: callbacks keep the state they were created with
    for callback in trainer.callback_handler.callbacks:
        saved = loaded.stateful_callbacks.get(type(callback).__name__)
        if isinstance(saved, dict):
            for key, value in saved.get("attributes", {}).items():
                setattr(callback, key, value)
