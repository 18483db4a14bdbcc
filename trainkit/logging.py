"""``get_logger``: a logger that, in multi-process runs, speaks once (on the main process) unless told otherwise.

Mirrors ``accelerate.logging.get_logger``: ``logger.info(msg, main_process_only=False)`` logs on every
process, ``in_order=True`` logs on every process one rank after another.
"""

from __future__ import annotations

import logging
import os
from typing import Any


class MultiProcessAdapter(logging.LoggerAdapter):
    """Filters records by process: the main process only, by default."""

    def log(self, level: int, msg: Any, *args: Any, main_process_only: bool = True,  # type: ignore[override]  # Accelerate's
            in_order: bool = False, **kwargs: Any) -> None:
        # Records name the caller's line: this method is the adapter's one frame between the caller and
        # Logger.log, which stacklevel=2 skips (a stacklevel the caller gives counts the same way, as in Accelerate).
        if not self.isEnabledFor(level):
            return
        msg, processed = self.process(msg, kwargs)
        kwargs = dict(processed)
        kwargs.setdefault("stacklevel", 2)
        rank = int(os.environ.get("RANK", 0))
        if not in_order:
            if not main_process_only or rank == 0:
                self.logger.log(level, msg, *args, **kwargs)
            return
        import torch.distributed as dist

        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        for turn in range(world):
            if turn == rank:
                self.logger.log(level, msg, *args, **kwargs)
            if world > 1:
                dist.barrier()


def get_logger(name: str, log_level: str | None = None) -> MultiProcessAdapter:
    """A logger for ``name`` whose calls accept ``main_process_only`` and ``in_order``."""
    logger = logging.getLogger(name)
    level = log_level or os.environ.get("TRAINKIT_LOG_LEVEL") or os.environ.get("ACCELERATE_LOG_LEVEL")
    if level:
        logger.setLevel(level.upper())
        logger.root.setLevel(level.upper())
    return MultiProcessAdapter(logger, {})
