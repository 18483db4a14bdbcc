"""Gradient accumulation state: whether this micro-batch ends an optimizer step, and how big its window is.

A window closes every ``num_steps`` micro-batches, and also at the end of a dataloader, so the short
last window of an epoch still steps. ``window_size`` is the number of micro-batches in the current
window. ``Accelerator.backward`` divides the loss by ``num_steps`` (Accelerate's rule, which scripts and
``accelerate test`` compare against), so k micro-batches of b reproduce one batch of k·b, and a short
last window of m micro-batches gives m/k of that smaller batch's gradient. Callers that want the short
window exact weight their losses themselves through an explicit window, as the Trainer does.

This is the one accumulation mechanism: ``Accelerator.accumulate`` opens windows implicitly (looking ahead
in the active dataloader), the Trainer opens them explicitly (:meth:`GradientState.open_window`) once it
has read a whole window and counted its loss items on every process. The two differ only in what the loss
handed to ``backward`` means (:meth:`GradientState.normalise_loss`).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from trainkit.engine.step.gradient_state_api import GradientStateAPI



class WindowedLoader(Protocol):
    """What accumulation reads from a prepared dataloader (``PreparedDataLoader``), typed structurally so that
    the data package depends on this module and not the other way round."""

    end_of_dataloader: bool
    remainder: int

    def batches_left(self) -> int | None:
        """Batches this rank will still get after the current one, or None when unknown."""


class GradientState(GradientStateAPI):
    """Per-Accelerator accumulation bookkeeping, fed by ``accumulate`` and the prepared dataloaders."""

    def __init__(self, num_steps: int = 1, *, caller_opens_windows: bool = False,
                 plugin_options: dict[str, Any] | None = None) -> None:
        self.num_steps = num_steps
        self.plugin_options = dict(plugin_options or {})
        """The run's accumulation: micro-batches per optimizer step (the one answer, also where the caller opens
        the windows)."""
        self.caller_opens_windows = caller_opens_windows
        """True when the caller opens every window itself (:meth:`open_window`, as the Trainer does): a micro-batch
        outside one is a window of its own and its loss is taken as it is."""
        self.sync_gradients = True
        self.step = 0
        """Micro-batches seen by ``accumulate`` so far."""
        self.window_size = self.implicit_window_steps
        self.window_items: torch.Tensor | int | None = None
        """Loss items in the current explicit window on all processes (None: not counted)."""
        self.loss_is_global_share = False
        """True inside an explicit window: each loss is this process's share of the window's global loss."""
        self._explicit_window = False
        self._dataloaders: list[WindowedLoader] = []

    @property
    def active_dataloader(self) -> WindowedLoader | None:
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
        """Real samples in the active dataloader's last global batch when it is not full, 0 when it is (the dataset's
        size modulo the global batch, as Accelerate's), -1 when unknown or not needed."""
        loader = self.active_dataloader
        return loader.remainder if loader is not None else -1

    @property
    def real_counts(self) -> list[int] | None:
        """For a streamed loader: real rows of the current batch on each rank (the rest is padding); else None."""
        loader = self.active_dataloader
        return getattr(loader, "real_counts", None) if loader is not None else None

    def push(self, loader: WindowedLoader) -> None:
        """Called by a prepared dataloader when its iteration starts."""
        self._dataloaders.append(loader)

    def pop(self, loader: WindowedLoader) -> None:
        """Called by a prepared dataloader when its iteration ends (or is abandoned)."""
        if loader in self._dataloaders:
            self._dataloaders.remove(loader)

    def open_window(self, size: int, global_items: torch.Tensor | int | None = None) -> None:
        """Start a window of exactly ``size`` micro-batches whose losses are shares of its global loss.

        The caller has already read the window (so its length, the short last one included, is known) and
        weighted each micro-batch's loss by its share of ``global_items``, the window's loss items on all
        processes; the next ``size`` calls of :meth:`advance` sync only at the last.
        """
        if size < 1:
            raise ValueError(f"An accumulation window needs at least one micro-batch, got {size}.")
        self.step = 0
        self.window_size = size
        self.window_items = global_items
        self.loss_is_global_share = True
        self._explicit_window = True

    def advance(self) -> None:
        """Account for one micro-batch and decide whether gradients synchronise after its backward."""
        self.step += 1
        if self._explicit_window:
            closes = self.step == self.window_size
        else:
            closes = self._advance_implicit()
        self.sync_gradients = closes
        if closes:
            self.step = 0  # the next window starts fresh, also after a short one
            self._explicit_window = False

    @property
    def implicit_window_steps(self) -> int:
        """Micro-batches in a window ``accumulate`` opens by itself: ``num_steps``, or 1 where the caller opens them."""
        return 1 if self.caller_opens_windows else self.num_steps

    def _advance_implicit(self) -> bool:
        """Window bookkeeping from ``num_steps`` and the active dataloader's look-ahead (``accumulate``)."""
        self.loss_is_global_share = False
        self.window_items = None
        steps = self.implicit_window_steps
        position = (self.step - 1) % steps  # 0-based index inside the window
        loader = self.active_dataloader
        left_in_loader = loader.batches_left() if loader is not None else None
        if position == 0:
            # A window opens: it is short when the dataloader ends before num_steps more batches.
            remaining = left_in_loader + 1 if left_in_loader is not None else steps
            self.window_size = min(steps, max(remaining, 1))
        return position + 1 == self.window_size or self.end_of_dataloader

    def normalise_loss(self, loss: torch.Tensor, gradient_reduction: str, num_processes: int) -> torch.Tensor:
        """The loss to backpropagate so that gradients are those of the window's loss over all processes.

        Implicit windows (``accumulate``): ``loss`` is this micro-batch's local mean; it is divided by
        ``num_steps`` (also in a short last window, as Accelerate does) and the strategy averages over processes. Explicit windows: ``loss`` is already this
        process's share of the global loss, so gradients must add up over processes; a strategy that
        averages them ("mean") gets the loss multiplied by the number of processes to compensate.
        """
        if self.loss_is_global_share:
            if gradient_reduction == "mean" and num_processes > 1:
                return loss * num_processes
            return loss
        if self.implicit_window_steps > 1:
            return loss / self.num_steps
        return loss

    def reset(self) -> None:
        """Forget any partial window (e.g. when a new epoch starts)."""
        self.step = 0
        self.sync_gradients = True
        self.window_size = self.implicit_window_steps
        self.window_items = None
        self.loss_is_global_share = False
        self._explicit_window = False


def sum_across_processes(count: Any, num_processes: int, reduce_sum: Any, *, same_on_every_process: bool) -> Any:
    """A per-process item count summed over processes; no collective when every process has the same count."""
    if num_processes == 1:
        return count
    if same_on_every_process:
        return count * num_processes
    return reduce_sum(count)
