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

import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from trainkit.engine import PreparedDataLoader

from .files import TRAINER_STATE_NAME, TRAINING_ARGS_NAME, training_loaders

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
    """Collective: load the engine's state of ``folder`` (optimizer, schedule, random states, data position; not
    the weights, which ``Trainer._load_from_checkpoint`` loads, as in transformers) into the prepared objects: the
    checkpointer is asked once to resume from it. Returns where the loop picks up in its first epoch.
    ``trainer.state`` is the checkpoint's already (``_init_training_state``). ``verify_checksums=False``: sizes only,
    for a folder the caller has just verified."""
    accelerator = trainer.accelerator
    if accelerator.is_main_process:
        logger.info("Resuming from %s", folder)
    # Verified first; nothing is half-loaded. The accumulation was rescaled before the plan (keep_global_batch_on_resume).
    resumed = accelerator.checkpointer.resume(folder, dataloaders=training_loaders(train_dataloader),
                                              verify_checksums=verify_checksums, keep_global_batch=False,
                                              load_models=False)  # the weights: the Trainer's _load_from_checkpoint
    position_restored = (resumed.engine_state and isinstance(train_dataloader, PreparedDataLoader)
                         and train_dataloader.resume_mid_epoch)
    if not resumed.engine_state and accelerator.is_main_process:
        logger.warning("%s holds the weights only (save_only_model): the optimizer, schedule and random "
                       "states start afresh, so the run will not continue exactly.", folder)
    if trainer.args.ignore_data_skip:  # transformers' meaning: the current epoch starts again from its first batch
        if position_restored:
            train_dataloader.progress.move_to(train_dataloader.progress.epoch)
        return START
    global_step = trainer.state.global_step
    steps_done = global_step % steps_per_epoch if steps_per_epoch else 0
    if position_restored or not steps_per_epoch:
        return ResumePoint(steps_done, 0)  # the loader continues at its next sample by itself
    return ResumePoint(steps_done, steps_done * accelerator.gradient_accumulation_steps)


def keep_global_batch_on_resume(trainer: Trainer, folder: str, train_dataloader: Any) -> None:
    """Before the run is planned: on another world size than ``folder`` was saved on, the engine rescales the run's
    accumulation so the global batch stays (the arguments stay as written); the saved accumulation is the one the
    Trainer recorded in its ``training_args.json``."""
    trainer.accelerator.checkpointer.rescale_for_global_batch(folder, train_dataloader, accumulation_from=TRAINING_ARGS_NAME)


def load_trainer_state(trainer: Trainer, folder: str) -> Any:
    """The TrainerState of ``folder``'s ``trainer_state.json``, read where the checkpoint is stored (a folder or an
    object store); unknown keys are left out, as ``TrainerState.load_from_json`` (which reads a local file) would
    fail on them."""
    from ..callbacks import TrainerState

    data = trainer.accelerator.checkpointer.read_json(folder, TRAINER_STATE_NAME)
    if data is None:
        raise FileNotFoundError(f"{folder} has no {TRAINER_STATE_NAME}: it is not a Trainer checkpoint.")
    known = {field.name for field in dataclasses.fields(TrainerState)}
    ignored = sorted(set(data) - known)
    if ignored:
        logger.info("%s: ignoring keys %s", TRAINER_STATE_NAME, ignored)
    return TrainerState(**{key: value for key, value in data.items() if key in known})


def saved_train_batch_size(trainer: Trainer, folder: str) -> int | None:
    """The per-process training batch size ``folder``'s run used (its trainer_state.json, read where the checkpoint
    is stored), None if unknown."""
    state = trainer.accelerator.checkpointer.read_json(folder, TRAINER_STATE_NAME)
    return None if state is None else state.get("train_batch_size")


def warn_about_changed_plan(trainer: Trainer, loaded: Any, folder: str) -> None:
    """One warning listing the intervals and batch size that differ from the checkpoint's (the run keeps its own)."""
    pairs = [(name, getattr(trainer.state, name), getattr(loaded, name)) for name in ("logging_steps", "eval_steps", "save_steps")]
    pairs.append(("per_device_train_batch_size", trainer.state.train_batch_size, loaded.train_batch_size))
    changed = [f"{name}: {now} (from args) != {saved} (from trainer_state.json)"
               for name, now, saved in pairs if now is not None and saved is not None and now != saved]
    if changed and trainer.accelerator.is_main_process:
        logger.warning("Resuming from %s with settings that differ from the checkpoint's; this run's are used:\n  %s",
                       folder, "\n  ".join(changed))


def adopt_state(trainer: Trainer, loaded: Any) -> None:
    """Take the checkpoint's TrainerState, keeping what describes this run (its plan, its process)."""
    for name in ("max_steps", "num_train_epochs", "train_batch_size", "logging_steps", "eval_steps", "save_steps",
                 "is_local_process_zero", "is_world_process_zero"):
        setattr(loaded, name, getattr(trainer.state, name))
    trainer.state = loaded
