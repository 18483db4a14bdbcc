"""Walking nests of tensors (lists, tuples, namedtuples, mappings), as ``accelerate.utils.operations`` does.

``recursively_apply`` with Accelerate's signature (extra arguments, ``test_type``, ``error_on_other_type``),
the structure descriptors a process sends before the tensors themselves (:class:`TensorInformation`,
``get_data_structure``, ``initialize_tensors``), and the fp32 output conversion for model forwards.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch


class CannotPadNestedTensorWarning(UserWarning):
    """``pad_across_processes`` met a nested tensor, which it cannot pad (it is returned unchanged)."""


@dataclass
class TensorInformation:
    """Shape and dtype of a tensor, to allocate a matching one on another process."""

    shape: torch.Size
    dtype: torch.dtype


def is_torch_tensor(tensor: Any) -> bool:
    """True for a ``torch.Tensor``."""
    return isinstance(tensor, torch.Tensor)


def is_torch_xpu_tensor(tensor: Any) -> bool:
    """True for a tensor on an Intel XPU (never on the hardware trainkit drives)."""
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "xpu"


def is_tensor_information(tensor_info: Any) -> bool:
    """True for a :class:`TensorInformation`."""
    return isinstance(tensor_info, TensorInformation)


def is_namedtuple(data: Any) -> bool:
    """True for a ``namedtuple`` instance (a tuple with ``_fields``)."""
    return isinstance(data, tuple) and hasattr(data, "_asdict") and hasattr(data, "_fields")


def honor_type(obj: Any, generator: Any) -> Any:
    """Build a container of ``obj``'s type (namedtuples included) from ``generator``."""
    if is_namedtuple(obj):
        return type(obj)(*list(generator))
    return type(obj)(generator)


def recursively_apply(func: Callable[..., Any], data: Any, *args: Any, test_type: Callable[[Any], bool] = is_torch_tensor,
                      error_on_other_type: bool = False, **kwargs: Any) -> Any:
    """``func(leaf, *args, **kwargs)`` for every leaf of ``data`` that passes ``test_type``, keeping the
    containers' types; other leaves are returned as they are, or refused with ``error_on_other_type``."""
    if isinstance(data, (tuple, list)):
        return honor_type(data, (recursively_apply(func, item, *args, test_type=test_type,
                                                   error_on_other_type=error_on_other_type, **kwargs) for item in data))
    if isinstance(data, Mapping):
        mapping_type: Any = type(data)  # dict, OrderedDict, BatchEncoding...: rebuilt from a plain dict
        return mapping_type({key: recursively_apply(func, value, *args, test_type=test_type,
                                                    error_on_other_type=error_on_other_type, **kwargs)
                             for key, value in data.items()})
    if test_type(data):
        return func(data, *args, **kwargs)
    if error_on_other_type:
        raise TypeError(f"Unsupported type {type(data).__name__} passed to {getattr(func, '__name__', func)}: only "
                        "nested lists, tuples and dicts of objects that pass "
                        f"{getattr(test_type, '__name__', test_type)} are accepted.")
    return data


def get_data_structure(data: Any) -> Any:
    """The same nest with a :class:`TensorInformation` in place of each tensor."""
    return recursively_apply(lambda tensor: TensorInformation(shape=tensor.shape, dtype=tensor.dtype), data)


def get_shape(data: Any) -> Any:
    """The same nest with each tensor's shape as a list of ints."""
    return recursively_apply(lambda tensor: list(tensor.shape), data)


def initialize_tensors(data_structure: Any) -> Any:
    """Allocate an empty tensor for each :class:`TensorInformation` of a nest."""
    return recursively_apply(lambda info: torch.empty(info.shape, dtype=info.dtype), data_structure,
                             test_type=is_tensor_information)


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


def ignorant_find_batch_size(data: Any) -> int | None:
    """:func:`find_batch_size`, or None where ``data`` holds no tensor to read it from."""
    try:
        return find_batch_size(data)
    except (ValueError, TypeError):
        return None


def _to_fp32(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor


class ConvertOutputsToFp32:
    """Wrap a forward so that its float16/bfloat16 output tensors come back as float32."""

    def __init__(self, model_forward: Callable[..., Any]) -> None:
        self.model_forward = model_forward
        functools.update_wrapper(self, model_forward)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return recursively_apply(_to_fp32, self.model_forward(*args, **kwargs))

    def __getstate__(self) -> Any:
        raise TypeError("ConvertOutputsToFp32 wraps a bound forward and cannot be pickled; unwrap the model first "
                        "(accelerator.unwrap_model(model, keep_fp32_wrapper=False)).")


def convert_outputs_to_fp32(model_forward: Callable[..., Any]) -> Callable[..., Any]:
    """A forward whose half-precision outputs are returned as float32 (``ConvertOutputsToFp32``)."""
    wrapped = ConvertOutputsToFp32(model_forward)

    def forward(*args: Any, **kwargs: Any) -> Any:
        return wrapped(*args, **kwargs)

    forward.__wrapped__ = model_forward  # type: ignore[attr-defined]  # as functools.wraps records it
    return forward
