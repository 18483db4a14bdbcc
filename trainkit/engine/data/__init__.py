"""Data for many processes: sharding any DataLoader, device placement, resumable positions."""

from __future__ import annotations

import itertools
from typing import Any

from torch.utils.data import BatchSampler, DataLoader

from .device import send_to_device
from .loader import DataLoaderDispatcher, DataLoaderStateMixin, DataProgress, PreparedDataLoader
from .preparation import loading_arguments, prepare_data_loader
from .sampling import IterableDatasetShard, SeedableRandomSampler, ShardedBatchSampler, get_sampler
from .stream_sources import ShardedIterable
from .streams import StreamShard


class _SkipBatchSampler(BatchSampler):
    """A batch sampler that passes over its first ``skip_batches`` batches (indices only, no data loaded).

    Accelerate's ``SkipBatchSampler`` (``accelerate.data_loader``), with its signature."""

    def __init__(self, batch_sampler: Any, skip_batches: int = 0) -> None:
        self.batch_sampler = batch_sampler
        self.skip_batches = skip_batches
        self.batch_size: int | None = getattr(batch_sampler, "batch_size", None)  # type: ignore[assignment]  # torch types it int; a custom sampler may have none
        self.drop_last = getattr(batch_sampler, "drop_last", False)

    def __iter__(self):  # type: ignore[override]  # the inner batch sampler's batches, sliced
        return itertools.islice(iter(self.batch_sampler), self.skip_batches, None)

    def __len__(self) -> int:
        return max(len(self.batch_sampler) - self.skip_batches, 0)


def skip_batches(dataloader: DataLoader, num_batches: int) -> DataLoader:
    """A copy of an unprepared ``dataloader`` that starts ``num_batches`` batches in."""
    if dataloader.batch_sampler is None:
        raise ValueError("skip_first_batches needs a DataLoader with batches (batch_size or batch_sampler).")
    return DataLoader(dataloader.dataset, batch_sampler=_SkipBatchSampler(dataloader.batch_sampler, num_batches),
                      **loading_arguments(dataloader))


__all__ = [
    "DataLoaderDispatcher",
    "DataLoaderStateMixin",
    "DataProgress",
    "IterableDatasetShard",
    "PreparedDataLoader",
    "SeedableRandomSampler",
    "ShardedBatchSampler",
    "ShardedIterable",
    "get_sampler",
    "StreamShard",
    "prepare_data_loader",
    "send_to_device",
    "skip_batches",
]
