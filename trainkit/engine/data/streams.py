"""Iterable datasets read once across the job: shards split over ranks and workers, resumable without replay.

A *reader* is one (rank, DataLoader worker) pair; a job has ``R = num_processes × max(num_workers, 1)``.
Each epoch, the dataset's shards (see :mod:`.stream_sources`) are put in order (a seeded permutation
when the stream shuffles) and dealt round-robin: reader ``j`` reads shards ``order[j::R]`` and nothing
else. A stream without enough shards is split by position instead: reader ``j`` keeps the examples whose
index is ``j`` modulo ``R`` (it still reads the others, but does nothing with them).

Every example read carries a tag (its reader, which of the reader's shards, the position after it), so
the main process knows, batch by batch, where each reader stands — also when workers prefetch. That
position, gathered from all ranks, is the loader's ``state_dict()``; loading it makes each reader open
its current shard at the stored position (a seek for the sharding protocol, the file reader's own
skip for ``datasets``) and continue. On another layout (other number of processes or workers) the
unread parts of every shard are dealt again: every unseen example is still read exactly once.

Ranks may run out at different times (shards differ in length). With ``even_batches`` (the default),
every batch is full (a reader's last one is filled with copies of its own examples), ranks compare
how many batches they hold every few batches (one tiny ``all_gather`` of real-example counts), a rank
that ran out repeats its first batch until every rank has, and ``gather_for_metrics`` keeps only the real rows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from trainkit.engine.process import collectives
from .stream_sources import HFSource, ProtocolSource, WholeSource, shard_order, source_for

logger = logging.getLogger(__name__)

STATE_FORMAT = "trainkit-stream/1"
DONE = -1
"""A cursor's item index once its reader has nothing left this epoch."""


class _Tagged(NamedTuple):
    example: Any
    cursor: tuple[int, int, Any] | None
    """(reader, index of the shard in the reader's list, position after this example), on a batch's last item."""
    real: bool


class StreamBatch(NamedTuple):
    """A collated batch of a stream with where it leaves its reader and how many of its rows are real."""

    batch: Any
    cursor: tuple[int, int, Any] | None
    real: int


class TaggedCollate:
    """Collate the examples with the user's function; keep the batch's cursor and real count beside them."""

    def __init__(self, collate_fn: Any) -> None:
        self.collate_fn = collate_fn

    def __call__(self, items: list[_Tagged]) -> StreamBatch:
        cursor = next((item.cursor for item in reversed(items) if item.cursor is not None), None)
        batch = self.collate_fn([item.example for item in items])
        return StreamBatch(batch, cursor, sum(item.real for item in items))


class StreamShard(IterableDataset):
    """What each DataLoader worker of this rank iterates: its own shards of ``dataset``, tagged (see module doc)."""

    def __init__(self, dataset: Any, *, batch_size: int, num_processes: int, process_index: int,
                 num_workers: int, drop_last: bool, even_batches: bool, seed: int) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_processes = num_processes
        self.process_index = process_index
        self.num_workers = max(num_workers, 1)
        self.num_readers = num_processes * self.num_workers
        self.drop_last = drop_last
        # Filling batches only serves to give every rank the same batches; one process needs none.
        self.pad = even_batches and not drop_last and num_processes > 1
        self.seed = seed
        self.source: ProtocolSource | HFSource | WholeSource = source_for(dataset, num_processes)
        self.epoch = 0
        self.plan: list[list[list[Any]]] = []
        """Per reader of the job: its ``[shard, position]`` items for this iteration."""
        self.rotation = 0
        """Which of this rank's readers the first worker plays (so a resume continues the batch order)."""
        self._restored: tuple[int, list[list[list[Any]]], int] | None = None
        self._cursors: dict[int, tuple[int, Any]] = {}
        self._consumed = 0

    @property
    def mode(self) -> str:
        """``"shards"`` (readers split the shards) or ``"positions"`` (readers split the examples by index)."""
        return self.source.kind

    def __len__(self) -> int:
        if not hasattr(self.dataset, "__len__"):
            raise TypeError("This iterable dataset has no length.")
        per_rank = -(-len(self.dataset) // self.num_processes)
        return per_rank

    # -- planning (main process) ------------------------------------------------------------------
    def has_restored(self, epoch: int) -> bool:
        """Whether a loaded position for ``epoch`` waits to be used."""
        return self._restored is not None and self._restored[0] == epoch

    def begin(self, epoch: int, use_restored: bool = True) -> None:
        """Plan the iteration of ``epoch``: a restored position for it, else a fresh deal of the shards."""
        self.epoch = epoch
        if use_restored and self._restored is not None and self._restored[0] == epoch:
            _, self.plan, self.rotation = self._restored
        else:
            order = shard_order(self.source.num_shards, self.seed, epoch, self.source.shuffles_shards)
            if self.mode == "positions":
                self.plan = [[[0, None]] for _ in range(self.num_readers)]
            else:
                self.plan = [[[shard, None] for shard in order[j :: self.num_readers]] for j in range(self.num_readers)]
            self.rotation = 0
        self._restored = None
        self._cursors = {}
        self._consumed = 0

    def my_readers(self) -> range:
        """The reader numbers of this rank."""
        first = self.process_index * self.num_workers
        return range(first, first + self.num_workers)

    # -- reading (workers, or the main process without workers) -----------------------------------
    def __iter__(self) -> Iterator[_Tagged]:
        info = get_worker_info()
        worker = info.id if info is not None else 0
        reader = self.process_index * self.num_workers + (worker + self.rotation) % self.num_workers
        return self._read(reader)

    def _examples(self, reader: int) -> Iterator[tuple[Any, int, Any]]:
        """(example, item index, position getter) of ``reader``'s share, in order."""
        # Split by position, each reader opens the one "shard" and keeps its own examples of it.
        readers = self.num_readers if self.mode == "positions" else 1
        for index, (shard, position) in enumerate(self.plan[reader]):
            opened = self.source.open(shard, position, self.epoch, reader % readers, readers)
            for example in opened:
                yield example, index, opened.position

    def _read(self, reader: int) -> Iterator[_Tagged]:
        size, count = self.batch_size, 0
        batch: list[Any] = []
        held: _Tagged | None = None
        for example, index, position in self._examples(reader):
            if held is not None:
                yield held
            count += 1
            if (count - 1) % size == 0:
                batch = []
            batch.append(example)
            # A batch's last example says where its reader stands (one more lookahead marks the very last).
            held = _Tagged(example, (reader, index, position()) if count % size == 0 else None, True)
        if held is None:
            return
        done = (reader, DONE, None)
        if count % size == 0 or not self.pad:
            yield held._replace(cursor=done)
            return
        yield held
        # The last batch is filled with copies of its own examples: the same after a resume as without one.
        fill = size - count % size
        for i in range(fill):
            yield _Tagged(batch[i % len(batch)], done if i == fill - 1 else None, False)

    # -- position (main process) --------------------------------------------------------------------
    def advance(self, cursor: tuple[int, int, Any] | None) -> None:
        """Record that the batch ending at ``cursor`` was handed to the training loop (None: a padding batch)."""
        if cursor is None:
            return
        self._consumed += 1
        reader, index, position = cursor
        self._cursors[reader] = (index, position)

    def _remaining(self, reader: int) -> list[list[Any]]:
        items = [list(item) for item in self.plan[reader]] if reader < len(self.plan) else []
        if reader not in self._cursors:
            return items
        index, position = self._cursors[reader]
        if index == DONE:
            return []
        rest = items[index:]
        rest[0][1] = position
        return rest

    def local_state(self) -> dict[str, Any]:
        """This rank's readers' unread work, and which reader's batch comes next."""
        return {"work": {str(j): self._remaining(j) for j in self.my_readers()},
                "rotation": (self.rotation + self._consumed) % self.num_workers}

    def state_dict(self, epoch: int) -> dict[str, Any]:
        """Collective: the whole job's position (every rank's readers), to store from the main process."""
        ranks = collectives.gather_object(self.local_state())
        work: dict[str, Any] = {}
        for rank_state in ranks:
            work.update(rank_state["work"])
        return {"format": STATE_FORMAT, "mode": self.mode, "epoch": epoch, "num_processes": self.num_processes,
                "num_workers": self.num_workers, "num_shards": self.source.num_shards,
                "rotation": [rank_state["rotation"] for rank_state in ranks], "work": work}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the same readers where the layout matches, else the unread work dealt again."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"Not a stream position (format {state.get('format')!r}, expected {STATE_FORMAT!r}).")
        if state["num_shards"] != self.source.num_shards or state["mode"] != self.mode:
            raise ValueError(
                f"The checkpoint's stream had {state['num_shards']} shard(s) read by {state['mode']}, this one has "
                f"{self.source.num_shards} read by {self.mode}: it is not the same stream, so its position cannot be used.")
        saved_readers = state["num_processes"] * state["num_workers"]
        work = [state["work"][str(j)] for j in range(saved_readers)]
        same_layout = (state["num_processes"], state["num_workers"]) == (self.num_processes, self.num_workers)
        if same_layout:
            self._restored = (int(state["epoch"]), work, int(state["rotation"][self.process_index]))
            return
        if self.mode == "positions":
            raise ValueError(
                f"This stream has no shards and was split by position over {saved_readers} readers "
                f"({state['num_processes']} processes x {state['num_workers']} workers); it can only resume on the same "
                f"layout (now {self.num_processes} x {self.num_workers}). Use a dataset with shards (several files, "
                "or the ShardedIterable protocol) to resume on another number of processes.")
        self._restored = (int(state["epoch"]), _deal_again(work, self.num_readers), 0)
        if self.process_index == 0:
            logger.warning(
                "Resuming a stream read by %d processes x %d workers on %d x %d: the unread parts of its shards are "
                "dealt again, so every unseen example is read exactly once, in another order than an uninterrupted run.",
                state["num_processes"], state["num_workers"], self.num_processes, self.num_workers)


def _deal_again(work: list[list[list[Any]]], readers: int) -> list[list[list[Any]]]:
    """Deal unread ``[shard, position]`` items over ``readers``: partly read ones first, round-robin."""
    items = [item for depth in range(max((len(w) for w in work), default=0)) for w in work if depth < len(w)
             for item in [w[depth]]]
    return [items[j::readers] for j in range(readers)]


AGREE_EVERY = 8
"""Batches a rank reads ahead before the ranks compare how many each still has: one collective per 8 batches."""


def stream_batches(batches: Iterator[StreamBatch], shard: StreamShard, agree: bool,
                   device: torch.device) -> Iterator[tuple[Any, list[int], tuple | None]]:
    """(batch, real rows per rank, cursor) until every rank ran out; a rank that did first repeats its first batch.

    ``agree``: every :data:`AGREE_EVERY` batches, one ``all_gather`` of the real counts of the batches each
    rank holds, so all ranks take the same number of steps (needed for DDP and for gathering); without it
    each rank stops at its own end. The caller passes the cursor to :meth:`StreamShard.advance` when it
    hands the batch on (not when it reads ahead), so a checkpoint holds the position after the batch consumed.
    """
    if not agree:
        for own in batches:
            yield own.batch, [own.real], own.cursor
        return
    first = None
    exhausted = False
    while True:
        held: list[StreamBatch] = []
        while not exhausted and len(held) < AGREE_EVERY:
            current: StreamBatch | None = next(batches, None)
            exhausted = current is None
            if current is not None:
                held.append(current)
        counts = _all_counts([b.real for b in held] + [0] * (AGREE_EVERY - len(held)), device)
        steps = max(sum(1 for c in rank if c) for rank in counts)
        if steps == 0:
            return
        if first is None:
            first = _first_batch(held, counts, shard.process_index)
        for step in range(steps):
            real = [rank[step] for rank in counts]
            if step < len(held):
                yield held[step].batch, real, held[step].cursor
            else:
                yield first, real, None


def _first_batch(held: list[StreamBatch], counts: list[list[int]], process_index: int) -> Any:
    """The batch a rank repeats once its own run out: its first one; a rank that got none at all (a stream shorter
    than the processes: one example on two ranks) receives the first batch of the lowest rank that has one, so every
    rank still takes every step (its rows counted as padding), as Accelerate pads a short stream."""
    empty = [rank for rank, own in enumerate(counts) if not own[0]]
    if not empty:
        return held[0].batch
    source = next(rank for rank, own in enumerate(counts) if own[0])
    payload = [held[0].batch if process_index == source else None]
    collectives.broadcast_object_list(payload, from_process=source)
    return held[0].batch if held else payload[0]


def _all_counts(real: list[int], device: torch.device) -> list[list[int]]:
    gathered = collectives.gather(torch.tensor(real, dtype=torch.int64, device=device))
    return gathered.view(-1, len(real)).tolist()


def agreement_device() -> torch.device:
    """Where the per-batch count exchange runs: the GPU under NCCL, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
