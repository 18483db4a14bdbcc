"""``accelerate.tracking``'s names: the tracker base class to subclass, and trainkit's built-in trackers."""

from trainkit.engine.tracking import (
    GeneralTracker,
    JSONLTracker,
    MLflowTracker,
    TensorBoardTracker,
    WandBTracker,
)

__all__ = ["GeneralTracker", "JSONLTracker", "MLflowTracker", "TensorBoardTracker", "WandBTracker"]
