"""Parallelism strategies: one small class each (single device, DDP, FSDP2), chosen through :mod:`.registry`."""

from .base import Strategy, StrategyCapabilities
from .ddp import DDPStrategy
from .registry import STRATEGIES, StrategyEntry, StrategyRequest, select_strategy
from .single import SingleDeviceStrategy

__all__ = ["STRATEGIES", "DDPStrategy", "SingleDeviceStrategy", "Strategy", "StrategyCapabilities", "StrategyEntry",
           "StrategyRequest", "select_strategy"]
