"""Fully sharded data parallelism on FSDP2 (``fully_shard``, DeviceMesh, DTensor parameters).

The strategy validates the plugin's options against the model, shards it (see :mod:`trainkit.engine.strategies.fsdp.sharding`
for the steps), re-binds optimizers to the new DTensor parameters, and exposes the state-dict operations
that ``get_state_dict`` and sharded checkpoints (``torch.distributed.checkpoint``) need.

Mixed precision has two parts. FSDP2's ``MixedPrecisionPolicy`` decides storage and communication:
parameters are all-gathered and computed in bf16/fp16 (half the all-gather bytes), gradients reduced
in fp32; outputs stay in the compute dtype (no fp32 copy of the logits). Autocast decides op precision
where the policy does not: it stays on at the root (embeddings, heads, a loss computed inside the model:
cross-entropy runs in fp32) and is turned off inside the wrapped units, whose bf16 parameters already
fix their precision: there CUDA autocast only adds fp32 copies of activations (layer norm, GPT-2's
``pow``, softmax) saved for backward. Those copies and the root's former fp32 outputs made the step's
peak 1.139x a hand-written ``fully_shard`` loop's on CPU with CUDA's fp32 list emulated, now 1.001x
(``benchmarks/fsdp_step_memory.py``). The loss comes back in float32 (``loss_in_float32``).
Measured on the tests' BERT (2 gloo ranks, 20 steps, CPU), the per-step loss differs from fp32 training
by 5.2e-4 (DDP under autocast: 6.1e-4; the policy alone, no autocast, whose loss is rounded to bf16:
4.2e-3). CPU autocast has no fp32 list for norms or softmax, so this does not show the GPU difference
inside the units, where trainkit now computes as the hand-written loop does. With fp32 shards (a policy
without ``param_dtype``), autocast stays on everywhere, as in Accelerate.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, cast

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, distribute_tensor

from trainkit.config.fsdp import FSDPOptions
from trainkit.engine.strategies.fsdp import pretrained_loading
from trainkit.engine.strategies.fsdp import rank0_weights
from trainkit.engine.strategies.fsdp import sharding
from trainkit.engine.strategies.fsdp.plugin import FullyShardedDataParallelPlugin
from trainkit.engine.parallel.dims import ParallelDims
from trainkit.engine.precision.base import Precision
from trainkit.engine.process.state import ProcessState
from trainkit.utils.dataclasses import DistributedType

from trainkit.engine.strategies.base import Strategy, StrategyCapabilities, StrategyRequest
from trainkit.engine.parallel.ties import parameter_ties, restore_parameter_ties

logger = logging.getLogger(__name__)


class FSDPStrategy(Strategy):
    """Shard parameters, gradients and optimizer state across processes with FSDP2."""

    distributed_type = DistributedType.FSDP
    wants_autocast = True
    # fp16: each rank sees only its gradient shard, so an overflow must be agreed on by all ranks.
    capabilities = StrategyCapabilities(shards_parameters=True, supports_no_sync=True, needs_sharded_grad_scaler=True,
                                        replaces_parameters=True, gradient_reduction="mean")

    def __init__(self, state: ProcessState, plugin: FullyShardedDataParallelPlugin | None,
                 precision: Precision | None = None, options: FSDPOptions | None = None,
                 dims: ParallelDims | None = None) -> None:
        """``options``: the resolved FSDP options (the engine's configuration); default: the plugin's own.
        ``plugin`` supplies what plain data cannot: policy callables, ignored modules, torch's config objects.
        ``precision``: settings to rebuild with this strategy's scaler (the Accelerator calls ``build_precision``).
        ``dims``: the run's degrees (a ParallelismConfig's); default: the sharding strategy's layout
        (:func:`data_parallel_dims`)."""
        super().__init__(state)
        self.options = options if options is not None else plugin.options if plugin is not None else FSDPOptions()
        self.dims: ParallelDims = dims if dims is not None else data_parallel_dims(self.options, state)
        # No plugin given (launcher or TrainingArguments options): a plugin view of the resolved options, so that
        # state.fsdp_plugin shows the options in force, as Accelerate's does.
        self.plugin = plugin if plugin is not None else FullyShardedDataParallelPlugin.showing(self.options)
        # id(original parameter) -> (weak reference to it, its sharded replacement): lets an optimizer
        # built before prepare() find the DTensor parameter that replaced each of its parameters.
        self._replacements: dict[int, tuple[weakref.ref, nn.Parameter]] = {}
        if precision is not None:
            self.build_precision(precision.mode, precision.scaler_kwargs)
        if self.options.cpu_ram_efficient_loading:  # from any source: plugin, launcher, DeepSpeed zero3_init_flag
            pretrained_loading.load_on_rank0_only()  # a model loaded after Accelerator() is built on meta
        if self.options.ignored_keys:
            logger.info("FSDP options without effect under FSDP2: %s", ", ".join(self.options.ignored_keys))

    @classmethod
    def from_request(cls, request: StrategyRequest) -> FSDPStrategy:
        """FSDP2 with the script's (or the launcher's) plugin."""
        return cls(request.state, request.fsdp_plugin, options=request.fsdp_options)

    # -- wrapping ---------------------------------------------------------------------------------
    def wrap_model(self, model: nn.Module) -> nn.Module:
        """Shard ``model`` in place (it becomes an ``FSDPModule``) and return it."""
        if isinstance(model, FSDPModule):
            return model
        units = self._choose_units(model)  # validates wrap classes before anything is moved or connected
        self.state.ensure_process_group()  # FSDP needs a process group even for one process
        options = self.options
        originals = {name: param for name, param in model.named_parameters(remove_duplicate=False)}
        rank, world = self.state.rank, self.state.world_size
        meta_loading = options.cpu_ram_efficient_loading and world > 1
        ties = parameter_ties(model)
        if meta_loading:
            kept = rank0_weights.move_to_meta_keeping_rank0_states(model, rank)
            restore_parameter_ties(model, ties)  # Module.to("meta") gives each name its own tensor
        else:
            model.to(self.device)
            if options.sync_module_states and world > 1:
                rank0_weights.broadcast_module_states(model)
        self._split_before_sharding(model)
        sharding.unify_group_dtypes(model, units)
        if options.activation_checkpointing:
            sharding.apply_activation_checkpointing(units or [model])
        mesh = self._data_mesh()
        shape = tuple(mesh.shape)
        # Resharding after forward frees gathered parameters to re-gather them in backward; where the shard
        # dimension holds one rank (one process, NO_SHARD) nothing was sharded, so that is pure cost
        # (measured: 24 % of a GPT-2 step on one H100).
        reshard = options.reshard_after_forward and shape[-1] > 1
        mp_policies = self._mp_policies()
        sharding.shard_model(
            model, units, mesh, reshard_after_forward=reshard,
            mp_policies=mp_policies,
            ignored_params={p for module in self.plugin.ignored_modules or [] for p in module.parameters()},
            offload=sharding.offload_policy(options.offload_params, self.device),
        )
        if meta_loading:
            rank0_weights.materialize_from_rank0(model, kept, self.device, rank)
            restore_parameter_ties(model, ties)
            pretrained_loading.restore_from_pretrained()  # later loads (evaluation reloads) are real again
        sharding.wire_prefetch(units, forward_prefetch=options.forward_prefetch,
                               backward_prefetch=options.backward_prefetch)
        if self.precision is not None and self.precision.enabled and sharding.computes_in_low_precision(mp_policies[0]):
            sharding.run_without_autocast(units, self.device.type)  # the policy already decides their precision
        self._remember_replacements(originals, model)
        logger.info("FSDP2 %s on mesh %s: %d units %s", options.sharding_strategy, shape, len(units),
                    sharding.describe_units(units, model)[:4])
        return model

    def _split_before_sharding(self, model: nn.Module) -> None:
        """Split layers across other mesh dimensions before sharding (tensor parallelism); none here."""

    def _data_mesh(self) -> Any:
        """The mesh ``fully_shard`` spans: the data dimensions of the run's :class:`ParallelDims`."""
        return self.dims.fsdp_mesh

    def _choose_units(self, model: nn.Module) -> list[nn.Module]:
        policy = self.plugin.wrap_policy if callable(self.plugin.wrap_policy) else self.options.auto_wrap_policy
        if policy is None:
            policy = "TRANSFORMER_BASED_WRAP" if getattr(model, "_no_split_modules", None) else "NO_WRAP"
        class_names = None
        if policy == "TRANSFORMER_BASED_WRAP":
            class_names = sharding.resolve_wrap_class_names(model, self.options.transformer_layer_cls_to_wrap)
        units = sharding.select_units(model, policy=policy, class_names=class_names,
                                      min_num_params=self.options.min_num_params)
        inside_ignored = {id(sub) for module in self.plugin.ignored_modules or [] for sub in module.modules()}
        units = [unit for unit in units if id(unit) not in inside_ignored]
        return sharding.keep_shared_parameters_together(model, units)

    def _mp_policies(self) -> tuple[Any, Any]:
        """The user's own MixedPrecisionPolicy everywhere, else one derived from the precision mode."""
        explicit = self.plugin.explicit_mp_policy()
        if explicit is not None:
            return explicit, explicit
        return sharding.mixed_precision_policies(self.plugin.param_dtype(default=self.precision.dtype if self.precision else None))

    def _remember_replacements(self, originals: dict[str, nn.Parameter], model: nn.Module) -> None:
        sharded = dict(model.named_parameters(remove_duplicate=False))
        for name, original in originals.items():
            replacement = sharded.get(name)
            if replacement is not None and replacement is not original:
                self._replacements[id(original)] = (weakref.ref(original), replacement)

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        """FSDP2 shards in place: the prepared model is the user's module (its class gains FSDPModule)."""
        return model

    # -- optimizers -------------------------------------------------------------------------------
    def rebind_optimizer(self, optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
        """Swap the original parameters in ``optimizer`` for their DTensor shards, sharding any state too.

        Hyper-parameters stay in their groups; an optimizer created after ``prepare`` already holds
        the sharded parameters and is left as it is.
        """
        optimizer = getattr(optimizer, "optimizer", optimizer)
        for group in optimizer.param_groups:
            params = []
            param: torch.Tensor
            for param in group["params"]:
                entry = self._replacements.get(id(param))
                if entry is not None and entry[0]() is param:
                    replacement = cast(DTensor, entry[1])
                    if param in optimizer.state:
                        optimizer.state[replacement] = _shard_state(optimizer.state.pop(param), replacement)
                    param = replacement
                params.append(param)
            group["params"] = params

    # -- gradients --------------------------------------------------------------------------------
    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """Accumulate unsharded local gradients (no reduce-scatter) until the context exits."""
        return _gradient_sync_paused(model) if isinstance(model, FSDPModule) else contextlib.nullcontext()

    def clip_grad_norm_(self, parameters: Iterable[torch.Tensor], max_norm: float,
                        norm_type: float = 2.0) -> torch.Tensor:
        """Clip by the norm over every shard of every gradient; return that norm as a plain tensor."""
        parameters = list(parameters)
        total = total_grad_norm(parameters, norm_type)
        coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for param in parameters:
            if param.grad is not None:
                grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
                grad.mul_(coefficient.to(grad.device, grad.dtype))
        return total

    # -- state dicts ------------------------------------------------------------------------------
    def full_state_dict(self, model: nn.Module, *, rank0_only: bool | None = None,
                        cpu_offload: bool | None = None) -> dict[str, Any]:
        """Unsharded tensors with the user's key names; by default as the plugin's ``state_dict_config`` says.

        Every rank must call this (it all-gathers). With ``rank0_only`` other ranks get ``{}``.
        """
        rank0_only = self.plugin.state_dict_rank0_only if rank0_only is None else rank0_only
        cpu_offload = self.plugin.state_dict_offload_to_cpu if cpu_offload is None else cpu_offload
        # torch's cpu_offload keeps the gathered tensors on rank 0 only, one at a time: use it when it fits.
        state = self.model_state_dict(model, full=True, cpu_offload=rank0_only and cpu_offload)
        if rank0_only and self.state.rank != 0:
            return {}
        return _to_cpu(state) if cpu_offload else state

    def optimizer_state_dict(self, model: nn.Module, optimizer: torch.optim.Optimizer, *, full: bool = False,
                             cpu_offload: bool | None = None, rank0_only: bool | None = None) -> dict[str, Any]:
        """As the base strategy's; with ``full``, unsharded where the plugin's ``optim_state_dict_config`` says
        (default: every rank, on device; ``rank0_only``: other ranks get ``{}``; ``offload_to_cpu``: on CPU).
        Every rank must call it."""
        if not full:
            return super().optimizer_state_dict(model, optimizer)
        rank0_only = self.plugin.optim_state_dict_rank0_only if rank0_only is None else rank0_only
        cpu_offload = self.plugin.optim_state_dict_offload_to_cpu if cpu_offload is None else cpu_offload
        # torch's cpu_offload with a full state dict gathers onto rank 0 only, on CPU, one tensor at a time.
        state = super().optimizer_state_dict(model, optimizer, full=True, cpu_offload=rank0_only and cpu_offload)
        if rank0_only and self.state.rank != 0:
            return {}
        return _nested_to_cpu(state) if cpu_offload else state

    @property
    def sharded_checkpoints(self) -> bool:
        """True when ``save_state`` should write DCP shards (SHARDED_STATE_DICT) rather than full tensors."""
        return self.options.state_dict_type == "SHARDED_STATE_DICT"

    def checkpoint_is_sharded(self, model: nn.Module) -> bool:
        """DCP shards for a sharded model unless the plugin asks for ``FULL_STATE_DICT``."""
        return self.sharded_checkpoints and is_sharded(model)


def data_parallel_dims(options: FSDPOptions, state: ProcessState) -> ParallelDims:
    """The degrees of FSDP's sharding strategy: FULL_SHARD / SHARD_GRAD_OP ``dp_shard = world``; HYBRID_*
    ``dp_replicate x dp_shard`` (shard groups of ``hybrid_shard_group_size``, default one machine); NO_SHARD
    ``dp_replicate = world`` with a size-1 shard dimension (see :func:`sharding.mesh_shape`)."""
    shape = sharding.mesh_shape(options.sharding_strategy, state.world_size, state.local_world_size,
                                options.hybrid_shard_group_size)
    replicate, shard = (1, shape[0]) if len(shape) == 1 else shape
    return ParallelDims.of(state.world_size, state.device.type, dp_replicate=replicate, dp_shard=shard,
                           replicate_dimension=len(shape) == 2)


def is_sharded(model: nn.Module) -> bool:
    """True for an FSDP2 model. Asked by module type first: after a forward without backward (an
    evaluation) FSDP2 leaves the root's parameters unsharded, plain tensors, until the next forward."""
    return any(isinstance(m, FSDPModule) for m in model.modules()) or any(isinstance(p, DTensor) for p in model.parameters())


@contextlib.contextmanager
def _gradient_sync_paused(model: FSDPModule) -> Iterator[None]:
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def total_grad_norm(parameters: Iterable[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
    """The norm of all gradients together, DTensor shards reduced across their mesh; a plain tensor."""
    norm_type = float(norm_type)
    parameters = list(parameters)
    by_mesh: dict[Any, list[torch.Tensor]] = {}  # tensor parallelism puts some gradients on a 2-D mesh
    for param in parameters:
        if param.grad is not None and isinstance(param.grad, DTensor):
            by_mesh.setdefault(param.grad.device_mesh, []).append(param.grad)
    plain = [p.grad for p in parameters if p.grad is not None and not isinstance(p.grad, DTensor)]
    parts = []
    for grads in by_mesh.values():
        norm = torch.nn.utils.get_total_norm(grads, norm_type)
        parts.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    if plain:  # replicated (unsharded) gradients: every rank already holds the whole norm
        parts.append(torch.nn.utils.get_total_norm(plain, norm_type))
    if not parts:
        return torch.tensor(0.0)
    device = parts[0].device
    stacked = torch.stack([part.to(device, torch.float32) for part in parts])
    if norm_type == float("inf"):
        return stacked.max()
    return stacked.pow(norm_type).sum().pow(1.0 / norm_type)


def _shard_state(state: dict[str, Any], param: DTensor) -> dict[str, Any]:
    """Optimizer state of a parameter that became a DTensor: shard its parameter-shaped tensors alike."""
    sharded = {}
    for key, value in state.items():
        if isinstance(value, torch.Tensor) and not isinstance(value, DTensor) and value.shape == param.shape:
            # Every rank holds the same full state; each keeps its own chunk (no communication).
            value = distribute_tensor(value.to(param.to_local().device), param.device_mesh, param.placements,
                                      src_data_rank=None)
        sharded[key] = value
    return sharded


def _nested_to_cpu(data: Any) -> Any:
    """Every tensor of a nested optimizer state dict moved to CPU (containers kept)."""
    if isinstance(data, torch.Tensor):
        return data.cpu()
    if isinstance(data, dict):
        return {key: _nested_to_cpu(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(_nested_to_cpu(value) for value in data)
    return data


def _to_cpu(state: dict[str, Any]) -> dict[str, Any]:
    return {key: value.cpu() if isinstance(value, torch.Tensor) else value for key, value in state.items()}
