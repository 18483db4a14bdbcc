"""Forcing DDP's gradient all-reduce in one backward even inside ``no_sync`` (``trigger_sync_in_backward``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn
from torch.nn.parallel import DistributedDataParallel


@contextlib.contextmanager
def sync_in_backward(model: nn.Module) -> Iterator[None]:
    """The next backward inside this block all-reduces ``model``'s gradients; other models are unchanged."""
    if not isinstance(model, DistributedDataParallel):
        yield  # one process or FSDP: nothing is held back, so nothing to trigger
        return
    saved = (model.require_backward_grad_sync, model.require_forward_param_sync)
    model.require_backward_grad_sync = True
    model.require_forward_param_sync = True
    # DDP's reducer only arms itself in forward; arm it now so the backward of an already-computed loss syncs.
    model.reducer.prepare_for_backward([])
    try:
        yield
    finally:
        model.require_backward_grad_sync, model.require_forward_param_sync = saved
