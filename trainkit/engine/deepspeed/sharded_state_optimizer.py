"""ZeRO stage 1 on torch: optimizer state sharded across ranks (a DeepSpeed config's ``zero_optimization.stage`` 1).

Its own module because ``torch.distributed.optim`` is costly and noisy to import (it scripts functional
optimizers with torch.jit); :func:`trainkit.engine.deepspeed.from_config.shard_optimizer_state` imports it only when
a run asks for stage 1 on several processes.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer


class ShardedStateOptimizer(ZeroRedundancyOptimizer):
    """ZeRO stage 1: each rank keeps the optimizer state of its share of the parameters only.

    Built over the user's optimizer class and hyper-parameters, and sharing the user's param-group dicts,
    so a scheduler made for the original optimizer still drives the learning rate. ``state_dict`` is the
    full state on every rank (gathered), so checkpoints are the same as without sharding and reshard on
    load: ``load_state_dict`` keeps each rank's share.
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        accepted = inspect.signature(type(optimizer).__init__).parameters
        # defaults can hold keys the constructor does not take (AdamW's decoupled_weight_decay): pass the rest.
        defaults = {key: value for key, value in optimizer.defaults.items() if key in accepted and key != "params"}
        groups = [{**group, "params": list(group["params"])} for group in optimizer.param_groups]
        super().__init__(groups, optimizer_class=type(optimizer), **defaults)
        # The user's scheduler holds the original groups: let this optimizer read its hyper-parameters there.
        self.param_groups = optimizer.param_groups

    def state_dict(self) -> dict[str, Any]:
        """The full optimizer state on every rank (each rank gathers it in turn; collective)."""
        state: dict[str, Any] = {}
        for target in range(self.world_size):
            self.consolidate_state_dict(to=target)
            if self.rank == target:
                state = super().state_dict()
        self._all_state_dicts: list[Any] = []  # the gathered copies are not needed between saves
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a full state; keys may be parameter names (torch.distributed.checkpoint's form) or indices."""
        order = [key for group in state_dict["param_groups"] for key in group["params"]]
        if any(not isinstance(key, int) for key in order):
            index = {key: position for position, key in enumerate(order)}
            state_dict = {"state": {index[key]: value for key, value in state_dict["state"].items()},
                          "param_groups": [{**group, "params": [index[key] for key in group["params"]]}
                                           for group in state_dict["param_groups"]]}
        super().load_state_dict(state_dict)
