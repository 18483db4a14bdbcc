"""A typed, read-only view of what an Accelerator prepared: the one way other code finds those objects.

Checkpoints, the Trainer and the preemption save read prepared models, optimizers, schedulers, dataloaders
and registered objects from here instead of the Accelerator's own lists, so those lists can only change
through ``prepare``, ``register_for_checkpointing`` and ``free_memory``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from trainkit.engine.data import PreparedDataLoader
from trainkit.engine.step.wrappers import PreparedOptimizer, PreparedScheduler


@runtime_checkable
class Stateful(Protocol):
    """An object whose state ``save_state`` stores (``register_for_checkpointing``)."""

    def state_dict(self) -> dict[str, Any]:
        """The object's state: tensors, numbers, strings, lists and dicts of them."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back what :meth:`state_dict` returned."""


@dataclass(frozen=True)
class PreparedObjects:
    """Everything an Accelerator holds for checkpoints, each kind in the order it was prepared or registered."""

    models: tuple[nn.Module, ...] = ()
    optimizers: tuple[PreparedOptimizer, ...] = ()
    schedulers: tuple[PreparedScheduler, ...] = ()
    dataloaders: tuple[PreparedDataLoader, ...] = ()
    custom_objects: tuple[Stateful, ...] = ()

    def model_owning(self, optimizer: torch.optim.Optimizer) -> nn.Module | None:
        """The prepared model holding all of ``optimizer``'s parameters (state dicts name them through it)."""
        wanted = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for model in self.models:
            if wanted <= {id(p) for p in model.parameters()}:
                return model
        return None
