"""Data parallelism with ``torch.nn.parallel.DistributedDataParallel`` (gloo on CPU, NCCL on GPU)."""

from __future__ import annotations

import contextlib
import functools
import weakref
from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainkit.engine.parallel.dims import ParallelDims
from trainkit.engine.process.state import ProcessState
from trainkit.utils.dataclasses import DistributedType

from .base import Strategy, StrategyCapabilities, StrategyRequest


class DDPStrategy(Strategy):
    """Replicate the model on every process and all-reduce gradients during backward."""

    capabilities = StrategyCapabilities(supports_no_sync=True, gradient_reduction="mean")

    def __init__(self, state: ProcessState, ddp_kwargs: dict[str, Any] | None = None,
                 comm_hook: dict[str, Any] | None = None, dims: ParallelDims | None = None) -> None:
        """``dims``: the run's degrees when a ParallelismConfig gave them (replication only); by default
        ``dp_replicate = world``. DDP reduces over the default process group, so it builds no device mesh."""
        super().__init__(state)
        self.dims = dims if dims is not None else ParallelDims.data_parallel(state.world_size, state.device.type)
        if not self.dims.pure_replication:
            raise ValueError(f"DDP replicates whole models; {self.dims.describe()} needs the N-D strategy.")
        self.ddp_kwargs = dict(ddp_kwargs or {})
        self.comm_hook = comm_hook
        """``{"hook", "wrapper", "state_option"}`` from DistributedDataParallelKwargs, or None."""
        self.distributed_type = DistributedType.MULTI_GPU if state.device.type == "cuda" else DistributedType.MULTI_CPU

    @classmethod
    def from_request(cls, request: StrategyRequest) -> DDPStrategy:
        """DDP with the script's DistributedDataParallelKwargs."""
        return cls(request.state, request.ddp_kwargs, request.comm_hook, request.parallel_dims)

    def wrap_model(self, model: nn.Module) -> nn.Module:
        model = model.to(self.device)
        if not any(p.requires_grad for p in model.parameters()):
            return model  # a frozen model (e.g. a teacher) has nothing to synchronise
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        wrapped = DistributedDataParallel(model, device_ids=device_ids, **self.ddp_kwargs)
        self.state.before_shutdown(functools.partial(_release_process_group, weakref.ref(wrapped)))
        if self.comm_hook:
            from .ddp_hooks import register_comm_hook

            register_comm_hook(wrapped, **self.comm_hook)
        return wrapped

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        return model.no_sync() if isinstance(model, DistributedDataParallel) else contextlib.nullcontext()


def _release_process_group(reference: weakref.ref) -> None:
    """At shutdown: let a DDP wrapper (maybe still referenced by the script) drop its reducer and group."""
    wrapped = reference()
    if wrapped is None:
        return
    for name in ("logger", "reducer"):
        if hasattr(wrapped, name):
            delattr(wrapped, name)
    wrapped.process_group = None
