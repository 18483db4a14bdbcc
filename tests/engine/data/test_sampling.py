"""Index-level sharding, checked for every rank of simulated worlds (no processes needed: it is pure)."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import BatchSampler, SequentialSampler

from trainkit.engine.data import IterableDatasetShard, SeedableRandomSampler, ShardedBatchSampler


def _shards(size: int, batch: int, world: int, split: bool = False, even: bool = True, drop_last: bool = False, skip: int = 0):
    out = []
    for rank in range(world):
        sampler = ShardedBatchSampler(BatchSampler(SequentialSampler(range(size)), batch, drop_last), world, rank,
                                      split_batches=split, even_batches=even)
        sampler.skip_samples = skip
        out.append((list(sampler), sampler.final_real_samples, len(sampler)))
    return out


@pytest.mark.parametrize("size,batch,world", list(itertools.product([1, 7, 13, 16, 37], [1, 3, 4], [1, 2, 3, 4])))
def test_every_sample_once_in_order_then_padding(size, batch, world):
    shards = _shards(size, batch, world)
    per_rank = [batches for batches, _, _ in shards]
    assert len({len(b) for b in per_rank}) == 1, "even_batches gives every rank the same number of batches"
    assert all(len(b) == length for b, _, length in zip(per_rank, shards, [s[2] for s in shards]))
    stream = [i for step in zip(*per_rank) for rank_batch in step for i in rank_batch]
    real = shards[0][1] if shards[0][1] >= 0 else None
    if world == 1:
        assert stream == list(range(size)), "one process: no padding, the last batch may be short"
        return
    assert all(len(rank_batch) == batch for b in per_rank for rank_batch in b), "padded to full batches"
    last_global = batch * world
    kept = stream if real is None else stream[: len(stream) - last_global + real]
    assert kept == list(range(size))


@pytest.mark.parametrize("size,world", [(13, 2), (7, 4), (16, 2), (1, 2)])
def test_split_batches_slices_each_global_batch(size, world):
    shards = _shards(size, 4, world, split=True)
    stream = [i for step in zip(*[b for b, _, _ in shards]) for part in step for i in part]
    real = shards[0][1]
    assert stream[: size] == list(range(size)) or (real >= 0 and stream[: len(stream) - 4 + real] == list(range(size)))
    if world == 1:
        assert stream == list(range(size))


def test_uneven_batches_without_padding_and_drop_last():
    uneven = _shards(13, 4, 2, even=False)
    assert [b for b, _, _ in uneven] == [[[0, 1, 2, 3], [8, 9, 10, 11]], [[4, 5, 6, 7], [12]]]
    dropped = _shards(13, 4, 2, drop_last=True)
    assert [b for b, _, _ in dropped] == [[[0, 1, 2, 3]], [[4, 5, 6, 7]]]
    assert [length for _, _, length in dropped] == [1, 1]


@pytest.mark.parametrize("old_world,new_world", [(2, 1), (1, 2), (2, 4), (4, 2)])
def test_resume_on_another_world_size_continues_the_global_stream(old_world, new_world):
    """Same global batch (8): skipping the consumed samples gives the uninterrupted order."""
    global_batch, size, consumed = 8, 40, 16
    full = _shards(size, global_batch // new_world, new_world)
    resumed = _shards(size, global_batch // new_world, new_world, skip=consumed)
    full_stream = [i for step in zip(*[b for b, _, _ in full]) for part in step for i in part]
    resumed_stream = [i for step in zip(*[b for b, _, _ in resumed]) for part in step for i in part]
    assert resumed_stream == full_stream[consumed:]


def test_seedable_sampler_depends_only_on_seed_and_epoch():
    """CPU, one process: the order is fixed by (data_seed, epoch); each pass advances the epoch; set_epoch replays."""
    a = SeedableRandomSampler(range(50), data_seed=3)
    b = SeedableRandomSampler(range(50), generator=torch.Generator().manual_seed(99), data_seed=3)
    assert isinstance(a, torch.utils.data.RandomSampler)
    first = list(a)
    assert first == list(b) and sorted(first) == list(range(50)) and a.epoch == b.epoch == 1
    second = list(a)
    assert second != first and second == list(b)
    a.set_epoch(0)
    assert list(a) == first


def test_seedable_sampler_reseeds_the_users_generator_from_torchs_initial_seed():
    """CPU, one process: without data_seed the seed is torch's initial seed (set_seed fixes it) plus the epoch."""
    torch.manual_seed(5)
    generator = torch.Generator()
    sampler = SeedableRandomSampler(range(20), generator=generator, num_samples=30, replacement=True)
    drawn = list(sampler)
    assert sampler.initial_seed == 5 and sampler.generator is generator and len(drawn) == 30
    expected = torch.randint(20, (30,), generator=torch.Generator().manual_seed(5)).tolist()
    assert drawn == expected


def test_iterable_dataset_shard_pads_the_last_global_batch():
    shards = [IterableDatasetShard(range(11), 2, num_processes=3, process_index=rank) for rank in range(3)]
    outputs = [list(shard) for shard in shards]
    assert [len(o) for o in outputs] == [4, 4, 4]
    stream = [x for step in zip(*[[o[i:i + 2] for i in range(0, 4, 2)] for o in outputs]) for part in step for x in part]
    assert stream[:11] == list(range(11)) and shards[0].final_real_samples == 5
