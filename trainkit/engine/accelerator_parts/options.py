"""Accelerate's less common ``Accelerator(...)`` options: validated here, once, and turned into plain values.

Each option is honoured, or refused with an error saying what it needs, or (where trainkit already
behaves that way, or the option cannot change anything here) accepted with a one-line notice. None is
silently ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trainkit.config.precision import PRECISIONS, declaration_for_options
from trainkit.utils.dataclasses import (
    AutocastKwargs,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    ProfileKwargs,
)

logger = logging.getLogger(__name__)

_HANDLER_TYPES = (DistributedDataParallelKwargs, GradScalerKwargs, InitProcessGroupKwargs, AutocastKwargs, ProfileKwargs)


@dataclass
class CompatOptions:
    """What the options resolved to."""

    handlers: dict[type, KwargsHandler] = field(default_factory=dict)
    precision_options: Any = None
    """A mixed precision's own options object (a class declared in ``trainkit.config.precision``), if given."""
    accumulation_steps: int | None = None
    sync_each_batch: bool = False
    accumulation_options: dict[str, Any] = field(default_factory=dict)
    """The plugin's fields given with other than their defaults, ``num_steps`` aside (``GradientState.plugin_kwargs``)."""

    @property
    def autocast_kwargs(self) -> AutocastKwargs | None:
        """The AutocastKwargs handler, if one was given."""
        return self.handlers.get(AutocastKwargs)  # type: ignore[return-value]  # the handler kept under its own type

    @property
    def profile_kwargs(self) -> ProfileKwargs | None:
        """The ProfileKwargs handler, if one was given."""
        return self.handlers.get(ProfileKwargs)  # type: ignore[return-value]  # the handler kept under its own type

    def ddp_comm_hook(self) -> dict[str, Any] | None:
        """The DDP communication hook to register, or None."""
        ddp = self.handlers.get(DistributedDataParallelKwargs)
        if not isinstance(ddp, DistributedDataParallelKwargs) or str(ddp.comm_hook) == "no":
            return None
        return {"hook": ddp.comm_hook, "wrapper": ddp.comm_wrapper, "state_option": ddp.comm_state_option}


def collect_handlers(kwargs_handlers: Sequence[KwargsHandler] | None) -> dict[type, KwargsHandler]:
    """One handler per type; an unknown object or a repeated type is an error. A mixed precision's options object
    (its class declared in ``trainkit.config.precision``) is a handler too, kept under its own class."""
    handlers: dict[type, KwargsHandler] = {}
    precision_options = tuple(declared.options for declared in PRECISIONS.values() if declared.options is not None)
    for handler in kwargs_handlers or []:
        kind = next((t for t in _HANDLER_TYPES + precision_options if isinstance(handler, t)), None)
        if kind is None:
            names = ", ".join(t.__name__ for t in _HANDLER_TYPES)
            raise TypeError(f"Accelerator(kwargs_handlers=...) got {handler!r}; valid handlers: {names}.")
        if kind in handlers:
            raise ValueError(f"Accelerator(kwargs_handlers=...) got two {kind.__name__} objects; pass one.")
        handlers[kind] = handler
    return handlers


def resolve_compat_options(
    *,
    kwargs_handlers: Sequence[KwargsHandler] | None,
    gradient_accumulation_steps: int | None,
    gradient_accumulation_plugin: GradientAccumulationPlugin | None,
    megatron_lm_plugin: Any,
    rng_types: Sequence[Any] | None,
) -> CompatOptions:
    """Validate the options and return what the Accelerator needs from them."""
    options = CompatOptions(handlers=collect_handlers(kwargs_handlers))
    options.precision_options = next((handler for handler in options.handlers.values()
                                      if declaration_for_options(handler) is not None), None)
    if megatron_lm_plugin is not None:
        raise NotImplementedError("Accelerator(megatron_lm_plugin=...): trainkit does not drive Megatron-LM; use FSDP2.")
    if gradient_accumulation_plugin is not None:
        if gradient_accumulation_steps not in (None, 1):
            raise ValueError("Pass either gradient_accumulation_steps or gradient_accumulation_plugin, not both.")
        if not gradient_accumulation_plugin.sync_with_dataloader:
            raise NotImplementedError(
                "GradientAccumulationPlugin(sync_with_dataloader=False): trainkit always closes the accumulation "
                "window at the end of a dataloader, so the last short window of an epoch still steps.")
        options.accumulation_steps = gradient_accumulation_plugin.num_steps
        options.sync_each_batch = gradient_accumulation_plugin.sync_each_batch
        options.accumulation_options = {name: value for name, value in gradient_accumulation_plugin.to_kwargs().items()
                                        if name != "num_steps"}
    if rng_types:
        logger.warning("Accelerator(rng_types=%s): no effect in trainkit; a shuffled loader's generator is kept in "
                       "step across processes by the loader itself (see DataLoaderConfiguration.use_seedable_sampler).",
                       list(rng_types))
    return options

