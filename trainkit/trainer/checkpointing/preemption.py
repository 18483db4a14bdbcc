"""The Trainer under preemption: on SIGTERM/SIGINT/SIGUSR1 every rank stops at the same step, one
``checkpoint-N`` is saved, the process exits with code 75, and the same command resumes from it.

On whenever the Trainer writes checkpoints (``save_strategy != "no"``); ``enable_jit_checkpoint=False`` turns
it off, ``True`` turns it on even without regular saves. The agreement between ranks and the exit live in
:mod:`trainkit.engine.process.preemption`; this module decides when it applies, saves, and leaves a marker in
``output_dir`` so that the next ``train()`` of the same command resumes by itself (removed when a run ends
normally). See docs/preemption.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from trainkit.config.files import write_text_atomic
from trainkit.engine import PreemptionWatch

from . import files as checkpoints

if TYPE_CHECKING:  # the Trainer as this module sees it: a Protocol (the Trainer imports this module, not the reverse)
    from .protocol import PreemptibleTrainer
    from trainkit.trainer.training_arguments.arguments import TrainingArguments

logger = logging.getLogger(__name__)

MARKER_NAME = "trainkit_preempted.json"
"""Left in ``output_dir`` by a run stopped by a preemption signal: the next ``train()`` resumes by itself."""


def is_enabled(args: TrainingArguments) -> bool:
    """``enable_jit_checkpoint`` when set, else on exactly when the run writes checkpoints."""
    explicit = getattr(args, "enable_jit_checkpoint", None)
    return bool(explicit) if explicit is not None else args.save_strategy != "no"


def marker_path(output_dir: str) -> str:
    """Where the preemption marker of ``output_dir`` lives."""
    return os.path.join(output_dir, MARKER_NAME)


def was_preempted(output_dir: str) -> bool:
    """True when the last run in ``output_dir`` was stopped by a preemption signal (and not finished since)."""
    return os.path.isfile(marker_path(output_dir))


@contextlib.contextmanager
def watching(trainer: PreemptibleTrainer) -> Iterator[None]:
    """Handle the preemption signals for the duration of the training loop (when enabled)."""
    if not is_enabled(trainer.args):
        yield
        return
    trainer._preemption_watch = PreemptionWatch().start()
    try:
        yield
    except BaseException:
        trainer._preemption_watch.close(wait=False)
        raise
    else:
        trainer._preemption_watch.close()
        output_dir = checkpoints.run_output_dir(trainer.args)
        if trainer.is_world_process_zero() and was_preempted(output_dir):
            os.remove(marker_path(output_dir))  # finished: the next run starts afresh
    finally:
        trainer._preemption_watch = None


def at_step_boundary(trainer: PreemptibleTrainer) -> None:
    """Collective (called after every optimizer step): on an agreed stop, save ``checkpoint-N`` and exit."""
    watch = getattr(trainer, "_preemption_watch", None)
    if watch is None or not watch.poll():
        return
    state, output_dir = trainer.state, checkpoints.run_output_dir(trainer.args)
    folder = os.path.normpath(checkpoints.checkpoint_folder(output_dir, state.global_step))
    if trainer.is_world_process_zero():
        logger.warning("Preemption (%s): all %d processes stop at step %d; saving %s.", watch.describe_cause(),
                       trainer.accelerator.num_processes, state.global_step, folder)
    trainer.checkpoint_manager.save_now()  # whatever the save strategy: this is the run's last chance
    if trainer.is_world_process_zero():
        note = {"checkpoint": folder, "global_step": state.global_step,
                "signal": watch.received.name if watch.received is not None else None}
        write_text_atomic(marker_path(output_dir), json.dumps(note) + "\n")
    trainer.accelerator.end_training()
    watch.exit_after_save(folder, state.global_step, state=trainer.accelerator.state)
