"""``trainkit.parallelism_config.ParallelismConfig``: where Accelerate's scripts import it from
(``accelerate.parallelism_config``). The class lives in :mod:`trainkit.config.parallelism` (plain data)."""

from trainkit.config.parallelism import ParallelismConfig

__all__ = ["ParallelismConfig"]
