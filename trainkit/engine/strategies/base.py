"""The contract every parallelism strategy fulfils: wrap a model, pause gradient sync, clip, export state,
build its mixed precision, and say what it can do (:class:`StrategyCapabilities`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from trainkit.engine.precision.base import Precision
from trainkit.engine.precision.registry import build_precision
from trainkit.engine.process.state import ProcessState
from trainkit.utils.dataclasses import DistributedType

if TYPE_CHECKING:
    import torch.distributed as dist

    from trainkit.config.fsdp import FSDPOptions
    from trainkit.engine.parallel import ParallelDims
    from trainkit.engine.strategies.fsdp.plugin import FullyShardedDataParallelPlugin

GradientReduction = Literal["mean", "sum"]


@dataclass(frozen=True)
class StrategyRequest:
    """What the Accelerator was asked for: the processes, and any strategy-specific options."""

    state: ProcessState
    fsdp_plugin: FullyShardedDataParallelPlugin | None = None
    fsdp_options: FSDPOptions | None = None
    """The resolved FSDP options; set exactly when the run shards with FSDP."""
    ddp_kwargs: dict[str, Any] = field(default_factory=dict)
    comm_hook: dict[str, Any] | None = None
    """DDP's communication hook from DistributedDataParallelKwargs (``{"hook", "wrapper", "state_option"}``)."""
    parallel_dims: ParallelDims | None = None
    """The degrees of the run's ParallelismConfig (None without one); strategies without it derive their own."""


@dataclass(frozen=True)
class StrategyCapabilities:
    """What a strategy does, stated once so that callers ask instead of inspecting model types."""

    shards_parameters: bool = False
    """Parameters (and their gradients and optimizer state) are split across processes."""
    supports_no_sync: bool = False
    """``no_sync`` really skips gradient communication (otherwise it is a no-op context)."""
    needs_sharded_grad_scaler: bool = False
    """fp16 loss scaling must agree on overflow across processes (each holds only a gradient shard)."""
    replaces_parameters: bool = False
    """Wrapping creates new parameter objects, so optimizers built before ``prepare`` are re-bound."""
    gradient_reduction: GradientReduction = "mean"
    """How gradients are combined across processes after backward: averaged ("mean") or added ("sum").
    The engine reads this to turn a loss that is one process's share of a global total into gradients of
    that total (see ``GradientState.normalise_loss``); no caller rescales losses itself."""


class Strategy:
    """How a model is placed and wrapped for one kind of parallelism.

    Subclasses override what differs; the defaults describe one process on one device.
    """

    distributed_type: DistributedType = DistributedType.NO
    capabilities: StrategyCapabilities = StrategyCapabilities()
    precision: Precision | None = None
    """The mixed precision this strategy built (:meth:`build_precision`)."""
    wants_autocast: bool = True
    """Whether prepared models run their forward under autocast. FSDP2 keeps it too: its policy casts
    parameters, while autocast keeps softmax, norms and losses in float32."""

    def __init__(self, state: ProcessState) -> None:
        self.state = state
        self.dims: ParallelDims | None = None
        """The run's degrees and device mesh (DDP, FSDP2, HSDP, TP are layouts of one ParallelDims); None for
        one device and for DeepSpeed configs, where every process reads its own batch."""

    @classmethod
    def from_request(cls, request: StrategyRequest) -> Strategy:
        """Build the strategy from what the Accelerator asked for (the registry calls this)."""
        return cls(request.state)

    def build_precision(self, mode: str, scaler_kwargs: dict[str, Any] | None = None, options: Any = None) -> Precision:
        """Build (and keep) the mixed precision this strategy runs with; fp16 gets the loss scaler it needs.
        ``options``: the mode's own settings (``EngineConfig.precision_options``)."""
        scaler_class = None
        if mode == "fp16" and self.capabilities.needs_sharded_grad_scaler:
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            scaler_class = ShardedGradScaler
        self.precision = build_precision(mode, self.device, scaler_kwargs, scaler_class=scaler_class, options=options)
        return self.precision

    @property
    def device(self) -> torch.device:
        """The device this process computes on."""
        return self.state.device

    # -- who reads which data (tensor parallelism makes it differ from the processes) --------------
    @property
    def data_parallel_size(self) -> int:
        """Processes that read different batches (all of them unless groups of processes share one batch)."""
        return self.dims.dp_size if self.dims is not None else self.state.world_size

    @property
    def data_parallel_rank(self) -> int:
        """Which share of each global batch this process reads (the same across a tensor- or sequence-parallel
        group)."""
        return self.dims.dp_rank(self.state.rank) if self.dims is not None else self.state.rank

    @property
    def data_group(self) -> dist.ProcessGroup | None:
        """The process group evaluation results are gathered over (None: every process)."""
        return self.dims.dp_group if self.dims is not None and self.dims.dp_size < self.state.world_size else None

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """Place ``model`` on the device and wrap it for this strategy."""
        return model.to(self.device)

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        """Return the user's module inside any wrapper this strategy added."""
        return model

    def rebind_optimizer(self, optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
        """Point ``optimizer`` at the parameters ``wrap_model`` produced, where they are new objects."""

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """A context in which backward accumulates local gradients without communicating."""
        return contextlib.nullcontext()

    def clip_grad_norm_(self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip gradients to a total norm computed over every process's gradients; return that norm."""
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def full_state_dict(self, model: nn.Module, *, rank0_only: bool = True, cpu_offload: bool = True) -> dict[str, Any]:
        """The unsharded model state with the user's key names (empty on other ranks when ``rank0_only``)."""
        return self.unwrap_model(model).state_dict()

    # -- state-dict I/O: the only way checkpoints read and write prepared models and optimizers ---------
    # torch's ``torch.distributed.checkpoint.state_dict`` API names keys as the user's module does whatever
    # the wrapper (plain, DDP, FSDP2), so a checkpoint written under one strategy loads under another.
    def checkpoint_is_sharded(self, model: nn.Module) -> bool:
        """Whether ``save_state`` writes ``model`` (and its optimizers) as DCP shards rather than full tensors."""
        return False

    def model_state_dict(self, model: nn.Module, *, full: bool = False, cpu_offload: bool = False) -> dict[str, Any]:
        """The model's state with the user's key names: shards as they live (``full=False``, for DCP) or full
        tensors (``full=True``; with ``cpu_offload``, on the CPU of rank 0 only). Collective under FSDP."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=full, cpu_offload=cpu_offload))

    def load_model_state_dict(self, model: nn.Module, state_dict: dict[str, Any], *, full: bool = False,
                              from_rank0: bool = False) -> None:
        """Load sharded or full state (strict); ``from_rank0``: only rank 0's full state is read, then broadcast."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        full, from_rank0 = _only_with_process_group(full, from_rank0)
        set_model_state_dict(model, state_dict, options=StateDictOptions(
            full_state_dict=full or from_rank0, broadcast_from_rank0=from_rank0, strict=True))

    def optimizer_state_dict(self, model: nn.Module, optimizer: torch.optim.Optimizer, *, full: bool = False,
                             cpu_offload: bool = False) -> dict[str, Any]:
        """Optimizer state keyed by parameter names: as it lives (``full=False``) or full tensors.

        An optimizer without state (not stepped yet, or plain SGD) is reported as such: torch's API would
        otherwise initialise it by a zero-gradient step, which must reach neither the checkpoint (Adam's
        step count would be 1) nor the running optimizer.
        """
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        optimizer = getattr(optimizer, "optimizer", optimizer)
        untouched = not optimizer.state
        state = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=full,
                                                                                   cpu_offload=cpu_offload))
        if untouched and optimizer.state:
            optimizer.state.clear()
            state = {**state, "state": {}}
        return state

    def optimizer_load_target(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The state structure ``torch.distributed.checkpoint.load`` fills for ``optimizer``, as it lives.

        An optimizer without state gets its state tensors initialised for the target (DCP needs them to know
        shapes and shards); the running optimizer is left without state, as it was.
        """
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        optimizer = getattr(optimizer, "optimizer", optimizer)
        untouched = not optimizer.state
        target = get_optimizer_state_dict(model, optimizer, options=StateDictOptions())
        if untouched:
            optimizer.state.clear()
        return target

    def load_optimizer_state_dict(self, model: nn.Module, optimizer: torch.optim.Optimizer, state_dict: dict[str, Any],
                                  *, full: bool = False, from_rank0: bool = False) -> None:
        """Load what :meth:`optimizer_state_dict` returned (saved on any number of ranks and strategies).

        A state without per-parameter entries (SGD without momentum, an optimizer saved before its first
        step) restores the hyper-parameters of each group and leaves the optimizer without state, as it was
        saved; torch's API cannot load those (it needs a tensor to find the device).
        """
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        optimizer = getattr(optimizer, "optimizer", optimizer)
        if not state_dict.get("state"):
            _load_hyperparameters(optimizer, state_dict.get("param_groups", []))
            return
        tuples = [{key for key, value in group.items() if isinstance(value, tuple)} for group in optimizer.param_groups]
        full, from_rank0 = _only_with_process_group(full, from_rank0)
        set_optimizer_state_dict(model, optimizer, state_dict, options=StateDictOptions(
            full_state_dict=full or from_rank0, broadcast_from_rank0=from_rank0))
        # torch's full-state load hands tuples back as lists (Adam's betas); keep the types the optimizer had.
        for group, keys in zip(optimizer.param_groups, tuples):
            group.update({key: tuple(group[key]) for key in keys if isinstance(group.get(key), list)})


def _only_with_process_group(full: bool, from_rank0: bool) -> tuple[bool, bool]:
    """``full``/``from_rank0`` as torch's loaders should see them. Without a process group (one process that
    never initialised torch.distributed) every tensor is already whole, so the local path is the same load;
    torch's full-state path would also ask the default group for a device when the model's tensors are all
    0-dimensional (a model of scalar parameters), and fail."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return full, from_rank0
    return False, False


def _load_hyperparameters(optimizer: torch.optim.Optimizer, saved_groups: list[dict[str, Any]]) -> None:
    """Copy each saved group's settings (lr, momentum...) into the optimizer's groups, in order; drop any state."""
    if len(saved_groups) != len(optimizer.param_groups):
        raise ValueError(f"The saved optimizer state has {len(saved_groups)} parameter groups, the optimizer "
                         f"{len(optimizer.param_groups)}.")
    optimizer.state.clear()
    for group, saved in zip(optimizer.param_groups, saved_groups):
        group.update({key: value for key, value in saved.items() if key != "params"})
