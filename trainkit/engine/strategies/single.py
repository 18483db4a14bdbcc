"""One process on one device: the model is moved there and nothing else changes."""

from __future__ import annotations

from .base import Strategy, StrategyCapabilities


class SingleDeviceStrategy(Strategy):
    """No parallelism; every operation is local."""

    # One process: averaging and adding gradients over processes are the same; "mean" keeps losses as they are.
    capabilities = StrategyCapabilities(gradient_reduction="mean")
