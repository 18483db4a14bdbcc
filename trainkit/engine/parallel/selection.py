"""When a run's ParallelismConfig needs the N-D strategy, and building its :class:`ParallelDims`."""

from __future__ import annotations

from trainkit.config.engine import EngineConfig
from trainkit.config.errors import ConfigError
from trainkit.engine.parallel.dims import ParallelDims
from trainkit.engine.process.state import ProcessState


def parallel_dims_for(config: EngineConfig, state: ProcessState) -> ParallelDims | None:
    """The run's degrees resolved against its world size (None without a ParallelismConfig); on more than one
    process the device mesh is built here, on every process, as Accelerate does (one process has none)."""
    if config.parallelism is None:
        return None
    if config.deepspeed is not None:
        raise ConfigError("parallelism_config with a DeepSpeed config: trainkit runs DeepSpeed configs on its own "
                          "DDP/FSDP2 layout; use one or the other.")
    dims = ParallelDims(config.parallelism, state.world_size, state.device.type)
    if state.world_size > 1:
        state.ensure_process_group()
        dims.config.device_mesh = dims.mesh
    return dims


def needs_nd_strategy(dims: ParallelDims | None, config: EngineConfig) -> bool:
    """Everything but pure replication without FSDP options: that stays plain DDP (as in Accelerate)."""
    if dims is None:
        return False
    return dims.tp > 1 or dims.dp_shard > 1 or config.fsdp is not None
