"""Ulysses sequence parallelism (``sp_size > 1``): attention over the whole sequence for a share of the heads.

Outside attention each rank of an ``sp`` group holds 1/sp of the sequence (:mod:`.sequence` cuts it in contiguous
chunks). Around the attention call, one all-to-all trades sequence for heads: each rank receives every chunk of
the sequence for heads/sp of the heads, runs the model's attention kernel on the whole (causal) sequence, and a
second all-to-all trades back. The collectives are torch's, with autograd (``all_to_all_single_autograd``), so
the backward pass runs the same exchanges in reverse.

transformers models need no edit: the function is registered in transformers' ``AttentionInterface`` and the
model's ``config._attn_implementation`` names it. It wraps an inner implementation (``sdpa`` by default,
``flash_attention_2``/``_3`` on GPUs; ``sp_attn_implementation`` chooses) that runs on the gathered sequence.
In evaluation mode it is the inner implementation, unchanged (every rank holds whole sequences then).

Heads: the query heads of a rank (after tensor parallelism) must divide by sp; key/value heads too, or sp must
be a multiple of them, in which case each key/value head is repeated so that every rank receives the one its
query heads use (grouped-query attention).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainkit.config.errors import ConfigError
from trainkit.engine.parallel import attention, sequence

logger = logging.getLogger(__name__)

NAME = "trainkit_ulysses"
"""The name under which the function is registered in transformers' AttentionInterface."""


class ContiguousLayout:
    """Rank ``r`` of ``size`` holds positions ``[r * L / size, (r + 1) * L / size)``."""

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size, self.multiple = rank, size, size

    def positions(self, length: int, device: torch.device) -> torch.Tensor:
        """This rank's contiguous chunk of a ``length`` sequence."""
        chunk = length // self.size
        return torch.arange(self.rank * chunk, (self.rank + 1) * chunk, device=device)


def check_heads(model: nn.Module, sp: int, tp: int) -> None:
    """Query heads per TP rank divisible by sp; key/value heads divisible by sp, or dividing it."""
    config = attention.text_config(model)
    heads = int(getattr(config, "num_attention_heads", None) or 0)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    if not heads:
        raise ConfigError(f"sp_size={sp}: {type(model).__name__}'s config has no num_attention_heads to split.")
    local, local_kv = heads // tp, kv_heads // tp
    if local % sp or (local_kv % sp and sp % local_kv):
        raise ConfigError(f"sp_size={sp}: {type(model).__name__} has {heads} attention heads and {kv_heads} key/value "
                          f"heads ({local} and {local_kv} per tensor-parallel rank); Ulysses gives each sp rank "
                          "heads/sp of them: the query heads must divide by sp_size, and the key/value heads divide "
                          "by it or divide it.")


def install(model: nn.Module, group: dist.ProcessGroup, inner: str) -> None:
    """Register the Ulysses function around ``inner`` for ``group`` and point the model's config at it."""
    size = dist.get_world_size(group)

    def ulysses_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        function = attention.implementation(inner)
        if not module.training:
            return function(module, query, key, value, attention_mask, **kwargs)
        attention.refuse_mask(attention_mask, "sp")
        sequence.count_attention_call()
        key, value = _repeat_kv_to(key, size), _repeat_kv_to(value, size)
        query, key, value = (_exchange(t, group, scatter_dim=1, gather_dim=2) for t in (query, key, value))
        kwargs.pop("position_ids", None)  # this rank's positions; the gathered sequence is whole and causal
        with attention.key_value_groups(module, query.shape[1] // key.shape[1]):
            output, weights = function(module, query, key, value, None, **kwargs)
        return _exchange(output, group, scatter_dim=1, gather_dim=2), weights  # (batch, sequence/sp, heads, dim)

    attention.register(model, NAME, ulysses_attention, inner)
    logger.info("sequence parallel (Ulysses) over %d ranks, attention %s inside", size, inner)


def _repeat_kv_to(states: torch.Tensor, size: int) -> torch.Tensor:
    """Key/value heads repeated so that ``size`` ranks each get whole heads (only when they are fewer than that)."""
    heads = states.shape[1]
    return states if heads % size == 0 else states.repeat_interleave(size // heads, dim=1)


def _exchange(tensor: torch.Tensor, group: dist.ProcessGroup, *, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """All-to-all: chunk ``j`` of ``scatter_dim`` goes to rank ``j``; what rank ``j`` sends lands at position ``j``
    of ``gather_dim``. Differentiable (its backward is the reverse exchange)."""
    from torch.distributed import _functional_collectives as funcol

    size = dist.get_world_size(group)
    chunks = torch.stack(tensor.chunk(size, dim=scatter_dim)).contiguous()
    received = funcol.all_to_all_single_autograd(chunks.flatten(), None, None, group)
    if isinstance(received, funcol.AsyncCollectiveTensor):
        received = received.wait()
    return torch.cat(received.view(chunks.shape).unbind(0), dim=gather_dim)
