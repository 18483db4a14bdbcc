"""``trainkit.data_loader``'s Accelerate classes behave as Accelerate's (CPU, one process; two processes are simulated
by process_index). Accelerate is the oracle where it is installed; trainkit never imports it."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler, TensorDataset

from trainkit.config.errors import ConfigError  # noqa: F401  (import check: config layer loads without torch state)
from trainkit.data_loader import (
    BatchSamplerShard,
    DataLoaderAdapter,
    DataLoaderDispatcher,
    DataLoaderShard,
    DataLoaderStateMixin,
    IterableDatasetShard,
    SkipBatchSampler,
    SkipDataLoader,
    get_sampler,
)
from trainkit.engine.step.accumulation import GradientState

accelerate_data_loader = pytest.importorskip("accelerate.data_loader")


@pytest.mark.parametrize("size, batch, drop_last, split_batches, even_batches",
                         [(size, batch, drop, split, even) for size in (7, 10, 12, 13) for batch in (2, 4)
                          for drop in (False, True) for split in (False, True) for even in (True, False)])
def test_batch_sampler_shard_gives_accelerates_shares_on_two_processes(size, batch, drop_last, split_batches,
                                                                        even_batches):
    def shares(cls):
        out = []
        for rank in range(2):
            inner = BatchSampler(SequentialSampler(range(size)), batch, drop_last)
            out.append(list(cls(inner, 2, rank, split_batches, even_batches)))
        return out

    ours, theirs = shares(BatchSamplerShard), shares(accelerate_data_loader.BatchSamplerShard)
    assert ours == theirs
    for rank in range(2):
        inner = BatchSampler(SequentialSampler(range(size)), batch, drop_last)
        assert len(BatchSamplerShard(inner, 2, rank, split_batches, even_batches)) == len(
            accelerate_data_loader.BatchSamplerShard(inner, 2, rank, split_batches, even_batches))


@pytest.mark.parametrize("size, batch, drop_last, split_batches",
                         [(s, b, d, sp) for s in (7, 12) for b in (2, 4) for d in (False, True) for sp in (False, True)])
def test_iterable_dataset_shard_gives_accelerates_shares(size, batch, drop_last, split_batches):
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(size))

    for rank in range(2):
        ours = IterableDatasetShard(Stream(), batch, drop_last, 2, rank, split_batches)
        theirs = accelerate_data_loader.IterableDatasetShard(Stream(), batch, drop_last, 2, rank, split_batches)
        assert list(ours) == list(theirs)


def test_skip_batch_sampler_and_skip_data_loader_pass_over_the_first_batches():
    inner = BatchSampler(SequentialSampler(range(10)), 3, False)
    ours, theirs = SkipBatchSampler(inner, 2), accelerate_data_loader.SkipBatchSampler(inner, 2)
    assert list(ours) == list(theirs) == [[6, 7, 8], [9]] and len(ours) == len(theirs) == 2
    loader = SkipDataLoader(TensorDataset(torch.arange(10)), skip_batches=1, batch_size=4)
    assert [b[0].tolist() for b in loader] == [[4, 5, 6, 7], [8, 9]] and len(loader) == 2
    assert isinstance(loader, DataLoaderAdapter) and loader.base_dataloader is loader
    with pytest.raises(ValueError, match="StatefulDataLoader"):
        DataLoaderAdapter(TensorDataset(torch.arange(3)), use_stateful_dataloader=True)


def test_get_sampler_finds_the_ordering_sampler():
    dataset = TensorDataset(torch.arange(10))
    plain = DataLoader(dataset, batch_size=2, shuffle=True)
    assert get_sampler(plain) is accelerate_data_loader.get_sampler(plain) is plain.sampler
    as_sampler = DataLoader(dataset, batch_size=None, sampler=BatchSampler(SequentialSampler(dataset), 2, False))
    assert get_sampler(as_sampler) is accelerate_data_loader.get_sampler(as_sampler)
    shard = DataLoaderShard(dataset, batch_sampler=BatchSamplerShard(BatchSampler(RandomSampler(dataset), 2, False),
                                                                     2, 0))
    assert isinstance(get_sampler(shard), RandomSampler) and shard.get_sampler() is get_sampler(shard)
    replacement = SequentialSampler(dataset)
    shard.set_sampler(replacement)
    assert shard.get_sampler() is replacement and [b[0].tolist() for b in shard] == [[0, 1], [4, 5], [8, 9]]


def test_data_loader_shard_constructor_gives_a_working_loader_with_end_of_pass_flags():
    dataset = TensorDataset(torch.arange(10.0))
    shard = DataLoaderShard(dataset, device=torch.device("cpu"), batch_sampler=BatchSamplerShard(
        BatchSampler(SequentialSampler(range(10)), 3, False), 2, 1))
    assert isinstance(shard, DataLoaderStateMixin)
    assert shard.total_batch_size == 6 and shard.total_dataset_length == 10 and len(shard) == 2
    seen = []
    state = shard.gradient_state  # the newest Accelerator's (trainkit.state.GradientState()), here a fresh one
    for batch in shard:
        seen.append((batch[0].tolist(), shard.end_of_dataloader, state.end_of_dataloader))
    assert seen == [([3.0, 4.0, 5.0], False, False), ([9.0, 0.0, 1.0], True, True)]
    assert shard.remainder == 10 % 6  # real samples in the last global batch, as Accelerate's remainder
    shard.reset()
    assert (shard.end_of_dataloader, shard.remainder) == (False, -1)

    # A dataset that fills its last global batch: Accelerate's remainder is 10 % 5 == 0 (nothing to drop), not 5.
    full = DataLoaderShard(dataset, device=torch.device("cpu"), batch_sampler=BatchSamplerShard(
        BatchSampler(SequentialSampler(range(10)), 5, False), 1, 0))
    assert [len(batch[0]) for batch in full] == [5, 5] and full.remainder == 0
    skipping = DataLoaderShard(dataset, batch_size=4, skip_batches=1)
    assert [b[0].tolist() for b in skipping] == [[4.0, 5.0, 6.0, 7.0], [8.0, 9.0]]
    with pytest.raises(ValueError, match="rng_types"):
        DataLoaderShard(dataset, rng_types=["generator"])


def test_state_mixin_begin_and_end_register_with_the_gradient_state():
    class Watched(DataLoaderStateMixin):
        pass

    loader = Watched()
    loader.gradient_state = state = GradientState()
    loader.end_of_dataloader, loader.remainder = True, 3
    loader.begin()
    assert (loader.end_of_dataloader, loader.remainder) == (False, -1) and state.active_dataloader is loader
    loader.end_of_dataloader = True
    assert state.end_of_dataloader
    loader.end()
    assert state.active_dataloader is not loader


def test_data_loader_shard_state_dict_round_trip_and_prefetch_adjustment_is_a_no_op():
    dataset = TensorDataset(torch.arange(8.0))
    shard = DataLoaderShard(dataset, batch_size=2)
    first = list(itertools.islice(iter(shard), 2))
    state = shard.state_dict()
    shard.adjust_state_dict_for_prefetch()
    assert shard.state_dict() == state and len(first) == 2
    resumed = DataLoaderShard(dataset, batch_size=2)
    resumed.load_state_dict(state_dict=state)
    assert resumed.state_dict()["epoch"] == state["epoch"]


def test_data_loader_dispatcher_on_one_process_reads_and_slices_global_batches():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(torch.arange(5.0))

    loader = DataLoaderDispatcher(Stream(), batch_size=2)
    assert [b.tolist() for b in loader] == [[0.0, 1.0], [2.0, 3.0], [4.0]]
    assert loader.end_of_dataloader and loader.total_batch_size == 2
    with pytest.raises(ValueError, match="slice_fn"):
        DataLoaderDispatcher(Stream(), slice_fn=lambda *a: a)


class _EpochBatches(BatchSampler):
    """A script's batch sampler whose order depends on the epoch it is told (as samplers with set_epoch do)."""

    def __init__(self, size: int, batch_size: int) -> None:
        super().__init__(range(size), batch_size, drop_last=False)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = torch.randperm(len(self.sampler), generator=torch.Generator().manual_seed(100 + self.epoch)).tolist()
        return (order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size))


def test_data_loader_dispatcher_reads_with_a_batch_sampler():
    """One process (CPU): the main process reads the script's batch sampler's batches (the same as Accelerate's
    dispatcher for a plain BatchSampler); set_epoch reaches an epoch-aware batch sampler at once and each pass
    reads that epoch's order; a skip_first_batches view keeps the loader's iteration and skips in its order."""
    from trainkit.data_loader import skip_first_batches

    dataset = list(range(10))
    plain = BatchSampler(range(10), 4, drop_last=False)
    ours = [b.tolist() for b in DataLoaderDispatcher(dataset, batch_sampler=plain)]
    assert ours == [b.tolist() for b in accelerate_data_loader.DataLoaderDispatcher(dataset, batch_sampler=plain)]
    assert ours == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]

    def order(epoch: int) -> list[list[int]]:
        return [part.tolist() for part in torch.randperm(10, generator=torch.Generator().manual_seed(100 + epoch)).split(4)]

    loader = DataLoaderDispatcher(dataset, batch_sampler=_EpochBatches(10, 4))
    loader.set_epoch(3)
    assert loader.batch_sampler.epoch == 3 and loader.iteration == 3
    skipped = skip_first_batches(loader, 1)
    assert skipped.iteration == 3
    assert [b.tolist() for b in skipped] == order(3)[1:]
    assert loader.iteration == 4  # a finished pass moves to the next epoch
    assert [b.tolist() for b in loader] == order(4) and loader.batch_sampler.epoch == 4


def test_data_loader_dispatcher_batch_sampler_on_several_processes_needs_split_batches():
    from trainkit.engine.data.loader import _dispatched_batch_size

    assert _dispatched_batch_size(_EpochBatches(10, 4), None, split_batches=True, world=2) == 4
    with pytest.raises(ValueError, match="split_batches=True"):
        _dispatched_batch_size(_EpochBatches(10, 4), None, split_batches=False, world=2)
    with pytest.raises(ValueError, match="multiple of the 3 processes"):
        _dispatched_batch_size(_EpochBatches(10, 4), None, split_batches=True, world=3)


@pytest.mark.parametrize("shuffle", [False, True])
def test_prepare_with_dispatch_batches_dispatches_map_style_data_as_accelerate(shuffle):
    """CPU, one process: ``dispatch_batches=True`` on a map-style dataset gives a DataLoaderDispatcher with Accelerate's
    batches (its order on the same seed, shuffled too) and its random stream; it pickles with the Accelerator.
    Two processes were compared with Accelerate itself (main process reads, each rank gets its slice)."""
    import pickle

    import accelerate

    import trainkit

    def run(library):
        accelerator = library.Accelerator(cpu=True, dataloader_config=library.DataLoaderConfiguration(
            dispatch_batches=True))
        torch.manual_seed(11)
        loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(10)), batch_size=3, shuffle=shuffle))
        batches = [[batch[0].tolist() for batch in loader] for _ in range(2)]
        return type(loader).__name__, len(loader), batches, torch.get_rng_state(), accelerator

    name, length, ours, state, accelerator = run(trainkit)
    theirs = run(accelerate)
    assert theirs[:3] == (name, length, ours) and name == "DataLoaderDispatcher" and length == 4
    assert torch.equal(theirs[3], state)
    copy = pickle.loads(pickle.dumps(accelerator))._dataloaders[0]
    assert isinstance(copy, DataLoaderDispatcher) and len(copy) == 4
