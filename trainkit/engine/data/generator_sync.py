"""Keep a user's shuffling ``torch.Generator`` in step across processes, and resumable.

With ``DataLoaderConfiguration(use_seedable_sampler=False)`` (Accelerate's default) a shuffled loader
keeps the user's ``RandomSampler`` and its generator: the order is exactly the one the same loader
gives on one process. For every process to draw that same permutation, the main process's generator
state is copied to the others at the start of each pass (what Accelerate's ``rng_types=["generator"]``
does). The state at the start of the running pass is what a checkpoint stores, so a resume replays the
same permutation.
"""

from __future__ import annotations

import base64
from typing import Any

import torch
import torch.distributed as dist


def broadcast_generator_state(generator: torch.Generator, from_process: int = 0) -> None:
    """Give ``generator`` the state it has on ``from_process`` (no-op without a process group)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    state = generator.get_state().to(device)
    dist.broadcast(state, src=from_process)
    generator.set_state(state.cpu())


def encode_state(state: torch.Tensor) -> str:
    """A generator state as JSON-friendly text."""
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def decode_state(text: str) -> torch.Tensor:
    """The generator state :func:`encode_state` wrote."""
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


class SyncedGenerator:
    """The user's sampler generator, the state it had when the running pass began, and a state to restore.

    Shared by a prepared loader and the views ``skip_first_batches`` makes of it.
    """

    def __init__(self, generator: torch.Generator, num_processes: int) -> None:
        self.generator = generator
        self.num_processes = num_processes
        self._pass_start: torch.Tensor | None = None
        self._to_restore: torch.Tensor | None = None

    def begin_pass(self) -> None:
        """Restore a loaded state if any, align every process with the main one, remember the start."""
        if self._to_restore is not None:
            self.generator.set_state(self._to_restore)
            self._to_restore = None
        if self.num_processes > 1:
            broadcast_generator_state(self.generator)
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
        else:
            state = self.generator.get_state()
        return {"generator": encode_state(state)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Use the stored state at the start of the next pass."""
        if "generator" in state:
            self._to_restore = decode_state(state["generator"])
