"""Writing and reading model weights: safetensors (or torch's pickle format, for ``save_model(safe_serialization=False)``),
sharded with an index above a size limit, with Accelerate's file names."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
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


@dataclass(frozen=True)
class WeightsFormat:
    """The file names ``save_model`` writes in one format (Accelerate's and transformers' names)."""

    single: str
    """The one file of an unsharded save."""
    shard_prefix: str
    shard_suffix: str
    """A shard is ``{prefix}-00001-of-00003{suffix}``."""
    index: str
    """The index naming each tensor's shard, beside the shards."""

    def shard_name(self, number: int, count: int) -> str:
        """The name of shard ``number`` (from 1) of ``count``."""
        return f"{self.shard_prefix}-{number:05d}-of-{count:05d}{self.shard_suffix}"

    def owns(self, filename: str) -> bool:
        """True for a file this format's saves write (the single file, the index, or any shard)."""
        shard = re.fullmatch(rf"{re.escape(self.shard_prefix)}-\d{{5}}-of-\d{{5}}{re.escape(self.shard_suffix)}",
                             filename)
        return filename in (self.single, self.index) or shard is not None


SAFETENSORS = WeightsFormat(WEIGHTS_NAME, "model", ".safetensors", INDEX_NAME)
TORCH_PICKLE = WeightsFormat("pytorch_model.bin", "pytorch_model", ".bin", "pytorch_model.bin.index.json")


def split_into_shards(tensors: dict[str, torch.Tensor], max_shard_size: int | str) -> list[dict[str, torch.Tensor]]:
    """``tensors`` in key order, cut into shards of at most ``max_shard_size`` bytes: a shard closes when the next
    tensor would take it over the limit, and a tensor larger than the limit gets a shard of its own, placed where it
    was met (so the shards are those of ``huggingface_hub``'s splitter, which Accelerate and transformers use)."""
    limit = parse_size(max_shard_size)
    shards: list[dict[str, torch.Tensor]] = []
    current: dict[str, torch.Tensor] = {}
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes > limit:
            shards.append({name: tensor})
            continue
        if size + nbytes > limit:
            shards.append(current)
            current, size = {}, 0
        current[name] = tensor
        size += nbytes
    if current or not shards:
        shards.append(current)
    return shards


def save_weights(state_dict: dict[str, torch.Tensor], directory: str, max_shard_size: int | str = "10GB",
                 safe_serialization: bool = True, remove_stale: bool = False) -> list[str]:
    """Write ``state_dict`` into ``directory`` as Accelerate's ``save_model`` does; return the files written.

    ``safe_serialization``: ``model.safetensors``, or ``model-0000i-of-0000n.safetensors`` shards with
    ``model.safetensors.index.json``; tied names are written once and listed in the metadata. Otherwise torch's
    format: ``pytorch_model.bin``, or ``pytorch_model-0000i-of-0000n.bin`` shards with
    ``pytorch_model.bin.index.json``; tied names stay in their source's shard, sharing its storage.
    ``remove_stale``: files of the same format left by an earlier save that this one does not write are removed, so
    the folder holds one model (``save_model``'s folder; never a checkpoint's, whose files its manifest lists)."""
    os.makedirs(directory, exist_ok=True)
    tensors, aliases = _deduplicate(state_dict)
    shards = split_into_shards(tensors, max_shard_size)
    weights = SAFETENSORS if safe_serialization else TORCH_PICKLE
    names = [weights.single] if len(shards) == 1 else [weights.shard_name(i + 1, len(shards)) for i in range(len(shards))]
    written = [*names, *([] if len(shards) == 1 else [weights.index])]
    if remove_stale:
        _remove_stale_files(directory, weights, keep=set(written))
    tied_metadata = {"trainkit_tied": json.dumps(aliases)} if aliases else None
    weight_map: dict[str, str] = {}
    for name, shard in zip(names, shards):
        if safe_serialization:
            write_safetensors_file(shard, os.path.join(directory, name), tied_metadata)
        else:
            shard = {**shard, **{alias: shard[source] for alias, source in aliases.items() if source in shard}}
            torch.save(shard, os.path.join(directory, name))
        weight_map.update(dict.fromkeys(shard, name))
    if len(shards) > 1:
        totals: dict[str, Any] = {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())}
        if aliases and safe_serialization:
            totals["tied"] = aliases
        with open(os.path.join(directory, weights.index), "w", encoding="utf-8") as handle:
            handle.write(json.dumps({"metadata": totals, "weight_map": weight_map}, indent=2, sort_keys=True) + "\n")
    return written


def save_safetensors(state_dict: dict[str, torch.Tensor], directory: str, max_shard_size: int | str = "10GB") -> list[str]:
    """Write ``state_dict`` into ``directory`` as safetensors (:func:`save_weights`); return the files written."""
    return save_weights(state_dict, directory, max_shard_size, safe_serialization=True)


def _remove_stale_files(directory: str, weights: WeightsFormat, keep: set[str]) -> None:
    """Remove the files of ``weights``' format an earlier save left in ``directory`` (a single file beside a new
    index would otherwise be read instead of it; a shard past the new count would linger)."""
    for filename in os.listdir(directory):
        path = os.path.join(directory, filename)
        if filename not in keep and weights.owns(filename) and os.path.isfile(path):
            os.remove(path)


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
