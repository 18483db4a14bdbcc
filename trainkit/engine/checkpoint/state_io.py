"""Pickle-free storage of nested state: the structure as JSON, its tensors in one safetensors file.

``state_dict()`` results (optimizers, schedulers, the loss scaler, registered objects) mix tensors
with ints, floats, strings, tuples and dicts keyed by ints. :func:`encode_state` turns such a nest into
a JSON-ready skeleton in which each tensor is replaced by a reference ``{"__tensor__": key}``; keys
are the tensor's path in the nest, so the same structure always gives the same keys (the sharded path
relies on that to line up saved and expected tensors). Anything else (functions, arbitrary objects)
is refused with its path, because storing it would need pickle.

Files are written through a :class:`~.sinks.FileSink` (now, or recorded for the background writer) and read
through a :class:`~.storage.base.CheckpointStorage`: these functions never open a path themselves.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .sinks import FileSink
    from .storage.base import CheckpointStorage

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


def json_bytes(data: Any) -> bytes:
    """Compact JSON (json's C encoder: an indented dump goes through the pure-Python one, about 1 ms of the loop
    per save for the random states alone)."""
    return json.dumps(data, allow_nan=False).encode("utf-8")


def write_json(sink: FileSink, data: Any, path: str) -> None:
    """Write ``data`` as JSON through ``sink`` (while an asynchronous save is captured, the text is made now: a
    snapshot, and written by the background writer)."""
    sink.data(json_bytes(data), path)


def read_json(storage: CheckpointStorage, path: str) -> Any:
    """Read a JSON file written by :func:`write_json`."""
    return json.loads(storage.read_bytes(path).decode("utf-8"))


def load_tensors(storage: CheckpointStorage, path: str) -> dict[str, torch.Tensor]:
    """Read a safetensors file onto the CPU (memory-mapped on a disk)."""
    local = storage.local_path(path)
    if local is not None:
        from safetensors.torch import load_file

        return load_file(local)
    from safetensors.torch import load

    return load(storage.read_bytes(path))


def state_document(skeleton: Any) -> dict[str, Any]:
    """The JSON document :func:`save_state` writes for a skeleton made by :func:`encode_state`."""
    return {"format": "trainkit-state/1", "state": skeleton}


def save_state(sink: FileSink, state: Any, directory: str, name: str) -> list[str]:
    """Store ``state`` as ``name.json`` (+ ``name.safetensors`` when it holds tensors); return the file names."""
    skeleton, tensors = encode_state(state)
    files = [f"{name}.json"]
    write_json(sink, state_document(skeleton), sink.storage.join(directory, files[0]))
    if tensors:
        files.append(f"{name}.safetensors")
        sink.tensors(tensors, sink.storage.join(directory, files[1]))
    return files


def load_state(storage: CheckpointStorage, directory: str, name: str) -> Any:
    """Read what :func:`save_state` wrote under ``name``."""
    document = read_json(storage, storage.join(directory, f"{name}.json"))
    tensor_path = storage.join(directory, f"{name}.safetensors")
    tensors = load_tensors(storage, tensor_path) if storage.exists(tensor_path) else {}
    return decode_state(document["state"], tensors)


def read_optional(storage: CheckpointStorage, directory: str, name: str) -> Any:
    """:func:`load_state` when ``name.json`` exists, else None."""
    return load_state(storage, directory, name) if storage.exists(storage.join(directory, f"{name}.json")) else None
