"""Training on uneven inputs: ranks that run out of batches early shadow the others' collectives.

Built on torch's own ``torch.distributed.algorithms.Join`` (DDP models and ZeroRedundancyOptimizer
are its joinables); trainkit only collects the joinables and, for the duration of the block, lets the
prepared dataloaders stop padding the last batch (``even_batches``) when asked.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from trainkit.utils.enums import DistributedType

logger = logging.getLogger(__name__)


def _batch_samplers(loaders: Sequence[Any]) -> list[Any]:
    """The sharding objects of the prepared loaders that have an ``even_batches`` switch."""
    shards = []
    for loader in loaders:
        for candidate in (getattr(loader, "batch_sampler", None), getattr(loader, "dataset", None)):
            if hasattr(candidate, "even_batches"):
                shards.append(candidate)
    return shards


@contextlib.contextmanager
def join_uneven_inputs(distributed_type: DistributedType, joinables: Sequence[Any], loaders: Sequence[Any],
                       even_batches: bool | None = None) -> Iterator[Any]:
    """Run the block under ``Join(joinables)`` on DDP runs; elsewhere, say it changes nothing and run it."""
    if distributed_type not in (DistributedType.MULTI_CPU, DistributedType.MULTI_GPU):
        logger.warning("join_uneven_inputs has effect only with several DDP processes (here: %s); running "
                       "the block unchanged.", distributed_type.value)
        yield None
        return
    from torch.distributed.algorithms import Join

    shards = _batch_samplers(loaders) if even_batches is not None else []
    previous = [shard.even_batches for shard in shards]
    for shard in shards:
        shard.even_batches = even_batches
    try:
        with Join(list(joinables)) as join:
            yield join
    finally:
        for shard, value in zip(shards, previous):
            shard.even_batches = value
