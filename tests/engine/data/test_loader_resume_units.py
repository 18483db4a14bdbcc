"""A prepared loader's position on one process (CPU): len() never changes, what load_state_dict restores per mode."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from trainkit import Accelerator
from trainkit.utils.dataclasses import DataLoaderConfiguration


def _loader(stateful: bool, seedable: bool = True, generator: torch.Generator | None = None):
    """seedable: the order comes from data_seed=5; else from ``generator`` (the user's, as Accelerate's default)."""
    config = DataLoaderConfiguration(use_stateful_dataloader=stateful, data_seed=5, use_seedable_sampler=seedable)
    accelerator = Accelerator(cpu=True, dataloader_config=config)
    return accelerator.prepare(DataLoader(TensorDataset(torch.arange(20)), batch_size=4, shuffle=True,
                                          generator=generator))


def _epoch(loader) -> list[list[int]]:
    return [batch[0].tolist() for batch in loader]


def _stopped_after(loader, batches: int) -> dict:
    """The position stored by a save taken inside the loop body after ``batches`` batches of epoch 0."""
    iterator = iter(loader)
    for _ in range(batches):
        next(iterator)
    state = loader.state_dict()
    iterator.close()
    return state


def test_len_is_the_whole_epoch_after_loading_and_skipping():
    loader = _loader(stateful=True)
    state = _stopped_after(loader, 3)
    resumed = _loader(stateful=True)
    resumed.load_state_dict(state)
    assert len(resumed) == 5
    view = resumed.skip_first_batches(2)
    assert (len(resumed), len(view)) == (5, 3)


def test_without_stateful_loading_restores_the_epoch_and_the_script_skips():
    reference = _loader(stateful=False)
    epochs = [_epoch(reference), _epoch(reference)]
    state = _stopped_after(_loader(stateful=False), 3)
    assert state["epoch"] == 0 and state["samples_seen"] == 12

    resumed = _loader(stateful=False)
    resumed.load_state_dict(state)
    assert _epoch(resumed.skip_first_batches(3)) == epochs[0][3:]  # Accelerate's step resume
    assert _epoch(resumed) == epochs[1]  # the next epoch's order, as uninterrupted


def test_stateful_loading_continues_at_the_next_batch():
    reference = _epoch(_loader(stateful=True))
    resumed = _loader(stateful=True)
    resumed.load_state_dict(_stopped_after(_loader(stateful=True), 3))
    assert _epoch(resumed) == reference[3:]


def test_a_save_after_the_last_batch_resumes_at_the_next_epoch():
    reference = _loader(stateful=False)
    _epoch(reference)
    next_epoch = _epoch(reference)
    state = _stopped_after(_loader(stateful=False), 5)  # inside the loop body, after the epoch's last batch
    assert (state["epoch"], state["samples_seen"]) == (1, 0)
    resumed = _loader(stateful=False)
    resumed.load_state_dict(state)
    assert _epoch(resumed) == next_epoch


def test_a_users_generator_is_restored_so_a_resume_replays_its_order():
    """Not seedable: the order is the user's generator's; the checkpoint carries its state at the epoch's start."""
    reference = _loader(stateful=True, seedable=False, generator=torch.Generator().manual_seed(3))
    epochs = [_epoch(reference), _epoch(reference)]
    interrupted = _loader(stateful=True, seedable=False, generator=torch.Generator().manual_seed(3))
    state = _stopped_after(interrupted, 3)
    resumed = _loader(stateful=True, seedable=False, generator=torch.Generator().manual_seed(77))
    resumed.load_state_dict(state)
    assert _epoch(resumed) == epochs[0][3:]
    assert _epoch(resumed) == epochs[1]

    after_last = _stopped_after(_loader(stateful=True, seedable=False, generator=torch.Generator().manual_seed(3)), 5)
    resumed = _loader(stateful=True, seedable=False, generator=torch.Generator().manual_seed(77))
    resumed.load_state_dict(after_last)
    assert _epoch(resumed) == epochs[1]


def test_a_users_generator_gives_the_plain_loaders_order():
    """CPU, one process, Accelerate's default (no seedable sampler): the prepared loader shuffles exactly like
    the same DataLoader unprepared, pass after pass, drawing from the user's generator."""
    plain = DataLoader(TensorDataset(torch.arange(20)), batch_size=4, shuffle=True,
                       generator=torch.Generator().manual_seed(11))
    expected = [_epoch(plain), _epoch(plain)]
    prepared = _loader(stateful=False, seedable=False, generator=torch.Generator().manual_seed(11))
    assert [_epoch(prepared), _epoch(prepared)] == expected
