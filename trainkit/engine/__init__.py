"""trainkit's distributed engine, and its one face: what the layers above it (``trainkit.trainer``, ``trainkit.cli``)
may use of it.

The Trainer and the CLI import engine things only from here (``from trainkit.engine import Accelerator``);
``tests/test_architecture.py`` fails on an import of any other engine module from ``trainer/`` or ``cli/``. The face
offers the Accelerator and capabilities with a small contract (functions and objects), never the engine's
internals: where the Trainer needs a process state, a checkpoint decision or DeepSpeed's optimizer, it asks here.

Names load lazily (the Accelerator, torch and the rest are imported when a name is first used), so importing
this package, ``trainkit.trainer.TrainingArguments`` or the ``trainkit`` command stays light. Scripts keep using
Accelerate's paths (``trainkit.Accelerator``, ``trainkit.utils``); this face is for trainkit's own upper layers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datetime import timedelta

    from trainkit.utils.dataclasses import (DataLoaderConfiguration, DistributedDataParallelKwargs,
                                            GradientAccumulationPlugin, InitProcessGroupKwargs, ProjectConfiguration)
    from trainkit.utils.enums import DistributedType
    from trainkit.utils.memory import is_out_of_memory, release_memory
    from trainkit.utils.random import set_seed

    from .accelerator import Accelerator
    from .accelerator_parts.configuration import deepspeed_plugin_settings, dynamo_from_arguments
    from .checkpoint import (TRAINER_CONVENTION, CheckpointError, CheckpointMismatchError, CorruptedCheckpointError,
                             IncompleteCheckpointError, StagedCheckpoint, check_location, elastic_reason,
                             latest_checkpoint_in, list_checkpoints)
    from .checkpoint.merged_weights import merge_weights
    from .checkpoint.serialization import save_safetensors
    from .data import PreparedDataLoader
    from .parallel.pretrained import sharded_by_transformers, transformers_layout
    from .precision.registry import check_precision_device
    from .process.collectives import broadcast_object_list
    from .process.devices import check_processes_fit_gpus
    from .process.nested import map_tensors
    from .process.preemption import PreemptionWatch
    from .process.state import ProcessState
    from .strategies.fsdp.pretrained_loading import load_on_rank0_only
    from .tracking import tracker_names

_EXPORTS: dict[str, str] = {
    # the Accelerator and what it prepares
    "Accelerator": "trainkit.engine.accelerator",
    "PreparedDataLoader": "trainkit.engine.data",
    # settings the Trainer hands to the Accelerator
    "deepspeed_plugin_settings": "trainkit.engine.accelerator_parts.configuration",
    "dynamo_from_arguments": "trainkit.engine.accelerator_parts.configuration",
    "transformers_layout": "trainkit.engine.parallel.pretrained",
    "sharded_by_transformers": "trainkit.engine.parallel.pretrained",
    "check_precision_device": "trainkit.engine.precision.registry",
    "tracker_names": "trainkit.engine.tracking",
    # processes
    "broadcast_object_list": "trainkit.engine.process.collectives",
    "map_tensors": "trainkit.engine.process.nested",
    "check_processes_fit_gpus": "trainkit.engine.process.devices",
    "PreemptionWatch": "trainkit.engine.process.preemption",
    # loading pretrained weights on rank 0 only (FSDP's cpu_ram_efficient_loading)
    "load_on_rank0_only": "trainkit.engine.strategies.fsdp.pretrained_loading",
    # checkpoints: the checkpointer itself is accelerator.checkpointer; these are its errors, conventions and helpers
    "CheckpointError": "trainkit.engine.checkpoint",
    "CheckpointMismatchError": "trainkit.engine.checkpoint",
    "CorruptedCheckpointError": "trainkit.engine.checkpoint",
    "IncompleteCheckpointError": "trainkit.engine.checkpoint",
    "StagedCheckpoint": "trainkit.engine.checkpoint",
    "TRAINER_CONVENTION": "trainkit.engine.checkpoint",
    "check_location": "trainkit.engine.checkpoint",
    "elastic_reason": "trainkit.engine.checkpoint",
    "latest_checkpoint_in": "trainkit.engine.checkpoint",
    "list_checkpoints": "trainkit.engine.checkpoint",
    "merge_weights": "trainkit.engine.checkpoint.merged_weights",
    "save_safetensors": "trainkit.engine.checkpoint.serialization",
    # Accelerate's helpers and keyword objects the Trainer builds the Accelerator with
    "DistributedType": "trainkit.utils.enums",
    "set_seed": "trainkit.utils.random",
    "is_out_of_memory": "trainkit.utils.memory",
    "release_memory": "trainkit.utils.memory",
    "DataLoaderConfiguration": "trainkit.utils.dataclasses",
    "DistributedDataParallelKwargs": "trainkit.utils.dataclasses",
    "GradientAccumulationPlugin": "trainkit.utils.dataclasses",
    "InitProcessGroupKwargs": "trainkit.utils.dataclasses",
    "ProjectConfiguration": "trainkit.utils.dataclasses",
}
"""Face name -> the engine module that defines it (imported on first use)."""


def process_state(*, cpu: bool | None = None, backend: str | None = None,
                  timeout: timedelta | None = None) -> ProcessState:
    """This process's state (rank, world, device, process group), set up on first use; ``cpu``/``backend``/
    ``timeout``: what the caller asks for (None: not asked, the launcher's settings apply)."""
    from .process.state import ProcessState

    return ProcessState.get(cpu=cpu, backend=backend, timeout=timeout)


def process_state_exists() -> bool:
    """Whether a process state was set up already (an Accelerator or PartialState created before)."""
    from .process.state import ProcessState

    return ProcessState._instance is not None


def load_full_weights(accelerator: Accelerator, model: Any, state: dict[str, Any], *, what: str) -> None:
    """Collective: a full (unsharded) state dict into the prepared ``model``: its keys and shapes checked against the
    model first (a ``CheckpointMismatchError`` naming ``what`` and each difference), then loaded by the strategy
    (sharded where it shards)."""
    from .checkpoint.model_state import compare_keys, expected_model_shapes

    strategy = accelerator.strategy
    compare_keys(what, expected_model_shapes(strategy, model), {key: tuple(value.shape) for key, value in state.items()})
    strategy.load_model_state_dict(model, state, full=True)


def read_safetensors_weights(folder: str) -> dict[str, Any] | None:
    """The weights a folder holds as safetensors (``model.safetensors``, or shards with their index; tied names
    restored), or None when it holds neither."""
    import os

    from .checkpoint import serialization

    names = (serialization.WEIGHTS_NAME, serialization.INDEX_NAME)
    if not any(os.path.isfile(os.path.join(folder, name)) for name in names):
        return None
    return serialization.load_safetensors(folder)


def deepspeed_optimizer(spec: dict[str, Any], params: Any, *, lr: float, weight_decay: float) -> Any:
    """The optimizer a DeepSpeed config's ``optimizer`` block (``spec``) names, over ``params``; ``lr`` and
    ``weight_decay`` fill its ``"auto"`` values."""
    from .deepspeed.from_config import DummyOptim, build_optimizer

    return build_optimizer(spec, DummyOptim(params, lr=lr, weight_decay=weight_decay))


def deepspeed_scheduler(spec: dict[str, Any], optimizer: Any, *, total_num_steps: int, warmup_num_steps: int) -> Any:
    """The schedule a DeepSpeed config's ``scheduler`` block (``spec``) names, for ``optimizer``."""
    from .deepspeed.from_config import DummyScheduler, build_scheduler

    placeholder = DummyScheduler(optimizer, total_num_steps=total_num_steps, warmup_num_steps=warmup_num_steps)
    return build_scheduler(spec, optimizer, placeholder)


def caller_opens_accumulation_windows(accelerator: Accelerator) -> None:
    """The caller (the Trainer) opens every accumulation window itself (``open_accumulation_window``): a
    micro-batch outside one is its own window and its loss is taken as it is. The run's accumulation stays the
    engine's one number, ``accelerator.gradient_accumulation_steps`` (= ``accelerator.config``'s)."""
    accelerator.gradient_state.caller_opens_windows = True
    accelerator.gradient_state.reset()


FACE_FUNCTIONS = ("caller_opens_accumulation_windows", "deepspeed_optimizer", "deepspeed_scheduler", "load_full_weights",
                  "process_state", "process_state_exists", "read_safetensors_weights")
__all__ = sorted([*_EXPORTS, *FACE_FUNCTIONS])


def __getattr__(name: str) -> Any:
    """Load a face name on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trainkit.engine' has no attribute {name!r} (the engine's face offers "
                             f"{', '.join(__all__)})")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
