"""``LocalSGD`` (``accelerate.local_sgd``): train without gradient all-reduce, average the weights every k steps.

Each process steps its own replica inside ``no_sync``; every ``local_sgd_steps`` optimizer steps (and when
the block ends) the parameters are averaged across processes with one all-reduce each. Fewer, larger
synchronisations than DDP, at the price of replicas drifting between them.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from trainkit.utils.enums import DistributedType


class LocalSGD:
    """Context manager: ``with LocalSGD(accelerator, model, local_sgd_steps=8) as local_sgd: ... local_sgd.step()``."""

    def __init__(self, accelerator: Any, model: nn.Module, local_sgd_steps: int, enabled: bool = True) -> None:
        if accelerator.distributed_type not in (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU):
            raise NotImplementedError(f"LocalSGD averages DDP replicas; it cannot run with {accelerator.distributed_type.value}"
                                      " (FSDP shards the parameters, so there are no replicas to average).")
        if local_sgd_steps < 1:
            raise ValueError(f"LocalSGD(local_sgd_steps={local_sgd_steps}) must be >= 1.")
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self.enabled = enabled and accelerator.num_processes > 1
        self.num_steps = 0
        self._no_sync: contextlib.AbstractContextManager | None = None

    def __enter__(self) -> LocalSGD:
        if self.enabled:
            self._no_sync = self.accelerator.no_sync(self.model)
            self._no_sync.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self.enabled:
            self._average_parameters()  # leave the block with identical replicas
            if self._no_sync is not None:  # set by __enter__ whenever enabled
                self._no_sync.__exit__(*exc_info)
            self._no_sync = None

    def step(self) -> None:
        """Count one optimizer step; average the parameters every ``local_sgd_steps`` steps."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._average_parameters()

    @torch.no_grad()
    def _average_parameters(self) -> None:
        self.accelerator.wait_for_everyone()
        for param in self.accelerator.unwrap_model(self.model).parameters():
            param.data.copy_(self.accelerator.reduce(param.data, reduction="mean"))
