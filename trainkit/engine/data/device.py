"""Moving nested batches (tensors in dicts, lists, tuples, BatchEncoding) onto a device."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def send_to_device(data: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Return ``data`` with every tensor on ``device``, keeping container types."""
    if isinstance(data, torch.Tensor):
        return data.to(device, non_blocking=non_blocking)
    if isinstance(data, Mapping):
        if not isinstance(data, dict) and hasattr(data, "to"):
            try:  # BatchEncoding knows how to move itself (non_blocking since transformers 4.4x)
                return data.to(device, non_blocking=non_blocking)
            except TypeError:
                return data.to(device)
        moved = {key: send_to_device(value, device, non_blocking) for key, value in data.items()}
        return moved if type(data) is dict else type(data)(moved)
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return type(data)(*(send_to_device(v, device, non_blocking) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(send_to_device(v, device, non_blocking) for v in data)
    return data
