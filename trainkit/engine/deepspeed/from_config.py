"""What a DeepSpeed config asks the engine for, built from torch: ZeRO-1's sharded optimizer state, the
optimizer and schedule its ``optimizer``/``scheduler`` blocks name, and Accelerate's placeholders for them.

The mapping itself (which key means what) lives in :mod:`trainkit.config.deepspeed`; stages 2 and 3 become
FSDP2 options there and need nothing here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from trainkit.config.errors import ConfigError


class DummyOptim:
    """Accelerate's placeholder for the optimizer a DeepSpeed config's ``optimizer`` block names.

    ``prepare`` replaces it by that optimizer; ``lr`` and ``weight_decay`` fill the block's ``"auto"``.
    """

    def __init__(self, params: Iterable[Any], lr: float = 0.001, weight_decay: float = 0, **kwargs: Any) -> None:
        self.params = list(params)
        self.lr = lr
        self.weight_decay = weight_decay
        self.kwargs = kwargs


class DummyScheduler:
    """Accelerate's placeholder for the schedule a DeepSpeed config's ``scheduler`` block names.

    ``total_num_steps`` and ``warmup_num_steps`` fill the block's ``"auto"``; ``lr_scheduler_callable``,
    when given, builds the schedule from the prepared optimizer instead of the config.
    """

    def __init__(self, optimizer: Any, total_num_steps: int | None = None, warmup_num_steps: int = 0,
                 lr_scheduler_callable: Any = None, **kwargs: Any) -> None:
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.lr_scheduler_callable = lr_scheduler_callable
        self.kwargs = kwargs


def build_optimizer(spec: dict[str, Any], placeholder: DummyOptim) -> torch.optim.Optimizer:
    """The torch optimizer a translated ``optimizer`` block names (AdamW, Adam, SGD), over the placeholder's
    parameters; its ``lr`` and ``weight_decay`` fill what the block left ``"auto"``."""
    kinds = {"AdamW": torch.optim.AdamW, "Adam": torch.optim.Adam, "SGD": torch.optim.SGD}
    fill = {**placeholder.kwargs, "lr": placeholder.lr, "weight_decay": placeholder.weight_decay}
    kwargs: dict[str, Any] = {key: fill.get(key) if value is None else value for key, value in spec["params"].items()}
    for key in ("betas", "eps"):  # "auto" with nothing to fill it: torch's defaults are DeepSpeed's
        if kwargs.get(key, 0) is None:
            del kwargs[key]
    unresolved = [key for key, value in kwargs.items() if value is None]
    if unresolved:
        raise ConfigError(f"optimizer.params {unresolved} of the DeepSpeed config are \"auto\" but nothing sets them; "
                          "write the values in the config.")
    params = placeholder.params
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])
    try:
        return kinds[spec["type"]](params, **kwargs)
    except TypeError as error:
        raise ConfigError(f"optimizer.params of the DeepSpeed config for torch {spec['type']}: {error}") from None


class DeepSpeedSchedule(torch.optim.lr_scheduler.LRScheduler):
    """DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR formulas as a torch scheduler.

    The learning rate at optimizer step ``t`` is the formula at ``t``: a warm-up from ``warmup_min_lr``
    to ``warmup_max_lr`` (``"log"``, DeepSpeed's default, or ``"linear"``) over ``warmup_num_steps``,
    then constant (WarmupLR), linear decay to 0 at ``total_num_steps`` (WarmupDecayLR), or, for
    WarmupCosineLR, ratios of the optimizer's own learning rate from ``warmup_min_ratio`` up to 1 and a
    cosine down to ``cos_min_ratio``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, kind: str, params: dict[str, Any]) -> None:
        self.kind = kind
        self.warmup_num_steps = max(2, int(params.get("warmup_num_steps", 1000)))
        self.warmup_type = str(params.get("warmup_type", "log"))
        if self.warmup_type not in ("log", "linear"):
            raise ConfigError(f"scheduler.params.warmup_type {self.warmup_type!r}: use 'log' or 'linear'.")
        total = params.get("total_num_steps")
        if kind != "WarmupLR" and total is None:
            raise ConfigError(f"scheduler {kind} needs total_num_steps (or \"auto\" with a known training length).")
        self.total_num_steps: int = int(total) if total is not None else 0  # read by WarmupDecayLR/WarmupCosineLR only
        self.min_lr = float(params.get("warmup_min_lr", 0.0))
        self.max_lr = params.get("warmup_max_lr")
        self.warmup_min_ratio = float(params.get("warmup_min_ratio", 0.0))
        self.cos_min_ratio = float(params.get("cos_min_ratio", 0.0001))
        super().__init__(optimizer)

    def _warmup_fraction(self, step: int) -> float:
        if self.warmup_type == "log":
            return math.log(step + 1) / math.log(self.warmup_num_steps)
        return step / self.warmup_num_steps

    def _factor(self, step: int) -> float:
        """Where the schedule stands in [0, 1] (WarmupLR/WarmupDecayLR) or as a ratio (WarmupCosineLR)."""
        if self.kind == "WarmupCosineLR":
            if step < self.warmup_num_steps:
                return self.warmup_min_ratio + self._warmup_fraction(step) * (1 - self.warmup_min_ratio)
            progress = (step - self.warmup_num_steps + 1) / max(self.total_num_steps - self.warmup_num_steps, 1)
            return max(0.0, self.cos_min_ratio + (1 - self.cos_min_ratio) * (1 + math.cos(math.pi * progress)) / 2)
        if step < self.warmup_num_steps:
            return self._warmup_fraction(step)
        if self.kind == "WarmupDecayLR":
            return max(0.0, (self.total_num_steps - step) / max(1.0, self.total_num_steps - self.warmup_num_steps))
        return 1.0

    def get_lr(self) -> list[float | torch.Tensor]:  # torch's LRScheduler.get_lr type
        factor = self._factor(max(self.last_epoch, 0))
        if self.kind == "WarmupCosineLR":
            return [base * factor for base in self.base_lrs]
        return [self.min_lr + ((base if self.max_lr is None else float(self.max_lr)) - self.min_lr) * factor
                for base in self.base_lrs]


def build_scheduler(spec: dict[str, Any], optimizer: torch.optim.Optimizer, placeholder: DummyScheduler) -> Any:
    """The schedule a translated ``scheduler`` block names, over ``optimizer``; the placeholder's step counts
    fill what the block left ``"auto"`` (its ``lr_scheduler_callable``, when given, decides instead)."""
    if placeholder.lr_scheduler_callable is not None:
        return placeholder.lr_scheduler_callable(optimizer)
    fill = {"total_num_steps": placeholder.total_num_steps, "warmup_num_steps": placeholder.warmup_num_steps}
    params = {key: fill.get(key) if value is None else value for key, value in spec["params"].items()}
    return DeepSpeedSchedule(getattr(optimizer, "optimizer", optimizer), spec["type"], params)


def deepspeed_optimizer(settings: Any, optimizer: torch.optim.Optimizer | DummyOptim) -> torch.optim.Optimizer:
    """The optimizer to prepare: the user's, or the one the config's ``optimizer`` block names (Accelerate's
    rule: a config with an optimizer block takes a :class:`DummyOptim`, and only then)."""
    block = settings.optimizer if settings is not None else None
    if isinstance(optimizer, DummyOptim):
        if block is None:
            raise ConfigError("DummyOptim needs a DeepSpeed config with an 'optimizer' block; without one, pass a "
                              "torch optimizer.")
        return build_optimizer(block, optimizer)
    if block is not None:
        raise ConfigError("The DeepSpeed config has an 'optimizer' block and the script passes its own optimizer: "
                          "pass trainkit.utils.DummyOptim(params, lr=...) or remove the block.")
    return optimizer


def deepspeed_scheduler(settings: Any, placeholder: DummyScheduler, optimizers: list[Any]) -> Any:
    """The schedule a :class:`DummyScheduler` stands for, over the prepared optimizer it names."""
    block = settings.scheduler if settings is not None else None
    if block is None and placeholder.lr_scheduler_callable is None:
        raise ConfigError("DummyScheduler needs a DeepSpeed config with a 'scheduler' block (or "
                          "lr_scheduler_callable=...); without one, pass a torch scheduler.")
    target = next((opt for opt in optimizers if getattr(opt, "placeholder", None) is placeholder.optimizer
                   or opt.optimizer is placeholder.optimizer), optimizers[-1] if optimizers else None)
    if target is None:
        raise ConfigError("DummyScheduler: prepare its optimizer first (or in the same prepare call).")
    return build_scheduler(block or {}, target.optimizer, placeholder)


def shard_optimizer_state(settings: Any, optimizer: torch.optim.Optimizer, num_processes: int) -> torch.optim.Optimizer:
    """ZeRO-1: the optimizer with its state sharded across processes, when the DeepSpeed config asks for it."""
    if settings is not None and settings.shard_optimizer_state and num_processes > 1:
        # Imported here: torch.distributed.optim scripts its functional optimizers with torch.jit on import,
        # which emits dozens of DeprecationWarnings; only a ZeRO-1 run should pay for that.
        from trainkit.engine.deepspeed.sharded_state_optimizer import ShardedStateOptimizer

        return ShardedStateOptimizer(optimizer)
    return optimizer


def clipping_before_step(settings: Any, optimizer: torch.optim.Optimizer, clip: Any) -> Any:
    """The DeepSpeed config's ``gradient_clipping``, as a call the prepared optimizer makes before each step."""
    if settings is None or not settings.gradient_clipping:
        return None
    parameters = [param for group in optimizer.param_groups for param in group["params"]]
    max_norm = settings.gradient_clipping
    return lambda: clip(parameters, max_norm)


def check_micro_batch(settings: Any, dataloader: Any) -> None:
    """A dataloader's batch size must be the DeepSpeed config's ``train_micro_batch_size_per_gpu``."""
    micro = settings.micro_batch_size if settings is not None else None
    if micro is not None and dataloader.batch_size not in (None, micro):
        raise ConfigError(f"The DeepSpeed config's train_micro_batch_size_per_gpu is {micro} but this dataloader's "
                          f"batch size is {dataloader.batch_size}; make them agree (or write \"auto\").")
