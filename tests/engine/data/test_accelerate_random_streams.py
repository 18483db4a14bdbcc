"""Prepared loaders draw what Accelerate's draw, in the same order, so a model with dropout trained by an Accelerate
loop gives Accelerate's numbers (CPU, one process; Accelerate 1.15 itself is the oracle, in the same test).

Each pass draws its iterator's base seed from torch's global RNG (or the loader's generator); a generator-less
``RandomSampler`` without the seedable sampler draws its own seed; a collate function draws while the batch after
the one handed out is read. The per-step losses and the global RNG state after two epochs (an evaluation pass in
between) must be equal to the bit.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import trainkit

accelerate = pytest.importorskip("accelerate", reason="Accelerate (the oracle) is installed in the dev venv only")


def noisy_collate(rows):
    """A collate function that draws from torch's global RNG (as MLM masking does)."""
    batch = torch.stack(rows)
    return batch + 0.01 * torch.randn_like(batch)


def run(library, seedable: bool, shuffle_generator: bool, workers: int = 0) -> tuple[list[float], torch.Tensor]:
    torch.manual_seed(3)
    data = torch.randn(24, 5, generator=torch.Generator().manual_seed(9))
    model = nn.Sequential(nn.Linear(5, 8), nn.Dropout(0.3), nn.Linear(8, 1))
    generator = torch.Generator().manual_seed(5) if shuffle_generator else None
    config = library.DataLoaderConfiguration(use_seedable_sampler=seedable)
    accelerator = library.Accelerator(cpu=True, dataloader_config=config)
    loader = DataLoader(list(data), batch_size=4, shuffle=True, generator=generator, collate_fn=noisy_collate,
                        num_workers=workers)
    evaluation = DataLoader(list(data[:8]), batch_size=4)
    model, loader, evaluation = accelerator.prepare(model, loader, evaluation)
    losses = []
    for _ in range(2):
        model.train()
        for batch in loader:
            losses.append(float(model(batch).detach().pow(2).mean()))
        model.eval()
        for batch in evaluation:
            model(batch)
    return losses, torch.get_rng_state()


@pytest.mark.parametrize("seedable", [True, False], ids=["seedable_sampler", "users_sampler"])
@pytest.mark.parametrize("shuffle_generator", [False, True], ids=["global_rng", "own_generator"])
def test_dropout_and_collate_draws_are_accelerates(seedable, shuffle_generator):
    theirs = run(accelerate, seedable, shuffle_generator)
    ours = run(trainkit, seedable, shuffle_generator)
    assert len(ours[0]) == 12
    assert ours[0] == theirs[0]
    assert torch.equal(ours[1], theirs[1])


def test_a_worker_loader_shuffles_in_accelerates_order():
    """With worker processes torch's iterator starts the sampler while it is built (it prefetches indices), right
    after drawing the base seed: the shuffled order of a generator-less sampler is drawn there too, as Accelerate's."""
    theirs = run(accelerate, seedable=False, shuffle_generator=False, workers=1)
    ours = run(trainkit, seedable=False, shuffle_generator=False, workers=1)
    assert ours[0] == theirs[0]
    assert torch.equal(ours[1], theirs[1])
