"""The weights files of a checkpoint that ``save_model`` (or ``save_pretrained``) wrote, for
``load_checkpoint_in_model`` (:mod:`trainkit.engine.inference.loading`).

A checkpoint is one weights file (``.safetensors``, or a torch ``.bin``/``.pt``), an index file (``*.index.json``:
``{"weight_map": {name: shard}}`` as ``save_pretrained`` writes it, or the bare map) listing the shards, or a folder
holding one index or one weights file. Torch files are read with ``weights_only=True``: nothing is unpickled.
"""

from __future__ import annotations

import json
import os

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
