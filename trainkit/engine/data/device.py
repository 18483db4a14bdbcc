"""Moving nested batches (tensors in dicts, lists, tuples, BatchEncoding) onto a device."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from trainkit.engine.nested import map_tensors


def send_to_device(data: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Return ``data`` with every tensor on ``device``, keeping container types."""

    def move_itself(mapping: Mapping) -> Any:
        # BatchEncoding knows how to move itself (and keeps its encodings).
        return mapping.to(device) if hasattr(mapping, "to") else None

    return map_tensors(lambda tensor: tensor.to(device, non_blocking=non_blocking), data, mapping_hook=move_itself)
