"""Writing and reading model weights as safetensors, sharded with an index above a size limit."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import torch

_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"


def parse_size(size: int | str) -> int:
    """Bytes in ``size`` ("10GB", "500MB", or an int)."""
    if isinstance(size, int):
        return size
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B)\s*", size.upper())
    if not match:
        raise ValueError(f"Cannot read size {size!r}; use e.g. '10GB' or '500MB'.")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def _deduplicate(state_dict: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Drop tensors that share storage with an earlier key (tied weights); safetensors refuses them."""
    seen: dict[tuple[int, int, tuple[int, ...]], str] = {}
    kept: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    for name, tensor in state_dict.items():
        key = (tensor.untyped_storage().data_ptr(), int(tensor.storage_offset()), tuple(tensor.shape))
        if tensor.numel() and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        kept[name] = tensor.detach().contiguous().cpu()
    return kept, aliases


def _plain_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU tensors; a later one sharing an earlier one's storage is cloned (safetensors
    refuses shared memory; model weights are de-duplicated with :func:`save_safetensors` first, so this only meets
    optimizer state)."""
    seen: set[tuple[int, int]] = set()
    plain: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        cpu = tensor.detach().contiguous().cpu()
        marker = (cpu.untyped_storage().data_ptr(), int(cpu.storage_offset()))
        plain[key] = cpu.clone() if cpu.numel() and marker in seen else cpu
        seen.add(marker)
    return plain


def write_safetensors_file(tensors: dict[str, torch.Tensor], path: str, metadata: dict[str, str] | None = None) -> None:
    """The one place trainkit writes a safetensors file on a disk: tensors detached, contiguous and on the CPU."""
    from safetensors.torch import save_file

    save_file(_plain_tensors(tensors), path, metadata={"format": "pt", **(metadata or {})})


def safetensors_bytes(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> bytes:
    """What :func:`write_safetensors_file` writes, as bytes (for storage that is not a disk: an object store)."""
    from safetensors.torch import save

    return save(_plain_tensors(tensors), metadata={"format": "pt", **(metadata or {})})


def save_safetensors(state_dict: dict[str, torch.Tensor], directory: str, max_shard_size: int | str = "10GB") -> list[str]:
    """Write ``state_dict`` into ``directory``; return the files written."""
    os.makedirs(directory, exist_ok=True)
    tensors, aliases = _deduplicate(state_dict)
    metadata = {"format": "pt"}
    if aliases:
        metadata["trainkit_tied"] = json.dumps(aliases)
    limit = parse_size(max_shard_size)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    if len(shards) == 1:
        write_safetensors_file(shards[0], os.path.join(directory, WEIGHTS_NAME), metadata)
        return [WEIGHTS_NAME]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map: dict[str, Any] = {}
    for name, shard in zip(names, shards):
        write_safetensors_file(shard, os.path.join(directory, name), metadata)
        weight_map.update(dict.fromkeys(shard, name))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    with open(os.path.join(directory, INDEX_NAME), "w", encoding="utf-8") as handle:
        json.dump({"metadata": {"total_size": total, **({"tied": aliases} if aliases else {})}, "weight_map": weight_map}, handle, indent=2)
    return [*names, INDEX_NAME]


def load_safetensors(directory: str) -> dict[str, torch.Tensor]:
    """Read what :func:`save_safetensors` wrote (single file or index), restoring tied keys."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    single = os.path.join(directory, WEIGHTS_NAME)
    if os.path.exists(single):
        state = load_file(single)
        with safe_open(single, framework="pt") as handle:
            tied = json.loads((handle.metadata() or {}).get("trainkit_tied", "{}"))
    else:
        with open(os.path.join(directory, INDEX_NAME), encoding="utf-8") as handle:
            index = json.load(handle)
        state = {}
        for name in sorted(set(index["weight_map"].values())):
            state.update(load_file(os.path.join(directory, name)))
        tied = index.get("metadata", {}).get("tied", {})
    for alias, source in tied.items():
        state[alias] = state[source]
    return state
