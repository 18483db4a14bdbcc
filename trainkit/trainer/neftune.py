"""NEFTune (``neftune_noise_alpha``): uniform noise on the input embeddings while the model trains.

The noise itself is the installed transformers' forward hook, wherever that release keeps it
(``transformers.integrations.neftune`` in recent releases, ``transformers.trainer_utils`` in 5.1); attaching it
to the model's input embeddings is done here, so every transformers trainkit declares gives the same behaviour.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Callable

from torch import nn
from torch.utils.hooks import RemovableHandle

HOOK_LOCATIONS = ("transformers.integrations.neftune", "transformers.trainer_utils")
"""Modules that hold ``neftune_post_forward_hook``, newest first."""


def noise_hook() -> Callable[..., Any]:
    """The installed transformers' NEFTune forward hook (it reads ``module.neftune_noise_alpha``)."""
    import importlib

    for location in HOOK_LOCATIONS:
        try:
            return getattr(importlib.import_module(location), "neftune_post_forward_hook")
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"neftune_noise_alpha needs transformers' neftune_post_forward_hook, found in none of "
                      f"{', '.join(HOOK_LOCATIONS)}; is transformers installed?")


def input_embeddings(model: nn.Module) -> nn.Module:
    """The module whose output NEFTune perturbs: the model's input embeddings (a PEFT model's base model's)."""
    owner = model
    base = getattr(model, "base_model", None)
    if type(model).__module__.split(".")[0] == "peft" and base is not None and hasattr(base, "model"):
        owner = base.model  # PeftModel -> its tuner -> the transformers model
    getter = getattr(owner, "get_input_embeddings", None)
    if getter is None:
        raise ValueError(f"neftune_noise_alpha needs a model with get_input_embeddings(); {type(model).__name__} has none.")
    return getter()


def activate_neftune(model: nn.Module, noise_alpha: float) -> RemovableHandle:
    """Add NEFTune noise of scale ``noise_alpha`` to ``model``'s input embeddings in training mode; the returned
    handle removes the hook."""
    hook = noise_hook()
    embeddings = input_embeddings(model)
    embeddings.neftune_noise_alpha = noise_alpha  # type: ignore[assignment]  # read by the hook
    return embeddings.register_forward_hook(hook)


@contextlib.contextmanager
def neftune_while_training(model: nn.Module, noise_alpha: float | None) -> Iterator[None]:
    """NEFTune on ``model`` for the duration of one ``train()`` (nothing when ``noise_alpha`` is None): the hook
    is removed when training ends, as transformers does, so the trained model's embeddings carry no hook."""
    if noise_alpha is None:
        yield
        return
    handle = activate_neftune(model, noise_alpha)
    try:
        yield
    finally:
        handle.remove()


__all__ = ["activate_neftune", "input_embeddings", "neftune_while_training", "noise_hook"]
