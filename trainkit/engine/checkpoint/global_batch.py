"""Keeping the global batch when a checkpoint resumes on another world size (an elastic membership change).

The global batch -- samples per optimizer step -- is the training loader's global batch (each process's batch
times the processes) times the gradient accumulation steps. A checkpoint records both: ``accelerator_state.json``
holds ``world_size`` and ``gradient_accumulation_steps``, the first tracked loader's position its
``global_batch_size`` (the Trainer's checkpoints track only the training loader; an ``Accelerator`` loop's
first prepared loader is taken as its training loader). Resumed on another world size, the accumulation
becomes *saved global batch / this run's loader global batch*: fewer processes accumulate more micro-batches,
more processes fewer, and the optimizer sees the same batch. The loader's position is a count of global samples,
so the data continues without a repeat or a gap. Where the quotient is not a whole number the resume is
refused, naming the numbers. The one decision lives in :func:`keep_global_batch`; the Accelerator's
``load_state`` and the Trainer's resume apply it (each to the accumulation it owns) and log it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import state_io

if TYPE_CHECKING:
    from .storage.base import CheckpointStorage

STATE_FILE = "accelerator_state.json"
LOADERS_NAME = "dataloaders"


class GlobalBatchError(ValueError):
    """The checkpoint's global batch cannot be rebuilt on this world size with a whole accumulation count."""


@dataclass(frozen=True)
class BatchShape:
    """How one run forms its global batch."""

    world_size: int
    loader_global_batch: int | None
    """Samples one micro-batch step reads over all processes; None when unknown (an unbatched loader, an old checkpoint)."""
    accumulation: int
    """Micro-batches per optimizer step."""

    @property
    def samples_per_step(self) -> int | None:
        """The global batch: samples per optimizer step over all processes."""
        return None if self.loader_global_batch is None else self.loader_global_batch * self.accumulation


@dataclass(frozen=True)
class Rescale:
    """What a resume on another world size changes to keep the global batch."""

    saved: BatchShape
    accumulation: int
    """The accumulation this run uses from now on."""
    folder: str

    @property
    def source(self) -> str:
        """Provenance words for the rescaled accumulation."""
        return (f"rescaled on resume from {self.folder} (world size {self.saved.world_size}, accumulation "
                f"{self.saved.accumulation}) to keep the global batch")

    def describe(self, configured: int, world_size: int) -> str:
        """One log line: what changed (world size, accumulation) and what stayed (the global batch).
        ``configured``: the accumulation this run was set up with before the checkpoint was read."""
        replaced = f" (instead of the configured {configured})" if configured != self.accumulation else ""
        return (f"World size {self.saved.world_size} -> {world_size} since {self.folder}: gradient_accumulation_steps "
                f"{self.saved.accumulation} -> {self.accumulation}{replaced}, keeping the global batch of "
                f"{self.saved.samples_per_step} samples per optimizer step; the data continues at the next global sample.")


def keep_global_batch(saved: BatchShape, current: BatchShape, folder: str) -> Rescale | None:
    """The accumulation that keeps ``saved``'s global batch on ``current``'s world size, or None when the world
    size is unchanged or a global batch is unknown. Raises :class:`GlobalBatchError` where it does not divide."""
    if saved.world_size == current.world_size:
        return None
    total, per_micro_step = saved.samples_per_step, current.loader_global_batch
    if total is None or per_micro_step is None:
        return None
    if total % per_micro_step:
        raise GlobalBatchError(
            f"Cannot keep the global batch of {folder} on {current.world_size} processes: it was {total} samples per "
            f"optimizer step ({saved.loader_global_batch} per micro-batch over {saved.world_size} processes x "
            f"{saved.accumulation} accumulation steps), and {total} is not a multiple of this run's "
            f"{per_micro_step} samples per micro-batch ({current.world_size} processes). Run on a world size whose "
            f"global micro-batch divides {total}, or change the per-process batch size so that it does.")
    return Rescale(saved, total // per_micro_step, folder)


def saved_batch_shape(storage: CheckpointStorage, folder: str, *, accumulation: int | None = None) -> BatchShape | None:
    """The batch shape a checkpoint was saved with (reads its JSON files), or None when it holds no engine state.
    ``accumulation``: the caller's own record of it (the Trainer's ``training_args.json``)."""
    state_path = storage.join(folder, STATE_FILE)
    if not storage.exists(state_path):
        return None
    info = state_io.read_json(storage, state_path)
    loaders = state_io.read_optional(storage, folder, LOADERS_NAME) or []
    first = loaders[0] if isinstance(loaders, list) and loaders and isinstance(loaders[0], dict) else {}
    steps = accumulation if accumulation is not None else info.get("gradient_accumulation_steps")
    loader_global = first.get("global_batch_size") if steps is not None else None  # unknown accumulation: no shape
    return BatchShape(int(info["world_size"]), int(loader_global) if loader_global else None, int(steps or 1))
