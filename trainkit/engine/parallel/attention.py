"""The seam with transformers' attention: registering trainkit's sequence-split attention functions by name.

transformers (every 5.x release) looks the attention function up in ``AttentionInterface`` by
``config._attn_implementation`` at each call, and the mask function in ``AttentionMaskInterface`` by the same
name. Registering a function under a new name and setting the config to it is transformers' documented way to
change attention without editing the model. The mask registered beside it is the inner implementation's, except
while a split training forward runs: its mask would be built from one rank's positions, and the split attention
is causal over the whole sequence anyway (:mod:`.sequence` refuses batches that need more than that).

Also here: the checks a model must pass to have its sequences split (a causal LM computing its loss through
transformers' loss functions, full attention in every layer), and the inner implementations allowed.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn

from trainkit.config.errors import ConfigError
from trainkit.engine.parallel import sequence

UNSPLITTABLE = ("eager", "flex_attention")
"""Implementations that cannot be given a split sequence: eager is not in the registry (each model defines its
own), flex attention needs block masks built for the whole sequence."""


def text_config(model: nn.Module) -> Any:
    """The model's (text) config: where heads and layer types are."""
    config: Any = getattr(model, "config", None)
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def check_model(model: nn.Module, dimension: str) -> None:
    """Refuse, by name, a model whose sequence cannot be split: no transformers config, no ``**kwargs`` to pass
    ``shift_labels``/``num_items_in_batch`` to its loss, not a causal LM, or layers with sliding/chunked masks."""
    name = type(model).__name__
    config = text_config(model)
    if config is None or not hasattr(getattr(model, "config", None), "_attn_implementation"):
        raise ConfigError(f"{dimension}_size > 1: {name} is not a transformers model (no config._attn_implementation); "
                          "sequence and context parallelism replace attention through transformers' AttentionInterface.")
    parameters = inspect.signature(model.forward).parameters.values()
    if not any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters):
        raise ConfigError(f"{dimension}_size > 1: {name}.forward takes no **kwargs, so it cannot receive the "
                          "shift_labels and num_items_in_batch its loss needs once the sequence is split.")
    loss_type = str(getattr(model, "loss_type", "") or "")
    if not (name.endswith("ForCausalLM") or "ForCausalLM" in loss_type) or getattr(config, "is_encoder_decoder", False):
        raise ConfigError(f"{dimension}_size > 1 trains causal language models (…ForCausalLM, whose labels are "
                          f"shifted before the sequence is split); {name} is not one.")
    refuse_layer_types(model, dimension)


def refuse_layer_types(model: Any, dimension: str) -> None:
    """Refuse a model whose config lists layers other than full attention (sliding, chunked, linear/recurrent
    attention): a split sequence runs full causal attention only, so those layers would train differently."""
    config = text_config(model)
    layer_types = getattr(config, "layer_types", None)
    other = sorted({kind for kind in layer_types or () if kind != "full_attention"})
    if layer_types is None and getattr(config, "sliding_window", None):
        other = ["sliding_attention"]
    if other:
        raise ConfigError(f"{dimension}_size > 1: {type(model).__name__} has attention layers of type {other}; split "
                          "sequences run full causal attention only, which would silently train those layers "
                          "differently.")


def inner_implementation(model: nn.Module, requested: str | None) -> str:
    """The implementation run on the gathered sequence: the requested one, else the model's own when it can be
    given one (sdpa, flash attention), else sdpa."""
    current = getattr(getattr(model, "config", None), "_attn_implementation", None)
    name = requested or (current if current and current not in UNSPLITTABLE and not current.startswith("trainkit_")
                         else "sdpa")
    if name in UNSPLITTABLE:
        raise ConfigError(f"sp_attn_implementation={name!r} cannot run a split sequence; use 'sdpa' or flash attention.")
    implementation(name)  # an error now if transformers does not know it
    return name


def implementation(name: str) -> Callable[..., Any]:
    """transformers' attention function registered as ``name``."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if name not in ALL_ATTENTION_FUNCTIONS:
        raise ConfigError(f"Attention implementation {name!r} is not registered in transformers' AttentionInterface; "
                          f"registered: {sorted(ALL_ATTENTION_FUNCTIONS.keys())}.")
    return ALL_ATTENTION_FUNCTIONS[name]


def register(model: nn.Module, name: str, function: Callable[..., Any], inner: str) -> None:
    """Register ``function`` (and the inner implementation's mask, set aside during split forwards) as ``name``
    and make the model use it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    inner_mask = ALL_MASK_ATTENTION_FUNCTIONS[inner] if inner in ALL_MASK_ATTENTION_FUNCTIONS else None

    def mask(*args: Any, **kwargs: Any) -> Any:
        if sequence.in_flight() or inner_mask is None:
            return None
        return inner_mask(*args, **kwargs)

    AttentionInterface.register(name, function)
    AttentionMaskInterface.register(name, mask)
    model.config._attn_implementation = name  # type: ignore[union-attr]  # a transformers model: its config exists


def refuse_mask(attention_mask: Any, dimension: str) -> None:
    """A split training forward gets no mask (its batches were checked to be causal); one here is a model that
    builds its own (a 4-D custom mask), which a split sequence cannot honour."""
    if attention_mask is not None:
        raise ConfigError(f"{dimension}_size > 1: the model passed an attention mask "
                          f"{tuple(getattr(attention_mask, 'shape', ()))} to attention during a split training "
                          "forward; split sequences support causal attention (with end-of-row padding) only.")


@contextlib.contextmanager
def key_value_groups(module: nn.Module, groups: int) -> Iterator[None]:
    """Tell transformers' kernels (which read ``module.num_key_value_groups`` to repeat key/value heads) how many
    query heads share a key/value head on this rank, for the duration of one call."""
    saved = getattr(module, "num_key_value_groups", None)
    if saved is None or saved == groups:
        yield
        return
    setattr(module, "num_key_value_groups", groups)
    try:
        yield
    finally:
        setattr(module, "num_key_value_groups", saved)
