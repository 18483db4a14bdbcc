"""Putting one named tensor of a module on a device (and dtype): ``set_module_tensor_to_device``.

Scripts use it to materialise a model built under :func:`trainkit.utils.modeling.init_empty_weights` (``meta``
tensors) tensor by tensor from a checkpoint, and to move or recast single weights; the big-model offload hooks
place weights with it. ``fp16_statistics`` (bitsandbytes) is refused by name; ``tied_params_map`` (the offload hooks' record of tied weights
already placed per device) is honoured.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def _owner(module: nn.Module, tensor_name: str) -> tuple[nn.Module, str]:
    """The submodule that holds ``tensor_name`` (dotted from ``module``) and the tensor's own name in it."""
    *path, name = tensor_name.split(".")
    owner = module.get_submodule(".".join(path)) if path else module
    if name not in owner._parameters and name not in owner._buffers:
        raise ValueError(f"{type(owner).__name__} at {'.'.join(path) or '<root>'!r} has no parameter or buffer "
                         f"named {name!r} (full name {tensor_name!r}).")
    return owner, name


def _keeps_integer_type(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex)


def set_module_tensor_to_device(module: nn.Module, tensor_name: str, device: int | str | torch.device,
                                value: torch.Tensor | None = None, dtype: str | torch.dtype | None = None,
                                fp16_statistics: torch.Tensor | None = None,
                                tied_params_map: dict[int, dict[Any, torch.Tensor]] | None = None,
                                non_blocking: bool = False, clear_cache: bool = True) -> None:
    """Put the parameter or buffer ``tensor_name`` (dotted names reach submodules) on ``device``.

    With ``value`` the tensor's content is replaced (its shape must match); a tensor on ``meta`` needs a
    ``value`` to go anywhere else. A ``value`` takes the old tensor's dtype, or ``dtype`` when given (integer
    and bool values keep theirs then); as in Accelerate, ``dtype`` applies to a ``value`` only (a move alone
    keeps the tensor's dtype). A parameter stays a parameter of the same class, with its
    ``requires_grad``; a buffer stays a buffer. ``clear_cache`` empties the accelerator's cache after a move
    off an accelerator. ``tied_params_map`` (data pointer of a tied weight -> {device: tensor placed there}): a
    tensor whose pointer is a key reuses the copy already on ``device``, or records the one made."""
    if fp16_statistics is not None:
        raise NotImplementedError("set_module_tensor_to_device: fp16_statistics belongs to bitsandbytes 8-bit "
                                  "weights, which trainkit does not drive (docs/migrating-from-accelerate.md).")
    owner, name = _owner(module, tensor_name)
    old = owner._parameters[name] if name in owner._parameters else owner._buffers[name]
    assert old is not None, f"{tensor_name} is registered as None"
    target = torch.device(f"cuda:{device}" if isinstance(device, int) else device)
    if old.device.type == "meta" and target.type != "meta" and value is None:
        raise ValueError(f"{tensor_name} is on the meta device (no data): pass value= to put it on {target}.")
    if value is not None and value.shape != old.shape:
        raise ValueError(f"{name}: the new value has shape {tuple(value.shape)}, the tensor it replaces "
                         f"{tuple(old.shape)}; a value must keep the tensor's shape.")
    new = old if value is None else value
    copies = None if tied_params_map is None else tied_params_map.get(new.data_ptr())
    if copies is not None and device in copies:  # a tied weight another module already put on this device
        shared = copies[device]
        if name in owner._parameters:
            owner._parameters[name] = shared if isinstance(shared, nn.Parameter) else nn.Parameter(shared)
        else:
            owner._buffers[name] = shared
        return
    if value is not None and dtype is None:
        new = new.to(old.dtype)  # a value takes the dtype of the tensor it replaces
    elif value is not None and dtype is not None and not _keeps_integer_type(new.dtype):
        new = new.to(getattr(torch, dtype.replace("torch.", "")) if isinstance(dtype, str) else dtype)
    with torch.no_grad():
        new = new.to(target, non_blocking=non_blocking)
    if name in owner._parameters:
        param_class = type(old) if isinstance(old, nn.Parameter) else nn.Parameter
        owner._parameters[name] = param_class(new, requires_grad=old.requires_grad)
    else:
        owner._buffers[name] = new
    if copies is not None:
        placed = owner._parameters[name] if name in owner._parameters else owner._buffers[name]
        assert placed is not None  # set just above
        copies[device] = placed
    if clear_cache and old.device.type not in ("cpu", "meta") and old.device != target:
        from trainkit.utils.memory import clear_device_cache

        clear_device_cache()
