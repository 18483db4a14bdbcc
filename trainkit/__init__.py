"""trainkit: one training loop from one CPU to many GPUs, with DDP, FSDP2, mixed precision and accumulation.

Public names are imported lazily, so ``import trainkit`` (and the ``trainkit`` CLI) stays fast and
does not pull in torch or transformers until a name that needs them is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from trainkit.version import __accelerate_version__, __trainkit_version__, __version__

_LAZY = {
    "Accelerator": "trainkit.engine.accelerator",
    "PartialState": "trainkit.state",
    "AcceleratorState": "trainkit.state",
    "GradientState": "trainkit.state",
    "AutocastKwargs": "trainkit.utils.dataclasses",
    "DDPCommunicationHookType": "trainkit.utils.enums",
    "FP8RecipeKwargs": "trainkit.utils.dataclasses",
    "GradientAccumulationPlugin": "trainkit.utils.dataclasses",
    "MegatronLMPlugin": "trainkit.utils.dataclasses",
    "ProfileKwargs": "trainkit.utils.dataclasses",
    "TorchDynamoPlugin": "trainkit.config.dynamo",
    "ParallelismConfig": "trainkit.parallelism_config",
    "find_executable_batch_size": "trainkit.utils.memory",
    "init_empty_weights": "trainkit.utils.modeling",
    "init_on_device": "trainkit.utils.modeling",
    **{name: "trainkit.big_modeling" for name in (
        "cpu_offload", "cpu_offload_with_hook", "disk_offload", "dispatch_model")},
    "load_checkpoint_in_model": "trainkit.engine.inference.loading",
    "infer_auto_device_map": "trainkit.engine.inference.device_map",
    "load_checkpoint_and_dispatch": "trainkit.engine.inference.loading",
    "notebook_launcher": "trainkit.engine.process.launchers",
    "debug_launcher": "trainkit.engine.process.launchers",
    "ProcessState": "trainkit.engine.process.state",
    "FullyShardedDataParallelPlugin": "trainkit.engine.strategies.fsdp.plugin",
    "DataLoaderConfiguration": "trainkit.utils.dataclasses",
    "DeepSpeedPlugin": "trainkit.config.deepspeed",
    "DistributedDataParallelKwargs": "trainkit.utils.dataclasses",
    "DistributedType": "trainkit.utils.dataclasses",
    "GradScalerKwargs": "trainkit.utils.dataclasses",
    "InitProcessGroupKwargs": "trainkit.utils.dataclasses",
    "ProjectConfiguration": "trainkit.utils.dataclasses",
    "skip_first_batches": "trainkit.data_loader",
    "synchronize_rng_states": "trainkit.utils.random",
    "is_rich_available": "trainkit.utils.imports",
    "Trainer": "trainkit.trainer",
    "TrainingArguments": "trainkit.trainer",
    "Seq2SeqTrainer": "trainkit.trainer",
    "Seq2SeqTrainingArguments": "trainkit.trainer",
    "TrainerCallback": "trainkit.trainer",
    "TrainerState": "trainkit.trainer",
    "TrainerControl": "trainkit.trainer",
    "EarlyStoppingCallback": "trainkit.trainer",
    "DefaultFlowCallback": "trainkit.trainer",
    "PrinterCallback": "trainkit.trainer",
    "ProgressCallback": "trainkit.trainer",
    "EvalPrediction": "trainkit.trainer",
}
_RENAMED: dict[str, str] = {}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        from trainkit.utils.unsupported import NOT_DRIVEN, placeholder  # names of features trainkit does not drive

        if name in NOT_DRIVEN:
            globals()[name] = placeholder(name)
            return globals()[name]
        raise AttributeError(f"module 'trainkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), _RENAMED.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)


if TYPE_CHECKING:
    from trainkit.engine.accelerator import Accelerator
    from trainkit.engine.strategies.fsdp.plugin import FullyShardedDataParallelPlugin
    from trainkit.trainer import (
        DefaultFlowCallback,
        EarlyStoppingCallback,
        EvalPrediction,
        PrinterCallback,
        ProgressCallback,
        Seq2SeqTrainer,
        Seq2SeqTrainingArguments,
        Trainer,
        TrainerCallback,
        TrainerControl,
        TrainerState,
        TrainingArguments,
    )
    from trainkit.utils.dataclasses import DataLoaderConfiguration, DistributedType
