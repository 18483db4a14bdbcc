"""Optimizers and learning-rate schedules named by TrainingArguments (``optim``, ``lr_scheduler_type``).

Weight decay follows transformers: it is not applied to biases nor to the weights of normalisation layers.
Schedules are transformers' own (``get_scheduler``), imported only when a schedule is built.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)


def _is_normalisation(module: nn.Module) -> bool:
    # LayerNorm, RMSNorm, GroupNorm, BatchNorm* and the many model-specific *Norm classes (LlamaRMSNorm, ...).
    return isinstance(module, (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._NormBase)) or "Norm" in type(module).__name__


def decay_parameter_names(model: nn.Module) -> set[str]:
    """Names of the parameters that receive weight decay: all but biases and normalisation weights."""
    excluded: set[str] = set()
    for module_name, module in model.named_modules():
        if _is_normalisation(module):
            excluded.update(f"{module_name}.{n}" if module_name else n for n, _ in module.named_parameters(recurse=False))
    return {
        name
        for name, _ in model.named_parameters()
        if name not in excluded and not name.endswith("bias")
    }


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two groups of trainable parameters: with ``weight_decay`` and without; empty groups are left out."""
    decayed = decay_parameter_names(model)
    with_decay: list[nn.Parameter] = []
    without_decay: list[nn.Parameter] = []
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            (with_decay if name in decayed else without_decay).append(parameter)
    groups = [{"params": with_decay, "weight_decay": weight_decay}, {"params": without_decay, "weight_decay": 0.0}]
    return [group for group in groups if group["params"]]


def build_optimizer(model: nn.Module, args) -> torch.optim.Optimizer:
    """The optimizer ``args.optim`` names, over ``model``'s trainable parameters (call after the engine wrapped it)."""
    groups = parameter_groups(model, args.weight_decay)
    extra = args.optimizer_extra_kwargs
    adam: dict[str, Any] = {"lr": args.learning_rate, "betas": (args.adam_beta1, args.adam_beta2), "eps": args.adam_epsilon}
    if args.optim in ("adamw_torch", "adamw_torch_fused"):
        fused = args.optim == "adamw_torch_fused" and _fused_supported(groups)
        if args.optim == "adamw_torch_fused" and not fused:
            logger.info("Fused AdamW is not available for these parameters; using the foreach implementation.")
        fused_flag: dict[str, Any] = {"fused": True} if fused else {}
        return torch.optim.AdamW(groups, **adam, **fused_flag, **extra)
    if args.optim == "sgd":
        return torch.optim.SGD(groups, lr=args.learning_rate, **extra)
    if args.optim == "adafactor":
        from transformers.optimization import Adafactor

        settings = {"scale_parameter": False, "relative_step": False, "lr": args.learning_rate}
        settings.update(extra)
        return Adafactor(groups, **settings)
    raise ValueError(f"Unsupported optim {args.optim!r}")  # unreachable: TrainingArguments validated it


def _fused_supported(groups: list[dict[str, Any]]) -> bool:
    # Fused AdamW runs on CPU and CUDA floating-point tensors (torch >= 2.4); DTensor shards are fine too.
    for group in groups:
        for parameter in group["params"]:
            if parameter.device.type not in ("cpu", "cuda", "xpu", "mps") or not parameter.is_floating_point():
                return False
    return True


def build_scheduler(optimizer: torch.optim.Optimizer, args, num_training_steps: int):
    """transformers' schedule ``args.lr_scheduler_type`` over ``num_training_steps`` optimizer steps."""
    from transformers.optimization import get_scheduler

    return get_scheduler(
        args.lr_scheduler_type,
        optimizer=optimizer,
        num_warmup_steps=args.warmup_steps_for(num_training_steps),
        num_training_steps=num_training_steps,
        scheduler_specific_kwargs=dict(args.lr_scheduler_kwargs or {}),
    )
