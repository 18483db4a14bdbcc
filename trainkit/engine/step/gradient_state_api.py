"""The attributes Accelerate's ``GradientState`` offers that trainkit's accumulation state answers as constants
or views (a mixin, so :mod:`trainkit.engine.step.accumulation` keeps to the bookkeeping itself)."""

from __future__ import annotations

from typing import Any


class GradientStateAPI:
    """Mixin over :class:`trainkit.engine.step.accumulation.GradientState`."""

    _dataloaders: list[Any]
    num_steps: int = 1
    """Micro-batches per optimizer step (set per Accelerator)."""
    plugin_options: dict[str, Any]
    """The ``GradientAccumulationPlugin`` fields given with other than their default values, ``num_steps`` aside."""
    num_steps_given = True
    """``plugin_kwargs`` names ``num_steps``: always under an Accelerator; for a ``GradientState()`` made before
    any, only when its plugin gave one (Accelerate's reading)."""
    sync_with_dataloader = True
    """Always True: trainkit closes the accumulation window at the end of every prepared dataloader."""
    is_xla_gradients_synced = False
    """False: trainkit drives no XLA device."""

    @property
    def initialized(self) -> bool:
        """True: the state exists once an Accelerator (or ``GradientState()``) made it."""
        return True

    @property
    def plugin_kwargs(self) -> dict[str, Any]:
        """Accelerate's view of the accumulation options: ``num_steps`` and the plugin's fields given with other than
        their defaults (e.g. ``sync_each_batch``), read by transformers' Trainer. A new dict at each read: change the
        accumulation through ``accelerator.gradient_accumulation_steps``."""
        return {**({"num_steps": self.num_steps} if self.num_steps_given else {}), **self.plugin_options}

    @property
    def adjust_scheduler(self) -> bool:
        """False, as Accelerate's ``GradientState`` reports in every case: it reads the option from the plugin's
        fields given with other than their default, so the plugin's default True never shows (and the explicit
        False is False). Prepared schedulers step only on the optimizer steps accumulation lets through, in both
        libraries; their step count is not advanced in between."""
        return False

    @property
    def dataloader_references(self) -> list[Any]:
        """The prepared dataloaders being iterated, outermost first, after Accelerate's leading None (settable, as
        in Accelerate)."""
        return [None, *self._dataloaders]

    @dataloader_references.setter
    def dataloader_references(self, references: list[Any]) -> None:
        self._dataloaders = [loader for loader in references if loader is not None]
