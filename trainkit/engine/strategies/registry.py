"""Which strategy runs: an ordered registry of strategies, each with the condition under which it applies.

Adding a strategy is one file (a :class:`~trainkit.engine.strategies.base.Strategy` subclass with its
``capabilities`` and ``from_request``) plus one line in :data:`STRATEGIES`. Strategies are imported only when
chosen, so an unused one (FSDP's modules) costs nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from .base import Strategy, StrategyRequest


@dataclass(frozen=True)
class StrategyEntry:
    """One registered strategy: its name, where its class lives ("module:Class"), and when it applies."""

    name: str
    target: str
    applies: Callable[[StrategyRequest], bool]

    def load(self) -> type[Strategy]:
        """Import and return the strategy class."""
        module_name, _, class_name = self.target.partition(":")
        return getattr(importlib.import_module(module_name), class_name)


# First match wins: the most specific request first, the single-device fallback last.
STRATEGIES: list[StrategyEntry] = [
    # A ParallelismConfig that shards or splits, or replicates with FSDP options; replication alone stays DDP.
    StrategyEntry("nd", "trainkit.engine.strategies.nd:NDParallelStrategy",
                  lambda r: r.parallel_dims is not None and (not r.parallel_dims.pure_replication
                                                             or r.fsdp_options is not None)),
    StrategyEntry("fsdp", "trainkit.engine.strategies.fsdp.strategy:FSDPStrategy", lambda r: r.fsdp_options is not None),
    StrategyEntry("ddp", "trainkit.engine.strategies.ddp:DDPStrategy", lambda r: r.state.world_size > 1),
    StrategyEntry("single", "trainkit.engine.strategies.single:SingleDeviceStrategy", lambda r: True),
]


def strategy_entry(request: StrategyRequest) -> StrategyEntry:
    """The registered strategy that applies to ``request``."""
    for entry in STRATEGIES:
        if entry.applies(request):
            return entry
    raise ValueError(f"No registered strategy applies; registered: {[entry.name for entry in STRATEGIES]}.")


def select_strategy(request: StrategyRequest) -> Strategy:
    """Build the strategy that applies to ``request``."""
    return strategy_entry(request).load().from_request(request)
