"""Keep a user's shuffling ``torch.Generator`` in step across processes, and resumable.

With ``DataLoaderConfiguration(use_seedable_sampler=False)`` (Accelerate's default) a shuffled loader
keeps the user's ``RandomSampler`` and its generator: the order is exactly the one the same loader
gives on one process. For every process to draw that same permutation, the main process's generator
state is copied to the others at the start of each pass (what Accelerate's ``rng_types=["generator"]``
does). The state at the start of the running pass is what a checkpoint stores, so a resume replays the
same permutation.
"""

from __future__ import annotations

from typing import Any

import torch

from trainkit.utils.enums import RNGType
from trainkit.utils.random import rng_state_from_text, rng_state_to_text, synchronize_rng_state


class SyncedGenerator:
    """The user's sampler generator, the state it had when the running pass began, and a state to restore.

    Shared by a prepared loader and the views ``skip_first_batches`` makes of it.
    """

    def __init__(self, generator: torch.Generator, num_processes: int, reseeded_each_pass: bool = False) -> None:
        self.generator = generator
        self.num_processes = num_processes
        self.reseeded_each_pass = reseeded_each_pass
        """Each pass seeds the generator afresh (see :class:`.pass_draws.PassDraws`): after a finished pass its state
        says nothing about the next one."""
        self._pass_start: torch.Tensor | None = None
        self._to_restore: torch.Tensor | None = None

    def begin_pass(self) -> None:
        """Restore a loaded state if any, align every process with the main one, remember the start."""
        if self._to_restore is not None:
            self.generator.set_state(self._to_restore)
            self._to_restore = None
        if self.num_processes > 1:
            synchronize_rng_state(RNGType.GENERATOR, self.generator)
        self._pass_start = self.generator.get_state().clone()

    def end_pass(self) -> None:
        """The pass consumed its whole order: the generator's current state starts the next one."""
        self._pass_start = None

    def state_dict(self, pass_finished: bool) -> dict[str, Any]:
        """The state that replays the position's pass: its start while it runs, else the current state."""
        if self._to_restore is not None:
            state = self._to_restore
        elif self._pass_start is not None and not pass_finished:
            state = self._pass_start
        elif self.reseeded_each_pass:
            return {"generator_reseeded": True}
        else:
            state = self.generator.get_state()
        return {"generator": rng_state_to_text(state), "generator_reseeded": self.reseeded_each_pass}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Use the stored state at the start of the next pass, and reseed each pass exactly when the saved run did
        (a run saved on another number of processes may have had the other mode)."""
        if "generator" in state:
            self._to_restore = rng_state_from_text(state["generator"])
        if "generator" in state or "generator_reseeded" in state:
            self.reseeded_each_pass = bool(state.get("generator_reseeded", False))
