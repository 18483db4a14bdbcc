"""Loading a checkpoint into a model: ``load_checkpoint_in_model`` (in place, or tensor by tensor to the devices a
device map names, parts offloaded to disk) and ``load_checkpoint_and_dispatch`` (plan a map, load, dispatch).

A checkpoint is one weights file, an index of shards, or a folder holding either
(:func:`trainkit.utils.checkpoint_files.checkpoint_files`); torch files are read with ``weights_only=True``. With a
device map, each tensor goes to the device of its nearest enclosing key; ``"disk"`` tensors are written to
``offload_folder`` (Accelerate's ``.dat`` files and ``index.json``) and left on the ``meta`` device for the offload
hooks of ``dispatch_model`` to bring in. The model may be built on the ``meta`` device (``init_empty_weights``).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from trainkit.engine.inference.device_map import (DeviceMap, check_device_map, check_tied_parameters_in_config,
                                                  check_tied_parameters_on_same_device, device_of,
                                                  infer_auto_device_map)
from trainkit.engine.inference.memory_budget import Device, get_balanced_memory
from trainkit.utils.checkpoint_files import checkpoint_files
from trainkit.utils.model_tensors import find_tied_parameters, load_state_dict, retie_parameters
from trainkit.utils.tensor_placement import set_module_tensor_to_device

logger = logging.getLogger(__name__)

_PLANNED_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def _as_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """``dtype`` as a torch dtype ("float16" and "torch.float16" name one)."""
    resolved = getattr(torch, dtype.removeprefix("torch."), None) if isinstance(dtype, str) else dtype
    if dtype is not None and not isinstance(resolved, torch.dtype):
        raise TypeError(f"load_checkpoint_in_model(dtype={dtype!r}): give a torch dtype or its name ('float16').")
    return resolved


class _Placement:
    """Where and in which dtype each tensor of a checkpoint goes in ``model`` along ``device_map``."""

    def __init__(self, model: nn.Module, device_map: Mapping[str, Any], dtype: torch.dtype | None,
                 keep_in_fp32_modules: list[str], offload_folder: str | os.PathLike | None, offload_buffers: bool,
                 offload_state_dict: bool) -> None:
        self.model, self.device_map, self.dtype, self.keep_in_fp32 = model, device_map, dtype, keep_in_fp32_modules
        self.offload_folder, self.offload_buffers = offload_folder, offload_buffers
        self.buffers = {name for name, _ in model.named_buffers()}
        self.model_dtypes = {name: tensor.dtype for name, tensor in model.state_dict(keep_vars=True).items()}
        self.disk_index: dict = {}
        # offload_state_dict: CPU tensors wait on disk until all are read, so the CPU holds one shard at a time
        self.parked_folder = tempfile.mkdtemp(prefix="trainkit-state-dict-") if offload_state_dict else None
        self.parked_index: dict = {}

    def dtype_for(self, name: str, tensor: torch.Tensor) -> torch.dtype:
        """``dtype`` (float32 under ``keep_in_fp32_modules``) for floating-point tensors when given; else the
        dtype of the model's tensor it replaces (integer tensors keep theirs)."""
        if not tensor.is_floating_point():
            return tensor.dtype
        if self.dtype is None:
            return self.model_dtypes[name]
        return torch.float32 if any(f".{module}." in f".{name}." for module in self.keep_in_fp32) else self.dtype

    def put(self, name: str, tensor: torch.Tensor) -> None:
        try:
            self._put(name, tensor)
        except ValueError as error:  # set_module_tensor_to_device names the tensor by its short name only
            raise ValueError(f"Loading {name!r} from the checkpoint: {error}") from error

    def _put(self, name: str, tensor: torch.Tensor) -> None:
        from trainkit.engine.inference.offload import offload_weight

        device = device_of(name, self.device_map)
        value = tensor.to(self.dtype_for(name, tensor))
        if device == "disk" and (self.offload_buffers or name not in self.buffers):
            folder, index = self.offload_folder, self.disk_index
        elif device in ("cpu", "disk") and self.parked_folder is not None:
            folder, index = self.parked_folder, self.parked_index
        else:
            # the buffers of disk parts stay in memory unless offload_buffers (dispatch_model moves them)
            set_module_tensor_to_device(self.model, name, "cpu" if device == "disk" else device, value=value,
                                        dtype=value.dtype)
            return
        assert folder is not None
        set_module_tensor_to_device(self.model, name, "meta", value=value.to("meta"), dtype=value.dtype)
        offload_weight(value, name, folder, index=index)

    def finish(self) -> None:
        """Write the disk index; bring the parked CPU tensors back into the model."""
        if not self.disk_index and self.parked_folder is None:
            return
        from trainkit.engine.inference.offload import load_offloaded_weights, save_offload_index

        if self.disk_index:
            assert self.offload_folder is not None
            save_offload_index(self.disk_index, self.offload_folder)
        if self.parked_folder is not None:
            load_offloaded_weights(self.model, self.parked_index, self.parked_folder)

    def close(self) -> None:
        """Remove the parked weights' folder (also when loading failed)."""
        if self.parked_folder is not None:
            shutil.rmtree(self.parked_folder, ignore_errors=True)


def _check_arguments(model: nn.Module, device_map: Mapping[str, Any] | None,
                     offload_folder: str | os.PathLike | None, tied: list[list[str]], refused: dict[str, bool]) -> None:
    given = [name for name, value in refused.items() if value]
    if given:
        raise NotImplementedError(f"load_checkpoint_in_model({', '.join(given)}=...): trainkit does not drive this "
                                  "(bitsandbytes 8-bit offload, sharded or rank-0-broadcast loading); load the full "
                                  "state dict on each process.")
    if not tied and check_tied_parameters_in_config(model):
        logger.warning("The model's config ties weights but none are tied: call model.tie_weights() before loading.")
    if device_map is None:
        return
    check_device_map(model, device_map)  # before anything moves: every tensor has a device
    check_tied_parameters_on_same_device(tied, device_map)
    if "disk" in device_map.values():
        if offload_folder is None:
            raise ValueError("load_checkpoint_in_model: the device_map sends parts of the model to 'disk'; pass "
                             "offload_folder= (a folder to write their weights to).")
        os.makedirs(offload_folder, exist_ok=True)


def load_checkpoint_in_model(model: nn.Module, checkpoint: str | os.PathLike, device_map: DeviceMap | None = None,
                             offload_folder: str | os.PathLike | None = None, dtype: str | torch.dtype | None = None,
                             offload_state_dict: bool = False, offload_buffers: bool = False,
                             keep_in_fp32_modules: list[str] | None = None, offload_8bit_bnb: bool = False,
                             strict: bool = False, full_state_dict: bool = True,
                             broadcast_from_rank0: bool = False) -> None:
    """Load the weights of ``checkpoint`` into ``model`` in place.

    Without ``device_map`` the tensors keep their devices (tensors on ``meta`` are created on the CPU). With it,
    each tensor goes to the device the map gives it (``"disk"``: written to ``offload_folder``, left on ``meta``;
    its buffers stay on the CPU unless ``offload_buffers``); ``offload_state_dict`` keeps the CPU tensors on disk
    until every shard is read. ``dtype`` casts floating-point weights, except those under
    ``keep_in_fp32_modules`` (float32); without it, weights take the dtype of the model's tensors. With
    ``strict``, a key the checkpoint lacks or the model lacks is an error; otherwise it is logged. Tied
    parameters are tied again at the end. ``dispatch_model`` (or ``load_checkpoint_and_dispatch``) then makes a
    model spread over devices runnable."""
    tied = find_tied_parameters(model)
    _check_arguments(model, device_map, offload_folder, tied, {
        "offload_8bit_bnb": offload_8bit_bnb, "full_state_dict": not full_state_dict,
        "broadcast_from_rank0": broadcast_from_rank0})
    dtype = _as_dtype(dtype)
    placement = (None if device_map is None else _Placement(model, device_map, dtype, keep_in_fp32_modules or [],
                                                            offload_folder, offload_buffers, offload_state_dict))
    expected = set(model.state_dict())
    try:
        loaded, unexpected = _load_files(model, checkpoint, device_map, placement, expected)
        if placement is not None:
            placement.finish()
    finally:
        if placement is not None:
            placement.close()
    if placement is None and dtype is not None:
        _cast_loaded(model, loaded, dtype, keep_in_fp32_modules or [])
    retie_parameters(model, tied)
    _report_keys(model, checkpoint, sorted(expected - loaded - _tied_aliases(model, loaded, tied)), unexpected, strict)


def _load_files(model: nn.Module, checkpoint: str | os.PathLike, device_map: DeviceMap | None,
                placement: _Placement | None, expected: set[str]) -> tuple[set[str], list[str]]:
    """Load each file of the checkpoint in turn (in place, or along the placement); the names loaded, and the
    names the model does not have."""
    loaded: set[str] = set()
    unexpected: list[str] = []
    for file in checkpoint_files(checkpoint):
        tensors = load_state_dict(file, device_map=device_map)
        unexpected += [name for name in tensors if name not in expected]
        known = {name: tensor for name, tensor in tensors.items() if name in expected}
        if placement is None:
            _load_in_place(model, known)
        else:
            for name, tensor in known.items():
                placement.put(name, tensor)
        loaded |= set(known)
        del tensors, known
    return loaded, unexpected


def _load_in_place(model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Copy into the model's tensors; a tensor still on ``meta`` has no memory to copy into, so it is set on the
    CPU instead."""
    on_meta = {name for name, tensor in model.state_dict(keep_vars=True).items() if tensor.device.type == "meta"}
    model.load_state_dict({name: value for name, value in tensors.items() if name not in on_meta}, strict=False)
    for name in on_meta & set(tensors):
        set_module_tensor_to_device(model, name, "cpu", value=tensors[name])


def _report_keys(model: nn.Module, checkpoint: str | os.PathLike, missing: list[str], unexpected: list[str],
                 strict: bool) -> None:
    if not missing and not unexpected:
        return
    message = (f"Loading {os.fspath(checkpoint)!r} into {type(model).__name__}: weights of the checkpoint were not "
               f"used when loading: {unexpected}; weights of the model were not in the checkpoint: {missing}")
    if strict:
        raise RuntimeError(message)
    logger.warning(message)


def _cast_loaded(model: nn.Module, loaded: set[str], dtype: torch.dtype, keep_in_fp32: list[str]) -> None:
    """Cast the loaded floating-point parameters and buffers to ``dtype`` in place (the Parameter objects stay,
    so an optimizer built on them still holds them), except those under ``keep_in_fp32``."""
    for name, tensor in (*model.named_parameters(), *model.named_buffers()):
        if name in loaded and tensor.is_floating_point() and not any(f".{m}." in f".{name}." for m in keep_in_fp32):
            tensor.data = tensor.data.to(dtype)


def _tied_aliases(model: nn.Module, loaded: set[str], tied: list[list[str]]) -> set[str]:
    """Keys that share a tensor with a loaded key (tied weights: ``save_model`` writes each once)."""
    aliases = {name for group in tied if set(group) & loaded for name in group}
    by_storage: dict[int, set[str]] = {}
    for key, tensor in model.state_dict(keep_vars=True).items():
        pointer = tensor.untyped_storage().data_ptr()
        if pointer:  # empty and meta tensors have no storage to share
            by_storage.setdefault(pointer, set()).add(key)
    return aliases | {key for keys in by_storage.values() if keys & loaded for key in keys}


def load_checkpoint_and_dispatch(model: nn.Module, checkpoint: str | os.PathLike,
                                 device_map: str | DeviceMap | None = None,
                                 max_memory: Mapping[Device, int | str] | None = None,
                                 no_split_module_classes: Iterable[str] | None = None,
                                 offload_folder: str | os.PathLike | None = None, offload_buffers: bool = False,
                                 dtype: str | torch.dtype | None = None, offload_state_dict: bool | None = None,
                                 skip_keys: str | list[str] | None = None,
                                 preload_module_classes: list[str] | None = None, force_hooks: bool = False,
                                 strict: bool = False, full_state_dict: bool = True,
                                 broadcast_from_rank0: bool = False) -> nn.Module:
    """Load ``checkpoint`` into ``model`` along ``device_map`` and dispatch it (``dispatch_model``), in one call.

    ``device_map`` may be planned here: ``"auto"``/``"balanced"`` spread the model evenly over the accelerators
    (:func:`get_balanced_memory`), ``"balanced_low_0"`` keeps accelerator 0 as empty as it can, ``"sequential"``
    fills them in order; then CPU and disk (:func:`infer_auto_device_map`, within ``max_memory``). With a map that
    uses the disk, ``offload_state_dict`` defaults to True. Without a map the model is loaded in place and
    returned as is."""
    if isinstance(device_map, str):
        if device_map not in _PLANNED_MAPS:
            raise ValueError(f"load_checkpoint_and_dispatch(device_map={device_map!r}): a device map given by name is "
                             f"one of {list(_PLANNED_MAPS)}; or give a dict of module names to devices.")
        if device_map != "sequential":
            max_memory = get_balanced_memory(model, max_memory=max_memory, dtype=dtype,
                                             no_split_module_classes=no_split_module_classes,
                                             low_zero=device_map == "balanced_low_0")
        device_map = infer_auto_device_map(model, max_memory=max_memory, dtype=dtype, offload_buffers=offload_buffers,
                                           no_split_module_classes=no_split_module_classes)
    if offload_state_dict is None:
        offload_state_dict = device_map is not None and "disk" in device_map.values()
    load_checkpoint_in_model(model, checkpoint, device_map=device_map, offload_folder=offload_folder, dtype=dtype,
                             offload_state_dict=offload_state_dict, offload_buffers=offload_buffers, strict=strict,
                             full_state_dict=full_state_dict, broadcast_from_rank0=broadcast_from_rank0)
    if device_map is None:
        return model
    from trainkit.engine.inference.dispatch import dispatch_model

    return dispatch_model(model, device_map=device_map, offload_dir=offload_folder, offload_buffers=offload_buffers,
                          skip_keys=skip_keys, preload_module_classes=preload_module_classes, force_hooks=force_hooks)
