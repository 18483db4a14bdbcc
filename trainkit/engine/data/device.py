"""Moving nested batches (tensors in dicts, lists, tuples, BatchEncoding) onto a device."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from trainkit.engine.process.nested import map_tensors


def send_to_device(data: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Return ``data`` with every tensor on ``device``, keeping container types."""

    def move_itself(mapping: Mapping) -> Any:
        if not hasattr(mapping, "to"):
            return None
        try:  # BatchEncoding knows how to move itself (non_blocking since transformers 4.4x)
            return mapping.to(device, non_blocking=non_blocking)
        except TypeError:
            return mapping.to(device)

    return map_tensors(lambda tensor: tensor.to(device, non_blocking=non_blocking), data, mapping_hook=move_itself)
