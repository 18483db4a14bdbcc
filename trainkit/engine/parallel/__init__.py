"""N-D parallelism: the device mesh of a run's parallel degrees (:mod:`.dims`) and tensor-parallel plans
(:mod:`.tensor_parallel`). The strategy that composes them with FSDP2 lives in ``engine/strategies/nd.py``."""

from .dims import ParallelDims

__all__ = ["ParallelDims"]
