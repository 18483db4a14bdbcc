"""Preparing a user's DataLoader: rebuilding it as a :class:`~.loader.PreparedDataLoader` for this rank, with the
sharding its kind of data needs.

A map-style dataset's batch sampler (or a batch sampler given as ``sampler=``) is wrapped in a
:class:`~.sampling.ShardedBatchSampler`; with ``dispatch_batches`` the main process reads global batches for all
(:class:`~.loader.DataLoaderDispatcher`); an iterable dataset becomes a :class:`~.streams.StreamShard` whose
readers each read their own shards; an unbatched loader on one process is kept as it is. Everything else about the
loader (workers, collate function, pinning, the generator) is carried over unchanged.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from trainkit.config.errors import ConfigError
from trainkit.engine.step.accumulation import GradientState
from trainkit.utils.dataclasses import DataLoaderConfiguration

from .dispatch import GlobalBatches
from .loader import DataLoaderDispatcher, PreparedDataLoader
from .sampling import ShardedBatchSampler, get_sampler, shuffling
from .streams import StreamShard, TaggedCollate

logger = logging.getLogger(__name__)

# DataLoader arguments carried over unchanged from the user's loader when it is rebuilt.
_PASSTHROUGH = (
    "num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn",
    "multiprocessing_context", "prefetch_factor", "persistent_workers", "pin_memory_device", "in_order",
)


def loading_arguments(dataloader: DataLoader) -> dict[str, Any]:
    """The arguments of ``dataloader`` that a rebuilt loader keeps: how it loads (workers, collate function,
    pinning, ...) and its ``generator``, from which each pass's base seed is drawn (None: torch's global RNG)."""
    kwargs = {name: getattr(dataloader, name) for name in _PASSTHROUGH if hasattr(dataloader, name)}
    kwargs["generator"] = dataloader.generator
    if kwargs.get("num_workers", 0) == 0:
        kwargs["prefetch_factor"] = None
    return kwargs


def prepare_data_loader(
    dataloader: DataLoader,
    *,
    num_processes: int,
    process_index: int,
    device: torch.device | None,
    gradient_state: GradientState,
    config: DataLoaderConfiguration,
    seed: int,
) -> PreparedDataLoader:
    """Rebuild ``dataloader`` so this rank reads its share of every global batch (see the module doc)."""
    if isinstance(dataloader, PreparedDataLoader):
        return dataloader
    kwargs = loading_arguments(dataloader)
    on_gpu = device is not None and device.type == "cuda"
    if on_gpu:
        # Pinned batches copy to the GPU asynchronously: the step never waits on the host for its input.
        # Host-to-device copies are always safe to overlap (the stream orders the kernels that read them).
        kwargs["pin_memory"] = True
    common = dict(device=device, gradient_state=gradient_state, seed=seed, non_blocking=config.non_blocking or on_gpu,
                  resume_mid_epoch=config.use_stateful_dataloader)
    dataset = dataloader.dataset
    if isinstance(dataset, IterableDataset) or _is_stream(dataset):
        return _prepare_stream(dataloader, num_processes, process_index, config, seed, common, kwargs)
    if dataloader.batch_sampler is None and isinstance(dataloader.sampler, BatchSampler):
        # sampler=BatchSampler(...), batch_size=None: the dataset is indexed with whole lists of indices (a batched
        # __getitem__). Shard the lists as any batch sampler's, and keep them in sampler= so that stays so.
        return _prepare_batch_sampler(dataloader, dataloader.sampler, num_processes, process_index, config, seed,
                                      common, kwargs, as_sampler=True)
    if dataloader.batch_sampler is None:
        if num_processes > 1:
            raise ConfigError("A DataLoader with batch_size=None cannot be sharded across processes; "
                              "give it a batch_size or a batch_sampler.")
        return PreparedDataLoader._build(dataset, batch_size=None, sampler=dataloader.sampler, global_batch_size=None,
                                  **common, **kwargs)
    return _prepare_batch_sampler(dataloader, dataloader.batch_sampler, num_processes, process_index, config, seed,
                                  common, kwargs, as_sampler=False, dispatched=bool(config.dispatch_batches))


def _prepare_batch_sampler(dataloader: DataLoader, batch_sampler: Any, num_processes: int, process_index: int,
                           config: DataLoaderConfiguration, seed: int, common: dict[str, Any], kwargs: dict[str, Any],
                           *, as_sampler: bool, dispatched: bool = False) -> PreparedDataLoader:
    """A map-style loader whose ``batch_sampler`` (or, ``as_sampler``, whose batch-yielding ``sampler``) is sharded;
    ``dispatched``: read by the main process alone, which sends each process its slice (Accelerate's dispatcher)."""
    # A dispatched loader's order is drawn by the main process alone: no other process reads the sampler.
    shuffled_on = 1 if dispatched else num_processes
    batch_sampler, synced, draw_order = shuffling(batch_sampler, config.use_seedable_sampler, seed, shuffled_on)
    batch_size = getattr(batch_sampler, "batch_size", None)
    if config.split_batches and batch_size is not None:
        _split_size(batch_size, num_processes)
    global_size = None if batch_size is None else (batch_size if config.split_batches else batch_size * num_processes)
    if dispatched:
        if global_size is None:
            raise ConfigError("dispatch_batches=True cuts global batches into one slice per process, so the "
                              "DataLoader needs a fixed batch_size (or a batch sampler with one).")
        if num_processes > 1 and callable(getattr(get_sampler(dataloader), "draw_pass_order", None)):
            raise ConfigError("dispatch_batches=True with a sampler that agrees its order across processes "
                              "(group_by_length): only the main process reads, so the others could not take part; "
                              "leave dispatch_batches unset for map-style data.")
        global_batches = batch_sampler if config.split_batches else GlobalBatches(batch_sampler, num_processes)
        sharded = ShardedBatchSampler(global_batches, 1, 0, even_batches=False)
    else:
        sharded = ShardedBatchSampler(batch_sampler, num_processes, process_index,
                                      split_batches=config.split_batches, even_batches=config.even_batches)
    batching = dict(batch_size=None, sampler=sharded) if as_sampler else dict(batch_sampler=sharded)
    loader_class = DataLoaderDispatcher if dispatched else PreparedDataLoader
    prepared = loader_class._build(dataloader.dataset, global_batch_size=global_size, **batching, **common, **kwargs)
    if dispatched:
        prepared.dispatch_to = (num_processes, process_index)
    prepared.synced_generator = synced
    prepared.pass_draws.draw_order = draw_order
    sharded.on_start = prepared.pass_draws.sampler_starts  # the order is drawn when the sampler starts, as its own
    return prepared


def _is_stream(dataset: Any) -> bool:
    """A ``datasets.IterableDataset`` is a torch IterableDataset only once torch is imported first; check by name."""
    return type(dataset).__name__ == "IterableDataset" and (type(dataset).__module__ or "").startswith("datasets.")


def _prepare_stream(dataloader: DataLoader, num_processes: int, process_index: int, config: DataLoaderConfiguration,
                    seed: int, common: dict[str, Any], kwargs: dict[str, Any]) -> PreparedDataLoader:
    """A loader over a :class:`StreamShard`: this rank's workers read only this rank's shards."""
    batch_size = dataloader.batch_size
    if batch_size is None and num_processes == 1:  # unbatched samples on one process: nothing to shard
        return PreparedDataLoader._build(dataloader.dataset, batch_size=None, global_batch_size=None, **common, **kwargs)
    if batch_size is None:
        raise ConfigError("An iterable dataset needs a DataLoader with a batch_size to be sharded across processes.")
    if config.split_batches:
        batch_size = _split_size(batch_size, num_processes)
    if config.dispatch_batches:
        prepared = DataLoaderDispatcher._build(dataloader.dataset, batch_size=batch_size * num_processes,
                                      drop_last=dataloader.drop_last, global_batch_size=batch_size * num_processes,
                                      **common, **kwargs)
        prepared.dispatch_to = (num_processes, process_index)
        return prepared
    workers = kwargs.get("num_workers", 0)
    if kwargs.get("persistent_workers"):
        # Workers keep the dataset they were started with, so a new epoch's shard deal or a resumed
        # position would never reach them.
        logger.warning("persistent_workers=True is turned off for a streamed dataset: each epoch deals its shards anew.")
        kwargs["persistent_workers"] = False
    if getattr(config, "use_stateful_dataloader", False) and process_index == 0:
        logger.warning("use_stateful_dataloader=True: a streamed dataset's position is already saved by trainkit's own "
                       "per-reader cursor (exact with workers, on any number of processes); torchdata is not used.")
    kwargs["collate_fn"] = TaggedCollate(kwargs.get("collate_fn") or torch.utils.data.default_collate)
    stream = StreamShard(dataloader.dataset, batch_size=batch_size, num_processes=num_processes,
                         process_index=process_index, num_workers=workers, drop_last=dataloader.drop_last,
                         even_batches=config.even_batches, seed=seed)
    if stream.mode == "positions" and num_processes > 1 and process_index == 0:
        logger.info("The iterable dataset has no shards (or fewer than the %d processes): every process reads the "
                    "whole stream and keeps 1 example in %d.", num_processes, stream.num_readers)
    return PreparedDataLoader._build(stream, batch_size=batch_size, drop_last=dataloader.drop_last,
                              global_batch_size=batch_size * num_processes, **common, **kwargs)


def _split_size(batch_size: int | None, num_processes: int) -> int:
    if batch_size is None or batch_size % num_processes:
        raise ConfigError(
            f"split_batches=True needs a batch size divisible by the number of processes "
            f"({num_processes}); got {batch_size}."
        )
    return batch_size // num_processes


