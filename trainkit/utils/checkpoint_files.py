"""Loading weights that ``save_model`` (or ``save_pretrained``) wrote back into a model: Accelerate's
``load_checkpoint_in_model`` without its big-model inference options (device maps, offloading).

A checkpoint is one weights file (``.safetensors`` or a torch ``.bin``), or a folder holding one of them or an
index (``model.safetensors.index.json`` / ``pytorch_model.bin.index.json``) that lists the shards. Torch files are
read with ``weights_only=True``: nothing is unpickled.
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

_INDEX_NAMES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
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
    for name in _INDEX_NAMES:
        if os.path.isfile(os.path.join(path, name)):
            return _shards_of(os.path.join(path, name))
    for name in _SINGLE_NAMES:
        if os.path.isfile(os.path.join(path, name)):
            return [os.path.join(path, name)]
    weights = sorted(f for f in os.listdir(path) if f.endswith((".safetensors", ".bin")))
    if len(weights) == 1:
        return [os.path.join(path, weights[0])]
    raise FileNotFoundError(f"load_checkpoint_in_model: {path!r} holds no index ({' or '.join(_INDEX_NAMES)}) and "
                            f"{'several' if weights else 'no'} weights files{f' ({weights})' if weights else ''}.")


def _shards_of(index_file: str) -> list[str]:
    with open(index_file, encoding="utf-8") as handle:
        weight_map = json.load(handle)["weight_map"]
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
    checkpoint lacks or the model lacks is an error; otherwise it is logged. The big-model inference options
    (``device_map``, ``offload_*``) are refused: load, then prepare the model.
    """
    offloading = {"device_map": device_map, "offload_folder": offload_folder, "offload_state_dict": offload_state_dict,
                  "offload_buffers": offload_buffers, "offload_8bit_bnb": offload_8bit_bnb,
                  "broadcast_from_rank0": broadcast_from_rank0, "full_state_dict": not full_state_dict}
    refused = [name for name, value in offloading.items() if value]
    if refused:
        raise NotImplementedError(f"load_checkpoint_in_model({', '.join(refused)}=...): trainkit does not do big-model "
                                  "inference (device maps, offloading); load the weights, then prepare the model.")
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."))
    expected = set(model.state_dict())
    loaded: set[str] = set()
    unexpected: list[str] = []
    for file in checkpoint_files(checkpoint):
        tensors = load_state_dict(file)
        if dtype is not None:
            tensors = {key: _cast(key, value, dtype, keep_in_fp32_modules or []) for key, value in tensors.items()}
        result = model.load_state_dict(tensors, strict=False)
        unexpected += result.unexpected_keys
        loaded |= set(tensors) - set(result.unexpected_keys)
    missing = sorted(expected - loaded - _tied_aliases(model, loaded))
    if missing or unexpected:
        message = f"load_checkpoint_in_model({os.fspath(checkpoint)!r}): missing {missing}, unexpected {unexpected}"
        if strict:
            raise RuntimeError(message)
        logger.warning(message)


def _cast(key: str, tensor: torch.Tensor, dtype: torch.dtype, keep_in_fp32: list[str]) -> torch.Tensor:
    if not tensor.is_floating_point() or any(f".{name}." in f".{key}." for name in keep_in_fp32):
        return tensor
    return tensor.to(dtype)


def _tied_aliases(model: nn.Module, loaded: set[str]) -> set[str]:
    """Keys that share storage with a loaded key (tied weights: ``save_model`` writes each once)."""
    by_storage: dict[int, set[str]] = {}
    for key, tensor in model.state_dict(keep_vars=True).items():
        pointer = tensor.untyped_storage().data_ptr()
        if pointer:  # empty and meta tensors have no storage to share
            by_storage.setdefault(pointer, set()).add(key)
    return {key for keys in by_storage.values() if keys & loaded for key in keys}
