"""Models that transformers already sharded while loading them (``from_pretrained(distributed_config=...)``).

Such a model owns its placement and gradient reduction: its planned layers are DTensors on transformers'
``("pp", "fsdp", "tp")`` mesh (tensor parallel innermost, as in :class:`~trainkit.engine.parallel.ParallelDims`)
and, with ``fsdp_size``, its modules are already ``fully_shard``-ed. ``prepare`` accepts it as it is, and only
checks that the run's data layout matches the model's (every rank of a TP group must read the same batch).
transformers marks these models with ``is_distributed_loading_by_transformers`` (5.x); it is read by name
(no transformers import), so any model carrying the flag is treated the same way.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from trainkit.config.errors import ConfigError
from trainkit.config.parallelism import ParallelismConfig


def sharded_by_transformers(model: nn.Module) -> bool:
    """True for a model ``from_pretrained(distributed_config=...)`` sharded at load time."""
    return bool(getattr(model, "is_distributed_loading_by_transformers", False))


def transformers_layout(model: Any) -> ParallelismConfig | None:
    """The model's degrees as a ParallelismConfig (None for a model transformers did not shard)."""
    if model is None or not sharded_by_transformers(model):
        return None
    distributed = getattr(getattr(model, "config", None), "distributed_config", None)
    tp = int(getattr(model, "_tp_size", None) or getattr(distributed, "tp_size", None) or 1)
    shard = int(getattr(distributed, "fsdp_size", None) or 1)
    replicate = int(getattr(distributed, "dp_replicate_size", None) or 1)
    return ParallelismConfig(dp_replicate_size=replicate, dp_shard_size=shard, tp_size=tp)


def check_run_matches(model: nn.Module, data_parallel_size: int, world_size: int) -> None:
    """The run reads data as the model is laid out, else an error saying how to make it so."""
    layout = transformers_layout(model)
    if layout is None:
        return
    if layout.data_parallel_size != data_parallel_size:
        raise ConfigError(
            f"{type(model).__name__} was sharded by from_pretrained(distributed_config=...) with "
            f"dp_replicate={layout.dp_replicate_size} x fsdp={layout.dp_shard_size} x tp={layout.tp_size}, so "
            f"{layout.data_parallel_size} process groups read different batches, but this Accelerator splits the data "
            f"{data_parallel_size} ways over {world_size} processes. Pass Accelerator(parallelism_config="
            f"ParallelismConfig(dp_replicate_size={layout.dp_replicate_size}, dp_shard_size={layout.dp_shard_size}, "
            f"tp_size={layout.tp_size})) (trainkit's Trainer does this by itself).")
