"""Prepared dataloaders: per-rank sharding, device placement, epoch seeding and a resumable position.

``prepare_data_loader`` rebuilds the user's DataLoader around a :class:`ShardedBatchSampler` (or a
:class:`~.streams.StreamShard`) and returns a :class:`PreparedDataLoader`, still a ``DataLoader``
with the same ``dataset``, ``len()`` and collate function; ``len()`` is always the whole epoch's
(neither a resume nor ``skip_first_batches`` changes it; the view ``skip_first_batches`` returns is
shorter, as in Accelerate). Its position is a cursor in samples of the global stream plus the epoch.
A checkpoint always stores both; loading restores the epoch, and, when the loader resumes mid-epoch
(``DataLoaderConfiguration(use_stateful_dataloader=True)``, and the Trainer), the exact next batch on
any world size with the same global batch, by skipping indices, not by loading the skipped batches.
An iterable dataset's rank (and each worker) reads only its own shards, and its position is the
stream's own cursor (see :mod:`.streams`), from which it always continues; with ``dispatch_batches``
the main process reads for all (see :mod:`.dispatch`).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from trainkit.config.errors import ConfigError
from trainkit.engine.accumulation import GradientState
from trainkit.utils.dataclasses import DataLoaderConfiguration

from .device import send_to_device
from .sampling import IterableDatasetShard, SeedableRandomSampler, ShardedBatchSampler
from .dispatch import dispatched_batches
from .generator_sync import SyncedGenerator
from .streams import StreamShard, TaggedCollate, agreement_device, stream_batches

logger = logging.getLogger(__name__)

# DataLoader arguments carried over unchanged from the user's loader when it is rebuilt.
_PASSTHROUGH = (
    "num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn",
    "multiprocessing_context", "prefetch_factor", "persistent_workers", "pin_memory_device", "in_order",
)


@dataclass
class DataProgress:
    """Where a dataloader stands: the epoch and how many global samples of it were consumed."""

    epoch: int = 0
    samples_seen: int = 0
    pending_skip: int = 0
    """Samples to skip at the start of the next iteration (set by a resume)."""
    last_batch_yielded: bool = False
    """The running iteration has handed out its last batch: the epoch's data is all consumed."""

    def state_dict(self) -> dict[str, int]:
        """JSON-friendly position; an epoch whose last batch was handed out counts as the next epoch's start,
        so a checkpoint taken inside the loop body after the last batch resumes at the next epoch."""
        if self.last_batch_yielded:
            return {"epoch": self.epoch + 1, "samples_seen": 0}
        return {"epoch": self.epoch, "samples_seen": self.samples_seen}

    def move_to(self, epoch: int, samples_seen: int = 0) -> None:
        """Set the position in place (views made by ``skip_first_batches`` share this object)."""
        self.epoch, self.samples_seen, self.pending_skip = epoch, samples_seen, samples_seen
        self.last_batch_yielded = False


class PreparedDataLoader(DataLoader):
    """A DataLoader that yields this rank's part of each global batch, already on the device."""

    def __init__(self, dataset: Any, *, device: torch.device | None, gradient_state: GradientState,
                 global_batch_size: int | None, seed: int, non_blocking: bool = False,
                 resume_mid_epoch: bool = False, **kwargs: Any) -> None:
        # A private generator keeps DataLoader's per-iteration base seed off the global RNG, so the
        # model's random stream (dropout...) does not depend on when iterators are built.
        self._loader_generator = torch.Generator()
        super().__init__(dataset, generator=self._loader_generator, **kwargs)
        self.dispatch_to: tuple[int, int] | None = None
        """(num_processes, process_index) when the main process reads and sends each rank its slice."""
        self.device = device
        self.gradient_state = gradient_state
        self.global_batch_size = global_batch_size
        self.seed = seed
        self.non_blocking = non_blocking
        self.resume_mid_epoch = resume_mid_epoch
        """``load_state_dict`` restores the position inside the epoch too (else the epoch only)."""
        self.progress = DataProgress()
        self.skipped_batches = 0
        """Batches this object passes over at each iteration's start (non-zero on ``skip_first_batches`` views)."""
        self.end_of_dataloader = False
        self.remainder = -1
        self._expected_batches: int | None = None
        self._yielded = 0
        self._stream_skip = 0
        self.real_counts: list[int] | None = None
        """For a stream: real (not padding) rows of the current batch on each rank; None otherwise."""
        self.synced_generator: SyncedGenerator | None = None
        """The user's shuffling generator, aligned across processes at each pass (non-seedable shuffling)."""

    # -- position ---------------------------------------------------------------------------------
    @property
    def _shard(self) -> ShardedBatchSampler | IterableDatasetShard | None:
        return self.dataset if isinstance(self.dataset, IterableDatasetShard) else self.batch_sampler

    @property
    def is_stream(self) -> bool:
        """True for an iterable dataset read shard by shard (its position is the stream's cursor)."""
        return isinstance(self.dataset, StreamShard)

    @property
    def _stream(self) -> StreamShard:
        assert isinstance(self.dataset, StreamShard)
        return self.dataset

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration use ``epoch``'s shuffling order (called for you at each new pass)."""
        if epoch != self.progress.epoch:
            self.progress.move_to(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The position to store in a checkpoint, with the shuffling seed that gives it meaning.

        Collective for a stream (every rank's readers are gathered): call it on every process.
        """
        state: dict[str, Any] = {**self.progress.state_dict(), "seed": self.seed}
        if self.is_stream:
            state["stream"] = self._stream.state_dict(self.progress.epoch)
        if self.synced_generator is not None:
            state.update(self.synced_generator.state_dict(pass_finished=self.progress.last_batch_yielded))
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a stored position: its epoch, and with ``resume_mid_epoch`` its next sample.

        Without ``resume_mid_epoch`` (Accelerate's default) the next iteration starts at the epoch's first
        batch, and the script skips what was seen with ``skip_first_batches``. A stream always continues
        from its readers' cursors (it cannot skip what it has not read).
        """
        if "seed" in state:
            self._set_seed(int(state["seed"]))
        if self.synced_generator is not None:
            self.synced_generator.load_state_dict(state)
        if self.is_stream:
            if "stream" not in state:
                raise ValueError("This checkpoint's loader position is not a stream's: it cannot place an iterable dataset.")
            self._stream.seed = self.seed
            self._stream.load_state_dict(state["stream"])
        # A stream (or a dispatched loader) cannot skip without reading: it always continues where it stood.
        mid_epoch = self.resume_mid_epoch or self.is_stream or self.dispatch_to is not None
        samples_seen = int(state["samples_seen"]) if mid_epoch else 0
        self.progress.move_to(int(state["epoch"]), samples_seen)

    def _set_seed(self, seed: int) -> None:
        """Use ``seed`` for the shuffling order too (the seedable sampler was built with the previous one)."""
        self.seed = seed
        sampler = getattr(getattr(self._shard, "batch_sampler", None), "sampler", None)
        if isinstance(sampler, SeedableRandomSampler):
            sampler.initial_seed = seed

    def batches_left(self) -> int | None:
        """Batches this rank will still get after the current one, or None when unknown."""
        if self._expected_batches is None:
            return None
        return max(self._expected_batches - self._yielded, 0)

    # -- iteration ----------------------------------------------------------------------------------
    def _begin_iteration(self) -> None:
        epoch = self.progress.epoch
        for target in (getattr(self._shard, "batch_sampler", None), self._shard, self.dataset):
            sampler = getattr(target, "sampler", None)
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)
        skip = self.progress.pending_skip + self.skipped_batches * (self.global_batch_size or 0)
        self.progress.pending_skip = 0
        self.progress.last_batch_yielded = False
        if self.is_stream or self.dispatch_to:
            # A stream placed by load_state_dict continues from its readers' cursors; one moved back to the
            # start of its epoch (move_to) starts afresh; skip_first_batches alone reads and drops batches.
            restored = self.is_stream and bool(skip) and self._stream.has_restored(epoch)
            if self.is_stream:
                self._stream.begin(epoch, use_restored=restored)
            self._stream_skip = 0 if restored or not self.global_batch_size else skip // self.global_batch_size
            self.progress.samples_seen = skip
        else:
            self.progress.samples_seen = skip
            if self._shard is not None:  # None: an unbatched loader (batch_size=None) on one process
                self._shard.skip_samples = skip
            if self.synced_generator is not None:
                self.synced_generator.begin_pass()
        self._loader_generator.manual_seed((self.seed * 1_000_003 + epoch) % 2**63)
        self._yielded = 0
        self.end_of_dataloader = False
        self.remainder = -1
        try:
            skipped = skip // self.global_batch_size if self.global_batch_size else 0
            # A stream's length is an estimate (its shards' sizes are unknown): windows end where it ends.
            self._expected_batches = None if self.is_stream else max(DataLoader.__len__(self) - skipped, 0)
        except TypeError:
            self._expected_batches = None

    def __iter__(self) -> Iterator[Any]:
        self._begin_iteration()
        iterator: Iterator[tuple[Any, list[int] | None, Any]]
        if self.is_stream or self.dispatch_to:
            iterator = self._stream_iterator()
        else:
            iterator = ((batch, None, None) for batch in super().__iter__())
        self.gradient_state.push(self)
        finished = False
        try:
            current = next(iterator, _END)
            while current is not _END:
                upcoming = next(iterator, _END)
                self._yielded += 1
                if upcoming is _END:
                    self.end_of_dataloader = True
                    self.progress.last_batch_yielded = True
                    if not (self.is_stream or self.dispatch_to):
                        self.remainder = self._shard.final_real_samples if self._shard is not None else -1
                if self.global_batch_size:
                    self.progress.samples_seen += self.global_batch_size
                batch, self.real_counts, cursor = current  # type: ignore[misc]  # not _END here
                if self.is_stream:
                    self._stream.advance(cursor)
                yield send_to_device(batch, self.device, self.non_blocking) if self.device is not None else batch
                current = upcoming
            finished = True
        finally:
            self.gradient_state.pop(self)
            if finished:
                self.progress.move_to(self.progress.epoch + 1)
                if self.synced_generator is not None:
                    self.synced_generator.end_pass()

    def _stream_iterator(self) -> Iterator[tuple[Any, list[int] | None, Any]]:
        """The stream's batches, agreed across ranks; batches skipped by ``skip_first_batches`` are read and dropped."""
        batches: Iterator[tuple[Any, list[int], Any]]
        if self.dispatch_to:
            world, rank = self.dispatch_to
            # Only the main process reads (with the global batch size); the others receive their slices.
            batches = dispatched_batches(super().__iter__() if rank == 0 else None, world, rank,
                                         (self.global_batch_size or world) // world)
        else:
            stream = self._stream
            agree = stream.pad and stream.num_processes > 1
            batches = stream_batches(super().__iter__(), stream, agree, agreement_device())
        for _ in range(self._stream_skip):
            skipped = next(batches, None)
            if skipped is not None and self.is_stream:
                self._stream.advance(skipped[2])
        return batches

    def skip_first_batches(self, num_batches: int) -> PreparedDataLoader:
        """A view of this loader whose iterations start ``num_batches`` batches further into the epoch.

        The view shares this loader's position (finishing it advances the epoch, a checkpoint taken while
        it runs stores the absolute position) and is ``num_batches`` shorter; this loader is unchanged.
        """
        if self.global_batch_size is None:
            raise ValueError("skip_first_batches needs a dataloader with a fixed batch size.")
        if num_batches < 0:
            raise ValueError(f"skip_first_batches needs num_batches >= 0, got {num_batches}.")
        view = copy.copy(self)
        view.progress = self.progress
        view.skipped_batches = self.skipped_batches + int(num_batches)
        return view

    def __len__(self) -> int:
        return max(super().__len__() - self.skipped_batches, 0)


_END = object()


def _shuffling(batch_sampler: Any, use_seedable_sampler: bool, seed: int, num_processes: int) -> tuple[Any, SyncedGenerator | None]:
    """Make a ``RandomSampler`` inside ``batch_sampler`` give every process the same order.

    use_seedable_sampler: it becomes a :class:`SeedableRandomSampler` (order from ``seed`` and the epoch),
    keeping its generator. Otherwise it stays as it is, with a generator (one is made from torch's RNG if it
    had none) that every process copies from the main one at each pass: the order one process would draw.
    """
    sampler = getattr(batch_sampler, "sampler", None)
    if not isinstance(sampler, RandomSampler):
        return batch_sampler, None
    if not use_seedable_sampler:
        if sampler.generator is None:
            sampler.generator = torch.Generator()
            sampler.generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
        return batch_sampler, SyncedGenerator(sampler.generator, num_processes)
    seedable = SeedableRandomSampler(sampler.data_source, sampler.replacement, sampler._num_samples,
                                     generator=sampler.generator if sampler.generator is not None else torch.Generator(),
                                     data_seed=seed)
    if type(batch_sampler) is BatchSampler:
        return BatchSampler(seedable, batch_sampler.batch_size, batch_sampler.drop_last), None
    replaced = copy.copy(batch_sampler)
    replaced.sampler = seedable
    return replaced, None


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
    """Rebuild ``dataloader`` so this rank reads its share of every global batch (see module doc)."""
    if isinstance(dataloader, PreparedDataLoader):
        return dataloader
    kwargs = {name: getattr(dataloader, name) for name in _PASSTHROUGH if hasattr(dataloader, name)}
    if kwargs.get("num_workers", 0) == 0:
        kwargs["prefetch_factor"] = None
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
    if config.dispatch_batches and process_index == 0:
        logger.info("dispatch_batches=True applies to iterable datasets; this map-style dataset is split by indices, "
                    "so each process loads only its own samples anyway.")
    if dataloader.batch_sampler is None:
        if num_processes > 1:
            raise ConfigError("A DataLoader with batch_size=None cannot be sharded across processes; "
                              "give it a batch_size or a batch_sampler.")
        return PreparedDataLoader(dataset, batch_size=None, sampler=dataloader.sampler, global_batch_size=None,
                                  **common, **kwargs)
    batch_sampler, synced = _shuffling(dataloader.batch_sampler, config.use_seedable_sampler, seed, num_processes)
    batch_size = getattr(batch_sampler, "batch_size", None)
    if config.split_batches and batch_size is not None:
        _split_size(batch_size, num_processes)
    sharded = ShardedBatchSampler(batch_sampler, num_processes, process_index,
                                  split_batches=config.split_batches, even_batches=config.even_batches)
    global_size = None if batch_size is None else (batch_size if config.split_batches else batch_size * num_processes)
    prepared = PreparedDataLoader(dataset, batch_sampler=sharded, global_batch_size=global_size, **common, **kwargs)
    prepared.synced_generator = synced
    if synced is not None and dataloader.generator is synced.generator:
        # A plain DataLoader draws each pass's worker base seed from its generator before the sampler draws
        # the order: drawing it from the same (synchronised) generator keeps one process's order exactly.
        prepared.generator = synced.generator
    return prepared


def _is_stream(dataset: Any) -> bool:
    """A ``datasets.IterableDataset`` is a torch IterableDataset only once torch is imported first; check by name."""
    return type(dataset).__name__ == "IterableDataset" and (type(dataset).__module__ or "").startswith("datasets.")


def _prepare_stream(dataloader: DataLoader, num_processes: int, process_index: int, config: DataLoaderConfiguration,
                    seed: int, common: dict[str, Any], kwargs: dict[str, Any]) -> PreparedDataLoader:
    """A loader over a :class:`StreamShard`: this rank's workers read only this rank's shards."""
    batch_size = dataloader.batch_size
    if batch_size is None:
        raise ConfigError("An iterable dataset needs a DataLoader with a batch_size to be sharded across processes.")
    if config.split_batches:
        batch_size = _split_size(batch_size, num_processes)
    if config.dispatch_batches:
        prepared = PreparedDataLoader(dataloader.dataset, batch_size=batch_size * num_processes,
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
    return PreparedDataLoader(stream, batch_size=batch_size, drop_last=dataloader.drop_last,
                              global_batch_size=batch_size * num_processes, **common, **kwargs)


def _split_size(batch_size: int | None, num_processes: int) -> int:
    if batch_size is None or batch_size % num_processes:
        raise ConfigError(
            f"split_batches=True needs a batch size divisible by the number of processes "
            f"({num_processes}); got {batch_size}."
        )
    return batch_size // num_processes
