"""Running under a launcher that creates the process group and names the device itself (Ray Train's
``TorchTrainer`` does both: ``init_process_group`` before the training function, ``ACCELERATE_TORCH_DEVICE``).

CPU, one process, a one-rank gloo group on an in-memory store; the Ray runs themselves are in
tests/cluster/test_ray_train.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from trainkit import Accelerator
from trainkit.config.errors import ConfigError
from trainkit.engine.process.devices import choose_device
from trainkit.engine.process.state import ProcessState, read_launch_environment


@pytest.fixture
def group_made_elsewhere(monkeypatch):
    """A gloo group trainkit did not create, with torchrun's variables set as Ray sets them."""
    ProcessState.reset()
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    ProcessState.reset()
    if dist.is_initialized():
        dist.destroy_process_group()


def test_an_existing_group_is_used_as_it_is_and_left_alive(group_made_elsewhere) -> None:
    accelerator = Accelerator(cpu=True)
    assert accelerator.state.backend == "gloo" and accelerator.num_processes == 1
    ProcessState.reset()  # what end of a run / _reset_state does: the group's owner destroys it, not trainkit
    assert dist.is_initialized()


def test_a_group_that_disagrees_with_the_environment_is_refused(group_made_elsewhere, monkeypatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match=r"rank 0 of 1, but the environment says rank 0 of 2"):
        ProcessState.get(cpu=True)


def test_the_launcher_s_device_variable_is_read(monkeypatch) -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "ACCELERATE_TORCH_DEVICE": "cuda:0"}
    assert read_launch_environment(env).assigned_device == "cuda:0"
    assert read_launch_environment({}).assigned_device is None


def test_a_named_cpu_device_wins_and_an_unknown_one_is_refused() -> None:
    assert choose_device(1, 2, cpu=False, assigned="cpu") == torch.device("cpu")
    # Kept as named, index included, as Accelerate's state.device; tensors placed there are ordinary CPU tensors.
    named = choose_device(0, 1, cpu=True, assigned="cpu:64")
    assert str(named) == "cpu:64" and torch.ones(1).to(named).device == torch.device("cpu")
    with pytest.raises(ConfigError, match=r"ACCELERATE_TORCH_DEVICE='xpu:0': trainkit computes on cpu or cuda"):
        choose_device(0, 1, cpu=False, assigned="xpu:0")


@pytest.mark.gpu
def test_the_named_gpu_is_used_rather_than_gpu_local_rank() -> None:
    # CUDA: Ray gives each worker its GPU; with several GPUs visible the index need not equal LOCAL_RANK.
    assert choose_device(1, 2, cpu=False, assigned="cuda:0") == torch.device("cuda", 0)
    assert torch.cuda.current_device() == 0
