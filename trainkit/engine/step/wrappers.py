"""Optimizer and scheduler wrappers that make accumulation and fp16 overflow skipping transparent.

Inside an accumulation window ``optimizer.step()`` / ``zero_grad()`` / ``scheduler.step()`` do
nothing, so the user's loop needs no ``if``. The scheduler is stepped once per process per optimizer
step (unless batches are split), which keeps a schedule sized from the unsharded dataloader's length
identical on any number of processes, and it is not stepped when fp16 skipped the optimizer step.
"""

from __future__ import annotations

from typing import Any

import torch

from trainkit.engine.step.accumulation import GradientState
from trainkit.engine.precision.base import Precision


def _newest_accelerator(what: str) -> Any:
    from trainkit.engine.process.state import ProcessState

    accelerator = ProcessState._instance.accelerator if ProcessState._instance is not None else None
    if accelerator is None:
        raise ValueError(f"{what} takes its mixed precision and accumulation state from the Accelerator: create "
                         "the Accelerator first (or let accelerator.prepare(...) build it).")
    return accelerator


class PreparedOptimizer(torch.optim.Optimizer):
    """Wraps the user's optimizer; attribute access passes through to it.

    Built by ``Accelerator.prepare``; ``AcceleratedOptimizer(optimizer)`` (Accelerate's signature) builds one
    for the newest Accelerator. ``device_placement`` has nothing to do (the optimizer state follows the
    parameters) and ``scaler`` must be None or the Accelerator's own (fp16 scaling belongs to its precision).
    """

    _is_accelerate_prepared = True
    """Accelerate's mark on what ``prepare`` returned (libraries test it)."""

    def __init__(self, optimizer: torch.optim.Optimizer, device_placement: bool = True, scaler: Any = None, *,
                 precision: Precision | None = None, gradient_state: GradientState | None = None) -> None:
        # Optimizer.__init__ is deliberately not called: all state lives in the wrapped optimizer.
        if precision is None or gradient_state is None:
            accelerator = _newest_accelerator("AcceleratedOptimizer(...)")
            precision = precision or accelerator.precision
            gradient_state = gradient_state or accelerator.gradient_state
        if scaler is not None and scaler is not precision.scaler:
            raise ValueError("AcceleratedOptimizer(scaler=...): trainkit scales fp16 losses with the Accelerator's "
                             "own GradScaler (configure it with GradScalerKwargs); pass scaler=None.")
        self.optimizer = optimizer
        self.precision = precision
        self.gradient_state = gradient_state
        self._is_overflow = False  # Accelerate's attribute (scripts set it to simulate a skipped step)
        self.before_step: Any = None
        """Called before each real step (a DeepSpeed config's ``gradient_clipping`` clips there)."""
        self.placeholder: Any = optimizer
        """What the script passed to ``prepare`` (a ``DummyOptim`` stands for a config-built optimizer)."""

    @property
    def step_was_skipped(self) -> bool:
        """True when the last step was skipped because fp16 gradients overflowed."""
        return self._is_overflow

    @step_was_skipped.setter
    def step_was_skipped(self, value: bool) -> None:
        self._is_overflow = value

    @property  # type: ignore[override]  # the wrapped optimizer's state, read through (Accelerate's AcceleratedOptimizer)
    def state(self) -> dict:
        return self.optimizer.state

    @state.setter
    def state(self, value: dict) -> None:
        self.optimizer.state = value  # type: ignore[assignment]  # torch types it a defaultdict; a loaded state is a dict

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]  # the wrapped optimizer's, read through
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]  # the wrapped optimizer's, read through
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        if self.gradient_state.sync_gradients:
            self.optimizer.zero_grad(**({} if set_to_none is None else {"set_to_none": set_to_none}))

    def step(self, closure: Any = None) -> None:  # type: ignore[override]  # Accelerate's signature
        if not self.gradient_state.sync_gradients or callable(getattr(self.optimizer, "fused_backward", None)):
            return  # a LOMO optimizer has already updated the weights in backward(learning_rate=...)
        kwargs = {"closure": closure} if closure is not None else {}
        if self.before_step is not None:
            self.before_step()
        self.step_was_skipped = not self.precision.optimizer_step(self.optimizer, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    # torch's optimizer hooks: registered on the wrapped optimizer, whose step and state_dict run them.
    def register_step_pre_hook(self, hook: Any) -> Any:  # type: ignore[override]  # registered on the wrapped optimizer
        return self.optimizer.register_step_pre_hook(hook)

    def register_step_post_hook(self, hook: Any) -> Any:  # type: ignore[override]  # registered on the wrapped optimizer
        return self.optimizer.register_step_post_hook(hook)

    def register_state_dict_pre_hook(self, hook: Any, prepend: bool = False) -> Any:  # type: ignore[override]  # registered on the wrapped optimizer
        return self.optimizer.register_state_dict_pre_hook(hook, prepend)

    def register_state_dict_post_hook(self, hook: Any, prepend: bool = False) -> Any:  # type: ignore[override]  # registered on the wrapped optimizer
        return self.optimizer.register_state_dict_post_hook(hook, prepend)

    def register_load_state_dict_pre_hook(self, hook: Any, prepend: bool = False) -> Any:  # type: ignore[override]  # registered on the wrapped optimizer
        return self.optimizer.register_load_state_dict_pre_hook(hook, prepend)

    def register_load_state_dict_post_hook(self, hook: Any, prepend: bool = False) -> Any:  # type: ignore[override]  # registered on the wrapped optimizer
        return self.optimizer.register_load_state_dict_post_hook(hook, prepend)

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
    """Wraps a learning-rate scheduler so it follows the optimizer steps that really happened.

    Built by ``Accelerator.prepare``; ``AcceleratedScheduler(scheduler, optimizers)`` (Accelerate's
    signature) builds one for the newest Accelerator: stepped once per process per optimizer step, or once
    with ``split_batches=True``.
    """

    _is_accelerate_prepared = True
    """Accelerate's mark on what ``prepare`` returned (libraries test it)."""

    def __init__(self, scheduler: Any, optimizers: Any, step_with_optimizer: bool = True, split_batches: bool = False,
                 *, gradient_state: GradientState | None = None, steps_per_call: int | None = None) -> None:
        optimizers = list(optimizers) if isinstance(optimizers, (list, tuple)) else [optimizers]
        if gradient_state is None or steps_per_call is None:
            accelerator = _newest_accelerator("AcceleratedScheduler(...)")
            gradient_state = gradient_state or accelerator.gradient_state
            steps_per_call = steps_per_call or (1 if split_batches else accelerator.num_processes)
        self.scheduler = scheduler
        self.optimizers = optimizers
        self.gradient_state = gradient_state
        self.steps_per_call = steps_per_call
        self.step_with_optimizer = step_with_optimizer
        self.split_batches = split_batches

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Advance the schedule by one optimizer step of every process, when a step happened."""
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradient_state.sync_gradients:
            return
        if any(getattr(opt, "step_was_skipped", False) for opt in self.optimizers):
            return
        total = getattr(self.scheduler, "total_steps", None)  # OneCycleLR raises past its end
        for _ in range(self.steps_per_call):
            if total is not None and self.scheduler._step_count > total:
                break
            self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def get_lr(self) -> list[float]:
        return self.scheduler.get_lr()

    def print_lr(self, *args: Any, **kwargs: Any) -> None:
        """Forward to the wrapped scheduler's ``print_lr`` (older torch schedulers)."""
        return self.scheduler.print_lr(*args, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes not set in __init__: get_lr, last_epoch, base_lrs, ...
        return getattr(self.__dict__["scheduler"], name)
