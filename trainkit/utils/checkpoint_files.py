"""Loading weights that ``save_model`` (or ``save_pretrained``) wrote back into a model: Accelerate's
``load_checkpoint_in_model`` without its big-model inference options (device maps, offloading).

A checkpoint is one weights file (``.safetensors``, or a torch ``.bin``/``.pt``), an index file (``*.index.json``:
``{"weight_map": {name: shard}}`` as ``save_pretrained`` writes it, or the bare map) listing the shards, or a folder
holding one index or one weights file. Torch files are read with ``weights_only=True``: nothing is unpickled.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import torch
from torch import nn

from trainkit.utils.model_tensors import load_state_dict

logger = logging.getLogger(__name__)

_SINGLE_NAMES = ("model.safetensors", "pytorch_model.bin")


def checkpoint_files(checkpoint: str | os.PathLike) -> list[str]:
    """The weights files of ``checkpoint`` (a file, or a folder with one weights file or an index of shards)."""
    path = os.fspath(checkpoint)
    if os.path.isfile(path):
        if path.endswith(".index.json"):
            return _shards_of(path)
        return [path]
    if not os.path.isdir(path):
        raise FileNotFoundError(f"load_checkpoint_in_model: {path!r} is neither a weights file nor a folder.")
    indexes = sorted(f for f in os.listdir(path) if f.endswith(".index.json"))
    if len(indexes) == 1:
        return _shards_of(os.path.join(path, indexes[0]))
    for name in _SINGLE_NAMES:
        if os.path.isfile(os.path.join(path, name)):
            return [os.path.join(path, name)]
    weights = sorted(f for f in os.listdir(path) if f.endswith((".safetensors", ".bin", ".pt")))
    if len(weights) == 1 and not indexes:
        return [os.path.join(path, weights[0])]
    raise FileNotFoundError(f"load_checkpoint_in_model: {path!r} holds {len(indexes)} index files (*.index.json) and "
                            f"{len(weights)} weights files; expected one index or one weights file.")


def _shards_of(index_file: str) -> list[str]:
    with open(index_file, encoding="utf-8") as handle:
        index = json.load(handle)
    weight_map = index.get("weight_map", index)
    folder = os.path.dirname(index_file)
    return [os.path.join(folder, name) for name in sorted(set(weight_map.values()))]


def load_checkpoint_in_model(model: nn.Module, checkpoint: str | os.PathLike, device_map: Any = None,
                             offload_folder: str | os.PathLike | None = None, dtype: str | torch.dtype | None = None,
                             offload_state_dict: bool = False, offload_buffers: bool = False,
                             keep_in_fp32_modules: list[str] | None = None, offload_8bit_bnb: bool = False,
                             strict: bool = False, full_state_dict: bool = True,
                             broadcast_from_rank0: bool = False) -> None:
    """Load the weights of ``checkpoint`` into ``model`` in place, on the devices its parameters are on.

    ``dtype`` casts floating-point weights (not those under ``keep_in_fp32_modules``). With ``strict``, a key the
    checkpoint lacks or the model lacks is an error; otherwise it is logged. ``device_map`` may put the whole model
    on one device (``{"": "cpu"}``); splitting it over devices and offloading (big-model inference) are refused.
    """
    device = _one_device(device_map)
    offloading = {"offload_folder": offload_folder, "offload_buffers": offload_buffers,
                  "offload_8bit_bnb": offload_8bit_bnb, "broadcast_from_rank0": broadcast_from_rank0,
                  "full_state_dict": not full_state_dict}
    refused = [name for name, value in offloading.items() if value]
    if refused:
        raise NotImplementedError(f"load_checkpoint_in_model({', '.join(refused)}=...): trainkit does not do big-model "
                                  "inference (device maps, offloading); load the weights, then prepare the model.")
    if offload_state_dict:
        logger.info("load_checkpoint_in_model(offload_state_dict=True): shards are loaded one at a time into the "
                    "model; nothing is offloaded.")
    if device is not None:
        model.to(device)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."))
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"load_checkpoint_in_model(dtype={dtype!r}): give a torch dtype or its name ('float16').")
    expected = set(model.state_dict())
    loaded: set[str] = set()
    unexpected: list[str] = []
    for file in checkpoint_files(checkpoint):
        tensors = load_state_dict(file)
        result = model.load_state_dict(tensors, strict=False)
        unexpected += result.unexpected_keys
        loaded |= set(tensors) - set(result.unexpected_keys)
    if dtype is not None:
        _cast_loaded(model, loaded, dtype, keep_in_fp32_modules or [])
    missing = sorted(expected - loaded - _tied_aliases(model, loaded))
    if missing or unexpected:
        message = (f"Loading {os.fspath(checkpoint)!r} into {type(model).__name__}: weights of the checkpoint were not "
                   f"used when loading: {unexpected}; weights of the model were not in the checkpoint: {missing}")
        if strict:
            raise RuntimeError(message)
        logger.warning(message)


def _one_device(device_map: Any) -> str | torch.device | int | None:
    """The device a device map puts the whole model on (``{"": "cpu"}``, or one device everywhere); a map that
    splits the model, or sends part of it to ``disk``, is big-model inference and refused."""
    if device_map is None:
        return None
    devices = set(device_map.values()) if isinstance(device_map, dict) else {device_map}
    if len(devices) != 1 or next(iter(devices)) in ("disk", "meta", "auto", "balanced", "sequential"):
        raise NotImplementedError(f"load_checkpoint_in_model(device_map={device_map!r}): trainkit does not dispatch a "
                                  "model over devices (big-model inference); give one device for the whole model.")
    return next(iter(devices))


def _cast_loaded(model: nn.Module, loaded: set[str], dtype: torch.dtype, keep_in_fp32: list[str]) -> None:
    """Cast the loaded floating-point parameters and buffers to ``dtype`` in place (the Parameter objects stay,
    so an optimizer built on them still holds them), except those under ``keep_in_fp32``."""
    for name, tensor in (*model.named_parameters(), *model.named_buffers()):
        if name in loaded and tensor.is_floating_point() and not any(f".{m}." in f".{name}." for m in keep_in_fp32):
            tensor.data = tensor.data.to(dtype)


def _tied_aliases(model: nn.Module, loaded: set[str]) -> set[str]:
    """Keys that share storage with a loaded key (tied weights: ``save_model`` writes each once)."""
    by_storage: dict[int, set[str]] = {}
    for key, tensor in model.state_dict(keep_vars=True).items():
        pointer = tensor.untyped_storage().data_ptr()
        if pointer:  # empty and meta tensors have no storage to share
            by_storage.setdefault(pointer, set()).add(key)
    return {key for keys in by_storage.values() if keys & loaded for key in keys}
