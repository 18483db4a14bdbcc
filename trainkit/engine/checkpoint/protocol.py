"""What the checkpointer needs from the Accelerator, as a structural type.

The Accelerator imports the checkpoint package (lazily, in ``save_state`` and ``load_state``); typing
:mod:`.accelerator_state` against this ``Protocol`` instead of ``Accelerator`` keeps the dependency one-way
(no import cycle, ``TYPE_CHECKING`` imports included) and lists what a checkpoint reads and writes on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from trainkit.config.engine import EngineConfig
    from trainkit.engine.accelerator_parts.prepared import PreparedObjects
    from trainkit.engine.strategies.base import Strategy
    from trainkit.utils.dataclasses import ProjectConfiguration


class CheckpointedAccelerator(Protocol):
    """The Accelerator as :mod:`.accelerator_state` sees it."""

    step: int
    """Saved and restored with the state (Accelerate's automatic-naming counter)."""
    gradient_accumulation_steps: int
    """Recorded with the global batch; rescaled on load where the world size changed (elastic resume)."""
    config: EngineConfig
    """The resolved settings (replaced, with provenance, when a resume rescales accumulation)."""

    @property
    def strategy(self) -> Strategy:
        """Decides sharded or full files and reads and writes model and optimizer state."""

    @property
    def precision(self) -> Any:
        """The mixed precision, whose ``state_dict``/``load_state_dict`` hold the loss scaler."""

    @property
    def prepared(self) -> PreparedObjects:
        """The models, optimizers, schedulers, loaders and custom objects a checkpoint holds."""

    @property
    def project_configuration(self) -> ProjectConfiguration:
        """Where automatically named checkpoints go and how many are kept."""

    @property
    def device(self) -> Any:
        """This process's device (random states are restored onto it)."""

    @property
    def process_index(self) -> int:
        """Global rank (each rank writes its own random states)."""

    @property
    def num_processes(self) -> int:
        """World size (stored, and checked on load)."""

    @property
    def is_main_process(self) -> bool:
        """True on the rank that writes the shared files."""

    def wait_for_everyone(self) -> None:
        """Barrier across all processes."""
