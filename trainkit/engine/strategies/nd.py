"""N-D parallelism: tensor parallelism and split sequences composed with FSDP2 over the data dimensions.

The run's degrees (:class:`~trainkit.engine.parallel.ParallelDims`) give one mesh ``dp_replicate x dp_shard x cp
x sp x tp``. Wrapping a model (1) splits its planned layers across ``tp`` with ``parallelize_module``
(:mod:`trainkit.engine.parallel.tensor_parallel`), then (2) runs the FSDP2 strategy's steps with
``fully_shard`` over the data dimensions: ``dp_shard`` (FSDP), ``(dp_replicate, dp_shard)`` (HSDP), or
``(dp_replicate, 1)`` (DDP: gradients all-reduced, parameters whole), with the sequence dimension (``cp`` or
``sp``) flattened into ``dp_shard``, then (3) with ``cp`` or ``sp``, replaces the model's attention and cuts its
training batches along the sequence (:mod:`trainkit.engine.parallel.sequence`, ``.ulysses``, ``.ring``).
Everything after wrapping (no-sync, clipping over DTensor norms, optimizer re-binding, state dicts, DCP
checkpoints) is the FSDP2 strategy's.

What differs from plain FSDP is who reads which data: only the data dimensions read different batches. The
strategy's ``data_parallel_size`` / ``data_parallel_rank`` / ``data_group`` (the base Strategy's, read from the
ParallelDims every multi-process strategy holds) are the engine's answers for data loading, loss normalisation
and evaluation gathers (every rank of a TP or sequence group reads the same batch and returns the same loss).
"""

from __future__ import annotations

import logging

from torch import nn

from trainkit.config.errors import ConfigError
from trainkit.engine.parallel import ParallelDims, attention
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
    def wrap_model(self, model: nn.Module) -> nn.Module:
        """Split layers (tp), shard (FSDP2), then split training sequences (cp or sp)."""
        dimension = self.dims.sequence_dimension
        if dimension is None or getattr(model, _SPLIT_MARK, False):
            return super().wrap_model(model)
        attention.check_model(model, dimension)  # before anything is moved or sharded
        if dimension == "sp":
            from trainkit.engine.parallel import ulysses

            ulysses.check_heads(model, self.dims.sp, self.dims.tp)
        model = super().wrap_model(model)
        _split_sequences(model, self.dims)
        setattr(model, _SPLIT_MARK, True)
        return model

    def _split_before_sharding(self, model: nn.Module) -> None:
        if self.dims.tp == 1:
            return
        plan = model_tp_plan(model, _user_plan(self.dims))
        applied = apply_tensor_parallel(model, self.dims.tp_mesh, plan)
        logger.info("tensor parallel over %d ranks: %d modules split (%s)", self.dims.tp, len(applied),
                    ", ".join(sorted(set(applied.values()))))


_SPLIT_MARK = "_trainkit_sequence_split"


def _split_sequences(model: nn.Module, dims: ParallelDims) -> None:
    """Replace the model's attention with the sequence dimension's and cut its training batches accordingly."""
    from trainkit.engine.parallel.sequence import SequenceSplit

    mesh = dims.sequence_mesh
    rank, size = mesh.get_local_rank(), mesh.size()
    if dims.cp > 1:
        from trainkit.engine.parallel import ring

        ring.install(model, mesh, dims.config.cp_handler.cp_comm_strategy)
        SequenceSplit(mesh.get_group(), ring.HeadTailLayout(rank, size)).attach(model)
        return
    from trainkit.engine.parallel import ulysses

    settings = dims.config.sp_handler
    ulysses.install(model, mesh.get_group(), attention.inner_implementation(model, settings.sp_attn_implementation))
    fixed = None if settings.sp_seq_length_is_variable else settings.sp_seq_length
    SequenceSplit(mesh.get_group(), ulysses.ContiguousLayout(rank, size), fixed_length=fixed).attach(model)


def _user_plan(dims: ParallelDims) -> dict[str, str] | None:
    """A plan given through the config's ``tp_handler`` (an object or mapping with ``tp_plan``), else None."""
    handler = dims.config.tp_handler
    if handler is None:
        return None
    plan = handler.get("tp_plan") if isinstance(handler, dict) else getattr(handler, "tp_plan", None)
    return dict(plan) if plan else None
