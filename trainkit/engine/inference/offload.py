"""Weights kept outside the model: on disk as raw ``.dat`` files described by an ``index.json``, or in a mapping.

The on-disk format is Accelerate's, so folders written by either library load in the other: one ``<name>.dat``
file per tensor holding its bytes in C order (what a NumPy memmap of that dtype and shape reads; a 0-d tensor
is stored as one element), and ``index.json`` mapping each name to ``{"dtype": ..., "shape": [...]}`` (dtype by
its torch/NumPy name: ``float32``, ``bfloat16``, ``float8_e4m3fn``...). The files are written and read with
``torch.from_file`` (a memory map), so bfloat16 and FP8 need no integer reinterpretation here.

:class:`OffloadedWeightsLoader` is the lazy mapping the offload hooks read weights from: a state dict first, then
the ``.dat`` files of a folder, or safetensors files named by an index (``safetensors_file``/``weight_name``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

INDEX_FILE = "index.json"


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"offload index: unknown dtype {name!r} (expected a torch dtype name such as 'float32').")
    return dtype


def offload_weight(weight: torch.Tensor, weight_name: str, offload_folder: str | os.PathLike,
                   index: dict | None = None) -> dict | None:
    """Write ``weight`` to ``<offload_folder>/<weight_name>.dat``; record its dtype and shape in ``index`` (when
    given) and return ``index``. The folder must exist; call :func:`save_offload_index` to write the index."""
    data = weight.detach().to("cpu").contiguous().reshape(-1)
    path = os.path.join(offload_folder, f"{weight_name}.dat")
    if index is not None:
        index[weight_name] = {"dtype": str(weight.dtype).removeprefix("torch."), "shape": list(weight.shape)}
    size = data.numel() * data.element_size()
    if size == 0:
        open(path, "wb").close()
        return index
    if os.path.exists(path):
        os.remove(path)  # from_file maps an existing file at its own size: start from an empty one
    mapped = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
    mapped.copy_(data.view(torch.uint8))
    del mapped  # unmapping flushes the bytes to the file
    return index


def load_offloaded_weight(weight_file: str | os.PathLike, weight_info: Mapping[str, Any]) -> torch.Tensor:
    """Read a tensor written by :func:`offload_weight`, given its index entry (``dtype`` and ``shape``)."""
    dtype, shape = _dtype(weight_info["dtype"]), tuple(weight_info["shape"])
    count = 1
    for dim in shape:
        count *= dim
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    # shared=False maps the file privately: the tensor never writes back; clone() detaches it from the file.
    return torch.from_file(str(weight_file), shared=False, size=count, dtype=dtype).reshape(shape).clone()


def save_offload_index(index: dict | None, offload_folder: str | os.PathLike) -> None:
    """Merge ``index`` into ``<offload_folder>/index.json`` (created when absent); nothing to do for an empty one."""
    if not index:
        return
    path = os.path.join(offload_folder, INDEX_FILE)
    current = {}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as file:
            current = json.load(file)
    current.update(index)
    with open(path, "w", encoding="utf-8") as file:
        json.dump(current, file, indent=2)


def offload_state_dict(save_dir: str | os.PathLike, state_dict: dict[str, torch.Tensor]) -> None:
    """Write every tensor of ``state_dict`` to ``save_dir`` (created if needed) with its ``index.json``."""
    os.makedirs(save_dir, exist_ok=True)
    index: dict = {}
    for name, tensor in state_dict.items():
        offload_weight(tensor, name, save_dir, index=index)
    save_offload_index(index, save_dir)


def load_offloaded_weights(model: nn.Module, index: dict | None, offload_folder: str | os.PathLike) -> None:
    """Put every tensor that ``index`` lists back into ``model`` on the CPU, read from ``offload_folder``."""
    from trainkit.utils.tensor_placement import set_module_tensor_to_device

    for name, info in (index or {}).items():
        weight = load_offloaded_weight(os.path.join(offload_folder, f"{name}.dat"), info)
        set_module_tensor_to_device(model, name, "cpu", value=weight)


class PrefixedDataset(Mapping):
    """The entries of ``dataset`` whose keys start with ``prefix``, read by the rest of the key.

    As in Accelerate, ``len`` is the length of the whole underlying mapping."""

    def __init__(self, dataset: Mapping, prefix: str) -> None:
        self.dataset = dataset
        self.prefix = prefix

    def __getitem__(self, key: str) -> Any:
        return self.dataset[f"{self.prefix}{key}"]

    def __iter__(self) -> Iterator[str]:
        return iter([key for key in self.dataset if key.startswith(self.prefix)])

    def __len__(self) -> int:
        return len(self.dataset)


class OffloadedWeightsLoader(Mapping):
    """A read-only mapping name -> tensor over weights kept outside the model: ``state_dict`` first, then the
    entries of ``index`` (read from ``save_folder/index.json`` when only the folder is given), each loaded on
    access from its ``.dat`` file or, when the entry names a ``safetensors_file``, from that file (on ``device``,
    the CPU by default)."""

    def __init__(self, state_dict: dict[str, torch.Tensor] | None = None,
                 save_folder: str | os.PathLike | None = None, index: Mapping | None = None,
                 device: Any = None) -> None:
        if state_dict is None and save_folder is None and index is None:
            raise ValueError("OffloadedWeightsLoader needs a state_dict, a save_folder or an index of offloaded "
                             "weights (all three are None).")
        self.state_dict = state_dict if state_dict is not None else {}
        self.save_folder = save_folder
        if index is None and save_folder is not None:
            with open(os.path.join(save_folder, INDEX_FILE), encoding="utf-8") as file:
                index = json.load(file)
        self.index = index if index is not None else {}
        self.all_keys = list(self.state_dict) + [key for key in self.index if key not in self.state_dict]
        self.device = device

    def __getitem__(self, key: str) -> torch.Tensor:
        if key in self.state_dict:
            return self.state_dict[key]
        info = self.index[key]
        if info.get("safetensors_file") is not None:
            return self._from_safetensors(key, info)
        if self.save_folder is None:
            raise KeyError(f"{key!r} is in the offload index without a safetensors_file, and no save_folder was given")
        return load_offloaded_weight(os.path.join(self.save_folder, f"{key}.dat"), info)

    def _from_safetensors(self, key: str, info: Mapping[str, Any]) -> torch.Tensor:
        from safetensors import safe_open

        device = "cpu" if self.device is None else self.device
        with safe_open(info["safetensors_file"], framework="pt", device="cpu") as file:
            tensor = file.get_tensor(info.get("weight_name", key))
        if "dtype" in info:
            tensor = tensor.to(_dtype(info["dtype"]))
        return tensor.to(device)

    def __iter__(self) -> Iterator[str]:
        return iter(self.all_keys)

    def __len__(self) -> int:
        return len(self.all_keys)
