"""Helpers that training scripts import (the names of ``accelerate.utils`` that real scripts use)."""

from trainkit.config.deepspeed import DeepSpeedPlugin
from trainkit.config.dynamo import TorchDynamoPlugin

from .dataclasses import (
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    DistributedType,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    ProjectConfiguration,
)
from .imports import (
    is_cuda_available,
    is_npu_available,
    is_tensorboard_available,
    is_wandb_available,
    is_xpu_available,
)
from .memory import find_executable_batch_size, release_memory
from .random import set_seed

def __getattr__(name: str):
    """Accelerate's DeepSpeed placeholders live with the engine (they need torch): loaded on first use."""
    if name in ("DummyOptim", "DummyScheduler"):
        from trainkit.engine import deepspeed

        return getattr(deepspeed, name)
    raise AttributeError(f"module 'trainkit.utils' has no attribute {name!r}")


__all__ = [
    "DataLoaderConfiguration",
    "DeepSpeedPlugin",
    "DummyOptim",
    "DummyScheduler",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "GradScalerKwargs",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "ProjectConfiguration",
    "TorchDynamoPlugin",
    "find_executable_batch_size",
    "is_cuda_available",
    "is_npu_available",
    "is_tensorboard_available",
    "is_wandb_available",
    "is_xpu_available",
    "release_memory",
    "set_seed",
]
