"""Where a stream's examples come from: its shards, how to open one at a stored position, and that position.

A *source* turns a user's iterable dataset into numbered shards that can be read independently and
resumed from a JSON-able position. Three kinds exist:

* :class:`ProtocolSource` for a torch ``IterableDataset`` that follows the small sharding protocol
  (``num_shards`` and ``iter_shard(index, start)``, see :class:`ShardedIterable`); its position is
  the number of records of the shard already read, and opening at it reads nothing before it.
* :class:`HFSource` for a ``datasets.IterableDataset`` with ``n_shards`` (one per file, usually); its
  position is the dataset's own ``state_dict()`` (records before it are passed over in the file reader,
  before any ``map``), or a count of examples for a shuffled stream, whose buffer ``state_dict`` cannot hold.
* :class:`HFPositionSource` for a ``datasets`` stream with fewer shards than processes: split by position in
  its file reader, under its ``map``, so each example is tokenised by one reader only.
* :class:`WholeSource` for anything else: one "shard", the whole stream, split by position (every reader
  reads every example and keeps its own).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable, Iterator
from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class ShardedIterable(Protocol):
    """The protocol a torch ``IterableDataset`` follows to be read shard by shard.

    ``num_shards``: how many independent shards the stream has (files, tar archives, database ranges...).
    ``iter_shard(index, start)``: the records of shard ``index`` from its ``start``-th on (seek if the
    format allows, else skip). An optional ``shuffle_shards = True`` attribute asks for a new shard order
    every epoch (seeded, the same on every rank).
    """

    num_shards: int

    def iter_shard(self, index: int, start: int = 0) -> Iterator[Any]:
        """Yield the records of shard ``index``, starting at its ``start``-th record."""
        ...


class ShardReader:
    """One opened shard: iterate it, and ask where it stands (a JSON-able position) after any example."""

    def __init__(self, examples: Iterator[Any], position) -> None:
        self._examples = examples
        self.position = position
        """Callable returning the position after the last example yielded."""

    def __iter__(self) -> Iterator[Any]:
        return self._examples


class ProtocolSource:
    """Shards of a torch IterableDataset that follows :class:`ShardedIterable`."""

    kind = "shards"

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self.num_shards = int(dataset.num_shards)
        self.shuffles_shards = bool(getattr(dataset, "shuffle_shards", False))

    def open(self, shard: int, position: Any, epoch: int, reader: int = 0, readers: int = 1) -> ShardReader:
        """Read ``shard`` from ``position`` (records already read; None means its start)."""
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)
        start = int(position or 0)
        counter = itertools.count(start + 1)
        read = [start]

        def examples() -> Iterator[Any]:
            for example in self.dataset.iter_shard(shard, start):
                read[0] = next(counter)
                yield example

        return ShardReader(examples(), lambda: read[0])


class HFSource:
    """Shards (data sources) of a ``datasets.IterableDataset``; positions from its own ``state_dict``."""

    kind = "shards"

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self.num_shards = int(dataset.num_shards)
        # A shuffle buffer's content is not in datasets' state_dict: a resume from it would lose the
        # buffered examples, so a shuffled stream counts examples and re-reads its current shard instead.
        self.buffered = _has_shuffle_buffer(dataset)
        self.shuffles_shards = self.buffered

    def open(self, shard: int, position: Any, epoch: int, reader: int = 0, readers: int = 1) -> ShardReader:
        """Read data source ``shard``, restored to ``position`` (None: from its start)."""
        part = self._part(shard, reader, readers)
        part.set_epoch(epoch)
        if self.buffered:
            skip = int(position or 0)
            counter = itertools.count(skip + 1)
            read = [skip]

            def examples() -> Iterator[Any]:
                for example in itertools.islice(_rows(part), skip, None):
                    read[0] = next(counter)
                    yield example

            return ShardReader(examples(), lambda: read[0])
        if position is not None:
            part.load_state_dict(position)
        return ShardReader(_rows(part), part.state_dict)

    def _part(self, shard: int, reader: int, readers: int) -> Any:
        return self.dataset.shard(num_shards=self.num_shards, index=shard)


class HFPositionSource(HFSource):
    """A ``datasets`` stream with too few shards, split by position *under* its ``map``/``filter``/``shuffle``.

    Reader ``j`` of ``R`` keeps records ``j, j+R, ...`` of the file reader itself, so the lazy ``map``
    above runs only on its own records: each example is tokenised once across the job.
    """

    kind = "positions"

    def __init__(self, dataset: Any) -> None:
        super().__init__(dataset)
        self.num_shards = 1
        self.shuffles_shards = False

    def _part(self, shard: int, reader: int, readers: int) -> Any:
        return split_under_transforms(self.dataset, readers, reader)


def split_under_transforms(dataset: Any, step: int, offset: int) -> Any:
    """A copy of a ``datasets`` stream whose source keeps every ``step``-th record from ``offset``, below its transforms.

    datasets' own ``split_dataset_by_node`` steps over the *output* (after ``map``), which maps every record
    on every node; this puts the step under the chain of lazy transforms instead. Raises ``TypeError`` for
    chains it cannot walk (several sources: concatenated or interleaved streams).
    """
    from datasets.iterable_dataset import StepExamplesIterable  # type: ignore[import-untyped]  # datasets ships no type information

    part = copy.deepcopy(dataset)
    holder, attribute = part, "_ex_iterable"
    node = getattr(part, attribute)
    while hasattr(node, "ex_iterable"):
        holder, attribute, node = node, "ex_iterable", node.ex_iterable
    if hasattr(node, "ex_iterables"):
        raise TypeError("a stream made of several sources")
    setattr(holder, attribute, StepExamplesIterable(node, step=step, offset=offset))
    return part


def _has_shuffle_buffer(dataset: Any) -> bool:
    """Whether a ``datasets`` stream went through ``.shuffle(buffer_size=...)`` (its chain holds a shuffle buffer)."""
    node = getattr(dataset, "_ex_iterable", None)
    while node is not None:
        if "Shuffled" in type(node).__name__:
            return True
        node = getattr(node, "ex_iterable", None)
    return False


def _rows(part: Any) -> Iterator[Any]:
    """The examples of a ``datasets`` stream one by one.

    Its ``__iter__`` splits the stream again among DataLoader workers when it runs inside one; the
    readers already did that split, so the examples are taken through ``iter(batch_size=1)``, which does not.
    """
    for batch in part.iter(batch_size=1):
        yield {key: value[0] for key, value in batch.items()}


class WholeSource:
    """A stream without shards: every reader reads it all and keeps its own examples (split by position)."""

    kind = "positions"

    def __init__(self, dataset: Iterable) -> None:
        self.dataset = dataset
        self.num_shards = 1
        self.shuffles_shards = False

    def open(self, shard: int, position: Any, epoch: int, reader: int = 0, readers: int = 1) -> ShardReader:
        """The examples ``reader, reader + readers, ...`` of the whole stream, after ``position`` examples passed over."""
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)
        skip = int(position or 0)
        read = [skip]

        def examples() -> Iterator[Any]:
            every = _rows(self.dataset) if _is_hf_iterable(self.dataset) else iter(self.dataset)
            for index, example in enumerate(itertools.islice(every, skip, None), start=skip):
                if index % readers == reader:
                    read[0] = index + 1
                    yield example

        return ShardReader(examples(), lambda: read[0])


def source_for(dataset: Any, min_shards: int) -> ProtocolSource | HFSource | WholeSource:
    """The best way to read ``dataset``: by shards when it has at least ``min_shards`` (one per process)."""
    if isinstance(dataset, ShardedIterable) and int(dataset.num_shards) >= min_shards:
        return ProtocolSource(dataset)
    if _is_hf_iterable(dataset):
        if int(dataset.num_shards) >= min_shards:
            return HFSource(dataset)
        try:
            split_under_transforms(dataset, 2, 0)
            return HFPositionSource(dataset)
        except (TypeError, AttributeError, ImportError):
            pass  # an unusual chain: split its output by position instead
    return WholeSource(dataset)


def _is_hf_iterable(dataset: Any) -> bool:
    module = type(dataset).__module__ or ""
    return module.startswith("datasets.") and hasattr(dataset, "num_shards") and hasattr(dataset, "shard")


def shard_order(num_shards: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The shards of an epoch in reading order: 0..n-1, or a permutation fixed by (seed, epoch)."""
    if not shuffle:
        return list(range(num_shards))
    generator = torch.Generator()
    generator.manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(num_shards, generator=generator).tolist()
