"""Pure functions that turn FSDP options into FSDP2 calls: wrap units, meshes, sharding, prefetch.

Nothing here holds state: :class:`trainkit.engine.strategies.fsdp.strategy.FSDPStrategy` calls these in order
(choose units, keeping tied parameters in one group -> place or meta-move (re-tying) -> one dtype per
group -> checkpoint activations -> ``fully_shard`` bottom-up -> wire prefetching -> autocast off inside
bf16/fp16 units); getting rank 0's weights onto the other ranks lives in
:mod:`trainkit.engine.strategies.fsdp.rank0_weights`. Each function does one FSDP2 step and can be tested alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from trainkit.config.errors import ConfigError, did_you_mean

logger = logging.getLogger(__name__)

HYBRID_STRATEGIES = ("HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
WrapPolicy = Callable[..., bool]
"""torch's auto-wrap policy signature: ``policy(module=, recurse=, nonwrapped_numel=) -> bool``."""


# -- meshes -----------------------------------------------------------------------------------------
def mesh_shape(sharding_strategy: str, world_size: int, local_world_size: int,
               hybrid_group_size: int | None = None) -> tuple[int, ...]:
    """The data-parallel mesh for a strategy: ``(world,)`` to shard, ``(replicas, group)`` otherwise.

    NO_SHARD is a 2-D mesh whose shard dimension has size 1: parameters stay DTensors (one code path
    for state dicts and clipping) and gradients are all-reduced over the replicate dimension, as DDP does.
    HYBRID_* shard within groups of ``hybrid_group_size`` processes (default: one machine's) and
    replicate across groups.
    """
    if sharding_strategy == "NO_SHARD":
        return (world_size, 1)
    if sharding_strategy in HYBRID_STRATEGIES:
        group = hybrid_group_size or local_world_size or world_size
        if group > world_size or world_size % group:
            raise ConfigError(
                f"hybrid_shard_group_size {group} must divide the number of processes ({world_size}): "
                f"choose one of {[g for g in range(1, world_size + 1) if world_size % g == 0]}."
            )
        return (world_size // group, group)
    return (world_size,)


# -- choosing the units that fully_shard wraps ------------------------------------------------------
def module_class_names(model: nn.Module) -> list[str]:
    """Sorted names of every module class inside ``model`` (what a wrap class may name)."""
    return sorted({type(module).__name__ for module in model.modules()})


def resolve_wrap_class_names(model: nn.Module, names: Iterable[str] | None) -> set[str]:
    """The transformer layer classes to wrap: ``names``, else the model's ``_no_split_modules``.

    Raises :class:`ConfigError` naming an unknown class, the closest one and the model's classes.
    """
    chosen = list(names or getattr(model, "_no_split_modules", None) or [])
    present = module_class_names(model)
    if not chosen:
        raise ConfigError(
            f"TRANSFORMER_BASED_WRAP needs fsdp_transformer_layer_cls_to_wrap: {type(model).__name__} declares "
            f"no _no_split_modules. Its module classes: {', '.join(present)}."
        )
    for name in chosen:
        if name not in present:
            guess = did_you_mean(name, present)
            hint = f" Did you mean {guess!r}?" if guess else ""
            raise ConfigError(
                f"fsdp_transformer_layer_cls_to_wrap names {name!r}, which is not a module class of "
                f"{type(model).__name__}.{hint} Its module classes: {', '.join(present)}."
            )
    return set(chosen)


def _is_container(module: nn.Module) -> bool:
    # fully_shard refuses ModuleList/ModuleDict without a forward of their own.
    return isinstance(module, (nn.ModuleList, nn.ModuleDict)) and type(module).forward is nn.Module.forward


def select_units(model: nn.Module, *, policy: str | WrapPolicy | None, class_names: set[str] | None = None,
                 min_num_params: int = 100_000_000) -> list[nn.Module]:
    """Submodules (never the root) that become their own FSDP units, in forward (pre-)order.

    ``policy`` is "TRANSFORMER_BASED_WRAP" (modules whose class name is in ``class_names``),
    "SIZE_BASED_WRAP" (a module whose not-yet-wrapped parameters reach ``min_num_params``, decided
    bottom-up as FSDP1 did), "NO_WRAP" / None (only the root), or a torch-style policy callable.
    """
    if policy in (None, "NO_WRAP"):
        return []
    if policy == "TRANSFORMER_BASED_WRAP":
        names = class_names or set()
        return [m for m in model.modules() if m is not model and type(m).__name__ in names]
    if policy == "SIZE_BASED_WRAP" or callable(policy):
        def decide(module: nn.Module, numel: int) -> bool:
            if callable(policy):
                return bool(policy(module=module, recurse=False, nonwrapped_numel=numel))
            return numel >= min_num_params

        chosen: set[int] = set()
        _collect_by_size(model, model, decide, chosen, set())
        return [m for m in model.modules() if id(m) in chosen]
    raise ConfigError(f"Unknown auto_wrap_policy {policy!r}.")


def _collect_by_size(module: nn.Module, root: nn.Module, decide: Callable[[nn.Module, int], bool],
                     chosen: set[int], seen_params: set[int]) -> int:
    """Post-order walk: return the parameter count left unwrapped below and including ``module``."""
    remaining = sum(_collect_by_size(child, root, decide, chosen, seen_params) for child in module.children())
    for param in module.parameters(recurse=False):
        if id(param) not in seen_params:  # a tied parameter counts once
            seen_params.add(id(param))
            remaining += param.numel()
    if module is not root and not _is_container(module) and remaining > 0 and decide(module, remaining):
        chosen.add(id(module))
        return 0
    return remaining


# -- shared (tied) parameters and dtypes --------------------------------------------------------------
def _reachable_parameters(module: nn.Module, skipped: nn.Module | None = None) -> set[int]:
    """ids of the parameters reachable from ``module`` without entering ``skipped``."""
    found: set[int] = set()
    stack, visited = [module], set()
    while stack:
        current = stack.pop()
        if current is skipped or id(current) in visited:
            continue
        visited.add(id(current))
        found.update(id(p) for p in current._parameters.values() if p is not None)
        stack.extend(child for child in current._modules.values() if child is not None)  # None: a removed submodule
    return found


def keep_shared_parameters_together(model: nn.Module, units: Sequence[nn.Module]) -> list[nn.Module]:
    """Drop every unit holding a parameter that is also reachable from outside it.

    FSDP2 manages each parameter in exactly one group and refuses a tied parameter split across two
    (GPT-2's ``wte``/``lm_head``, T5's ``shared``/``embed_tokens``). A dropped unit's parameters fall to
    the nearest enclosing unit, else to the root, so modules sharing a parameter always share a group,
    whatever the wrap policy chose.
    """
    kept, dropped = [], []
    for unit in dict.fromkeys(units):  # a module reachable under two names is one unit
        inside = _reachable_parameters(unit)
        if inside & _reachable_parameters(model, skipped=unit):
            dropped.append(unit)
        else:
            kept.append(unit)
    if dropped:
        logger.info("FSDP: %d unit(s) hold tied parameters and stay with their parent: %s",
                    len(dropped), describe_units(dropped, model))
    return kept


def unify_group_dtypes(model: nn.Module, units: Sequence[nn.Module]) -> None:
    """Cast each FSDP group's trainable floating parameters to one dtype (the widest) before sharding.

    FSDP2 all-gathers and reduce-scatters one flat buffer per group and refuses trainable parameters of
    several dtypes in a group (an AssertionError at the first forward). Widening loses no precision;
    frozen parameters keep their dtype (FSDP2 accepts them mixed). Logged once per cast.
    """
    unit_ids = {id(unit) for unit in units}
    for group in [*units, model]:
        params = _group_parameters(group, unit_ids)
        dtypes = {p.dtype for p in params if p.requires_grad and p.is_floating_point()}
        if len(dtypes) < 2:
            continue
        widest = max(dtypes, key=lambda dtype: (torch.finfo(dtype).bits, torch.finfo(dtype).max))
        for param in params:
            if param.requires_grad and param.is_floating_point() and param.dtype != widest:
                param.data = param.data.to(widest)
        logger.warning("FSDP: trainable parameters of %s had dtypes %s; cast to %s (FSDP2 needs one dtype per "
                       "unit).", describe_units([group], model)[0] if group is not model else "the root",
                       sorted(str(d) for d in dtypes), widest)


def _group_parameters(group: nn.Module, unit_ids: set[int]) -> list[nn.Parameter]:
    """Parameters that ``fully_shard(group)`` manages: reachable without entering another unit."""
    params: dict[int, nn.Parameter] = {}
    stack, visited = [group], set()
    while stack:
        current = stack.pop()
        if id(current) in visited or (current is not group and id(current) in unit_ids):
            continue
        visited.add(id(current))
        params.update((id(p), p) for p in current._parameters.values() if p is not None)
        stack.extend(child for child in current._modules.values() if child is not None)  # None: a removed submodule
    return list(params.values())


# -- policies ---------------------------------------------------------------------------------------
def mixed_precision_policies(dtype: torch.dtype | None) -> tuple[MixedPrecisionPolicy, MixedPrecisionPolicy]:
    """(units' policy, root's policy): compute in ``dtype``, reduce gradients in fp32; outputs stay in ``dtype``.

    Both are the same policy, the one a hand-written ``fully_shard`` loop uses. The root does not cast its
    outputs to fp32 (``output_dtype``): that made an fp32 copy of every output, GPT-2's whole logits tensor
    (batch x sequence x 50257) among them, alive as long as the outputs. The loss comes back in fp32 from
    the engine instead (:func:`trainkit.engine.precision.amp.loss_in_float32`); float32 reductions keep gradient
    sums exact across ranks.
    """
    if dtype is None:
        return MixedPrecisionPolicy(), MixedPrecisionPolicy()
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    return policy, policy


def computes_in_low_precision(policy: MixedPrecisionPolicy) -> bool:
    """True when ``policy`` all-gathers parameters in bf16/fp16, so its units compute in that dtype."""
    return policy.param_dtype in (torch.bfloat16, torch.float16)


def run_without_autocast(units: Sequence[nn.Module], device_type: str) -> None:
    """Turn autocast off inside each unit's forward (and its recomputation), restoring it afterwards.

    Under a low-precision ``MixedPrecisionPolicy`` the units' parameters are already bf16/fp16, so autocast
    adds nothing there but fp32 copies: on CUDA its fp32 op list (layer norm, ``pow`` in GPT-2's GELU,
    softmax) casts activations up and saves them for backward. Outside the units (embeddings, heads, the
    loss a model computes itself) autocast stays on, so losses are still computed in fp32. Hooks rather
    than a replaced ``forward``: they survive ``copy.deepcopy`` and run again when activation checkpointing
    recomputes the unit.
    """
    for unit in units:
        saved: list[bool] = []

        def enter(module: nn.Module, args: Any, saved: list[bool] = saved) -> None:
            saved.append(torch.is_autocast_enabled(device_type))
            torch.set_autocast_enabled(device_type, False)

        def leave(module: nn.Module, args: Any, output: Any, saved: list[bool] = saved) -> None:
            if saved:
                torch.set_autocast_enabled(device_type, saved.pop())

        unit.register_forward_pre_hook(enter)
        unit.register_forward_hook(leave, always_call=True)


def offload_policy(offload_params: bool, device: torch.device) -> OffloadPolicy:
    """CPUOffloadPolicy (pinned memory only where CUDA copies benefit from it), else no offloading."""
    if not offload_params:
        return OffloadPolicy()
    return CPUOffloadPolicy(pin_memory=device.type == "cuda")


# -- applying ---------------------------------------------------------------------------------------
def apply_activation_checkpointing(modules: Sequence[nn.Module]) -> None:
    """Recompute each module's activations in backward (composable: state-dict keys stay unchanged)."""
    from torch.distributed._composable import checkpoint

    for module in modules:
        checkpoint(module)


def shard_model(model: nn.Module, units: Sequence[nn.Module], mesh: DeviceMesh, *, reshard_after_forward: bool,
                mp_policies: tuple[MixedPrecisionPolicy, MixedPrecisionPolicy], offload: OffloadPolicy,
                ignored_params: set[nn.Parameter] | None = None) -> None:
    """``fully_shard`` every unit bottom-up, then the root (which owns the remaining parameters).

    ``mp_policies`` is (units' policy, root's policy), as :func:`mixed_precision_policies` returns.
    ``ignored_params`` are neither sharded nor synchronised (Accelerate's ``ignored_modules``).
    """
    unit_policy, root_policy = mp_policies
    ignored = ignored_params or None
    for unit in reversed(units):  # pre-order reversed: children before their parents
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard_after_forward,
                    mp_policy=unit_policy, offload_policy=offload, ignored_params=ignored)
    # The root is needed again as soon as backward starts: never reshard it after forward.
    fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=root_policy, offload_policy=offload,
                ignored_params=ignored)


def wire_prefetch(units: Sequence[nn.Module], *, forward_prefetch: bool, backward_prefetch: str | None) -> None:
    """Explicit FSDP2 prefetching between consecutive units (in forward order).

    forward_prefetch: each unit starts the next unit's all-gather before running its own forward.
    BACKWARD_PRE: each unit starts the previous unit's all-gather before computing its gradients.
    BACKWARD_POST and NO_PREFETCH: no explicit list; FSDP2 then prefetches one unit ahead in reverse
    forward order at run time (it has no switch that turns backward prefetching off).
    """
    fsdp_units = [unit for unit in units if isinstance(unit, FSDPModule)]
    if forward_prefetch:
        for current, following in zip(fsdp_units, fsdp_units[1:]):
            current.set_modules_to_forward_prefetch([following])
    if backward_prefetch == "BACKWARD_PRE":
        for current, previous in zip(fsdp_units[1:], fsdp_units):
            current.set_modules_to_backward_prefetch([previous])


# -- descriptions ---------------------------------------------------------------------------------
def describe_units(units: Sequence[nn.Module], model: nn.Module) -> list[str]:
    """Qualified names of the chosen units (for logs and errors)."""
    names = {id(module): name for name, module in model.named_modules()}
    return [names.get(id(unit), type(unit).__name__) for unit in units]


def local_numel(parameters: Iterable[nn.Parameter]) -> int:
    """Elements this rank stores for ``parameters`` (DTensor parameters count their local shard)."""
    total = 0
    for param in parameters:
        data: Any = param.to_local() if hasattr(param, "to_local") else param
        total += data.numel()
    return total
