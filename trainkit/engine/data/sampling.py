"""Index-level sharding: which samples each rank reads, in which order, starting where.

Every rank iterates the *same* batch sampler (same seed, same epoch) and keeps its part of each global
batch, so any sampler or batch sampler works, not only ``DistributedSampler``. Positions are counted
in samples of that global stream, so a run can resume on a different number of processes.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, Sampler

from trainkit.engine.process import collectives
from trainkit.utils.dataclasses import DataLoaderConfiguration

from .generator_sync import SyncedGenerator
from .pass_draws import reseeding


class SeedableRandomSampler(RandomSampler):
    """A ``RandomSampler`` whose order is fixed by ``(initial_seed, epoch)``: identical on every rank, replayable.

    Takes ``RandomSampler``'s arguments (``generator`` included) plus ``data_seed``. At each pass the
    generator (the user's, or one made here) is reseeded with ``initial_seed + epoch`` and the epoch then
    advances by one, so consecutive passes differ and :meth:`set_epoch` replays any of them.
    ``initial_seed`` is ``data_seed``, else torch's initial seed when the sampler is built (what
    ``set_seed`` fixes).
    """

    def __init__(self, data_source: Sized, replacement: bool = False, num_samples: int | None = None,
                 generator: torch.Generator | None = None, *, data_seed: int | None = None) -> None:
        super().__init__(data_source, replacement=replacement, num_samples=num_samples, generator=generator)
        self.initial_seed = int(data_seed) if data_seed is not None else torch.initial_seed()
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass draw ``epoch``'s permutation."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        if self.generator is None:
            self.generator = torch.Generator()
        self.generator.manual_seed(self.initial_seed + self.epoch)
        yield from super().__iter__()
        self.set_epoch(self.epoch + 1)


class _Padding:
    """Indices from the start of the epoch, handed out cyclically to fill the last global batch."""

    def __init__(self, wanted: int) -> None:
        self.wanted = wanted
        self.indices: list[int] = []
        self._cursor = 0

    def observe(self, batch: list[int]) -> None:
        if len(self.indices) < self.wanted:
            self.indices.extend(batch[: self.wanted - len(self.indices)])

    def take(self, count: int) -> list[int]:
        out = []
        for _ in range(count):
            out.append(self.indices[self._cursor % len(self.indices)])
            self._cursor += 1
        return out


class ShardedBatchSampler(Sampler[list[int]]):
    """This rank's batches of the global batches formed from ``batch_sampler``.

    split_batches=False: each group of ``num_processes`` consecutive batches is one global batch and
    rank r takes the r-th. split_batches=True: each batch is a global batch, cut into equal slices.
    even_batches: the last global batch is filled up with indices from the start of the epoch so
    every rank gets a full batch; :attr:`final_real_samples` says how many of it are real.
    """

    def __init__(
        self,
        batch_sampler: Iterable[list[int]],
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
        even_batches: bool = True,
    ) -> None:
        self.batch_sampler = batch_sampler
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.drop_last = bool(getattr(batch_sampler, "drop_last", False))
        batch_size = getattr(batch_sampler, "batch_size", None)
        self.batch_size = batch_size
        if split_batches and batch_size is None:
            raise ValueError("BatchSamplerShard(split_batches=True) cuts each batch into equal slices, so the batch "
                             "sampler needs a fixed batch_size; batches of varying size need split_batches=False.")
        if split_batches and batch_size is not None and batch_size % num_processes:
            raise ValueError(f"BatchSamplerShard(split_batches=True): the batch size ({batch_size}) must be a "
                             f"round multiple of the number of processes ({num_processes}).")
        self.skip_samples = 0
        """Samples of the global stream to pass over at the start of the next iteration (consumed once)."""
        self.final_real_samples = -1
        """Real (not padding) samples in the last global batch of the last iteration; -1 until known."""
        self.on_start: Callable[[], None] | None = None
        """Called as each iteration starts reading ``batch_sampler`` (a prepared loader's pass makes its order draw)."""

    def __len__(self) -> int:
        batches = len(self.batch_sampler)  # type: ignore[arg-type]  # the wrapped batch sampler is sized (a BatchSampler)
        if self.split_batches:
            return batches
        if self.drop_last:
            return batches // self.num_processes
        if self.even_batches:
            return math.ceil(batches / self.num_processes)
        return batches // self.num_processes + int(self.process_index < batches % self.num_processes)

    def _groups(self) -> Iterator[list[list[int]]]:
        """Global batches as lists of per-rank index lists, before padding."""
        if self.split_batches:
            per_rank = self._per_rank_size()
            for batch in self.batch_sampler:
                yield [list(part) for part in _split(batch, self.num_processes, per_rank)]
        else:
            batches = iter(self.batch_sampler)
            while group := list(itertools.islice(batches, self.num_processes)):
                yield group

    def __iter__(self) -> Iterator[list[int]]:
        if self.on_start is not None:
            self.on_start()
        per_rank = self._per_rank_size()
        padding = _Padding(wanted=per_rank * self.num_processes if per_rank else 0)
        first_batches: list[list[int]] = []  # batches of varying size fill a short last round with these
        to_skip, self.skip_samples = self.skip_samples, 0
        self.final_real_samples = -1
        last_real = -1
        groups = self._groups()
        group = next(groups, None)
        while group is not None:
            for part in group:
                padding.observe(part)
            first_batches.extend(group[: self.num_processes - len(first_batches)])
            real = sum(len(part) for part in group)
            upcoming = None
            if to_skip >= real:
                to_skip -= real
            elif self._is_full(group, per_rank):
                last_real = real
                yield from self._part(group)
            else:
                # Only the last group can be short in a plain batch sampler: look ahead only then, so a full group is
                # handed out without reading the next batch (the sampler's end-of-pass code, e.g. a seedable
                # sampler's next epoch, runs no earlier than the loader's own one-batch look-ahead makes it).
                upcoming = next(groups, None)
                if upcoming is None:
                    finished = self._finish_last_group(group, padding, per_rank, first_batches)
                    if finished is None:  # dropped (drop_last)
                        last_real = -1
                        break
                    last_real = real
                    group = finished
                yield from self._part(group)
            group = upcoming if upcoming is not None else next(groups, None)
        self.final_real_samples = last_real

    def _part(self, group: list[list[int]]) -> Iterator[list[int]]:
        if self.process_index < len(group) and group[self.process_index]:
            yield group[self.process_index]  # an uneven last split batch may leave this rank nothing

    def _is_full(self, group: list[list[int]], per_rank: int | None) -> bool:
        if len(group) != self.num_processes:
            return False
        return per_rank is None or all(len(part) == per_rank for part in group)

    def _finish_last_group(self, group: list[list[int]], padding: _Padding, per_rank: int | None,
                           first_batches: list[list[int]]) -> list[list[int]] | None:
        if self.num_processes == 1:
            return group  # padding only exists to give every rank a batch: one process needs none
        if self.drop_last and not self.split_batches:
            return None  # an incomplete global batch is dropped like an incomplete batch
        if not self.even_batches:
            return group
        if per_rank is None:  # batches of varying size: whole batches from the epoch's start, cyclically
            missing = self.num_processes - len(group)
            return group + [first_batches[k % len(first_batches)] for k in range(missing)]
        if not padding.indices:
            return group
        padded = [part + padding.take(per_rank - len(part)) for part in group]
        padded += [padding.take(per_rank) for _ in range(self.num_processes - len(group))]
        return padded

    def _per_rank_size(self) -> int | None:
        if self.batch_size is None:
            return None
        return self.batch_size // self.num_processes if self.split_batches else self.batch_size


def _split(batch: list[int], parts: int, size: int | None) -> list[list[int]]:
    """Slices of ``size`` (a short last batch leaves the last ranks short or empty, as Accelerate's split)."""
    size = size or math.ceil(len(batch) / parts)
    return [batch[i * size : (i + 1) * size] for i in range(parts)]


class IterableDatasetShard(IterableDataset):
    """This rank's slice of each global batch of an iterable dataset (every rank reads the full stream).

    Kept for scripts that use it directly (Accelerate has this name); ``prepare`` reads streams through
    :class:`~.streams.StreamShard` instead, which reads only this rank's shards.
    """

    def __init__(
        self,
        dataset: Iterable,
        batch_size: int = 1,
        drop_last: bool = False,
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
        *,
        even_batches: bool = True,
    ) -> None:
        """``batch_size`` is each process's batch, or with ``split_batches`` the global batch (cut into
        ``num_processes`` equal slices, so it must divide evenly). ``drop_last`` drops a short last global batch;
        otherwise ``even_batches`` fills it up with the stream's first samples (False: ranks may get less)."""
        if split_batches and batch_size % num_processes:
            raise ValueError(f"IterableDatasetShard(split_batches=True): batch_size={batch_size} must be a multiple "
                             f"of num_processes={num_processes}, so that each process gets an equal slice.")
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_processes = num_processes
        self.process_index = process_index
        self.drop_last = drop_last
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.final_real_samples = -1
        self.skip_samples = 0

    @property
    def _per_rank(self) -> int:
        return self.batch_size // self.num_processes if self.split_batches else self.batch_size

    def set_epoch(self, epoch: int) -> None:
        """Forward the epoch to the wrapped dataset (e.g. a shuffling ``datasets.IterableDataset``)."""
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        if not isinstance(self.dataset, Sized):
            raise TypeError("This iterable dataset has no length.")
        global_size = self._per_rank * self.num_processes
        full, rest = divmod(len(self.dataset), global_size)
        if rest and not self.drop_last and self.even_batches:
            full += 1  # the short last global batch is filled up
        mine = full * self._per_rank
        if rest and not self.drop_last and not self.even_batches:
            mine += max(0, min(self._per_rank, rest - self.process_index * self._per_rank))
        return mine

    def __iter__(self) -> Iterator:
        per_rank = self._per_rank
        global_size = per_rank * self.num_processes
        mine = slice(self.process_index * per_rank, (self.process_index + 1) * per_rank)
        to_skip, self.skip_samples = self.skip_samples, 0
        self.final_real_samples = -1
        first: list = []
        buffer: list = []
        for item in self.dataset:
            if to_skip > 0:
                to_skip -= 1
                if len(first) < global_size:
                    first.append(item)
                continue
            if len(first) < global_size:
                first.append(item)
            buffer.append(item)
            if len(buffer) == global_size:
                yield from buffer[mine]
                buffer = []
        if buffer and not self.drop_last:
            self.final_real_samples = len(buffer)
            if self.even_batches:
                cycle = itertools.cycle(first)
                buffer += [next(cycle) for _ in range(global_size - len(buffer))]
            yield from buffer[mine]


def shared_data_seed(dataloader: DataLoader, config: DataLoaderConfiguration) -> int:
    """One data seed for every rank (the main process's); reading it draws nothing from torch's RNG, so preparing
    a loader leaves the random stream (dropout...) where Accelerate leaves it.

    With ``use_seedable_sampler`` it orders the shuffling: ``data_seed``, else torch's initial seed (what
    ``set_seed`` fixes), as in Accelerate. Otherwise it seeds the loader's workers (and a stream's shard
    order): ``data_seed``, else the sampler's generator seed, else torch's initial seed.
    """
    if config.data_seed is not None:
        return config.data_seed
    sampler = getattr(dataloader, "sampler", None)
    generator = getattr(sampler, "generator", None)
    if not config.use_seedable_sampler and generator is not None:
        return int(generator.initial_seed())
    seed = int(collectives.broadcast_object_list([torch.initial_seed()], from_process=0)[0])
    if config.use_seedable_sampler and isinstance(sampler, RandomSampler):
        return seed  # the seedable sampler's order: exactly Accelerate's initial seed
    return seed % 2**31  # worker seeds and a stream's shard order scale it: keep it small


def shuffling(batch_sampler: Any, use_seedable_sampler: bool, seed: int,
               num_processes: int) -> tuple[Any, SyncedGenerator | None, Callable[[torch.Generator], None] | None]:
    """Make a ``RandomSampler`` inside ``batch_sampler`` give every process the same order; also return the draw
    each pass makes for its order from the global generator (see :class:`.pass_draws.PassDraws`), if any.

    use_seedable_sampler: it becomes a :class:`SeedableRandomSampler` (order from ``seed`` and the epoch),
    keeping its generator. Otherwise it stays as it is, with a generator that every process copies from the
    main one at each pass: the order one process would draw. A sampler without one gets one as in Accelerate:
    on several processes seeded now from torch's RNG; on one, seeded at each pass from torch's RNG, the draw the
    sampler would make itself.
    """
    sampler = getattr(batch_sampler, "sampler", None)
    draws_its_order = getattr(sampler, "draw_pass_order", None)
    if callable(draws_its_order):
        return batch_sampler, None, draws_its_order
    if not isinstance(sampler, RandomSampler):
        return batch_sampler, None, None
    if not use_seedable_sampler:
        draw_order = None
        if sampler.generator is None:
            sampler.generator = torch.Generator()
            if num_processes > 1:
                sampler.generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
            else:
                draw_order = reseeding(sampler.generator)
        return batch_sampler, SyncedGenerator(sampler.generator, num_processes, draw_order is not None), draw_order
    seedable = SeedableRandomSampler(sampler.data_source, sampler.replacement, sampler._num_samples,
                                     generator=sampler.generator if sampler.generator is not None else torch.Generator(),
                                     data_seed=seed)
    if type(batch_sampler) is BatchSampler:
        return BatchSampler(seedable, batch_sampler.batch_size, batch_sampler.drop_last), None, None
    replaced = copy.copy(batch_sampler)
    replaced.sampler = seedable
    return replaced, None, None


def get_sampler(dataloader: DataLoader) -> Any:
    """The sampler that orders ``dataloader``'s samples, through any batch samplers wrapped around it.

    For a plain DataLoader it is Accelerate's answer (the batch sampler's ``sampler``); for a prepared loader
    it is the sampler under the sharding batch sampler. None when there is none (an iterable dataset).
    """
    if isinstance(dataloader.sampler, BatchSampler):  # a batch sampler passed as sampler= (batch_size=None)
        return getattr(dataloader.sampler, "sampler", None)
    wrapper: Any = dataloader.batch_sampler
    if wrapper is None and isinstance(dataloader.sampler, ShardedBatchSampler):
        wrapper = dataloader.sampler  # a prepared loader over a batch sampler given as sampler=
    while wrapper is not None and not hasattr(wrapper, "sampler") and hasattr(wrapper, "batch_sampler"):
        wrapper = wrapper.batch_sampler  # ShardedBatchSampler, _SkipBatchSampler: look underneath
    return getattr(wrapper, "sampler", None)
