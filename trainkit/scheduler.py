"""``accelerate.scheduler``'s name: ``AcceleratedScheduler`` is trainkit's prepared scheduler class.

``isinstance(scheduler, AcceleratedScheduler)`` holds for what ``Accelerator.prepare`` returns.
"""

from trainkit.engine.step.wrappers import PreparedScheduler as AcceleratedScheduler

__all__ = ["AcceleratedScheduler"]
