"""Optimizers that step differently, through a prepared optimizer (CPU, one process): LOMO updates the weights
inside ``backward(loss, learning_rate=...)`` (Accelerate's call) and its ``step`` is then a no-op; schedule-free
optimizers switch between train and eval modes through the wrapper."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn

from trainkit import Accelerator


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 3, generator=g), torch.randn(8, 1, generator=g)


@pytest.mark.skipif(importlib.util.find_spec("lomo_optim") is None, reason="lomo-optim is not installed")
def test_lomo_steps_inside_backward_with_the_learning_rate():
    from lomo_optim import Lomo

    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    expected = nn.Linear(3, 1)
    expected.load_state_dict(model.state_dict())
    accelerator = Accelerator(cpu=True)
    prepared_model, optimizer = accelerator.prepare(model, Lomo(model, lr=0.1))
    x, y = _batch()
    accelerator.backward(nn.functional.mse_loss(prepared_model(x), y), learning_rate=0.1)
    after_backward = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer.step()  # nothing more: the update happened in backward
    optimizer.zero_grad()
    nn.functional.mse_loss(expected(x), y).backward()  # plain SGD at 0.1 is LOMO's update without clipping
    with torch.no_grad():
        for parameter in expected.parameters():
            parameter -= 0.1 * parameter.grad
    for key, value in expected.state_dict().items():
        torch.testing.assert_close(after_backward[key], value, rtol=0, atol=1e-7)
        assert torch.equal(model.state_dict()[key], after_backward[key])


def test_a_learning_rate_without_a_lomo_optimizer_is_refused():
    accelerator = Accelerator(cpu=True)
    model, _ = accelerator.prepare(nn.Linear(3, 1), torch.optim.SGD(nn.Linear(3, 1).parameters(), lr=0.1))
    x, y = _batch()
    with pytest.raises(ValueError, match="LOMO"):
        accelerator.backward(nn.functional.mse_loss(model(x), y), learning_rate=0.1)


@pytest.mark.skipif(importlib.util.find_spec("schedulefree") is None, reason="schedulefree is not installed")
def test_schedule_free_modes_pass_through_the_prepared_optimizer():
    from schedulefree import AdamWScheduleFree

    accelerator = Accelerator(cpu=True)
    model = nn.Linear(3, 1)
    _, optimizer = accelerator.prepare(model, AdamWScheduleFree(model.parameters(), lr=0.1))
    optimizer.train()
    assert optimizer.param_groups[0]["train_mode"] is True
    optimizer.eval()
    assert optimizer.param_groups[0]["train_mode"] is False
