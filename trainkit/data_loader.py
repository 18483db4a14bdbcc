"""``accelerate.data_loader``'s names over trainkit's sharded dataloaders (:mod:`trainkit.engine.data`).

``DataLoaderShard`` is trainkit's :class:`PreparedDataLoader` and ``BatchSamplerShard`` its
:class:`ShardedBatchSampler`: every process iterates the same seeded order and keeps its part.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch.utils.data import DataLoader

from trainkit.engine.step.accumulation import GradientState
from trainkit.engine.data import (
    DataLoaderDispatcher,
    DataLoaderStateMixin,
    IterableDatasetShard,
    PreparedDataLoader,
    SeedableRandomSampler,
    ShardedBatchSampler,
    get_sampler,
    skip_batches,
)
from trainkit.engine.data import _SkipBatchSampler as SkipBatchSampler
from trainkit.engine.data import prepare_data_loader as _prepare
from trainkit.utils.dataclasses import DataLoaderConfiguration

BatchSamplerShard = ShardedBatchSampler
DataLoaderShard = PreparedDataLoader

__all__ = ["BatchSamplerShard", "DataLoaderAdapter", "DataLoaderDispatcher", "DataLoaderShard", "DataLoaderStateMixin",
           "IterableDatasetShard", "SeedableRandomSampler", "SkipBatchSampler", "SkipDataLoader", "get_sampler", "prepare_data_loader",
           "skip_first_batches"]

class DataLoaderAdapter(DataLoader):
    """Accelerate's base of its loaders: a DataLoader (torchdata's ``StatefulDataLoader`` is not used: trainkit's
    prepared loaders save and restore their position themselves)."""

    def __init__(self, dataset: Any, use_stateful_dataloader: bool = False, batch_sampler: Any = None,
                 **kwargs: Any) -> None:
        if use_stateful_dataloader:
            raise ValueError("DataLoaderAdapter(use_stateful_dataloader=True): trainkit does not use torchdata's "
                             "StatefulDataLoader; prepare the loader (Accelerator.prepare) and its position is saved "
                             "by save_state and restored by load_state.")
        super().__init__(dataset, batch_sampler=batch_sampler, **kwargs)
        self.use_stateful_dataloader = use_stateful_dataloader
        self.base_dataloader = self
        """The loader that does the work (this one)."""


class SkipDataLoader(DataLoaderAdapter):
    """A DataLoader whose passes start ``skip_batches`` batches in; the skipped batches are read and dropped (for any
    dataset, iterable ones included). :func:`skip_first_batches` skips without reading where it can."""

    def __init__(self, dataset: Any, skip_batches: int = 0, use_stateful_dataloader: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(dataset, use_stateful_dataloader=use_stateful_dataloader, **kwargs)
        self.skip_batches = skip_batches

    def __iter__(self) -> Any:
        return itertools.islice(super().__iter__(), self.skip_batches, None)

    def __len__(self) -> int:
        return max(super().__len__() - self.skip_batches, 0)


def skip_first_batches(dataloader: DataLoader, num_batches: int = 0) -> DataLoader:
    """A loader whose next pass starts ``num_batches`` batches in (prepared or not), without loading them."""
    if isinstance(dataloader, PreparedDataLoader):
        return dataloader.skip_first_batches(num_batches)
    return skip_batches(dataloader, num_batches)


def prepare_data_loader(
    dataloader: DataLoader,
    device: torch.device | None = None,
    num_processes: int | None = None,
    process_index: int | None = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    rng_types: Any = None,
    dispatch_batches: bool | None = None,
    even_batches: bool = True,
    slice_fn_for_dispatch: Any = None,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
    torch_device_mesh: Any = None,
) -> PreparedDataLoader:
    """Accelerate's function form: shard ``dataloader`` for ``process_index`` of ``num_processes``.

    Defaults come from the process state. ``slice_fn_for_dispatch`` and ``torch_device_mesh`` are refused
    (no dispatching loader, no device meshes for data here).
    """
    from trainkit.engine.process.state import ProcessState

    if slice_fn_for_dispatch is not None or torch_device_mesh is not None:
        raise NotImplementedError("prepare_data_loader: slice_fn_for_dispatch and torch_device_mesh need "
                                  "Accelerate's dispatching loader, which trainkit does not have.")
    state = ProcessState.get()
    num_processes = state.world_size if num_processes is None else num_processes
    process_index = state.rank if process_index is None else process_index
    config = DataLoaderConfiguration(split_batches=split_batches, dispatch_batches=dispatch_batches,
                                     even_batches=even_batches, data_seed=data_seed, non_blocking=non_blocking,
                                     use_stateful_dataloader=use_stateful_dataloader,
                                     use_seedable_sampler=use_seedable_sampler)
    # The seedable sampler's order comes from data_seed, else torch's initial seed (Accelerate's rule); without
    # it the seed only seeds the loader's workers.
    generator = getattr(getattr(dataloader, "sampler", None), "generator", None)
    if data_seed is not None:
        seed = data_seed
    elif use_seedable_sampler or generator is None:
        seed = torch.initial_seed()
    else:
        seed = int(generator.initial_seed())
    return _prepare(dataloader, num_processes=num_processes, process_index=process_index,
                    device=(device or state.device) if put_on_device else None, gradient_state=GradientState(),
                    config=config, seed=seed)
