"""Loader behaviours Accelerate's own data-loader tests rely on (CPU, one process; shards built for 2-3 ranks).

``BatchSamplerShard`` with batches of varying size (no ``batch_size``) fills a short last round with whole
batches from the epoch's start; ``split_batches`` needs a batch size the ranks divide. A prepared loader's
``iteration`` is its epoch, ``set_epoch`` reaches the script's own batch sampler at once, and looking one batch
ahead never starts a seedable sampler's next epoch early.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from trainkit import Accelerator
from trainkit.data_loader import BatchSamplerShard, DataLoaderShard, SeedableRandomSampler, skip_first_batches
from trainkit.data_loader import prepare_data_loader


def _shards(batches, ranks, **kwargs):
    return [list(BatchSamplerShard(batches, ranks, rank, **kwargs)) for rank in range(ranks)]


def test_batches_of_varying_size_fill_the_last_round_with_whole_batches():
    varying = [[0, 1, 2], [3, 4], [5, 6, 7, 8], [9, 10, 11], [12, 13]]
    assert _shards(varying, 2, even_batches=True) == [[[0, 1, 2], [5, 6, 7, 8], [12, 13]],
                                                     [[3, 4], [9, 10, 11], [0, 1, 2]]]
    assert _shards([[0], [1, 2], [3], [4, 5], [6, 7], [8], [9]], 3, even_batches=True)[1:] == [
        [[1, 2], [6, 7], [0]], [[3], [8], [1, 2]]]  # padding cycles through the first round: [0], then [1, 2]
    assert _shards([[0, 1, 2]], 3, even_batches=True) == [[[0, 1, 2]]] * 3
    assert _shards(varying, 2, even_batches=False)[1] == [[3, 4], [9, 10, 11]]


def test_split_batches_needs_a_batch_size_the_processes_divide():
    with pytest.raises(ValueError, match="split_batches"):
        BatchSamplerShard([[0, 1], [2, 3]], 2, 0, split_batches=True)
    with pytest.raises(ValueError, match="round multiple"):
        BatchSamplerShard(BatchSampler(range(9), batch_size=3, drop_last=False), 2, 0, split_batches=True)


class EpochBatches(BatchSampler):
    """A batch sampler with a ``set_epoch`` of its own (as custom samplers in scripts have)."""

    def __init__(self, data, batch_size):
        super().__init__(data, batch_size, drop_last=False)
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch


def test_set_epoch_reaches_the_scripts_batch_sampler_and_iteration_is_the_epoch():
    batches = EpochBatches(list(range(8)), 2)
    loader = Accelerator(cpu=True).prepare(DataLoader(list(range(8)), batch_sampler=batches))
    loader.set_epoch(3)
    assert batches.epoch == 3 and loader.iteration == 3  # reached at once, not at the next pass
    assert skip_first_batches(loader, 1).iteration == 3


def test_looking_ahead_never_starts_the_seedable_samplers_next_epoch():
    sampler = SeedableRandomSampler(list(range(16)))
    loader = DataLoaderShard(list(range(16)), batch_sampler=BatchSampler(sampler, 4, drop_last=False))
    loader.set_epoch(1)
    next(iter(skip_first_batches(loader, 2)))  # the third of four batches, read ahead by one
    assert sampler.epoch == 1  # was 2: the sharding sampler read one batch further ahead than needed


def test_base_dataloader_is_the_loader_and_an_instance_attribute():
    loader = DataLoaderShard(list(range(4)), batch_size=2)
    assert loader.base_dataloader is loader
    with pytest.raises(AttributeError):
        DataLoaderShard.base_dataloader


class Numbers(IterableDataset):
    def __iter__(self):
        return iter(torch.arange(5))


def test_an_unbatched_stream_on_one_process_yields_its_samples():
    Accelerator(cpu=True)
    loader = prepare_data_loader(DataLoader(Numbers(), batch_size=None), num_processes=1, process_index=0)
    assert [int(sample) for sample in loader] == [0, 1, 2, 3, 4]  # was a ConfigError asking for a batch_size


def test_dispatching_a_sampler_that_agrees_its_order_across_processes_is_refused():
    """CPU, two processes simulated: with dispatch_batches only the main process reads the sampler, so a sampler whose
    pass order is agreed by a collective (the Trainer's length grouping) could not run; refused by name."""
    from trainkit.config.errors import ConfigError

    class Agreeing(torch.utils.data.SequentialSampler):
        def draw_pass_order(self, generator):
            raise AssertionError("not reached")

    loader = DataLoader(list(range(8)), batch_size=2, sampler=Agreeing(range(8)))
    with pytest.raises(ConfigError, match="group_by_length"):
        prepare_data_loader(loader, num_processes=2, process_index=0, dispatch_batches=True)
