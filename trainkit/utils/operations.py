"""``accelerate.utils``' operations on nested tensors, as scripts import them.

The collectives are trainkit's engine ones (:mod:`trainkit.engine.collectives`); this module adds the
small structural helpers Accelerate exports next to them and keeps Accelerate's defaults where they
differ from the ``Accelerator`` methods (``reduce`` averages here, sums on the Accelerator).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from trainkit.engine import collectives
from trainkit.engine.collectives import broadcast, broadcast_object_list, gather, gather_object, recursively_apply
from trainkit.engine.data.device import send_to_device
from trainkit.engine.operation_checks import DistributedOperationException, verify_operation
from trainkit.engine.precision import to_float32

__all__ = [
    "DistributedOperationException", "broadcast", "broadcast_object_list", "concatenate", "convert_to_fp32",
    "copy_tensor_to_devices", "extract_model_from_parallel", "find_batch_size", "find_device", "gather",
    "gather_object", "honor_type", "is_torch_tensor", "listify", "pad_across_processes", "recursively_apply",
    "reduce", "save", "send_to_device", "slice_tensors", "verify_operation", "wait_for_everyone",
]


def convert_to_fp32(tensor: Any) -> Any:
    """Turn every float16/bfloat16 tensor of a nest into float32, keeping container types."""
    return to_float32(tensor)


def is_torch_tensor(tensor: Any) -> bool:
    """True for a ``torch.Tensor``."""
    return isinstance(tensor, torch.Tensor)


def honor_type(obj: Any, generator: Any) -> Any:
    """Build a container of ``obj``'s type (namedtuples included) from ``generator``."""
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*list(generator))
    return type(obj)(generator)


def reduce(tensor: Any, reduction: str = "mean", scale: float = 1.0) -> Any:
    """All-reduce every tensor across processes (``mean`` by default, as in ``accelerate.utils``)."""
    return collectives.reduce(tensor, reduction, scale)


def pad_across_processes(tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
    """Pad tensors along ``dim`` to the largest size any process has."""
    return collectives.pad_across_processes(tensor, dim, pad_index, pad_first)


def copy_tensor_to_devices(tensor: torch.Tensor | None = None) -> torch.Tensor:
    """Send a tensor that exists on one process only (``None`` elsewhere) to every process."""
    import torch.distributed as dist

    from trainkit.engine.state import ProcessState

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        if tensor is None:
            raise ValueError("copy_tensor_to_devices: no process holds a tensor.")
        return tensor
    owners: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(owners, None if tensor is None else (list(tensor.shape), tensor.dtype))
    holders = [rank for rank, info in enumerate(owners) if info is not None]
    if len(holders) != 1:
        raise DistributedOperationException(f"copy_tensor_to_devices needs the tensor on exactly one process; "
                                            f"processes {holders} hold one.")
    shape, dtype = owners[holders[0]]
    if tensor is None:
        tensor = torch.zeros(shape, dtype=dtype, device=ProcessState.get().device)
    return collectives.broadcast(tensor.clone(), from_process=holders[0])


def concatenate(data: list[Any], dim: int = 0) -> Any:
    """Concatenate a list of same-structured nests of tensors along ``dim``."""
    first = data[0]
    if isinstance(first, (tuple, list)):
        return honor_type(first, (concatenate([d[i] for d in data], dim=dim) for i in range(len(first))))
    if isinstance(first, Mapping):
        return type(first)({key: concatenate([d[key] for d in data], dim=dim) for key in first})
    if not isinstance(first, torch.Tensor):
        raise TypeError(f"concatenate: can only concatenate tensors, got {type(first).__name__}.")
    return torch.cat(data, dim=dim)


def slice_tensors(data: Any, tensor_slice: slice, process_index: int | None = None,
                  num_processes: int | None = None) -> Any:
    """Apply ``tensor_slice`` to every tensor of a nest."""
    return recursively_apply(lambda t: t[tensor_slice], data)


def find_batch_size(data: Any) -> int:
    """The size of the first dimension of the first tensor found in ``data``."""
    if isinstance(data, (tuple, list)):
        if not data:
            raise ValueError("find_batch_size: cannot find a batch size in an empty sequence.")
        return find_batch_size(data[0])
    if isinstance(data, Mapping):
        for value in data.values():
            return find_batch_size(value)
        raise ValueError("find_batch_size: cannot find a batch size in an empty mapping.")
    if not isinstance(data, torch.Tensor):
        raise TypeError(f"find_batch_size: expected tensors, got {type(data).__name__}.")
    return data.shape[0]


def find_device(data: Any) -> torch.device | None:
    """The device of the first tensor found in ``data`` (None when there is none)."""
    if isinstance(data, torch.Tensor):
        return data.device
    values = data.values() if isinstance(data, Mapping) else data if isinstance(data, (list, tuple)) else []
    for value in values:
        device = find_device(value)
        if device is not None:
            return device
    return None


def listify(data: Any) -> Any:
    """Every tensor of a nest as (nested) Python numbers."""
    return recursively_apply(lambda t: t.tolist(), data)


def extract_model_from_parallel(model: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True,
                                recursive: bool = False) -> nn.Module:
    """The user's module inside DDP / DataParallel (FSDP2 shards in place: the module itself); a
    ``torch.compile`` wrapper is kept around it unless ``keep_torch_compile=False``."""
    from trainkit.engine.unwrapping import extract_model

    return extract_model(model, keep_fp32_wrapper=keep_fp32_wrapper, keep_torch_compile=keep_torch_compile,
                         recursive=recursive)


def wait_for_everyone() -> None:
    """Barrier across all processes (nothing on a single process)."""
    from trainkit.engine.state import ProcessState

    ProcessState.get().wait_for_everyone()


def save(obj: Any, f: str | os.PathLike, save_on_each_node: bool = False, safe_serialization: bool = False) -> None:
    """Write ``obj`` once (main process, or each machine's first with ``save_on_each_node``)."""
    from trainkit.engine.state import ProcessState

    state = ProcessState.get()
    if not (state.is_local_main_process if save_on_each_node else state.is_main_process):
        return
    if safe_serialization:
        from safetensors.torch import save_file

        save_file({k: v.detach().contiguous().cpu() for k, v in obj.items()}, os.fspath(f), metadata={"format": "pt"})
    else:
        torch.save(obj, f)
