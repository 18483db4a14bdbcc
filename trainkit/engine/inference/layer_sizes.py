"""What a device map is planned from: the model's parts by name, the bytes each holds, the largest layer, and the
parameters tied across parts.

A *part* is a ``(full name, module or tensor)`` pair; a module's direct parts are its own parameters, its children,
then its own buffers. Sizes come from :func:`trainkit.utils.model_tensors.compute_module_sizes` (a tied parameter
counts once, under its first name; a name absent from the sizes holds 0 bytes). A *layer* is a module that is not
split further: one without children, or one whose class is listed as not to be split.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Union

import torch
from torch import nn

Part = tuple[str, Union[nn.Module, torch.Tensor]]


def is_inside(name: str, scope: str) -> bool:
    """True when ``name`` is ``scope`` or belongs to it (``h.1.weight`` is in ``h.1``; ``h.10`` is not)."""
    return name == scope or name.startswith(scope + ".")


def direct_parts(name: str, module: nn.Module) -> list[Part]:
    """The module's own parameters, its children, then its own buffers, under their full names."""
    prefix = f"{name}." if name else ""
    parts: list[Part] = [*module.named_parameters(recurse=False), *module.named_children(),
                         *module.named_buffers(recurse=False)]
    return [(prefix + part_name, part) for part_name, part in parts]


def no_split_names(no_split_module_classes: str | Iterable[str] | None) -> list[str]:
    """The class names not to split, from ``None``, one name, or any collection of names (a set included)."""
    if no_split_module_classes is None:
        return []
    if isinstance(no_split_module_classes, str):
        return [no_split_module_classes]
    return list(no_split_module_classes)


def is_splittable(part: nn.Module | torch.Tensor, no_split_module_classes: Sequence[str]) -> bool:
    """True for a module with children whose class is not listed as not to be split."""
    return (isinstance(part, nn.Module) and next(part.children(), None) is not None
            and type(part).__name__ not in no_split_module_classes)


def get_max_layer_size(modules: Sequence[Part], module_sizes: Mapping[str, int],
                       no_split_module_classes: Sequence[str]) -> tuple[int, list[str]]:
    """The size of the largest layer among ``modules`` (and inside them) and the names of the layers that size."""
    largest, names = 0, []
    pending = list(modules)
    while pending:
        name, part = pending.pop(0)
        if not is_splittable(part, no_split_module_classes):
            size = module_sizes.get(name, 0)
            if size > largest:
                largest, names = size, [name]
            elif size == largest:
                names.append(name)
        else:
            assert isinstance(part, nn.Module)
            pending[:0] = [(f"{name}.{child_name}", child) for child_name, child in part.named_children()]
    return largest, names


def tied_outside(name: str, tied_parameters: list[list[str]]) -> list[str]:
    """The tied parameters outside part ``name`` that share a tensor with a parameter inside it."""
    outside: list[str] = []
    for group in tied_parameters:
        inside = [param for param in group if is_inside(param, name)]
        if inside and len(inside) < len(group):
            outside += [param for param in group if not is_inside(param, name)]
    return outside


def get_module_size_with_ties(tied_params: list[str], module_size: int, module_sizes: Mapping[str, int],
                              modules_to_treat: Sequence[Part],
                              ) -> tuple[int, list[str], list[nn.Module | torch.Tensor]]:
    """The bytes a part needs when the parts of ``modules_to_treat`` holding its ``tied_params`` go with it.

    Returns that size, and the name and module of the part holding each tied parameter (in the order of
    ``tied_params``; a part holding two of them is listed twice). A tied parameter whose part is no longer in
    ``modules_to_treat`` (already placed) adds nothing."""
    size, names, modules = module_size, [], []  # type: tuple[int, list[str], list[nn.Module | torch.Tensor]]
    for param in tied_params:
        holder = next(((name, part) for name, part in modules_to_treat if is_inside(param, name)), None)
        if holder is None:
            continue
        names.append(holder[0])
        modules.append(holder[1])
        # the shared tensor is already counted in the part itself
        size += module_sizes.get(holder[0], 0) - module_sizes.get(param, 0)
    return size, names, modules


def get_module_leaves(module_sizes: Mapping[str, int]) -> list[str]:
    """The names in ``module_sizes`` that no other name is nested in (the tensors, for a full size table)."""
    parents = {name.rsplit(".", 1)[0] for name in module_sizes if "." in name}
    return [name for name in module_sizes if name and name not in parents]


def calculate_maximum_sizes(model: nn.Module) -> tuple[int, tuple[int, list[str]]]:
    """The model's total size in bytes and its largest layer (size, names); transformers models name the blocks
    not to split in ``_no_split_modules``."""
    from trainkit.utils.model_tensors import compute_module_sizes

    sizes = compute_module_sizes(model)
    no_split = no_split_names(getattr(model, "_no_split_modules", None))
    return sizes.get("", 0), get_max_layer_size(direct_parts("", model), sizes, no_split)
