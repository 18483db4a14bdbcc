"""Building the :class:`ParallelDims` of a run's ParallelismConfig (the strategy registry decides which
strategy runs it: ``engine/strategies/registry.py``)."""

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
    if dims.cp > 1:
        from trainkit.engine.parallel.ring import check_device

        check_device(state.device.type)  # before a model is built: CP needs a device with a ring kernel
    if state.world_size > 1:
        state.ensure_process_group()
        dims.config.device_mesh = dims.mesh
    return dims

