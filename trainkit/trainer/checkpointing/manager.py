"""The Trainer's one checkpoint manager: saving, the resume point, rotation and the best model.

Every path that writes or reads a Trainer checkpoint goes through one :class:`CheckpointManager`: the
periodic save of the training loop, a save on demand (the preemption save calls :meth:`save_now`),
``train(resume_from_checkpoint=...)`` and ``load_best_model_at_end``. It remembers the folder the run
resumed from, so rotation never deletes it. The files themselves are written by :mod:`.files`
and loaded by :mod:`.resume`, both through the Accelerator's one checkpointer (``accelerator.checkpointer``), which
also decides which folder to resume from, where the checkpoints are stored (``checkpoint_dir``: a folder or an
object-store URL, default ``output_dir``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from trainkit.engine import TRAINER_CONVENTION, CorruptedCheckpointError, IncompleteCheckpointError, elastic_reason

from . import files as checkpoints
from . import preemption, resume
from .transformers_checkpoint import is_transformers_checkpoint, load_transformers_weights, resume_transformers_checkpoint

if TYPE_CHECKING:  # the Trainer as this module sees it: a Protocol (the Trainer imports this module, not the reverse)
    from .protocol import CheckpointedTrainer as Trainer

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _named_resume_errors() -> Iterator[None]:
    """A damaged or incomplete checkpoint, raised on every rank before anything was loaded, says how to resume."""
    try:
        yield
    except (CorruptedCheckpointError, IncompleteCheckpointError) as error:
        # A script that passes transformers' get_last_checkpoint() names the newest folder by number, sound or not.
        raise type(error)(f"{error} train(resume_from_checkpoint=True) resumes from the newest checkpoint in "
                          "output_dir that verifies.") from None


class CheckpointManager:
    """Writes, finds, rotates and loads one Trainer's ``checkpoint-N`` folders (see the module doc)."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self._resumed_from: str | None = None
        self._verified: str | None = None  # a folder the automatic choice has just checksummed

    @property
    def resumed_from(self) -> str | None:
        """The checkpoint this run resumed from (kept by rotation), or None."""
        return self._resumed_from

    def save(self) -> str | None:
        """Collective: the loop's periodic save (under ``save_strategy="best"`` only at a new best); the folder."""
        return checkpoints.save_training_checkpoint(self.trainer, self._resumed_from)

    def save_now(self) -> str:
        """Collective: write ``checkpoint-{global_step}`` now whatever the save strategy (e.g. before a
        preemption), rotate and upload as a periodic save does; return the folder. Synchronous even with
        ``async_save``: a save in flight is finished first, and this one is durable when it returns."""
        folder = checkpoints.save_training_checkpoint(self.trainer, self._resumed_from, only_if_best=False,
                                                      synchronous=True)
        return folder if folder is not None else checkpoints.checkpoint_folder(
            checkpoints.run_folder(self.trainer), self.trainer.state.global_step)

    def rotate(self) -> list[str]:
        """Main process: delete the oldest checkpoints beyond ``save_total_limit`` (never the best, the newest,
        nor the one resumed from); return what was deleted."""
        args, state = self.trainer.args, self.trainer.state
        return self.trainer.accelerator.checkpointer.rotate(
            checkpoints.run_folder(self.trainer), args.save_total_limit,
            protected=[state.best_model_checkpoint, self._resumed_from], prefix=checkpoints.PREFIX)

    def resume_folder(self, requested: str | os.PathLike | bool | None) -> str | None:
        """Collective: the folder ``train(resume_from_checkpoint=requested)`` resumes from (see
        :func:`trainkit.engine.checkpoint.find_resume_folder`), or None."""
        output_dir, checkpointer = checkpoints.run_output_dir(self.trainer.args), self.trainer.accelerator.checkpointer
        root = self.trainer.args.checkpoint_dir or output_dir  # as transformers: the run's folder, not a trial's
        if requested is True:  # transformers' ValueError and words (scripts and its tests match them)
            try:
                self._verified = checkpointer.find_resume_folder(True, root, conventions=[TRAINER_CONVENTION])
            except FileNotFoundError:
                raise ValueError(f"No valid checkpoint found in output directory ({root}): "
                                 "resume_from_checkpoint=True needs a complete checkpoint-N folder there.") from None
            return self._verified
        if isinstance(requested, (str, os.PathLike)) and "://" not in os.fspath(requested) and \
                not os.path.isdir(os.fspath(requested)):
            raise ValueError(f"Can't find a valid checkpoint at {os.fspath(requested)}: no such folder.")
        reason = elastic_reason(self.trainer.accelerator.config.elastic)
        if requested is None and checkpointer.decide("look for a preemption marker",
                                                     lambda: preemption.was_preempted(output_dir)):
            reason = f"The previous run in {output_dir} was stopped by a preemption signal"
        folder = checkpointer.find_resume_folder(requested, root, conventions=[TRAINER_CONVENTION],
                                                 automatic_reason=reason)
        self._verified = folder if requested is None else None  # chosen automatically: checksummed already
        return folder

    def load_weights(self, folder: str, model: Any = None) -> None:
        """Collective: verify ``folder`` (checksums, unless it was just verified) and load its weights into
        ``model`` (default: the prepared model)."""
        with _named_resume_errors():
            if is_transformers_checkpoint(folder):
                load_transformers_weights(self.trainer, folder, model)
            else:
                checkpoints.load_model_weights(self.trainer, folder, checksums=folder != self._verified, model=model)
        self._verified = folder

    def resume(self, folder: str, train_dataloader: Any, steps_per_epoch: int | None) -> resume.ResumePoint:
        """Collective: load ``folder``'s engine state (optimizer, schedule, RNG, data position), or a transformers
        checkpoint's optimizer, schedule and random states; return where the loop picks up (the trainer state and the
        weights are loaded by the Trainer's hooks)."""
        with _named_resume_errors():
            if is_transformers_checkpoint(folder):  # transformers' Trainer wrote it: continued as transformers would
                point = resume_transformers_checkpoint(self.trainer, folder, steps_per_epoch)
            else:  # a folder verified moments ago (chosen automatically, or by load_weights) is checked by size only
                point = resume.resume_training(self.trainer, folder, train_dataloader, steps_per_epoch,
                                               verify_checksums=folder != self._verified)
        self._resumed_from = folder
        return point

    def load_best_model(self) -> bool:
        """Collective: load the best checkpoint's weights, when there is one; return whether it did.

        A best checkpoint that is gone or does not verify is not loaded: as transformers does for a missing one,
        a warning says so and the model keeps its last weights (the run's work is not thrown away at its end).
        """
        trainer = self.trainer
        best = trainer.state.best_model_checkpoint
        if best is None:
            return False
        trainer.accelerator.wait_for_everyone()
        logger.info("Loading the best model from %s (%s=%s).", best, trainer.args.metric_for_best_model,
                    trainer.state.best_metric)
        try:
            checkpoints.load_model_weights(trainer, best)  # verifies on every rank before copying anything
        except (CorruptedCheckpointError, IncompleteCheckpointError) as error:
            if trainer.is_world_process_zero():
                logger.warning("load_best_model_at_end: the best checkpoint cannot be loaded, so the model keeps "
                               "its last weights: %s", error)
            return False
        return True
