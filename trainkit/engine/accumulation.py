"""Gradient accumulation state: whether this micro-batch ends an optimizer step, and how big its window is.

A window closes every ``num_steps`` micro-batches, and also at the end of a dataloader, so the short
last window of an epoch still steps. ``window_size`` is the number of micro-batches in the current
window — ``Accelerator.backward`` divides the loss by it, so k micro-batches of b reproduce one batch
of k·b exactly, the short window included.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainkit.engine.data.loader import PreparedDataLoader


class GradientState:
    """Per-Accelerator accumulation bookkeeping, fed by ``accumulate`` and the prepared dataloaders."""

    def __init__(self, num_steps: int = 1) -> None:
        self.num_steps = num_steps
        self.sync_gradients = True
        self.step = 0
        """Micro-batches seen by ``accumulate`` so far."""
        self.window_size = num_steps
        self._dataloaders: list[PreparedDataLoader] = []

    @property
    def active_dataloader(self) -> PreparedDataLoader | None:
        """The innermost prepared dataloader being iterated, if any."""
        return self._dataloaders[-1] if self._dataloaders else None

    @property
    def in_dataloader(self) -> bool:
        """True while a prepared dataloader is being iterated."""
        return bool(self._dataloaders)

    @property
    def end_of_dataloader(self) -> bool:
        """True when the batch just yielded is the last one of the active dataloader."""
        loader = self.active_dataloader
        return loader is not None and loader.end_of_dataloader

    @property
    def remainder(self) -> int:
        """Real samples in the active dataloader's last global batch (-1 when unknown or not needed)."""
        loader = self.active_dataloader
        return loader.remainder if loader is not None else -1

    @property
    def real_counts(self) -> list[int] | None:
        """For a streamed loader: real rows of the current batch on each rank (the rest is padding); else None."""
        loader = self.active_dataloader
        return getattr(loader, "real_counts", None) if loader is not None else None

    def push(self, loader: PreparedDataLoader) -> None:
        """Called by a prepared dataloader when its iteration starts."""
        self._dataloaders.append(loader)

    def pop(self, loader: PreparedDataLoader) -> None:
        """Called by a prepared dataloader when its iteration ends (or is abandoned)."""
        if loader in self._dataloaders:
            self._dataloaders.remove(loader)

    def advance(self) -> None:
        """Account for one micro-batch and decide whether gradients synchronise after its backward."""
        self.step += 1
        position = (self.step - 1) % self.num_steps  # 0-based index inside the window
        loader = self.active_dataloader
        left_in_loader = loader.batches_left() if loader is not None else None
        if position == 0:
            # A window opens: it is short when the dataloader ends before num_steps more batches.
            remaining = left_in_loader + 1 if left_in_loader is not None else self.num_steps
            self.window_size = min(self.num_steps, max(remaining, 1))
        closes = position + 1 == self.window_size or self.end_of_dataloader
        self.sync_gradients = closes
        if closes:
            self.step = 0  # the next window starts fresh, also after a short one

    def reset(self) -> None:
        """Forget any partial window (e.g. when a new epoch starts)."""
        self.step = 0
        self.sync_gradients = True
        self.window_size = self.num_steps
