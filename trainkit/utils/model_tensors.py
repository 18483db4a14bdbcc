"""Inspecting a model's tensors, as ``accelerate.utils`` offers it: tied parameters, storage identity, byte
sizes, sub-state-dicts, and loading weights without unpickling arbitrary objects.
"""

from __future__ import annotations

import enum
import logging
import re
from collections import defaultdict
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)


class CustomDtype(enum.Enum):
    """Sub-byte and fp8 element types that torch has no dtype for (sizes in :func:`dtype_byte_size`)."""

    FP8 = "fp8"
    INT4 = "int4"
    INT2 = "int2"


def find_tied_parameters(model: nn.Module, **kwargs: Any) -> list[list[str]]:
    """Groups of parameter names that share one parameter object (e.g. tied input/output embeddings)."""
    groups: dict[int, list[str]] = defaultdict(list)
    for name, parameter in model.named_parameters(remove_duplicate=False):
        groups[id(parameter)].append(name)
    return sorted(sorted(names) for names in groups.values() if len(names) > 1)


def retie_parameters(model: nn.Module, tied_params: list[list[str]]) -> None:
    """Make each group of names point at one parameter again (the first one not on the meta device)."""
    for group in tied_params:
        owners = [(model.get_submodule(name.rpartition(".")[0]), name.rpartition(".")[2]) for name in group]
        keep = next((getattr(module, attr) for module, attr in owners
                     if getattr(module, attr).device != torch.device("meta")), None)
        if keep is not None:
            for module, attr in owners:
                setattr(module, attr, keep)


def named_module_tensors(module: nn.Module, include_buffers: bool = True, recurse: bool = False,
                         remove_non_persistent: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """The module's parameters, then (with ``include_buffers``) its buffers, by name."""
    yield from module.named_parameters(recurse=recurse)
    if not include_buffers:
        return
    skipped: set[str] = set()
    if remove_non_persistent:
        for prefix, submodule in (module.named_modules() if recurse else [("", module)]):
            skipped |= {f"{prefix}.{name}" if prefix else name for name in submodule._non_persistent_buffers_set}
    for name, buffer in module.named_buffers(recurse=recurse):
        if name not in skipped:
            yield name, buffer


def get_non_persistent_buffers(module: nn.Module, recurse: bool = False, fqns: bool = False) -> set[str]:
    """Names of the module's non-persistent buffers (those ``state_dict`` leaves out), in a new set.

    With ``recurse`` the submodules' count too, by their own names, or by dotted full names with ``fqns``."""
    if not recurse:
        return set(module._non_persistent_buffers_set)
    names: set[str] = set()
    for prefix, submodule in module.named_modules():
        for name in submodule._non_persistent_buffers_set:
            names.add(f"{prefix}.{name}" if fqns and prefix else name)
    return names


def id_tensor_storage(tensor: torch.Tensor) -> tuple[torch.device, int, int]:
    """(device, storage address, storage size): equal for tensors that share memory."""
    storage = tensor.untyped_storage()
    return tensor.device, storage.data_ptr(), storage.nbytes()


def clean_state_dict_for_safetensors(state_dict: dict) -> dict:
    """Keep one name per shared storage (safetensors refuses aliasing) and make every tensor contiguous."""
    by_storage: dict[Any, list[str]] = defaultdict(list)
    for name, tensor in state_dict.items():
        if isinstance(tensor, torch.Tensor):
            by_storage[id_tensor_storage(tensor)].append(name)
    removed = [name for names in by_storage.values() for name in names[1:]]
    for name in removed:
        del state_dict[name]
    if removed:
        logger.warning(f"Removed shared tensor {removed} while saving: they alias another entry, which keeps their "
                       "values (tie them again after loading).")
    return {key: value.contiguous() if isinstance(value, torch.Tensor) else value for key, value in state_dict.items()}


def dtype_byte_size(dtype: torch.dtype | CustomDtype) -> float:
    """Bytes per element of ``dtype`` (``torch.bool``: 1/8, ``CustomDtype.INT4``: 1/2)."""
    if dtype == torch.bool:
        return 1 / 8
    special = {CustomDtype.INT2: 1 / 4, CustomDtype.INT4: 1 / 2, CustomDtype.FP8: 1.0}
    if isinstance(dtype, CustomDtype):
        return special[dtype]
    if "float8" in str(dtype):
        return 1.0
    bits = re.search(r"[^\d](\d+)_?", str(dtype))
    if bits is None:
        raise ValueError(f"dtype_byte_size: {dtype} is not a sized dtype.")
    return int(bits.group(1)) / 8


_UNITS = {"GIB": 2**30, "MIB": 2**20, "KIB": 2**10, "GB": 10**9, "MB": 10**6, "KB": 10**3}


def convert_file_size_to_int(size: int | str) -> int:
    """Bytes in ``size``: an int, or a string with a unit ("5GB" = 5e9, "5GiB" = 5 * 2**30; "b" for bits)."""
    if isinstance(size, int):
        return size
    text = size.upper()
    for unit, factor in _UNITS.items():
        if text.endswith(unit):
            try:
                value = int(float(size[: -len(unit)]) * factor)
            except ValueError:
                break
            if value < 0:
                break
            return value // 8 if size.endswith("b") else value
    raise ValueError(f"size {size!r} is not valid: use an integer of bytes or a string with a unit, like '5.0GB'.")


def compute_module_sizes(model: nn.Module, dtype: str | torch.dtype | None = None,
                         special_dtypes: dict[str, str | torch.dtype] | None = None,
                         buffers_only: bool = False) -> dict[str, int]:
    """Bytes of every submodule and tensor (by name, "" for the whole model), counting each tensor in ``dtype``
    when given (never larger than its own dtype) and ``special_dtypes[name]`` for the names listed there."""
    def as_dtype(value: str | torch.dtype) -> torch.dtype:
        return getattr(torch, value.replace("torch.", "")) if isinstance(value, str) else value

    sizes: dict[str, int] = defaultdict(int)
    tensors = model.named_buffers(recurse=True) if buffers_only else named_module_tensors(model, recurse=True)
    for name, tensor in tensors:
        if special_dtypes is not None and name in special_dtypes:
            size = tensor.numel() * dtype_byte_size(as_dtype(special_dtypes[name]))
        elif dtype is not None:
            size = tensor.numel() * min(dtype_byte_size(as_dtype(dtype)), dtype_byte_size(tensor.dtype))
        else:
            size = tensor.numel() * dtype_byte_size(tensor.dtype)
        parts = name.split(".")
        for depth in range(len(parts) + 1):  # the model (""), each enclosing module and the tensor itself
            sizes[".".join(parts[:depth])] += int(size)
    return dict(sizes)


def compute_module_total_buffer_size(model: nn.Module, dtype: str | torch.dtype | None = None,
                                     special_dtypes: dict[str, str | torch.dtype] | None = None) -> int:
    """Bytes of all the model's buffers (counted as :func:`compute_module_sizes` counts them)."""
    return compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes, buffers_only=True).get("", 0)


def extract_submodules_state_dict(state_dict: dict[str, torch.Tensor], submodule_names: list[str]) -> dict:
    """The entries of ``state_dict`` that belong to the named submodules (``h.1`` does not take ``h.10``)."""
    return {key: value for name in submodule_names for key, value in state_dict.items()
            if key == name or key.startswith(name + ".")}


def get_module_children_bottom_up(model: nn.Module, return_fqns: bool = False) -> list[Any]:
    """Every module, children before their parents (the model last); with ``return_fqns`` (name, module) pairs."""
    ordered: list[Any] = []
    stack: list[tuple[str, nn.Module]] = [("", model)]
    while stack:
        name, module = stack.pop()
        stack.extend((f"{name}.{child_name}" if name else child_name, child)
                     for child_name, child in module.named_children())
        ordered.append((name, module) if return_fqns else module)
    return ordered[::-1]


def model_has_dtensor(model: nn.Module) -> bool:
    """True when the model's parameters are DTensors (sharded by FSDP2)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(parameter, DTensor) for parameter in model.parameters())


def load(f: Any, map_location: Any = None, **kwargs: Any) -> Any:
    """``torch.load`` that only loads tensors and plain containers (``weights_only=True`` unless told otherwise)."""
    kwargs.setdefault("weights_only", True)
    return torch.load(f, map_location=map_location, **kwargs)


def load_state_dict(checkpoint_file: str, device_map: Any = None) -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` file, or of a torch checkpoint loaded with ``weights_only=True``.

    Torch checkpoints load on the CPU. A safetensors file loads on the CPU too, or, with ``device_map`` (module
    names to devices), each tensor straight on the device of its nearest enclosing key (integers are CUDA
    indices; ``"disk"`` and names the map does not cover load on the CPU)."""
    if not str(checkpoint_file).endswith(".safetensors"):
        return load(checkpoint_file, map_location="cpu")
    from safetensors import safe_open
    from safetensors.torch import load_file

    if device_map is None:
        return load_file(checkpoint_file, device="cpu")
    with safe_open(checkpoint_file, framework="pt") as file:
        devices = {name: _mapped_device(name, device_map) for name in file.keys()}  # safe_open is no mapping
    tensors = {}
    for device in dict.fromkeys(devices.values()):  # one pass per device, each tensor read straight onto it
        with safe_open(checkpoint_file, framework="pt", device=device) as file:
            tensors.update({name: file.get_tensor(name) for name, where in devices.items() if where == device})
    return {name: tensors[name] for name in devices}


def mapped_key(name: str, device_map: Mapping[str, Any]) -> str | None:
    """The key of ``device_map`` that places tensor or module ``name``: its own, else its nearest enclosing
    module's (``""`` places everything); None when no key does."""
    scope = name
    while scope not in device_map:
        if not scope:
            return None
        scope = scope.rpartition(".")[0]
    return scope


def _mapped_device(name: str, device_map: Mapping[str, Any]) -> Any:
    """Where to read tensor ``name`` for ``device_map``: its device (integers are CUDA indices), or the CPU for
    ``"disk"`` and names the map does not place."""
    key = mapped_key(name, device_map)
    device = "cpu" if key is None else device_map[key]
    if device in ("disk", "meta"):
        return "cpu"
    return f"cuda:{device}" if isinstance(device, int) else device
