"""Helpers that training scripts import (the names of ``accelerate.utils`` that real scripts use)."""

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

__all__ = [
    "DataLoaderConfiguration",
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
