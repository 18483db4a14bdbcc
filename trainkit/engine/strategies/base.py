"""The contract every parallelism strategy fulfils: wrap a model, pause gradient sync, clip, export state,
build its mixed precision, and say what it can do (:class:`StrategyCapabilities`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from trainkit.engine.precision import Precision
from trainkit.engine.state import ProcessState
from trainkit.utils.dataclasses import DistributedType

if TYPE_CHECKING:
    from trainkit.config.fsdp import FSDPOptions
    from trainkit.engine.fsdp_plugin import FullyShardedDataParallelPlugin

GradientReduction = Literal["mean", "sum"]


@dataclass(frozen=True)
class StrategyRequest:
    """What the Accelerator was asked for: the processes, and any strategy-specific options."""

    state: ProcessState
    fsdp_plugin: FullyShardedDataParallelPlugin | None = None
    fsdp_options: FSDPOptions | None = None
    """The resolved FSDP options; set exactly when the run shards with FSDP."""
    ddp_kwargs: dict[str, Any] = field(default_factory=dict)
    comm_hook: dict[str, Any] | None = None
    """DDP's communication hook from DistributedDataParallelKwargs (``{"hook", "wrapper", "state_option"}``)."""


@dataclass(frozen=True)
class StrategyCapabilities:
    """What a strategy does, stated once so that callers ask instead of inspecting model types."""

    shards_parameters: bool = False
    """Parameters (and their gradients and optimizer state) are split across processes."""
    supports_no_sync: bool = False
    """``no_sync`` really skips gradient communication (otherwise it is a no-op context)."""
    needs_sharded_grad_scaler: bool = False
    """fp16 loss scaling must agree on overflow across processes (each holds only a gradient shard)."""
    replaces_parameters: bool = False
    """Wrapping creates new parameter objects, so optimizers built before ``prepare`` are re-bound."""
    gradient_reduction: GradientReduction = "mean"
    """How gradients are combined across processes after backward: averaged ("mean") or added ("sum").
    The engine reads this to turn a loss that is one process's share of a global total into gradients of
    that total (see ``GradientState.normalise_loss``); no caller rescales losses itself."""


class Strategy:
    """How a model is placed and wrapped for one kind of parallelism.

    Subclasses override what differs; the defaults describe one process on one device.
    """

    distributed_type: DistributedType = DistributedType.NO
    capabilities: StrategyCapabilities = StrategyCapabilities()
    precision: Precision | None = None
    """The mixed precision this strategy built (:meth:`build_precision`)."""
    wants_autocast: bool = True
    """Whether prepared models run their forward under autocast. FSDP2 keeps it too: its policy casts
    parameters, while autocast keeps softmax, norms and losses in float32."""

    def __init__(self, state: ProcessState) -> None:
        self.state = state

    @classmethod
    def from_request(cls, request: StrategyRequest) -> Strategy:
        """Build the strategy from what the Accelerator asked for (the registry calls this)."""
        return cls(request.state)

    def build_precision(self, mode: str, scaler_kwargs: dict[str, Any] | None = None) -> Precision:
        """Build (and keep) the mixed precision this strategy runs with; fp16 gets the loss scaler it needs."""
        scaler_class = None
        if mode == "fp16" and self.capabilities.needs_sharded_grad_scaler:
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            scaler_class = ShardedGradScaler
        self.precision = Precision(mode, self.device, scaler_kwargs, scaler_class=scaler_class)
        return self.precision

    @property
    def device(self) -> torch.device:
        """The device this process computes on."""
        return self.state.device

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """Place ``model`` on the device and wrap it for this strategy."""
        return model.to(self.device)

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        """Return the user's module inside any wrapper this strategy added."""
        return model

    def rebind_optimizer(self, optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
        """Point ``optimizer`` at the parameters ``wrap_model`` produced, where they are new objects."""

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """A context in which backward accumulates local gradients without communicating."""
        return contextlib.nullcontext()

    def clip_grad_norm_(self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip gradients to a total norm computed over every process's gradients; return that norm."""
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def full_state_dict(self, model: nn.Module, *, rank0_only: bool = True, cpu_offload: bool = True) -> dict[str, Any]:
        """The unsharded model state with the user's key names (empty on other ranks when ``rank0_only``)."""
        return self.unwrap_model(model).state_dict()
