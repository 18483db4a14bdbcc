"""The one walker over nested batches and outputs: tensors inside dicts, Mappings, lists, tuples and namedtuples.

Moving batches to the device, casting outputs to float32, every collective and the evaluation loop's
host conversion all go through :func:`map_tensors`; :func:`iter_leaves` lists the leaves of the same nests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any

import torch


def map_tensors(function: Callable[[torch.Tensor], Any], data: Any, *, update_mappings_in_place: bool = False,
                mapping_hook: Callable[[Mapping], Any] | None = None) -> Any:
    """Apply ``function`` to every tensor in ``data``, keeping container types; other leaves pass unchanged.

    A plain dict is rebuilt as a dict. Another Mapping is rebuilt with its own type, or, with
    ``update_mappings_in_place``, updated key by key (``ModelOutput`` keeps its type and refuses ``update``).
    ``mapping_hook`` may handle a non-dict Mapping itself (e.g. ``BatchEncoding.to``): a non-None result is used.
    """

    def walk(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return function(value)
        if isinstance(value, Mapping):
            if type(value) is not dict and mapping_hook is not None:
                handled = mapping_hook(value)
                if handled is not None:
                    return handled
            mapped = {key: walk(item) for key, item in value.items()}
            if type(value) is dict:
                return mapped
            if update_mappings_in_place and isinstance(value, MutableMapping):
                for key, item in mapped.items():
                    value[key] = item
                return value
            return type(value)(mapped)  # type: ignore[call-arg]  # Mapping subclasses take a dict
        if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
            return type(value)(*(walk(item) for item in value))
        if isinstance(value, (list, tuple)):
            return type(value)(walk(item) for item in value)
        return value

    return walk(data)


def iter_leaves(data: Any) -> Iterator[Any]:
    """Every non-container value inside ``data`` (dicts, Mappings, lists and tuples are descended into)."""
    if isinstance(data, Mapping):
        for value in data.values():
            yield from iter_leaves(value)
    elif isinstance(data, (list, tuple)):
        for value in data:
            yield from iter_leaves(value)
    else:
        yield data
