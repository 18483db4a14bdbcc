"""Optimizer and scheduler wrappers that make accumulation and fp16 overflow skipping transparent.

Inside an accumulation window ``optimizer.step()`` / ``zero_grad()`` / ``scheduler.step()`` do
nothing, so the user's loop needs no ``if``. The scheduler is stepped once per process per optimizer
step (unless batches are split), which keeps a schedule sized from the unsharded dataloader's length
identical on any number of processes, and it is not stepped when fp16 skipped the optimizer step.
"""

from __future__ import annotations

from typing import Any

import torch

from trainkit.engine.accumulation import GradientState
from trainkit.engine.precision import Precision


class PreparedOptimizer(torch.optim.Optimizer):
    """Wraps the user's optimizer; attribute access passes through to it."""

    def __init__(self, optimizer: torch.optim.Optimizer, precision: Precision, gradient_state: GradientState) -> None:
        # Optimizer.__init__ is deliberately not called: all state lives in the wrapped optimizer.
        self.optimizer = optimizer
        self.precision = precision
        self.gradient_state = gradient_state
        self.step_was_skipped = False
        """True when the last step was skipped because fp16 gradients overflowed."""
        self.before_step: Any = None
        """Called before each real step (a DeepSpeed config's ``gradient_clipping`` clips there)."""
        self.placeholder: Any = optimizer
        """What the script passed to ``prepare`` (a ``DummyOptim`` stands for a config-built optimizer)."""

    @property
    def state(self) -> dict:  # type: ignore[override]
        return self.optimizer.state

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optimizer.defaults

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.gradient_state.sync_gradients:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        if not self.gradient_state.sync_gradients:
            return
        kwargs = {"closure": closure} if closure is not None else {}
        if self.before_step is not None:
            self.before_step()
        self.step_was_skipped = not self.precision.optimizer_step(self.optimizer, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def train(self) -> None:
        """Forward to optimizers with train/eval modes (schedule-free ones)."""
        if hasattr(self.optimizer, "train"):
            self.optimizer.train()

    def eval(self) -> None:
        """Forward to optimizers with train/eval modes (schedule-free ones)."""
        if hasattr(self.optimizer, "eval"):
            self.optimizer.eval()

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"PreparedOptimizer({self.optimizer!r})"


class PreparedScheduler:
    """Wraps a learning-rate scheduler so it follows the optimizer steps that really happened."""

    def __init__(self, scheduler: Any, optimizers: list[PreparedOptimizer], gradient_state: GradientState,
                 *, steps_per_call: int, step_with_optimizer: bool = True) -> None:
        self.scheduler = scheduler
        self.optimizers = optimizers
        self.gradient_state = gradient_state
        self.steps_per_call = steps_per_call
        self.step_with_optimizer = step_with_optimizer

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Advance the schedule by one optimizer step of every process, when a step happened."""
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradient_state.sync_gradients:
            return
        if any(opt.step_was_skipped for opt in self.optimizers):
            return
        total = getattr(self.scheduler, "total_steps", None)  # OneCycleLR raises past its end
        for _ in range(self.steps_per_call):
            if total is not None and self.scheduler._step_count > total:
                break
            self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes not set in __init__: get_lr, last_epoch, base_lrs, ...
        return getattr(self.__dict__["scheduler"], name)
