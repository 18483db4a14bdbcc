"""Context parallelism (``cp_size > 1``): torch's ring attention over sequences split across a ``cp`` group.

Each rank holds 1/cp of every sequence in torch's head-tail load-balanced layout (rank ``r`` of ``cp`` holds
chunks ``r`` and ``2 cp - 1 - r`` of ``2 cp``, so causal attention costs every rank the same; torch's
``_HeadTailLoadBalancer`` gives the positions). Attention runs torch's ring attention: the local query, key and
value become DTensors sharded on the sequence over the ``cp`` mesh, and ``scaled_dot_product_attention`` on them
is dispatched by torch's context-parallel handlers (``_enable_context_parallel_dispatcher``), which pass key/value
shards around the ring (``cp_comm_strategy``: ``allgather`` or ``alltoall``, torch's ``set_rotate_method``) and
merge the partial results by their log-sum-exp, forward and backward.

Those handlers rewrite SDPA's flash, memory-efficient and cuDNN kernels, all CUDA-only: on CPU the ring has no
kernel (``aten._scaled_dot_product_flash_attention`` has no CPU implementation, and DTensor has no sharding
strategy for the CPU one, ``aten._scaled_dot_product_flash_attention_for_cpu``; torch 2.11 and 2.13). The kernel
is looked up by device type in :data:`RING_KERNELS`, so a run on a device without one fails at ``prepare`` with
that reason; trainkit's CPU tests register torch's ring algorithm over the CPU kernel there to check everything
around it.

transformers models need no edit: the function is registered in transformers' ``AttentionInterface`` (see
:mod:`.attention`); in evaluation mode it is plain ``sdpa`` over whole sequences.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from trainkit.config.errors import ConfigError
from trainkit.engine.parallel import attention, sequence

logger = logging.getLogger(__name__)

NAME = "trainkit_ring"
"""The name under which the function is registered in transformers' AttentionInterface."""
RingKernel = Callable[..., torch.Tensor]
"""``kernel(query, key, value, *, scale, mesh) -> output``: causal attention of this rank's query shard over the
whole sequence, every tensor ``(batch, heads, sequence / cp, head_dim)`` in the head-tail layout."""


def torch_ring_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, scale: float | None,
                         mesh: DeviceMesh) -> torch.Tensor:
    """torch's ring attention: SDPA on sequence-sharded DTensors, dispatched to the context-parallel handlers."""
    from torch.distributed.tensor import DTensor, Shard

    placement = [Shard(2)]
    query, key, value = (DTensor.from_local(tensor.contiguous(), mesh, placement, run_check=False)
                         for tensor in (query, key, value))
    output = nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scale)
    return output.to_local() if isinstance(output, DTensor) else output


RING_KERNELS: dict[str, RingKernel] = {"cuda": torch_ring_attention}
"""The ring attention kernel for each device type (torch's runs on CUDA's attention kernels only)."""
CPU_REASON = ("torch's ring attention (torch.distributed.tensor.experimental.context_parallel) dispatches SDPA's "
              "flash / memory-efficient / cuDNN kernels, which exist for CUDA only: on CPU "
              "aten._scaled_dot_product_flash_attention has no kernel and DTensor has no sharding strategy for "
              "aten._scaled_dot_product_flash_attention_for_cpu")


class HeadTailLayout:
    """torch's load-balanced layout for causal ring attention (its ``_HeadTailLoadBalancer``)."""

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size, self.multiple = rank, size, 2 * size

    def positions(self, length: int, device: torch.device) -> torch.Tensor:
        """Chunks ``rank`` and ``2 size - 1 - rank`` of ``2 size`` chunks of a ``length`` sequence."""
        from torch.distributed.tensor.experimental._attention import _HeadTailLoadBalancer

        order = _HeadTailLoadBalancer(length, self.size, device)._generate_indices()[0]
        return order.chunk(self.size)[self.rank].to(device=device, dtype=torch.long)


def check_device(device_type: str) -> None:
    """An error naming why context parallelism cannot run on ``device_type`` (no ring kernel for it)."""
    if device_type not in RING_KERNELS:
        raise ConfigError(f"cp_size > 1 on {device_type}: {CPU_REASON if device_type == 'cpu' else 'no ring kernel'}. "
                          f"Context parallelism runs on {sorted(RING_KERNELS)}; on CPU use sequence parallelism "
                          "(sp_size), which splits sequences the same way with torch's all-to-all.")


def enable_torch_ring(comm_strategy: str) -> None:
    """Turn on torch's context-parallel SDPA dispatch for this process, rotating key/value shards by
    ``comm_strategy``, for inputs in the head-tail layout. It stays on: backward passes through the same handlers."""
    from torch.distributed.tensor.experimental._attention import (
        _cp_options,
        _enable_context_parallel_dispatcher,
        set_rotate_method,
    )

    set_rotate_method(comm_strategy)
    _cp_options.enable_load_balance = True
    _enable_context_parallel_dispatcher()


def install(model: nn.Module, mesh: DeviceMesh, comm_strategy: str) -> None:
    """Turn on torch's ring attention with ``comm_strategy`` and point the model at the ring function."""
    check_device(mesh.device_type)
    kernel = RING_KERNELS[mesh.device_type]
    enable_torch_ring(comm_strategy)

    def ring_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                       **kwargs: Any) -> tuple[torch.Tensor, None]:
        if not module.training:
            return attention.implementation("sdpa")(module, query, key, value, attention_mask, dropout=dropout,
                                                    scaling=scaling, **kwargs)
        attention.refuse_mask(attention_mask, "cp")
        sequence.count_attention_call()
        if dropout:
            raise ConfigError(f"cp_size > 1: attention dropout ({dropout}) is not supported by torch's ring attention; "
                              "set the model's attention_dropout to 0.")
        groups = query.shape[1] // key.shape[1]  # grouped-query attention: the ring takes equal head counts
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        output = kernel(query, key, value, scale=scaling, mesh=mesh)
        return output.transpose(1, 2).contiguous(), None

    attention.register(model, NAME, ring_attention, "sdpa")
    logger.info("context parallel (torch ring attention, %s) over %d ranks", comm_strategy, mesh.size())
