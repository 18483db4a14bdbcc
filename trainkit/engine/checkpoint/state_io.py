"""Pickle-free storage of nested state: the structure as JSON, its tensors in one safetensors file.

``state_dict()`` results (optimizers, schedulers, the loss scaler, registered objects) mix tensors
with ints, floats, strings, tuples and dicts keyed by ints. :func:`encode_state` turns such a nest into
a JSON-ready skeleton in which each tensor is replaced by a reference ``{"__tensor__": key}``; keys
are the tensor's path in the nest, so the same structure always gives the same keys (the sharded path
relies on that to line up saved and expected tensors). Anything else (functions, arbitrary objects)
is refused with its path, because storing it would need pickle.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import torch

TENSOR_TAG = "__tensor__"
TUPLE_TAG = "__tuple__"
ITEMS_TAG = "__items__"  # a dict whose keys are not all strings (e.g. optimizer state keyed by param id)
FLOAT_TAG = "__float__"  # inf and nan, which strict JSON cannot hold


def encode_state(state: Any, path: str = "") -> tuple[Any, dict[str, torch.Tensor]]:
    """Split ``state`` into a JSON-serialisable skeleton and ``{key: tensor}`` (tensors left where they live)."""
    tensors: dict[str, torch.Tensor] = {}
    skeleton = _encode(state, path, tensors)
    return skeleton, tensors


def _encode(value: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        key = path or "tensor"
        tensors[key] = value
        return {TENSOR_TAG: key}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {FLOAT_TAG: repr(value)}
    if hasattr(value, "item") and hasattr(value, "dtype") and getattr(value, "ndim", 1) == 0:
        return _encode(value.item(), path, tensors)  # numpy scalar
    if hasattr(value, "tolist") and hasattr(value, "dtype"):
        return _encode(value.tolist(), path, tensors)  # numpy array
    if isinstance(value, tuple):
        return {TUPLE_TAG: [_encode(v, f"{path}/{i}", tensors) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, f"{path}/{i}", tensors) for i, v in enumerate(value)]
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and not any(k.startswith("__") and k.endswith("__") for k in value):
            return {k: _encode(v, f"{path}/{k}", tensors) for k, v in value.items()}
        return {ITEMS_TAG: [[_encode(k, f"{path}/key{i}", tensors), _encode(v, f"{path}/{k}", tensors)]
                            for i, (k, v) in enumerate(value.items())]}
    raise TypeError(
        f"Cannot store {type(value).__name__} at {path or '<root>'!r} without pickle; a state_dict() may only "
        "hold tensors, numbers, strings, booleans, None, lists, tuples and dicts of them."
    )


def decode_state(skeleton: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Rebuild the nest from a skeleton and its tensors (the inverse of :func:`encode_state`)."""
    if isinstance(skeleton, list):
        return [decode_state(v, tensors) for v in skeleton]
    if not isinstance(skeleton, dict):
        return skeleton
    if TENSOR_TAG in skeleton:
        key = skeleton[TENSOR_TAG]
        if key not in tensors:
            raise KeyError(f"Tensor {key!r} is referenced by the checkpoint's JSON but missing from its tensors.")
        return tensors[key]
    if TUPLE_TAG in skeleton:
        return tuple(decode_state(v, tensors) for v in skeleton[TUPLE_TAG])
    if ITEMS_TAG in skeleton:
        return {decode_state(k, tensors): decode_state(v, tensors) for k, v in skeleton[ITEMS_TAG]}
    if FLOAT_TAG in skeleton:
        return float(skeleton[FLOAT_TAG])
    return {k: decode_state(v, tensors) for k, v in skeleton.items()}


def write_json(data: Any, path: str) -> None:
    """Write ``data`` as JSON and flush it to disk (the manifest's checksums are taken from the file).

    While an asynchronous save is captured, the text is made now (a snapshot) and written by the background
    writer (see :mod:`.staging`): the loop does not wait for the disk. The text is compact: an indented dump
    goes through json's pure-Python encoder, which took about 1 ms of the loop per save for the random
    states alone (~1,250 integers), where the C encoder takes a few microseconds."""
    from .staging import active_recorder

    text = json.dumps(data, allow_nan=False)
    recorder = active_recorder()
    if recorder is not None:
        recorder.defer_text(text, path)
        return
    write_text_now(text, path)


def write_text_now(text: str, path: str, fsync: bool = True) -> None:
    """Write ``text`` to ``path`` and flush it to disk (``fsync=False``: the caller's commit does, as the
    checksum pass of :func:`.atomic.commit_checkpoint` fsyncs every file before the manifest is written)."""
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        if fsync:
            os.fsync(handle.fileno())


def read_json(path: str) -> Any:
    """Read a JSON file written by :func:`write_json`."""
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def save_tensors(tensors: dict[str, torch.Tensor], path: str) -> None:
    """Write plain (non-distributed) tensors to a safetensors file, copied to the CPU (or, while an
    asynchronous save is captured, record the write for its background writer: see :mod:`.staging`)."""
    from .staging import active_recorder

    recorder = active_recorder()
    if recorder is not None:
        recorder.defer("safetensors", tensors, path)
        return
    write_tensors_now(tensors, path)


def write_tensors_now(tensors: dict[str, torch.Tensor], path: str) -> None:
    """Write a safetensors file now (what :func:`save_tensors` does outside an asynchronous capture)."""
    from trainkit.engine.checkpoint.serialization import write_safetensors_file

    write_safetensors_file(tensors, path)


def load_tensors(path: str) -> dict[str, torch.Tensor]:
    """Read a safetensors file onto the CPU."""
    from safetensors.torch import load_file

    return load_file(path)


def state_document(skeleton: Any) -> dict[str, Any]:
    """The JSON document :func:`save_state` writes for a skeleton made by :func:`encode_state`."""
    return {"format": "trainkit-state/1", "state": skeleton}


def save_state(state: Any, directory: str, name: str) -> list[str]:
    """Store ``state`` as ``name.json`` (+ ``name.safetensors`` when it holds tensors); return the file names."""
    skeleton, tensors = encode_state(state)
    files = [f"{name}.json"]
    write_json(state_document(skeleton), os.path.join(directory, files[0]))
    if tensors:
        files.append(f"{name}.safetensors")
        save_tensors(tensors, os.path.join(directory, files[1]))
    return files


def load_state(directory: str, name: str) -> Any:
    """Read what :func:`save_state` wrote under ``name``."""
    document = read_json(os.path.join(directory, f"{name}.json"))
    tensor_path = os.path.join(directory, f"{name}.safetensors")
    tensors = load_tensors(tensor_path) if os.path.exists(tensor_path) else {}
    return decode_state(document["state"], tensors)
