"""Ahead of the first asynchronous save: what it would otherwise pay for while the training loop waits.

Measured before this module (a 403 MB state, weights + AdamW): later background saves blocked the loop for 2.5-6 %
of a synchronous save, the first one for 21-53 % on 1 process and 31-118 % on 2, because that save allocated and
touched its staging buffers, made the writer's process group and imported DCP. Now, when objects are prepared
with ``async_save`` on, the writer's group is made (a collective, where every process is anyway), and a background
thread imports DCP and safetensors and reserves staging memory for the models' state; once an optimizer holds
state (after its first step: its shapes are unknown before), the same is done for the optimizers' state. A save
that comes before a reservation has finished waits for it, and uses it.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from .staging import staged_bytes

if TYPE_CHECKING:
    from .async_writer import BackgroundCheckpointWriter
    from .protocol import CheckpointedAccelerator


def _import_writers() -> None:
    """The modules a save's writers use, imported off the loop's thread."""
    import safetensors.torch  # noqa: F401
    import torch.distributed.checkpoint  # noqa: F401

    from . import sharded_io  # noqa: F401


def _model_tensors(model: Any) -> list[Any]:
    return [value for value in model.state_dict().values() if hasattr(value, "element_size")]


def _optimizer_tensors(optimizer: Any) -> list[Any]:
    inner = getattr(optimizer, "optimizer", optimizer)
    return [value for state in inner.state.values() for value in state.values() if hasattr(value, "element_size")]


def _on_cuda(tensors: list[Any]) -> bool:
    return any(getattr(getattr(tensor, "device", None), "type", "cpu") == "cuda" for tensor in tensors)


class StagingAhead:
    """What has been reserved for one Accelerator's saves (the models prepared so far; the optimizers once)."""

    def __init__(self) -> None:
        self.models: set[int] = set()
        self.optimizers_done = False
        self.imported = False

    def pending(self, accelerator: CheckpointedAccelerator) -> bool:
        """Cheap (every ``backward``): whether optimizer state exists that has no reserved memory yet."""
        return not self.optimizers_done and bool(accelerator.prepared.optimizers)

    def models_to_reserve(self, accelerator: CheckpointedAccelerator) -> list[Any]:
        fresh = [model for model in accelerator.prepared.models if id(model) not in self.models]
        self.models.update(id(model) for model in fresh)
        return [tensor for model in fresh for tensor in _model_tensors(model)]

    def optimizers_to_reserve(self, accelerator: CheckpointedAccelerator) -> list[Any]:
        optimizers = accelerator.prepared.optimizers
        tensors = [tensor for optimizer in optimizers for tensor in _optimizer_tensors(optimizer)]
        if not tensors:  # no step taken yet: their state's shapes are not known
            return []
        self.optimizers_done = True
        return tensors


def reserve_staging(accelerator: CheckpointedAccelerator, writer: BackgroundCheckpointWriter, ahead: StagingAhead,
                    *, step_done: bool) -> None:
    """Collective when objects are prepared (``step_done=False``: the writer's group is made); otherwise local.
    Reserves staging memory, in a background thread, for what is not reserved yet."""
    if not step_done:
        writer.prepare_group()
        if not ahead.imported:
            ahead.imported = True
            threading.Thread(target=_import_writers, name="trainkit-checkpoint-imports", daemon=True).start()
        tensors = ahead.models_to_reserve(accelerator)
    else:
        tensors = ahead.optimizers_to_reserve(accelerator)
    if tensors:
        writer.pool.reserve(staged_bytes(tensors), pinned=_on_cuda(tensors))
