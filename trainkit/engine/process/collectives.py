"""Cross-process operations on nested structures of tensors: gather, reduce, pad, broadcast.

Each function is a no-op copy-free pass-through on a single process, and otherwise one torch.distributed
collective per tensor (never a home-made one). Every rank must call them in the same order.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from trainkit.engine.process.nested import iter_leaves, map_tensors
from trainkit.engine.process.operation_checks import verify_operation, verify_padding


def _world(group: dist.ProcessGroup | None = None) -> int:
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


def recursively_apply(function: Callable[[torch.Tensor], Any], data: Any) -> Any:
    """Apply ``function`` to every tensor in a nest of lists, tuples and mappings, keeping their types."""
    return map_tensors(function, data)


def _gather_one(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    tensor = tensor.contiguous()
    if tensor.ndim == 0:
        tensor = tensor[None]
    parts = [torch.empty_like(tensor) for _ in range(_world(group))]
    dist.all_gather(parts, tensor, group=group)
    return torch.cat(parts, dim=0)


@verify_operation
def gather(tensor: Any) -> Any:
    """Concatenate every process's tensors along dim 0 (scalars become a vector), in rank order."""
    if _world() == 1:
        return tensor
    return recursively_apply(_gather_one, tensor)


def gather_object(object: Any, group: dist.ProcessGroup | None = None) -> list[Any]:  # noqa: A002 - Accelerate's name
    """Gather picklable objects from every process (of ``group``); lists are concatenated, other objects listed."""
    if _world(group) == 1:
        return list(object) if isinstance(object, list) else [object]
    gathered: list[Any] = [None] * _world(group)
    dist.all_gather_object(gathered, object, group=group)
    if all(isinstance(item, list) for item in gathered):
        return [x for item in gathered for x in item]
    return gathered


# Accelerate's reductions: "max" takes the element-wise maximum, "none" leaves each process's values.
_REDUCTIONS = ("sum", "mean", "max", "none")


@verify_operation
def reduce(data: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
    """All-reduce every tensor (``sum``, ``mean`` or element-wise ``max``; ``none`` copies) times ``scale``;
    returns new tensors."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}.")

    def _reduce(tensor: torch.Tensor) -> torch.Tensor:
        out = tensor.clone()
        if _world() > 1 and reduction != "none":
            dist.all_reduce(out, op=dist.ReduceOp.MAX if reduction == "max" else dist.ReduceOp.SUM)
            if reduction == "mean":
                out /= _world()
        if scale != 1.0:
            out *= scale
        return out

    return recursively_apply(_reduce, data)


@verify_padding
def pad_across_processes(data: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
    """Pad every tensor along ``dim`` (negative counts from the end) to the largest size any process has, so they
    can be gathered. A tensor without that dimension is returned as it is; a nested tensor too, with a
    ``CannotPadNestedTensorWarning``."""
    world = _world()

    def _pad(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.is_nested:
            from trainkit.utils.structures import CannotPadNestedTensorWarning

            warnings.warn("pad_across_processes: a nested tensor cannot be padded; it is returned as it is.",
                          CannotPadNestedTensorWarning, stacklevel=4)
            return tensor
        if world == 1 or not -tensor.ndim <= dim < tensor.ndim:
            return tensor
        axis = dim % tensor.ndim
        size = torch.tensor([tensor.shape[axis]], device=tensor.device)
        longest = int(_gather_one(size).max())
        if longest == tensor.shape[axis]:
            return tensor
        shape = list(tensor.shape)
        shape[axis] = longest
        padded = tensor.new_full(shape, pad_index)
        length = tensor.shape[axis]
        region = slice(longest - length, longest) if pad_first else slice(0, length)
        index = [slice(None)] * tensor.ndim
        index[axis] = region
        padded[tuple(index)] = tensor
        return padded

    return recursively_apply(_pad, data)


@verify_operation
def broadcast(tensor: Any, from_process: int = 0) -> Any:
    """Overwrite every tensor with ``from_process``'s values (in place; returns ``tensor``, a nest of tensors)."""
    if _world() == 1:
        return tensor

    def _broadcast(tensor: torch.Tensor) -> torch.Tensor:
        dist.broadcast(tensor, src=from_process)
        return tensor

    return recursively_apply(_broadcast, tensor)


def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """Overwrite the list's items with ``from_process``'s (in place; returns the list)."""
    if _world() > 1:
        dist.broadcast_object_list(object_list, src=from_process)
    return object_list


def truncate(data: Any, length: int) -> Any:
    """Keep the first ``length`` rows of every tensor (drops the padding of the last global batch)."""
    return recursively_apply(lambda t: t[:length], data)


def keep_real_rows(data: Any, real_counts: list[int]) -> Any:
    """From rows gathered in rank order (equal parts per rank), keep the first ``real_counts[r]`` of rank r's part."""
    def keep(rows: Any) -> Any:
        per_rank = len(rows) // len(real_counts)
        index = [r * per_rank + i for r, count in enumerate(real_counts) for i in range(min(count, per_rank))]
        if isinstance(rows, torch.Tensor):
            return rows[torch.tensor(index, dtype=torch.long, device=rows.device)]
        return [rows[i] for i in index]

    if isinstance(data, list) and not any(isinstance(x, torch.Tensor) for x in data):
        return keep(data)
    return recursively_apply(keep, data)


def scatter_object(objects: list[Any] | None, from_process: int = 0) -> Any:
    """``objects[rank]`` on each process, sent from ``from_process`` (which alone passes the list)."""
    if _world() == 1:
        return objects[0] if objects else None
    received: list[Any] = [None]
    dist.scatter_object_list(received, objects if dist.get_rank() == from_process else None, src=from_process)
    return received[0]


def gather_for_metrics(data: Any, use_gather_object: bool = False, *, real_counts: list[int] | None = None,
                       remainder: int = -1, group: dist.ProcessGroup | None = None) -> Any:
    """Gather ``data``, then drop the rows that only padded the last batch: a stream's padding (``real_counts``:
    real rows per rank) or the even-batches padding of the last global batch (``remainder`` real rows, -1: none).

    ``group``: gather over these processes only (the data-parallel ranks when tensor-parallel groups read the
    same batch, so each sample is counted once)."""
    tensors_only = all(isinstance(t, torch.Tensor) for t in iter_leaves(data))
    if group is not None:
        gathered = gather_object(data, group) if use_gather_object or not tensors_only else (
            data if _world(group) == 1 else recursively_apply(lambda t: _gather_one(t, group), data))
    else:
        gathered = gather_object(data) if use_gather_object or not tensors_only else gather(data)
    if real_counts is not None and sum(real_counts) < _rows(gathered):
        return keep_real_rows(gathered, real_counts)
    if remainder > 0:
        return gathered[:remainder] if isinstance(gathered, list) else truncate(gathered, remainder)
    return gathered


def _rows(data: Any) -> int:
    """Rows (first dimension) of a gathered nest: a list's length, else its first tensor's."""
    if isinstance(data, list) and not any(isinstance(leaf, torch.Tensor) for leaf in iter_leaves(data)):
        return len(data)
    for leaf in iter_leaves(data):
        if isinstance(leaf, torch.Tensor):
            return leaf.shape[0] if leaf.ndim else 1
    return len(data) if isinstance(data, list) else 0


