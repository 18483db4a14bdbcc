"""``accelerate.accelerator``'s names: the ``Accelerator`` and the configuration classes scripts import beside it.

Accelerate scripts write ``from accelerate.accelerator import Accelerator, DataLoaderConfiguration,
GradientAccumulationPlugin``; this module makes the same line work with ``trainkit.accelerator``. Every name is
the object ``trainkit`` and ``trainkit.utils`` already export (one class, several import paths).
"""

from __future__ import annotations

from trainkit.engine.accelerator import Accelerator
from trainkit.optimizer import AcceleratedOptimizer
from trainkit.scheduler import AcceleratedScheduler
from trainkit.state import AcceleratorState, GradientState, PartialState
from trainkit.tracking import GeneralTracker
from trainkit.utils import (
    AORecipeKwargs,
    AutocastKwargs,
    DataLoaderConfiguration,
    DeepSpeedPlugin,
    DistributedDataParallelKwargs,
    DistributedType,
    DynamoBackend,
    FP8BackendType,
    FP8RecipeKwargs,
    FullyShardedDataParallelPlugin,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    LoggerType,
    MegatronLMPlugin,
    MSAMPRecipeKwargs,
    ParallelismConfig,
    PrecisionType,
    ProfileKwargs,
    ProjectConfiguration,
    RNGType,
    TERecipeKwargs,
    TorchDynamoPlugin,
    TorchTensorParallelPlugin,
)

__all__ = [
    "AORecipeKwargs", "AcceleratedOptimizer", "AcceleratedScheduler", "Accelerator", "AcceleratorState",
    "AutocastKwargs", "DataLoaderConfiguration", "DeepSpeedPlugin", "DistributedDataParallelKwargs",
    "DistributedType", "DynamoBackend", "FP8BackendType", "FP8RecipeKwargs", "FullyShardedDataParallelPlugin",
    "GeneralTracker", "GradScalerKwargs", "GradientAccumulationPlugin", "GradientState", "InitProcessGroupKwargs",
    "KwargsHandler", "LoggerType", "MSAMPRecipeKwargs", "MegatronLMPlugin", "ParallelismConfig", "PartialState",
    "PrecisionType", "ProfileKwargs", "ProjectConfiguration", "RNGType", "TERecipeKwargs", "TorchDynamoPlugin",
    "TorchTensorParallelPlugin",
]
