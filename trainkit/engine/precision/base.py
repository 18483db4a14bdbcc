"""The contract every mixed precision fulfils, and full precision ("no") as its plain implementation.

A precision has five hooks, called in this order over a run: :meth:`Precision.convert_module` once per
model before the strategy wraps it (where fp8 would swap layers), :meth:`Precision.wrap_forward` /
:meth:`Precision.autocast` around the forward, :meth:`Precision.backward`, :meth:`Precision.optimizer_step`
(after :meth:`Precision.unscale_` where gradients are clipped), and :meth:`Precision.state_dict` /
:meth:`Precision.load_state_dict` in checkpoints. Every hook of this base class does what a float32 loop
does, so a new precision overrides only the hooks it changes. Implementations are looked up by mode in
:mod:`trainkit.engine.precision.registry`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import nn


class Precision:
    """Full precision: float32 compute, plain backward and optimizer step, no state."""

    runs_on: ClassVar[tuple[str, ...] | None] = None
    """Device types this precision runs on; None: every device type trainkit computes on."""

    def __init__(self, mode: str, device: torch.device, scaler_kwargs: dict[str, Any] | None = None,
                 scaler_class: type[torch.amp.GradScaler] | None = None) -> None:
        """``mode``: the registry's name for this precision. ``scaler_kwargs`` / ``scaler_class``: the loss
        scaler's settings and class, used by precisions that scale the loss (the strategy picks the class)."""
        self.mode = mode
        self.device = device
        self.dtype: torch.dtype | None = None
        """The low-precision compute dtype; None in full precision."""
        self.scaler_kwargs: dict[str, Any] = dict(scaler_kwargs or {})
        """The GradScaler settings (GradScalerKwargs) this precision was built with."""
        self.scaler: torch.amp.GradScaler | None = None
        """The loss scaler, where this precision scales the loss."""
        self.options: Any = None
        """This mode's own settings (an instance of the options class its declaration in
        ``trainkit.config.precision`` names, resolved like every engine setting); None for modes without any."""

    @property
    def enabled(self) -> bool:
        """True unless running in full precision."""
        return self.dtype is not None

    def convert_module(self, module: nn.Module) -> nn.Module:
        """Convert ``module`` for this precision before the strategy wraps it (full precision: unchanged)."""
        return module

    def autocast(self, enabled: bool = True, cache_enabled: bool | None = None) -> contextlib.AbstractContextManager:
        """A context in which eligible ops run in the low-precision dtype (full precision: no change)."""
        return contextlib.nullcontext()

    def wrap_forward(self, forward: Callable) -> Callable:
        """The model's forward as this precision runs it (full precision: unchanged)."""
        return forward

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Backpropagate ``loss``."""
        loss.backward(**kwargs)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients to their true scale before clipping (a no-op unless the loss is scaled)."""

    def optimizer_step(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> bool:
        """Step ``optimizer``; return False when the precision skipped the step (fp16 overflow)."""
        optimizer.step(**kwargs)
        return True

    def state_dict(self) -> dict[str, Any]:
        """What this precision needs in a checkpoint (empty without a loss scaler)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output."""
