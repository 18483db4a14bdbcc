"""Training on uneven inputs: ranks that run out of batches early shadow the others' collectives.

Built on torch's own ``torch.distributed.algorithms.Join`` (DDP models and ZeroRedundancyOptimizer
are its joinables); trainkit only collects the joinables and, for the duration of the block, lets the
prepared dataloaders stop padding the last batch (``even_batches``) when asked.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from torch.utils.data import IterableDataset

from trainkit.utils.enums import DistributedType

logger = logging.getLogger(__name__)


def _batch_samplers(loaders: Sequence[Any]) -> tuple[list[Any], int]:
    """The batch samplers of the prepared map-style loaders (their ``even_batches`` switch), and how many
    loaders read an iterable dataset.

    As in Accelerate, the override is for map-style data only: an iterable loader keeps its own setting
    (each rank's stream decides its padding when the loader is built) and the caller warns about it.
    """
    shards, iterables = [], 0
    for loader in loaders:
        if isinstance(getattr(loader, "dataset", None), IterableDataset):
            iterables += 1
            continue
        sampler = getattr(loader, "batch_sampler", None)
        if hasattr(sampler, "even_batches"):
            shards.append(sampler)
    return shards, iterables


@contextlib.contextmanager
def join_uneven_inputs(distributed_type: DistributedType, joinables: Sequence[Any], loaders: Sequence[Any],
                       even_batches: bool | None = None) -> Iterator[Any]:
    """Run the block under ``Join(joinables)`` on DDP runs; elsewhere, say it changes nothing and run it."""
    if distributed_type not in (DistributedType.MULTI_CPU, DistributedType.MULTI_GPU):
        if distributed_type == DistributedType.NO:
            logger.warning("join_uneven_inputs has effect only with several DDP processes (here: %s); running "
                           "the block unchanged.", distributed_type.value)
        else:  # several processes that are not DDP: a UserWarning, whose phrase Accelerate scripts look for
            warnings.warn(f"join_uneven_inputs has no effect with {distributed_type.value}: torch's Join is only "
                          "supported for multi-GPU (or multi-CPU) DDP runs.", UserWarning, stacklevel=3)
        yield None
        return
    from torch.distributed.algorithms import Join

    shards, iterables = _batch_samplers(loaders) if even_batches is not None else ([], 0)
    if iterables:
        warnings.warn(f"join_uneven_inputs(even_batches={even_batches}): overriding even_batches is only supported "
                      f"for map-style datasets; {iterables} prepared dataloader(s) read an iterable dataset and "
                      "keep their setting.", UserWarning, stacklevel=3)
    previous = [shard.even_batches for shard in shards]
    for shard in shards:
        shard.even_batches = even_batches
    try:
        with Join(list(joinables)) as join:
            yield join
    finally:
        for shard, value in zip(shards, previous):
            shard.even_batches = value
