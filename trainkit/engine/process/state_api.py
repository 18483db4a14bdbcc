"""The attributes and methods Accelerate's ``PartialState``/``AcceleratorState`` offer, on trainkit's process state.

:class:`ProcessState` inherits them; ``trainkit.state.PartialState()`` and ``AcceleratorState()`` both
return the one process state. What depends on the Accelerator (its distributed type, precision, FSDP
plugin) is read from the most recently created Accelerator of the process, which attaches itself.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist

from trainkit.utils.enums import DistributedType

logger = logging.getLogger(__name__)


class AccelerateStateAPI:
    """Mixin over :class:`trainkit.engine.process.state.ProcessState` (which provides rank, world size, device)."""

    rank: int
    world_size: int
    local_rank: int
    device: Any
    megatron_lm_plugin = None
    """Always None: trainkit does not drive Megatron-LM."""
    torch_tp_plugin = None
    """None: tensor parallelism is set with a ParallelismConfig (see :attr:`parallelism_config`)."""
    use_ipex = False
    fork_launched = False
    _accelerator_ref: Callable[[], Any] | None = None
    accelerator_state_cleared = False
    """True after ``AcceleratorState._reset_state()`` until the next Accelerator is made."""
    gradient_state_cleared = False
    """True after ``GradientState._reset_state()`` until the next Accelerator is made."""
    _distributed_type_override: DistributedType | None = None

    # -- the Accelerator of the process -----------------------------------------------------------
    def attach_accelerator(self, accelerator: Any) -> None:
        """Called by ``Accelerator.__init__``: the newest Accelerator answers the Accelerator-level questions."""
        self._accelerator_ref = weakref.ref(accelerator)
        self.accelerator_state_cleared = self.gradient_state_cleared = False

    def clear_accelerator_state(self) -> None:
        """``AcceleratorState._reset_state()``: forget the Accelerator-level state (the process state stays)."""
        self._accelerator_ref = None
        self._distributed_type_override = None
        self.accelerator_state_cleared = True

    @property
    def accelerator(self) -> Any:
        """The newest live Accelerator of this process, or None."""
        return self._accelerator_ref() if self._accelerator_ref is not None else None

    @property
    def debug(self) -> bool:
        """True in debug mode (``ACCELERATE_DEBUG_MODE``/``TRAINKIT_DEBUG_MODE``, or set here): collectives check shapes first."""
        from trainkit.engine.process.operation_checks import debug_mode

        return debug_mode()

    @debug.setter
    def debug(self, enabled: bool) -> None:
        from trainkit.engine.process.operation_checks import set_debug_mode

        set_debug_mode(enabled)

    @property
    def initialized(self) -> bool:
        """True: the state exists (Accelerate's flag for an initialised shared state)."""
        return True

    @property
    def distributed_type(self) -> DistributedType:
        """FSDP/MULTI_GPU/MULTI_CPU/NO: the Accelerator's when one exists, else from the processes and device.

        Settable, as in Accelerate (test harnesses do): the value set is what every reader of the state and
        the Accelerator reports from then on; it does not change how trainkit wraps models or communicates.
        """
        if self._distributed_type_override is not None:
            return self._distributed_type_override
        accelerator = self.accelerator
        if accelerator is not None:
            return accelerator.distributed_type
        if self.world_size == 1:
            return DistributedType.NO
        return DistributedType.MULTI_GPU if self.device.type == "cuda" else DistributedType.MULTI_CPU

    @distributed_type.setter
    def distributed_type(self, value: DistributedType | str) -> None:
        try:
            self._distributed_type_override = DistributedType(value)
        except ValueError:
            raise ValueError(f"distributed_type={value!r} is not a DistributedType; valid: "
                             f"{[member.value for member in DistributedType]}") from None

    @property
    def is_fsdp2(self) -> bool:
        """True when the model is sharded: trainkit's FSDP is always FSDP2."""
        return self.distributed_type == DistributedType.FSDP

    @property
    def deepspeed_plugins(self) -> dict[str, Any]:
        """The DeepSpeed configs by name: ``{"default": plugin}`` for a run with one, else empty."""
        plugin = getattr(self, "deepspeed_plugin", None)
        return {"default": plugin} if plugin is not None else {}

    def get_deepspeed_plugin(self, name: str) -> Any:
        """The DeepSpeed config called ``name`` (trainkit runs one, called "default")."""
        plugins = self.deepspeed_plugins
        if not plugins:
            raise ValueError("get_deepspeed_plugin needs a DeepSpeed config: pass deepspeed_plugin=DeepSpeedPlugin(...) "
                             "to the Accelerator.")
        if name not in plugins:
            raise KeyError(f"no DeepSpeed config named {name!r}; trainkit runs one, named {list(plugins)}")
        return plugins[name]

    def select_deepspeed_plugin(self, name: str | None = None) -> None:
        """Activate the DeepSpeed config ``name``: with one config (trainkit's case) it is always the active one."""
        self.get_deepspeed_plugin("default" if name is None else name)

    @property
    def mixed_precision(self) -> str:
        """The Accelerator's mixed precision ("no" before one exists)."""
        accelerator = self.accelerator
        return accelerator.mixed_precision if accelerator is not None else "no"

    @property
    def fsdp_plugin(self) -> Any:
        """The FSDP plugin in use, or None."""
        accelerator = self.accelerator
        return getattr(getattr(accelerator, "strategy", None), "plugin", None) if accelerator is not None else None

    @property
    def parallelism_config(self) -> Any:
        """The newest Accelerator's ParallelismConfig (degrees resolved), or None."""
        accelerator = self.accelerator
        return getattr(accelerator, "parallelism_config", None) if accelerator is not None else None

    @property
    def device_mesh(self) -> Any:
        """The newest Accelerator's device mesh (``dp_replicate x dp_shard x tp``), or None."""
        accelerator = self.accelerator
        return getattr(accelerator, "torch_device_mesh", None) if accelerator is not None else None

    @property
    def dynamo_plugin(self) -> Any:
        """The torch.compile settings of the newest Accelerator, or None."""
        accelerator = self.accelerator
        return getattr(accelerator, "dynamo_plugin", None) if accelerator is not None else None

    @property
    def num_processes(self) -> int:
        """Number of processes (Accelerate's name)."""
        return self.world_size

    @property
    def process_index(self) -> int:
        """Global rank (Accelerate's name)."""
        return self.rank

    @property
    def local_process_index(self) -> int:
        """Rank on this machine (Accelerate's name)."""
        return self.local_rank

    @property
    def default_device(self) -> Any:
        """The device this process computes on."""
        return self.device

    # -- running on some processes ----------------------------------------------------------------
    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on each machine's first process only."""
        if self.local_rank == 0:
            print(*args, **kwargs)

    def _only_on(self, condition: Callable[[], bool], function: Callable | None) -> Callable:
        from trainkit.engine.process.control import only_when

        return only_when(condition)(function) if function is not None else only_when(condition)

    def on_main_process(self, function: Callable | None = None) -> Callable:
        """Decorator: run ``function`` on global rank 0 only."""
        return self._only_on(lambda: self.rank == 0, function)

    def on_local_main_process(self, function: Callable | None = None) -> Callable:
        """Decorator: run ``function`` on each machine's first process only."""
        return self._only_on(lambda: self.local_rank == 0, function)

    def on_last_process(self, function: Callable) -> Callable:
        """Decorator: run ``function`` on the highest global rank only."""
        return self._only_on(lambda: self.rank == self.world_size - 1, function)

    def on_process(self, function: Callable | None = None, process_index: int | None = None) -> Callable:
        """Decorator: run ``function`` on global rank ``process_index`` only."""
        return self._only_on(lambda: self.rank == process_index, function)

    def on_local_process(self, function: Callable | None = None, local_process_index: int | None = None) -> Callable:
        """Decorator: run ``function`` on local rank ``local_process_index`` of each machine only."""
        return self._only_on(lambda: self.local_rank == local_process_index, function)

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """Yield this process's contiguous share of ``inputs`` (see :mod:`trainkit.engine.process.splitting`)."""
        from trainkit.engine.process.splitting import split_between

        yield split_between(inputs, self.rank, self.world_size, apply_padding)

    def destroy_process_group(self, group: Any = None) -> None:
        """Destroy ``group`` (default: the default process group), if it exists."""
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group(group)
            logger.debug("Destroyed process group %s", group or "default")
        if group is None:
            self._owns_process_group = False

    def set_device(self) -> None:
        """Make this process's device the current one (already done when the state was created)."""
        if self.device.type == "cuda":
            import torch

            torch.cuda.set_device(self.device)
