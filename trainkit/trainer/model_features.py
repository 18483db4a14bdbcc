"""What the arguments turn on in the model before training: gradient checkpointing (with transformers'
options) and the model features the Trainer prepares once per run."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from torch import nn


def prepare_model_features(trainer: Any, model: nn.Module) -> None:
    """Apply the model-side fields before the engine wraps the model."""
    args = trainer.args
    if getattr(model, "config", None) is not None and hasattr(model.config, "use_cache"):
        model.config.use_cache = args.use_cache
    if args.activation_checkpointing:
        _enable_activation_checkpointing(model, dict(args.activation_checkpointing_kwargs or {}))
    if args.use_liger_kernel:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance

        _apply_liger_kernel_to_instance(model=model, **(args.liger_kernel_config or {}))
    if "underflow_overflow" in args.debug:
        from transformers.debug_utils import DebugUnderflowOverflow

        DebugUnderflowOverflow(model)


def _enable_activation_checkpointing(model: nn.Module, kwargs: dict[str, Any]) -> None:
    """Call the checkpointing method the model has: transformers >= 5.23's ``activation_checkpointing_enable``, else
    ``gradient_checkpointing_enable`` (older releases and custom models), passing ``every_n_layers`` / ``offload``
    only to a method that takes them."""
    from .training_arguments.fields import CHECKPOINTING_LAYER_OPTIONS, requested_layer_options

    layer_options = requested_layer_options(kwargs)
    checkpoint_kwargs = {key: value for key, value in kwargs.items() if key not in CHECKPOINTING_LAYER_OPTIONS}
    method: Callable[..., Any]
    if hasattr(model, "activation_checkpointing_enable"):
        method, kwargs_name = getattr(model, "activation_checkpointing_enable"), "activation_checkpointing_kwargs"
    elif hasattr(model, "gradient_checkpointing_enable"):
        method, kwargs_name = getattr(model, "gradient_checkpointing_enable"), "gradient_checkpointing_kwargs"
    else:
        raise ValueError(f"activation_checkpointing=True, but {type(model).__name__} has no "
                         "activation_checkpointing_enable() or gradient_checkpointing_enable().")
    parameters = inspect.signature(method).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    lacking = [] if takes_any else sorted(set(layer_options) - set(parameters))
    if lacking:
        raise ValueError(f"activation_checkpointing_kwargs {lacking} need a model whose {method.__name__}() takes "
                         f"them; {type(model).__name__}'s does not (transformers models take them since 5.16).")
    call = dict(layer_options)
    if takes_any or kwargs_name in parameters:
        call[kwargs_name] = checkpoint_kwargs or None
    elif checkpoint_kwargs:
        raise ValueError(f"activation_checkpointing_kwargs {sorted(checkpoint_kwargs)}: {type(model).__name__}."
                         f"{method.__name__}() takes no {kwargs_name}.")
    method(**call)
