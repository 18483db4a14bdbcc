"""What the checkpoint modules need from a Trainer, as a structural type (the Trainer is never imported here).

The Trainer imports the checkpoint modules; typing them against this ``Protocol`` instead of ``Trainer``
keeps the dependency one-way (no import cycle, ``TYPE_CHECKING`` imports included) and lists, in one place,
what saving, resuming and a preemption save touch. Read-only members are properties; ``state`` and the
preemption watch are the only attributes these modules assign. trainer.py has mypy check that the Trainer
satisfies :class:`PreemptibleTrainer`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from trainkit.engine import Accelerator
    from trainkit.engine import PreemptionWatch

    from ..training_arguments.arguments import TrainingArguments
    from ..callbacks import CallbackHandler, TrainerState


class CheckpointedTrainer(Protocol):
    """The Trainer as the checkpoint files, resume and the manager see it."""

    state: TrainerState
    """Saved with each checkpoint; replaced by the checkpoint's own on resume."""

    _engine_saved_weights_to: str | None
    """The checkpoint folder being written while ``save_model`` runs in it: the engine wrote the weights there."""

    @property
    def args(self) -> TrainingArguments:
        """Where and how often to save (``output_dir``, ``save_*``, ``hub_strategy``), what a resume restores."""

    @property
    def accelerator(self) -> Accelerator:
        """Writes and loads the engine's state; its ``config`` holds the run's resolved accumulation."""

    @property
    def callback_handler(self) -> CallbackHandler:
        """Its callbacks' states are saved (and restored on request), its training loader's position too."""

    @property
    def model_wrapped(self) -> Any:
        """The model as the engine prepared it: its weights are saved and loaded."""

    @property
    def optimizer(self) -> Any:
        """The prepared optimizer: a transformers checkpoint's ``optimizer.pt`` is loaded into it."""

    @property
    def lr_scheduler(self) -> Any:
        """The schedule: a transformers checkpoint's ``scheduler.pt`` is loaded into it."""

    def is_world_process_zero(self) -> bool:
        """True on the one process that writes the run's own files."""

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Collective: the model's files in ``output_dir`` (in a checkpoint: all but the engine's weights)."""

    def _stateful_callbacks(self) -> list[Any]:
        """The callbacks and control whose states ``trainer_state.json`` stores."""

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """Main process: upload a committed checkpoint as ``hub_strategy`` says."""

    _trial: Any
    """The hyperparameter-search trial being trained (None outside a search)."""

    def _get_output_dir(self, trial: Any) -> str:
        """The run's checkpoint folder: ``output_dir``, or the trial's ``run-{id}`` folder in it."""


class SavesNow(Protocol):
    """The manager's on-demand save, as the preemption save calls it."""

    def save_now(self) -> str:
        """Collective: write ``checkpoint-{global_step}`` whatever the save strategy; return the folder."""


class PreemptibleTrainer(CheckpointedTrainer, Protocol):
    """A Trainer that saves once and exits on a preemption signal (:mod:`.preemption`)."""

    _preemption_watch: PreemptionWatch | None
    """The signal watch while the training loop runs (set by :func:`.preemption.watching`), else None."""

    @property
    def checkpoint_manager(self) -> SavesNow:
        """Writes the preemption checkpoint (:meth:`~.manager.CheckpointManager.save_now`)."""
