"""Learning-rate schedules named by ``TrainingArguments.lr_scheduler_type``, as transformers builds them.

The four everyday schedules without extra arguments (``linear``, the default, ``cosine``, ``constant`` and
``constant_with_warmup``) are built here: a ``LambdaLR`` over a module-level factor function, bound with
``functools.partial`` as transformers binds its own, so the rates, ``state_dict()`` and resumes are the ones
transformers' ``get_scheduler`` gives. Every other name, and any ``lr_scheduler_kwargs``, goes to transformers'
``get_scheduler`` itself. Building the common ones here keeps a plain ``nn.Module`` run from importing
transformers (~0.3 s of start-up). ``tests/trainer/test_built_here.py`` compares each with transformers'
schedule, step by step, for several warm-up and run lengths.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR


def _constant(_: int | None = None) -> int:
    return 1  # an int, as transformers' constant factor: the rate is base_lr * 1


def _warming_up(step: int, num_warmup_steps: int) -> float:
    return float(step) / float(max(1, num_warmup_steps))


def _constant_with_warmup(step: int, *, num_warmup_steps: int) -> float:
    return _warming_up(step, num_warmup_steps) if step < num_warmup_steps else 1.0


def _linear(step: int, *, num_warmup_steps: int, num_training_steps: int) -> float:
    if step < num_warmup_steps:
        return _warming_up(step, num_warmup_steps)
    return max(0.0, float(num_training_steps - step) / float(max(1, num_training_steps - num_warmup_steps)))


def _cosine(step: int, *, num_warmup_steps: int, num_training_steps: int) -> float:
    if step < num_warmup_steps:
        return _warming_up(step, num_warmup_steps)
    progress = float(step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))  # half a cosine wave (num_cycles 0.5)


def _factor(name: str, num_warmup_steps: int, num_training_steps: int) -> Callable[[int], Any]:
    if name == "constant":
        return _constant  # a function, not a partial: its state_dict entry is None, as transformers'
    if name == "constant_with_warmup":
        return functools.partial(_constant_with_warmup, num_warmup_steps=num_warmup_steps)
    shape = _linear if name == "linear" else _cosine
    return functools.partial(shape, num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps)


BUILT_HERE = ("linear", "cosine", "constant", "constant_with_warmup")
"""The schedule names built here when ``lr_scheduler_kwargs`` is empty."""


def scheduler_names() -> list[str]:
    """Every ``lr_scheduler_type`` value the installed transformers defines (its ``SchedulerType``)."""
    from transformers.trainer_utils import SchedulerType

    return [s.value for s in SchedulerType]


def build_scheduler(optimizer: torch.optim.Optimizer, args: Any, num_training_steps: int) -> Any:
    """transformers' schedule ``args.lr_scheduler_type`` over ``num_training_steps`` optimizer steps."""
    num_warmup_steps = args.warmup_steps_for(num_training_steps)
    kwargs = dict(args.lr_scheduler_kwargs or {})
    if type(optimizer).__name__ == "LayerWiseDummyOptimizer":
        optimizer = _LayerWiseAsScheduled(optimizer)
    elif args.lr_scheduler_type in BUILT_HERE and not kwargs:
        return LambdaLR(optimizer, _factor(args.lr_scheduler_type, num_warmup_steps, num_training_steps))
    from transformers.optimization import get_scheduler

    return get_scheduler(args.lr_scheduler_type, optimizer=optimizer, num_warmup_steps=num_warmup_steps,
                         num_training_steps=num_training_steps, scheduler_specific_kwargs=kwargs)


class _LayerWiseAsScheduled(torch.optim.Optimizer):
    """A layer-wise optimizer (GaLore/APOLLO ``*_layerwise``) as transformers' Trainer hands it to ``get_scheduler``:
    already wrapped by Accelerate, so the schedule is built over the placeholder's one group (the layers' own
    optimizers keep the base rate; transformers' per-layer schedules are not attached under its Trainer)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:  # Optimizer.__init__ deliberately not called
        self.optimizer = optimizer
        self.defaults = optimizer.defaults

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]  # the wrapped optimizer's groups, read through
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    def step(self, closure: Any = None) -> None:  # type: ignore[override]  # the wrapped optimizer's step, called through
        """Nothing: the layers step in their gradient hooks."""


def replan_schedule(trainer: Any, max_steps: int) -> None:
    """Re-span a schedule the Trainer built when a new run plans a different number of steps (the object stays
    the one registered for checkpointing; its state is replaced by a fresh schedule's)."""
    if not getattr(trainer, "_scheduler_built", False) or getattr(trainer, "_scheduled_steps", None) == max_steps:
        return
    optimizer = trainer.lr_scheduler.optimizer
    for group in optimizer.param_groups:
        group["lr"] = group.get("initial_lr", group["lr"])
    fresh = build_scheduler(optimizer, trainer.args, max_steps)
    trainer.lr_scheduler.__dict__.update(fresh.__dict__)
    trainer._scheduled_steps = max_steps
