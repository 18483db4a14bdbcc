"""Attributes of Accelerate's ``DataLoaderShard`` that trainkit's prepared loader answers from its own state:
``iteration`` (the pass), ``base_dataloader``, and telling samplers and datasets which epoch runs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any


class _ThisLoader:
    """``base_dataloader``: the loader that does the work, which for a prepared loader is itself. An instance
    attribute in Accelerate, so reading it on the class is an ``AttributeError`` here too."""

    def __get__(self, loader: Any, owner: type) -> Any:
        if loader is None:
            raise AttributeError(f"base_dataloader is an attribute of {owner.__name__} instances")
        return loader


class ShardAttributes:
    """Mixin over :class:`~trainkit.engine.data.loader.PreparedDataLoader` (which provides the progress, the shard
    and ``set_epoch``)."""

    progress: Any
    dataset: Any
    _shard: Any
    dispatch_to: tuple[int, int] | None
    base_dataloader = _ThisLoader()
    _is_accelerate_prepared = True
    """Accelerate's mark on what ``prepare`` returned (libraries test it)."""

    if TYPE_CHECKING:
        def set_epoch(self, epoch: int) -> None: ...

    @property
    def iteration(self) -> int:
        """Accelerate's name for the pass (epoch) the next iteration runs; setting it is ``set_epoch``."""
        return int(self.progress.epoch)

    @iteration.setter
    def iteration(self, epoch: int) -> None:
        self.set_epoch(epoch)

    def _propagate_epoch(self, epoch: int) -> None:
        """Call ``set_epoch`` on the script's batch sampler, the samplers inside and the dataset, where they have it
        (a ``DistributedSampler``, a seedable sampler, a custom batch sampler, a ``datasets`` stream)."""
        # The script's batch sampler: inside the sharding one, or the loader's own (a DataLoaderDispatcher's).
        script_batches = getattr(self._shard, "batch_sampler", None) or (self._shard if self.dispatch_to else None)
        samplers = [getattr(target, "sampler", None) for target in (script_batches, self._shard, self.dataset)]
        for target in (script_batches, *samplers, self.dataset):
            if hasattr(target, "set_epoch"):
                target.set_epoch(epoch)
