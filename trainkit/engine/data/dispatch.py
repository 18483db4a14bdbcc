"""``dispatch_batches=True``: the main process reads every global batch and hands each rank its slice.

For streams that cannot be split (a single sequential source, a reader that must run once), and for map-style
data when the script asks for it (as Accelerate does), rank 0 iterates the user's DataLoader with the *global*
batch size (a map-style loader's batches taken ``num_processes`` at a time, :class:`GlobalBatches`), cuts each collated batch along its first
dimension into one slice per rank and sends them with ``scatter_object_list``; the other ranks read
nothing. A short last global batch is filled up by repeating its own rows, so every rank gets a full
slice, and the real rows per rank travel with it (``gather_for_metrics`` keeps only those).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from trainkit.engine.process import collectives
from trainkit.engine.process.collectives import recursively_apply


class GlobalBatches:
    """A batch sampler's batches joined ``num_processes`` at a time: the global batches the main process reads for a
    dispatched map-style loader (the last one short when the batches run out, unless ``drop_last``)."""

    def __init__(self, batch_sampler: Any, num_processes: int) -> None:
        self.batch_sampler = batch_sampler
        self.num_processes = num_processes
        batch_size = getattr(batch_sampler, "batch_size", None)
        self.batch_size = None if batch_size is None else batch_size * num_processes
        self.drop_last = bool(getattr(batch_sampler, "drop_last", False))

    @property
    def sampler(self) -> Any:
        """The sampler ordering the dataset (the wrapped batch sampler's)."""
        return getattr(self.batch_sampler, "sampler", None)

    def __len__(self) -> int:
        batches = len(self.batch_sampler)
        return batches // self.num_processes if self.drop_last else -(-batches // self.num_processes)

    def __iter__(self) -> Iterator[list[int]]:
        joined: list[int] = []
        taken = 0
        for batch in self.batch_sampler:
            joined.extend(batch)
            taken += 1
            if taken == self.num_processes:
                yield joined
                joined, taken = [], 0
        if joined and not self.drop_last:
            yield joined


def batch_rows(batch: Any) -> int:
    """Rows of a collated batch: the first dimension of its first tensor."""
    found: list[int] = []

    def note(tensor: torch.Tensor) -> None:
        if tensor.ndim:
            found.append(tensor.shape[0])

    recursively_apply(note, batch)
    if not found:
        raise ValueError("dispatch_batches=True needs batches of tensors (it slices them along their first dimension).")
    return found[0]


def split_global_batch(batch: Any, num_processes: int, per_rank: int) -> tuple[list[Any], list[int]]:
    """Cut ``batch`` into ``num_processes`` slices of ``per_rank`` rows (filled by repeating rows); real rows of each."""
    rows = batch_rows(batch)
    if num_processes == 1:
        return [batch], [rows]  # one process: a short last batch stays short, as an undispatched loader's
    full = per_rank * num_processes
    if rows < full:
        index = torch.arange(full) % rows

        def repeat_rows(tensor: torch.Tensor) -> torch.Tensor:
            return tensor[index.to(tensor.device)] if tensor.ndim else tensor

        batch = recursively_apply(repeat_rows, batch)

    def rank_slice(rank: int):
        def cut(tensor: torch.Tensor) -> torch.Tensor:
            return tensor[rank * per_rank : (rank + 1) * per_rank] if tensor.ndim else tensor

        return cut

    slices = [recursively_apply(rank_slice(r), batch) for r in range(num_processes)]
    real = [max(0, min(per_rank, rows - r * per_rank)) for r in range(num_processes)]
    return slices, real


def dispatched_batches(global_batches: Iterator[Any] | None, num_processes: int, process_index: int,
                       per_rank: int) -> Iterator[tuple[Any, list[int], None]]:
    """(this rank's slice, real rows per rank, None) for each global batch rank 0 reads; ends for all together."""
    while True:
        payload: list[Any] = [None] * num_processes
        if process_index == 0:
            batch = next(global_batches, None) if global_batches is not None else None
            if batch is not None:
                slices, real = split_global_batch(batch, num_processes, per_rank)
                payload = [(piece, real) for piece in slices]
        received = collectives.scatter_object(payload if process_index == 0 else None, from_process=0)
        if received is None:
            return
        piece, real = received
        yield piece, real, None

