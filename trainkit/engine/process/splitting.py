"""``split_between_processes``: each process's contiguous share of some inputs, for distributed inference.

Shares are as even as possible (the first ``len % processes`` processes get one item more). With
``apply_padding`` every share has the longest share's length, made up with the last item repeated, so the
results can be gathered and the padding cut off. On one process the inputs come back unchanged.
"""

from __future__ import annotations

from typing import Any

import torch


def share_bounds(length: int, index: int, parts: int) -> tuple[int, int]:
    """``[start, end)`` of process ``index``'s share of ``length`` items split into ``parts``."""
    per, extra = divmod(length, parts)
    start = index * per + min(index, extra)
    return start, start + per + (1 if index < extra else 0)


def split_between(inputs: Any, index: int, parts: int, apply_padding: bool = False) -> Any:
    """Process ``index``'s share of a list, tuple, tensor, ``datasets.Dataset``, or dict of those.

    A dict's values must all have the same length; it is split value by value into a new dict (the
    caller's dict is left as it was). A ``Dataset`` gives a ``Dataset`` (``Dataset.select`` of the share).
    Other sliceable sequences (NumPy arrays, ranges...) are sliced like a list.
    """
    if parts == 1:
        return inputs
    length = _length(inputs)
    start, end = share_bounds(length, index, parts)
    padded_length = -(-length // parts) if apply_padding and length else None
    if isinstance(inputs, dict):
        return {key: _share(value, start, end, padded_length) for key, value in inputs.items()}
    return _share(inputs, start, end, padded_length)


def _length(inputs: Any) -> int:
    if isinstance(inputs, dict):
        lengths = {key: _length(value) for key, value in inputs.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"split_between_processes: every value of a dict must have the same length; got {lengths}.")
        return next(iter(lengths.values()), 0)
    if isinstance(inputs, (str, bytes)) or not hasattr(inputs, "__len__") or not hasattr(inputs, "__getitem__"):
        raise TypeError(f"split_between_processes takes a list, tuple, tensor, datasets.Dataset or a dict of those; "
                        f"got {type(inputs).__name__}.")
    return len(inputs)


def _share(values: Any, start: int, end: int, padded_length: int | None) -> Any:
    """``values[start:end]``, made ``padded_length`` long with the last item when given."""
    if _is_hf_dataset(values):
        indices = list(range(start, end))
        if padded_length is not None:
            indices += [len(values) - 1] * (padded_length - len(indices))
        return values.select(indices)
    part = values[start:end]
    missing = 0 if padded_length is None else padded_length - len(part)
    if missing <= 0:
        return part
    last = values[-1:]
    if isinstance(part, torch.Tensor):
        return torch.cat([part, last.expand(missing, *last.shape[1:])])
    if isinstance(part, tuple):
        return part + tuple(last) * missing
    if isinstance(part, list):
        return part + list(last) * missing
    raise TypeError(f"split_between_processes(apply_padding=True) cannot pad a {type(values).__name__}; "
                    "pass a list, tuple, tensor or datasets.Dataset.")


def _is_hf_dataset(values: Any) -> bool:
    """A ``datasets.Dataset`` (checked by type, so ``datasets`` is imported only by those who use it)."""
    return any(cls.__module__.startswith("datasets.") and cls.__name__ == "Dataset" for cls in type(values).__mro__)
