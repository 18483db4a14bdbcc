"""``accelerate.utils``' operations on nested tensors, as scripts import them.

The collectives are trainkit's engine ones (:mod:`trainkit.engine.process.collectives`); this module adds the
small structural helpers Accelerate exports next to them and keeps Accelerate's defaults where they
differ from the ``Accelerator`` methods (``reduce`` averages here, sums on the Accelerator).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from trainkit.engine.process import collectives
from trainkit.engine.process import collectives
from trainkit.engine.process.collectives import broadcast, broadcast_object_list, gather
from trainkit.engine.data.device import send_to_device as _send_nest_to_device
from trainkit.engine.process.operation_checks import DistributedOperationException, verify_operation
from trainkit.engine.precision.amp import to_float32
from trainkit.utils.structures import (
    CannotPadNestedTensorWarning,
    ConvertOutputsToFp32,
    TensorInformation,
    convert_outputs_to_fp32,
    find_batch_size,
    get_data_structure,
    get_shape,
    honor_type,
    ignorant_find_batch_size,
    initialize_tensors,
    is_namedtuple,
    is_tensor_information,
    is_torch_tensor,
    is_torch_xpu_tensor,
    recursively_apply,
)

# Accelerate's codes for dtypes when a tensor's description travels as integers between processes.
TENSOR_TYPE_TO_INT = {torch.float32: 1, torch.float64: 2, torch.float16: 3, torch.bfloat16: 4, torch.uint8: 5,
                      torch.int8: 6, torch.int16: 7, torch.int32: 8, torch.int64: 9, torch.bool: 10}
TENSOR_INT_TO_DTYPE = {code: dtype for dtype, code in TENSOR_TYPE_TO_INT.items()}

__all__ = [
    "CannotPadNestedTensorWarning", "ConvertOutputsToFp32", "DistributedOperationException", "GatheredParameters",
    "TENSOR_INT_TO_DTYPE", "TENSOR_TYPE_TO_INT", "TensorInformation", "broadcast", "broadcast_object_list",
    "chained_operation", "concatenate", "convert_outputs_to_fp32", "convert_to_fp32", "copy_tensor_to_devices",
    "extract_model_from_parallel", "find_batch_size", "find_device", "gather", "gather_object", "gather_tensor_shape",
    "get_data_structure", "get_shape", "honor_type", "ignorant_find_batch_size", "initialize_tensors",
    "is_namedtuple", "is_tensor_information", "is_torch_tensor", "is_torch_xpu_tensor", "listify",
    "pad_across_processes", "pad_input_tensors", "recursively_apply", "reduce", "save", "send_to_device",
    "slice_tensors", "verify_operation", "wait_for_everyone",
]



def gather_object(object: Any) -> list[Any]:  # noqa: A002 - Accelerate's name
    """Gather picklable objects from every process (Accelerate's signature: all processes, no group)."""
    return collectives.gather_object(object)

def _same_mapping_type(original: Mapping[Any, Any], items: dict[Any, Any]) -> Any:
    """``items`` as the mapping class of ``original`` (dict, OrderedDict, BatchEncoding, ...), whose constructor
    takes a dict; the ``Mapping`` ABC itself declares no constructor."""
    kind: Callable[[dict[Any, Any]], Any] = type(original)
    return kind(items)


def send_to_device(tensor: Any, device: Any, non_blocking: bool = False, skip_keys: Any = None) -> Any:
    """Every tensor of a nest (and anything with ``.to``, e.g. a ``BatchEncoding``) on ``device``; values under
    ``skip_keys`` (a key or a list of keys, at any mapping level) stay where they are."""
    if skip_keys is None:
        return _send_nest_to_device(tensor, device, non_blocking)
    keys = [skip_keys] if isinstance(skip_keys, str) else list(skip_keys)
    if isinstance(tensor, Mapping):
        return _same_mapping_type(tensor, {key: value if key in keys else send_to_device(value, device, non_blocking, keys)
                                           for key, value in tensor.items()})
    if isinstance(tensor, (tuple, list)):
        return honor_type(tensor, (send_to_device(item, device, non_blocking, keys) for item in tensor))
    return _send_nest_to_device(tensor, device, non_blocking)


def chained_operation(function: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: a :class:`DistributedOperationException` inside ``function`` is re-raised naming it too."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except DistributedOperationException as error:
            raise DistributedOperationException(
                f"Error while calling {function.__module__}.{function.__name__}; see the error above.") from error

    return wrapper


def gather_tensor_shape(tensor: torch.Tensor | None) -> torch.Tensor:
    """On every process, the shape (an int tensor) of a tensor that exactly one process holds (None elsewhere)."""
    shapes = gather_object([None if tensor is None else list(tensor.shape)])
    held = [shape for shape in shapes if shape is not None]
    if len(held) != 1:
        raise DistributedOperationException(f"gather_tensor_shape needs the tensor on exactly one process; "
                                            f"{len(held)} processes hold one.")
    from trainkit.engine.process.state import ProcessState

    return torch.tensor(held[0], dtype=torch.int, device=ProcessState.get().device)


def pad_input_tensors(tensor: Any, batch_size: int, num_processes: int, dim: int = 0) -> Any:
    """Zero-pad every tensor along ``dim`` from ``batch_size`` rows to the next multiple of ``num_processes``
    (at least ``num_processes``), so each process gets a share of the batch."""
    target = max(num_processes, -(-batch_size // num_processes) * num_processes)

    def pad(part: torch.Tensor) -> torch.Tensor:
        shape = list(part.shape)
        shape[dim] = target - batch_size + part.shape[dim]
        padded = part.new_zeros(shape)
        padded.narrow(dim, 0, part.shape[dim]).copy_(part)
        return padded

    return recursively_apply(pad, tensor, error_on_other_type=True)


@contextlib.contextmanager
def GatheredParameters(params: Any, modifier_rank: int | None = None, fwd_module: Any = None,  # noqa: N802
                       enabled: bool = True) -> Iterator[None]:
    """DeepSpeed ZeRO-3's parameter-gathering context. trainkit runs DeepSpeed configs on FSDP2/DDP without
    ZeRO-3's partitioned parameters, so (as in Accelerate without ZeRO-3 init) there is nothing to gather."""
    yield


def convert_to_fp32(tensor: Any) -> Any:
    """Turn every float16/bfloat16 tensor of a nest into float32, keeping container types."""
    return to_float32(tensor)


def reduce(tensor: Any, reduction: str = "mean", scale: float = 1.0) -> Any:
    """All-reduce every tensor across processes (``mean`` by default, as in ``accelerate.utils``)."""
    return collectives.reduce(tensor, reduction, scale)


def pad_across_processes(tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
    """Pad tensors along ``dim`` to the largest size any process has."""
    return collectives.pad_across_processes(tensor, dim, pad_index, pad_first)


def copy_tensor_to_devices(tensor: torch.Tensor | None = None) -> torch.Tensor:
    """Send a tensor that exists on one process only (``None`` elsewhere) to every process."""
    import torch.distributed as dist

    from trainkit.engine.process.state import ProcessState

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
    """Concatenate a list of same-structured nests of tensors along ``dim`` (a list of one is returned as it is)."""
    if len(data) == 1:
        return data[0]
    first = data[0]
    if isinstance(first, (tuple, list)):
        return honor_type(first, (concatenate([d[i] for d in data], dim=dim) for i in range(len(first))))
    if isinstance(first, Mapping):
        return _same_mapping_type(first, {key: concatenate([d[key] for d in data], dim=dim) for key in first})
    if not isinstance(first, torch.Tensor):
        raise TypeError(f"concatenate: can only concatenate tensors, got {type(first).__name__}.")
    return torch.cat(data, dim=dim)


def slice_tensors(data: Any, tensor_slice: slice, process_index: int | None = None,
                  num_processes: int | None = None) -> Any:
    """Apply ``tensor_slice`` to every tensor of a nest."""
    return recursively_apply(lambda t: t[tensor_slice], data)


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
    from trainkit.engine.step.unwrapping import extract_model

    return extract_model(model, keep_fp32_wrapper=keep_fp32_wrapper, keep_torch_compile=keep_torch_compile,
                         recursive=recursive)


def wait_for_everyone() -> None:
    """Barrier across all processes (nothing on a single process)."""
    from trainkit.engine.process.state import ProcessState

    ProcessState.get().wait_for_everyone()


def save(obj: Any, f: str | os.PathLike, save_on_each_node: bool = False, safe_serialization: bool = False) -> None:
    """Write ``obj`` once (main process, or each machine's first with ``save_on_each_node``)."""
    from trainkit.engine.process.state import ProcessState

    state = ProcessState.get()
    if not (state.is_local_main_process if save_on_each_node else state.is_main_process):
        return
    if safe_serialization:
        from safetensors.torch import save_file

        from trainkit.utils.model_tensors import clean_state_dict_for_safetensors

        tensors = clean_state_dict_for_safetensors(dict(obj))  # one name per shared storage, with a warning
        save_file({k: v.detach().cpu() for k, v in tensors.items()}, os.fspath(f), metadata={"format": "pt"})
    else:
        torch.save(obj, f)
