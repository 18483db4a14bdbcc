"""N-D parallelism: tensor parallelism on the ``tp`` sub-mesh composed with FSDP2 over the data dimensions.

The run's degrees (:class:`~trainkit.engine.parallel.ParallelDims`) give one mesh ``dp_replicate x dp_shard x
tp``. Wrapping a model (1) splits its planned layers across ``tp`` with ``parallelize_module``
(:mod:`trainkit.engine.parallel.tensor_parallel`), then (2) runs the FSDP2 strategy's steps with
``fully_shard`` over the data dimensions: ``dp_shard`` (FSDP), ``(dp_replicate, dp_shard)`` (HSDP), or
``(dp_replicate, 1)`` (DDP: gradients all-reduced, parameters whole). Everything after wrapping (no-sync,
clipping over DTensor norms, optimizer re-binding, state dicts, DCP checkpoints) is the FSDP2 strategy's.

What differs from plain FSDP is who reads which data: only the data dimensions read different batches. The
strategy's ``data_parallel_size`` / ``data_parallel_rank`` / ``data_group`` (the base Strategy's, read from the
ParallelDims every multi-process strategy holds) are the engine's answers for data loading, loss normalisation
and evaluation gathers (every rank of a TP group reads the same batch and computes the same loss).
"""

from __future__ import annotations

import logging

from torch import nn

from trainkit.config.errors import ConfigError
from trainkit.engine.parallel import ParallelDims
from trainkit.engine.parallel.tensor_parallel import apply_tensor_parallel, model_tp_plan
from trainkit.engine.strategies.base import StrategyRequest
from trainkit.engine.strategies.fsdp.strategy import FSDPStrategy

logger = logging.getLogger(__name__)


class NDParallelStrategy(FSDPStrategy):
    """Tensor parallelism x FSDP2 / HSDP / DDP, laid out by a :class:`ParallelDims`."""

    def __init__(self, request: StrategyRequest, dims: ParallelDims) -> None:
        super().__init__(request.state, request.fsdp_plugin, options=request.fsdp_options, dims=dims)
        if self.options.cpu_ram_efficient_loading and dims.tp > 1:
            raise ConfigError("cpu_ram_efficient_loading with tp_size > 1: trainkit loads rank 0's weights into "
                              "FSDP shards only; load the model on every rank (or use from_pretrained's "
                              "distributed_config) for tensor parallelism.")

    @classmethod
    def from_request(cls, request: StrategyRequest) -> NDParallelStrategy:
        """The strategy for the request's parallel degrees (the registry picks it when they are set)."""
        if request.parallel_dims is None:
            raise ValueError("NDParallelStrategy needs the run's parallel degrees (StrategyRequest.parallel_dims).")
        return cls(request, request.parallel_dims)

    # -- wrapping ---------------------------------------------------------------------------------
    def _split_before_sharding(self, model: nn.Module) -> None:
        if self.dims.tp == 1:
            return
        plan = model_tp_plan(model, _user_plan(self.dims))
        applied = apply_tensor_parallel(model, self.dims.tp_mesh, plan)
        logger.info("tensor parallel over %d ranks: %d modules split (%s)", self.dims.tp, len(applied),
                    ", ".join(sorted(set(applied.values()))))


def _user_plan(dims: ParallelDims) -> dict[str, str] | None:
    """A plan given through the config's ``tp_handler`` (an object or mapping with ``tp_plan``), else None."""
    handler = dims.config.tp_handler
    if handler is None:
        return None
    plan = handler.get("tp_plan") if isinstance(handler, dict) else getattr(handler, "tp_plan", None)
    return dict(plan) if plan else None
