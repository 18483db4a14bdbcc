"""Prepared dataloaders: per-rank batches on the device, epoch seeding and a resumable position.

A :class:`PreparedDataLoader` (built by :func:`~.preparation.prepare_data_loader` around a
:class:`ShardedBatchSampler` or a :class:`~.streams.StreamShard`) is still a ``DataLoader`` with the user's
``dataset``, ``len()`` and collate function; ``len()`` is always the whole epoch's (neither a resume nor
``skip_first_batches`` changes it; the view ``skip_first_batches`` returns is shorter, as in Accelerate). Its
position is a cursor in samples of the global stream plus the epoch. A checkpoint always stores both; loading
restores the epoch, and, when the loader resumes mid-epoch (``DataLoaderConfiguration(use_stateful_dataloader=True)``,
and the Trainer), the exact next batch on any world size with the same global batch, by skipping indices, not by
loading the skipped batches. An iterable dataset's rank (and each worker) reads only its own shards, and its position
is the stream's own cursor (see :mod:`.streams`), from which it always continues; with ``dispatch_batches`` the main
process reads for all (see :mod:`.dispatch`; :class:`DataLoaderDispatcher` is Accelerate's constructor for that).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator, Sized
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.utils.data import BatchSampler, DataLoader

from trainkit.engine.step.accumulation import GradientState

from .device import send_to_device
from .shard_attributes import ShardAttributes
from .sampling import IterableDatasetShard, SeedableRandomSampler, ShardedBatchSampler, get_sampler
from .dispatch import dispatched_batches
from .generator_sync import SyncedGenerator
from .pass_draws import PassDraws, reseeding
from .streams import StreamShard, agreement_device, stream_batches


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


def current_gradient_state() -> GradientState:
    """The gradient state a loader built outside ``prepare`` reports to: the newest Accelerator's (Accelerate's
    shared ``GradientState``), else a fresh one."""
    from trainkit.engine.process.state import ProcessState  # the process state reaches the data layer: import on use

    state = ProcessState._instance
    accelerator = state.accelerator if state is not None and not getattr(state, "gradient_state_cleared", False) \
        else None
    return accelerator.gradient_state if accelerator is not None else GradientState()


class DataLoaderStateMixin:
    """Accelerate's end-of-pass bookkeeping for a loader that :class:`GradientState` watches.

    ``end_of_dataloader`` turns true when the last batch of a pass is yielded and ``remainder`` is then the
    number of real (not padding) samples in the last global batch (-1 when unknown). ``begin``/``end`` register
    the loader as the active one with the gradient state (a prepared loader does it itself on each pass).
    """

    end_of_dataloader: bool = False
    remainder: int = -1
    gradient_state: GradientState

    def reset(self) -> None:
        """Clear the end-of-pass flags (at the start of a pass)."""
        self.end_of_dataloader = False
        self.remainder = -1

    def begin(self) -> None:
        """Start a pass: clear the flags and become the gradient state's active loader."""
        self.reset()
        if not hasattr(self, "gradient_state"):
            self.gradient_state = current_gradient_state()
        self.gradient_state.push(self)  # type: ignore[arg-type]  # the prepared loader that mixes this in is a WindowedLoader

    def end(self) -> None:
        """End a pass: stop being the gradient state's active loader."""
        self.gradient_state.pop(self)  # type: ignore[arg-type]  # the prepared loader that mixes this in is a WindowedLoader


class PreparedDataLoader(DataLoaderStateMixin, ShardAttributes, DataLoader):
    """A DataLoader that yields this rank's part of each global batch, already on the device."""

    # Accelerate's constructor (``DataLoaderShard(dataset, batch_sampler=BatchSamplerShard(...), ...)``) for code that
    # builds one directly; Accelerator.prepare builds them with :meth:`_build` from parts it has already worked out.
    def __init__(
        self,
        dataset: Any,
        device: torch.device | None = None,
        rng_types: Any = None,
        synchronized_generator: torch.Generator | None = None,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        _drop_last: bool = False,
        _non_blocking: bool = False,
        torch_device_mesh: Any = None,
        iteration: int = 0,
        **kwargs: Any,
    ) -> None:
        # use_stateful_dataloader needs nothing more: this loader has state_dict/load_state_dict already.
        if rng_types:
            raise ValueError(f"DataLoaderShard(rng_types={rng_types!r}): trainkit does not copy RNG states across "
                             "processes at each pass; give the sampler a generator (prepare keeps it in step on "
                             "every process) or use DataLoaderConfiguration(use_seedable_sampler=True).")
        if synchronized_generator is not None:
            raise ValueError("DataLoaderShard(synchronized_generator=...): pass the generator to the sampler instead; "
                             "Accelerator.prepare keeps a sampler's generator in step across processes.")
        if torch_device_mesh is not None:
            raise ValueError("DataLoaderShard(torch_device_mesh=...): trainkit shards data over processes only "
                             "(no device meshes for data).")
        if isinstance(dataset, torch.utils.data.IterableDataset):
            raise ValueError("DataLoaderShard over an iterable dataset: wrap it in IterableDatasetShard(...) and use "
                             "a plain DataLoader, or let Accelerator.prepare / prepare_data_loader shard it.")
        batching = {name: kwargs.pop(name) for name in _BATCHING_ARGUMENTS if name in kwargs}
        batch_sampler = DataLoader(dataset, **batching).batch_sampler  # torch's own checks of the combination
        kwargs["generator"] = batching.get("generator")  # also draws each pass's base seed, as in Accelerate
        if batch_sampler is None:
            raise ValueError("DataLoaderShard needs batches: give batch_size (default 1) or batch_sampler, not "
                             "batch_size=None.")
        if not isinstance(batch_sampler, ShardedBatchSampler):
            batch_sampler = ShardedBatchSampler(batch_sampler, 1, 0, even_batches=False)  # one process's batches
        per_rank = batch_sampler.batch_size
        global_size = None if per_rank is None else (
            per_rank if batch_sampler.split_batches else per_rank * batch_sampler.num_processes)
        kwargs.setdefault("prefetch_factor", None if kwargs.get("num_workers", 0) == 0 else 2)
        self._setup(dataset, batch_sampler=batch_sampler, device=device, gradient_state=current_gradient_state(),
                    global_batch_size=global_size, seed=torch.initial_seed(), non_blocking=_non_blocking, **kwargs)
        self.skipped_batches = skip_batches
        self.use_stateful_dataloader = use_stateful_dataloader
        self.set_epoch(iteration)  # the pass to start at (its shuffling order, for a seedable sampler)

    @classmethod
    def _build(cls, dataset: Any, **parts: Any) -> PreparedDataLoader:
        """An instance from prepared parts (see :meth:`_setup`), without Accelerate's constructor."""
        loader = cls.__new__(cls)
        loader._setup(dataset, **parts)
        return loader

    def _setup(self, dataset: Any, *, device: torch.device | None, gradient_state: GradientState,
               global_batch_size: int | None, seed: int, non_blocking: bool = False,
               resume_mid_epoch: bool = False, **kwargs: Any) -> None:
        # Each pass draws its iterator's base seed from ``generator`` (None: torch's global generator), as torch's
        # DataLoader does under Accelerate; pass_draws records those draws so a resumed pass can replay them.
        super().__init__(dataset, **kwargs)
        self.pass_draws = PassDraws(reads_in_workers=self.num_workers > 0, all_generators=resume_mid_epoch)
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
        self.reset()
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
        if isinstance(self.dataset, IterableDatasetShard):
            return self.dataset
        if self.batch_sampler is None and isinstance(self.sampler, ShardedBatchSampler):
            return self.sampler  # a batch sampler given as sampler= (batch_size=None): the dataset takes index lists
        # prepare_data_loader builds every prepared loader with a ShardedBatchSampler (or none, for streams)
        return cast("ShardedBatchSampler | None", self.batch_sampler)

    @property
    def is_stream(self) -> bool:
        """True for an iterable dataset read shard by shard (its position is the stream's cursor)."""
        return isinstance(self.dataset, StreamShard)

    @property
    def _stream(self) -> StreamShard:
        assert isinstance(self.dataset, StreamShard)
        return self.dataset

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration use ``epoch``'s shuffling order (called for you at each new pass); samplers and
        datasets with a ``set_epoch`` of their own (the script's batch sampler too) hear of it at once."""
        if epoch != self.progress.epoch:
            self.progress.move_to(epoch)
        self._propagate_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The position to store in a checkpoint, with the shuffling seed that gives it meaning.

        Collective for a stream (every rank's readers are gathered): call it on every process.
        """
        state: dict[str, Any] = {**self.progress.state_dict(), "seed": self.seed}
        if self.global_batch_size:  # lets a resume on another world size keep the global batch (checkpoint/global_batch.py)
            state["global_batch_size"] = self.global_batch_size
        if self.is_stream:
            state["stream"] = self._stream.state_dict(self.progress.epoch)
        if self.synced_generator is not None:
            state.update(self.synced_generator.state_dict(pass_finished=self.progress.last_batch_yielded))
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from a stored position: its epoch, and with ``resume_mid_epoch`` its next sample.

        Without ``resume_mid_epoch`` (Accelerate's default) the next iteration starts at the epoch's first
        batch, and the script skips what was seen with ``skip_first_batches``. A stream always continues
        from its readers' cursors (it cannot skip what it has not read).
        """
        state = state_dict
        if "seed" in state:
            self._set_seed(int(state["seed"]))
        if self.synced_generator is not None:
            self.synced_generator.load_state_dict(state)
            synced = self.synced_generator
            self.pass_draws.draw_order = reseeding(synced.generator) if synced.reseeded_each_pass else None
        if self.is_stream:
            if "stream" not in state:
                raise ValueError("This checkpoint's loader position is not a stream's: it cannot place an iterable dataset.")
            self._stream.seed = self.seed
            self._stream.load_state_dict(state["stream"])
        # A stream (or a dispatched loader) cannot skip without reading: it always continues where it stood.
        mid_epoch = self.resume_mid_epoch or self.is_stream or self.dispatch_to is not None
        samples_seen = int(state["samples_seen"]) if mid_epoch else 0
        self.progress.move_to(int(state["epoch"]), samples_seen)

    def random_state(self) -> dict[str, Any] | None:
        """This process's random draws of the pass in progress (its base seed, the batch read ahead), which a resume
        replays to continue exactly; None between passes. Per process: checkpoints store it beside the RNG states."""
        progress = self.progress
        if progress.last_batch_yielded or not progress.samples_seen:
            return None
        return self.pass_draws.state_dict(progress.epoch, progress.samples_seen)

    def load_random_state(self, state: dict[str, Any] | None) -> None:
        """Replay :meth:`random_state`'s draws in the next pass if it continues that position (see .pass_draws)."""
        self.pass_draws.load_state_dict(state)

    def adjust_state_dict_for_prefetch(self) -> None:
        """Accelerate's correction of a stateful loader's position for batches prefetched ahead of the one
        yielded. Nothing to do here: :meth:`state_dict` counts the batches yielded, never those prefetched."""

    # -- Accelerate's accessors -----------------------------------------------------------------------
    def get_sampler(self) -> Any:
        """The sampler that orders the dataset (the one under the sharding batch sampler), or None."""
        return get_sampler(self)

    def set_sampler(self, sampler: Any) -> None:
        """Order the dataset with ``sampler`` from the next pass on (kept under the sharding batch sampler)."""
        inner = getattr(self._shard, "batch_sampler", None)
        if isinstance(inner, BatchSampler) or hasattr(inner, "sampler"):
            inner.sampler = sampler  # type: ignore[union-attr]  # inner has a sampler (checked above)
        elif isinstance(self.batch_sampler, BatchSampler):
            self.batch_sampler.sampler = sampler
        else:
            raise ValueError("set_sampler: this loader has no batch sampler whose sampler can be replaced "
                             "(an iterable dataset, or a loader with batch_size=None).")

    @property
    def total_batch_size(self) -> int | None:
        """Samples in one global batch (all processes together), or None for an unbatched loader."""
        return self.global_batch_size

    @property
    def total_dataset_length(self) -> int:
        """Samples in the whole dataset (every process's part together)."""
        dataset = self.dataset.dataset if isinstance(self.dataset, IterableDatasetShard) else self.dataset
        return len(cast(Sized, dataset))  # a TypeError for an unsized dataset, as torch's len(loader)

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
        self._propagate_epoch(epoch)
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
        self._yielded = 0
        self.reset()
        try:
            skipped = skip // self.global_batch_size if self.global_batch_size else 0
            # A stream's length is an estimate (its shards' sizes are unknown): windows end where it ends.
            self._expected_batches = None if self.is_stream else max(DataLoader.__len__(self) - skipped, 0)
        except TypeError:
            self._expected_batches = None

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # batches, not torch's _BaseDataLoaderIter
        self._begin_iteration()
        synced = self.synced_generator
        # A dispatched loader's other ranks only receive; they draw the base seed all the same, as Accelerate's do.
        new_iterator = self._draw_base_seed if self.dispatch_to and self.dispatch_to[1] != 0 else super().__iter__
        base = self.pass_draws.open(self, new_iterator, self.progress.epoch, self.progress.samples_seen,
                                    synced.begin_pass if synced is not None else None)
        iterator: Iterator[tuple[Any, list[int] | None, Any]]
        if self.is_stream or self.dispatch_to:
            iterator = self._stream_iterator(base)
        else:
            iterator = ((batch, None, None) for batch in base)
        self.gradient_state.push(self)
        finished = False
        read = functools.partial(next, iterator, _END)
        try:
            current = self.pass_draws.read(read)
            while current is not _END:
                upcoming = self.pass_draws.read(read)
                self._yielded += 1
                if upcoming is _END:
                    self.end_of_dataloader = True
                    self.progress.last_batch_yielded = True
                    if not (self.is_stream or self.dispatch_to):
                        real = self._shard.final_real_samples if self._shard is not None else -1
                        # Accelerate's remainder: the dataset's size modulo the global batch, so 0 when the last
                        # global batch is full (gather_for_metrics then keeps every gathered row).
                        self.remainder = real % self.global_batch_size if real > 0 and self.global_batch_size else real
                if self.global_batch_size:
                    self.progress.samples_seen += self.global_batch_size
                batch, self.real_counts, cursor = cast("tuple[Any, list[int] | None, Any]", current)  # not _END
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

    def _draw_base_seed(self) -> Iterator[Any]:
        torch.empty((), dtype=torch.int64).random_(generator=self.generator)
        return iter(())

    def _stream_iterator(self, base: Iterator[Any]) -> Iterator[tuple[Any, list[int] | None, Any]]:
        """The stream's batches, agreed across ranks; batches skipped by ``skip_first_batches`` are read and dropped."""
        batches: Iterator[tuple[Any, list[int], Any]]
        if self.dispatch_to:
            world, rank = self.dispatch_to
            # Only the main process reads (with the global batch size); the others receive their slices.
            batches = dispatched_batches(base if rank == 0 else None, world, rank,
                                         (self.global_batch_size or world) // world)
        else:
            stream = self._stream
            agree = stream.pad and stream.num_processes > 1
            batches = stream_batches(base, stream, agree, agreement_device())
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
# DataLoader arguments that choose the batches: Accelerate's DataLoaderShard constructor turns them into one batch sampler.
_BATCHING_ARGUMENTS = ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last", "generator")


class DataLoaderDispatcher(PreparedDataLoader):
    """Accelerate's main-process-reads-and-sends loader: process 0 iterates the dataset with the global batch size
    and every process receives its slice of each global batch (the last one filled up so all get a full slice,
    ``remainder`` saying how many samples of it are real). For datasets only the main process can read.

    ``batch_size`` (default 1) is each process's batch, or with ``split_batches`` the global batch. A
    ``batch_sampler`` gives the global batches itself (one process, or ``split_batches`` on several).
    ``skip_batches`` passes over the first batches of every pass (read by the main process, then dropped).
    """

    def __init__(
        self,
        dataset: Any,
        split_batches: bool = False,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        _drop_last: bool = False,
        _non_blocking: bool = False,
        slice_fn: Any = None,
        torch_device_mesh: Any = None,
        iteration: int = 0,
        **kwargs: Any,
    ) -> None:
        from trainkit.engine.process.state import ProcessState

        if slice_fn is not None:
            raise ValueError("DataLoaderDispatcher(slice_fn=...): trainkit slices every tensor of a batch along its "
                             "first dimension and takes no custom slicing function.")
        if torch_device_mesh is not None:
            raise ValueError("DataLoaderDispatcher(torch_device_mesh=...): trainkit shards data over processes only "
                             "(no device meshes for data).")
        unsupported = sorted(name for name in ("sampler", "shuffle") if kwargs.get(name))
        if unsupported:
            raise ValueError(f"DataLoaderDispatcher({', '.join(unsupported)}=...): give batch_size (and drop_last) "
                             "or a batch_sampler; the main process batches the dataset in order. For shuffled "
                             "map-style data use Accelerator.prepare, which shards by indices.")
        state = ProcessState.get()
        world, rank = state.world_size, state.rank
        batch_sampler = kwargs.pop("batch_sampler", None)
        batch_size = _dispatched_batch_size(batch_sampler, kwargs.pop("batch_size", 1), split_batches, world)
        global_size = batch_size if split_batches or batch_sampler is not None else batch_size * world
        batching = {"batch_sampler": batch_sampler} if batch_sampler is not None else {"batch_size": global_size}
        kwargs.setdefault("prefetch_factor", None if kwargs.get("num_workers", 0) == 0 else 2)
        self._setup(dataset, **batching, device=state.device, gradient_state=current_gradient_state(),
                    global_batch_size=global_size, seed=torch.initial_seed(), non_blocking=_non_blocking, **kwargs)
        self.dispatch_to = (world, rank)
        self.split_batches = split_batches
        self.skipped_batches = skip_batches
        self.use_stateful_dataloader = use_stateful_dataloader
        self.set_epoch(iteration)


def _dispatched_batch_size(batch_sampler: Any, batch_size: int | None, split_batches: bool, world: int) -> int:
    """The size of the batches the main process reads: ``batch_size``, or the ``batch_sampler``'s, whose batches
    are global batches (one process, or ``split_batches``: the processes split each of them)."""
    if batch_sampler is not None:
        if world > 1 and not split_batches:
            raise ValueError("DataLoaderDispatcher(batch_sampler=...) on several processes needs split_batches=True "
                             "(each batch of the sampler is one global batch, split between the processes).")
        batch_size = getattr(batch_sampler, "batch_size", None)
    if batch_size is None:
        raise ValueError("DataLoaderDispatcher needs a batch_size (not None), or a batch_sampler with one: it cuts "
                         "global batches into slices.")
    if split_batches and batch_size % world:
        raise ValueError(f"DataLoaderDispatcher(split_batches=True): batch size {batch_size} must be a multiple "
                         f"of the {world} processes, so that each gets an equal slice.")
    return int(batch_size)
