"""Models that transformers already sharded while loading them (``from_pretrained(distributed_config=...)``).

Such a model owns its placement and gradient reduction: its planned layers are DTensors on transformers' device
mesh (tensor parallel innermost, as in :class:`~trainkit.engine.parallel.ParallelDims`) and, with ``fsdp_size``,
its modules are already ``fully_shard``-ed. ``prepare`` accepts it as it is, and only checks that the run is laid
out as the model is (every rank of a TP group must read the same batch; FSDP ranks read different ones).

How transformers marks such a model differs by version, so both marks are read by name (no transformers import):

* 5.2x (e.g. 5.24) sets ``is_distributed_loading_by_transformers``; ``model._device_mesh`` is its
  ``(pp, fsdp, tp)`` view (``dp_replicate`` is a further mesh dimension, read from the ``distributed_config``);
* earlier 5.x (e.g. 5.17) has no such flag; it sets ``model._device_mesh``, ``model._tp_size`` and
  ``model.config.distributed_config``, and applies tensor parallelism *or* FSDP, never both: with ``tp_size`` and
  ``fsdp_size`` both above 1 it applies TP alone, on a mesh of ``tp_size`` processes.

The layout is therefore read from what transformers applied (its mesh), not from what the config asked for.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from trainkit.config.errors import ConfigError
from trainkit.config.parallelism import ParallelismConfig


def sharded_by_transformers(model: nn.Module) -> bool:
    """True for a model ``from_pretrained(distributed_config=...)`` sharded at load time (any transformers 5.x)."""
    if bool(getattr(model, "is_distributed_loading_by_transformers", False)):
        return True
    distributed = getattr(getattr(model, "config", None), "distributed_config", None)
    return distributed is not None and getattr(model, "_device_mesh", None) is not None


def _mesh_sizes(mesh: Any) -> dict[str, int]:
    """``{dimension name: size}`` of transformers' mesh; a 1-D mesh without names is keyed ``""``."""
    names = getattr(mesh, "mesh_dim_names", None)
    if not names:
        return {"": int(mesh.size())}
    return {name: int(mesh[name].size()) for name in names}


def transformers_layout(model: Any) -> ParallelismConfig | None:
    """The degrees transformers applied to the model, as a ParallelismConfig (None for a model it did not shard)."""
    if model is None or not sharded_by_transformers(model):
        return None
    distributed = getattr(getattr(model, "config", None), "distributed_config", None)
    tp = int(getattr(model, "_tp_size", None) or getattr(distributed, "tp_size", None) or 1)
    replicate = int(getattr(distributed, "dp_replicate_size", None) or 1)
    mesh = getattr(model, "_device_mesh", None)
    if mesh is None:  # flagged but without a mesh: trust the config
        shard = int(getattr(distributed, "fsdp_size", None) or 1)
    else:
        sizes = _mesh_sizes(mesh)
        if "" in sizes:  # one unnamed dimension: transformers' TP-only mesh (or its FSDP-only one, unnamed)
            tp = sizes[""] if tp > 1 else 1
            shard = 1 if tp > 1 else sizes[""]
        else:
            tp = sizes.get("tp", 1)
            shard = sizes.get("fsdp", 1)
    return ParallelismConfig(dp_replicate_size=replicate, dp_shard_size=shard, tp_size=tp)


def check_run_matches(model: nn.Module, run: ParallelismConfig | None, world_size: int) -> None:
    """The run (its resolved ParallelismConfig, None without one) is laid out as the model, else an error saying
    how to make it so (or that transformers applied less than its ``distributed_config`` asked for)."""
    layout = transformers_layout(model)
    if layout is None:
        return
    degrees = layout.degrees()
    described = " x ".join(f"{name}={size}" for name, size in degrees.items())
    name = type(model).__name__
    if layout.total_size != world_size:
        distributed = getattr(getattr(model, "config", None), "distributed_config", None)
        asked = {key: getattr(distributed, key, None) for key in ("dp_replicate_size", "fsdp_size", "tp_size")}
        raise ConfigError(
            f"{name} was sharded by from_pretrained(distributed_config=...) over {layout.total_size} of the "
            f"{world_size} processes ({described}); its distributed_config asked for "
            f"{ {key: value for key, value in asked.items() if value is not None} }. This transformers version "
            "applies tp_size or fsdp_size, not both (transformers releases whose DistributedConfig has "
            "dp_replicate_size compose them): load with tp_size or fsdp_size equal to the number of processes, "
            "or let trainkit shard the model (load it whole, pass ParallelismConfig(dp_shard_size=..., tp_size=...)).")
    if run is None or run.degrees() != degrees:
        have = "no parallelism_config" if run is None else " x ".join(f"{k}={v}" for k, v in run.degrees().items())
        raise ConfigError(
            f"{name} was sharded by from_pretrained(distributed_config=...) as {described}, but this Accelerator "
            f"runs {have} over {world_size} processes, so its ranks would not read data as the model is laid out. "
            f"Pass Accelerator(parallelism_config=ParallelismConfig(dp_replicate_size={layout.dp_replicate_size}, "
            f"dp_shard_size={layout.dp_shard_size}, tp_size={layout.tp_size})) "
            "(trainkit's Trainer does this by itself).")
