"""``trainkit.optimizer`` / ``trainkit.scheduler``: Accelerate's wrapper classes and helpers (CPU, one process)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainkit import Accelerator
from trainkit.engine.process.state import ProcessState
from trainkit.optimizer import AcceleratedOptimizer, move_to_device, patch_optimizer_step
from trainkit.scheduler import AcceleratedScheduler


@pytest.fixture(autouse=True)
def _fresh_state():
    ProcessState.reset()
    yield
    ProcessState.reset()


def test_prepared_objects_are_accelerates_classes_and_run_torch_hooks():
    accelerator = Accelerator(cpu=True)
    model = nn.Linear(2, 1)
    optimizer, scheduler = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=1.0),
                                               torch.optim.lr_scheduler.StepLR(torch.optim.SGD([nn.Parameter(
                                                   torch.ones(1))], lr=1.0), step_size=1))
    assert isinstance(optimizer, AcceleratedOptimizer) and isinstance(scheduler, AcceleratedScheduler)
    calls = []
    handle = optimizer.register_step_post_hook(lambda opt, args, kwargs: calls.append("post"))
    optimizer.register_state_dict_pre_hook(lambda opt: calls.append("state"))
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    optimizer.state_dict()
    assert calls == ["post", "state"] and optimizer.step_was_skipped is False
    handle.remove()
    optimizer.zero_grad(set_to_none=None)  # torch's default: gradients become None
    assert model.weight.grad is None
    assert scheduler.get_lr() == scheduler.scheduler.get_lr()


def test_accelerates_constructors_build_wrappers_for_the_newest_accelerator():
    with pytest.raises(ValueError, match="create the Accelerator first"):
        AcceleratedOptimizer(torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=0.1))
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    parameter = nn.Parameter(torch.ones(1))
    optimizer = AcceleratedOptimizer(torch.optim.SGD([parameter], lr=0.5), device_placement=True, scaler=None)
    assert optimizer.gradient_state is accelerator.gradient_state and optimizer.precision is accelerator.precision
    with pytest.raises(ValueError, match="GradScalerKwargs"):
        AcceleratedOptimizer(torch.optim.SGD([parameter], lr=0.5), scaler=torch.amp.GradScaler("cpu"))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer.optimizer, lambda step: 1.0 / (step + 1))
    scheduler = AcceleratedScheduler(schedule, optimizer, step_with_optimizer=True, split_batches=False)
    assert scheduler.steps_per_call == accelerator.num_processes and scheduler.optimizers == [optimizer]
    scheduler.step()  # in sync (no accumulate window open): one optimizer step happened
    assert schedule.last_epoch == 1


def test_move_to_device_and_patch_optimizer_step():
    state = {"state": {0: {"momentum_buffer": torch.ones(2)}}, "param_groups": [{"lr": 0.1, "params": [0]}]}
    moved = move_to_device(state, torch.device("cpu"))
    assert moved["param_groups"] == state["param_groups"] and moved["state"][0]["momentum_buffer"].device.type == "cpu"
    accelerator = Accelerator(cpu=True)
    optimizer = accelerator.prepare(torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=0.1))
    optimizer.optimizer.step = patch_optimizer_step(optimizer, optimizer.optimizer.step)
    optimizer.step()
    assert optimizer._accelerate_step_called is True
