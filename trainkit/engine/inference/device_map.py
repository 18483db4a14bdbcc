"""Device maps: which device each part of a model goes to (``{"encoder": 0, "decoder.block.3": "cpu",
"lm_head": "disk"}``), planned by :func:`infer_auto_device_map` and checked by :func:`check_device_map`.

The plan is greedy, in the model's own order: parts fill the budget's devices one after the other (accelerators by
index, then ``"mps"``, ``"cpu"``, and ``"disk"``, which has no limit). A part that does not fit where the planner
stands is split into its direct parts when it can be, else the planner moves on to the next device. While later
parts may still be offloaded, the first accelerator and the CPU keep room for the largest remaining layer (an
offloaded layer is brought there to run). Parts that share a tied parameter go to the same device: a part's size
counts the parts tied to it, and they are placed with it. Planning reads sizes and dtypes only: the model may be on
the ``meta`` device, and a map for GPUs is planned on a machine without them.
"""

from __future__ import annotations

import inspect
import logging
import warnings
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any, Union

import torch
from torch import nn

from trainkit.engine.inference.layer_sizes import (Part, direct_parts, get_max_layer_size, get_module_size_with_ties,
                                                   is_inside, is_splittable, no_split_names, tied_outside)
from trainkit.engine.inference.memory_budget import Device, get_max_memory
from trainkit.utils.model_tensors import (compute_module_sizes, compute_module_total_buffer_size,
                                          convert_file_size_to_int, find_tied_parameters, mapped_key)

logger = logging.getLogger(__name__)

DeviceMap = dict[str, Union[int, str, torch.device]]


def clean_device_map(device_map: DeviceMap, module_name: str = "") -> DeviceMap:
    """Merge the entries under ``module_name`` (the whole map for ``""``) that all go to one device into one entry,
    then do the same below each child; the map is changed in place and returned."""
    prefix = f"{module_name}." if module_name else ""
    inside = [key for key in device_map if key.startswith(prefix)]
    if len(inside) > 1 and len({device_map[key] for key in inside}) == 1:
        device = device_map[inside[0]]
        for key in inside:
            del device_map[key]
        device_map[module_name] = device
    depth = len(module_name.split(".")) + 1 if module_name else 1
    children = dict.fromkeys(".".join(key.split(".")[:depth]) for key in device_map
                             if key.startswith(prefix) and len(key) > len(module_name))
    for child in children:
        clean_device_map(device_map, child)
    return device_map


def check_device_map(model: nn.Module, device_map: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` naming the model's tensors that ``device_map`` gives no device; warn (``UserWarning``)
    about keys that name no submodule or tensor of the model."""
    known = {name for name, _ in model.named_modules()}
    known |= {name for name, _ in model.named_parameters(remove_duplicate=False)}
    known |= {name for name, _ in model.named_buffers(remove_duplicate=False)}
    unknown = [key for key in device_map if key and key not in known]
    if unknown:
        warnings.warn(f"These device_map keys do not match any submodules (or tensors) of {type(model).__name__}: "
                      f"{unknown}", UserWarning, stacklevel=2)
    if "" in device_map:
        return
    uncovered = [name for name in model.state_dict() if not any(is_inside(name, key) for key in device_map)]
    if uncovered:
        raise ValueError(f"The device_map gives no device to these tensors of {type(model).__name__}: "
                         f"{', '.join(uncovered)}")


def check_device_same(first_device: torch.device, second_device: torch.device) -> bool:
    """True when two devices are the same one; an accelerator without an index (``cuda``) is its device 0."""
    def indexed(device: torch.device) -> torch.device:
        return device if device.type == "cpu" or device.index is not None else torch.device(device.type, 0)

    return indexed(first_device) == indexed(second_device)


def device_of(name: str, device_map: Mapping[str, Any]) -> Any:
    """The device ``device_map`` gives the tensor or module ``name`` (its own key, or its nearest enclosing one)."""
    key = mapped_key(name, device_map)
    if key is None:
        raise ValueError(f"The device_map gives no device to {name!r} (nor to a module holding it).")
    return device_map[key]


def check_tied_parameters_on_same_device(tied_params: list[list[str]], device_map: Mapping[str, Any]) -> None:
    """Log a warning for each group of tied parameters that ``device_map`` spreads over several devices."""
    for group in tied_params:
        devices = {param: device_of(param, device_map) for param in group}
        if len(set(devices.values())) > 1:
            logger.warning(f"Tied parameters are on different devices: {devices}. Put them on one device in the "
                           "device_map (or plan it with device_map='auto').")


def check_tied_parameters_in_config(model: nn.Module) -> bool:
    """True when a transformers model's config (or one of its modules) says some weights are tied: tied word
    embeddings with output embeddings, a tied encoder and decoder, or a module with its own ``_tie_weights``."""
    if "PreTrainedModel" not in [cls.__name__ for cls in inspect.getmro(type(model))]:
        return False
    config = getattr(model, "config", None)
    get_text_config = getattr(config, "get_text_config", None)
    text_config = get_text_config(decoder=True) if get_text_config is not None else config
    output_embeddings = getattr(model, "get_output_embeddings", lambda: None)()
    tied_embeddings = bool(getattr(text_config, "tie_word_embeddings", False) and output_embeddings is not None)
    tied_encoder_decoder = bool(getattr(config, "is_encoder_decoder", False)
                                and getattr(config, "tie_encoder_decoder", False))
    return tied_embeddings or tied_encoder_decoder or any(hasattr(module, "_tie_weights") for module in model.modules())


def _take(modules: list[Part], name: str) -> tuple[Part, list[Part]]:
    """Part ``name`` out of ``modules``, opening the part of the list that holds it into its direct parts."""
    remaining = list(modules)
    pieces = name.split(".")
    for depth in range(1, len(pieces)):
        ancestor = ".".join(pieces[:depth])
        index = next((i for i, (part_name, _) in enumerate(remaining) if part_name == ancestor), None)
        if index is not None:
            holder = remaining[index][1]
            assert isinstance(holder, nn.Module)
            remaining[index:index + 1] = direct_parts(ancestor, holder)
    index = next(i for i, (part_name, _) in enumerate(remaining) if part_name == name)
    return remaining.pop(index), remaining


def fallback_allocate(modules: list[Part], module_sizes: Mapping[str, int], size_limit: int | str,
                      no_split_module_classes: list[str] | None = None,
                      tied_parameters: list[list[str]] | None = None,
                      ) -> tuple[str | None, nn.Module | torch.Tensor | None, list[Part]]:
    """The first part of ``modules`` (looking inside the ones too big, depth first) that fits in ``size_limit``
    with its tied parts: ``(name, part, the other parts)``, or ``(None, None, modules)`` when none fits."""
    try:
        limit = convert_file_size_to_int(size_limit)
    except ValueError:
        return None, None, modules
    no_split = no_split_names(no_split_module_classes)
    searching = list(modules)
    while searching:
        name, part = searching.pop(0)
        outside = tied_outside(name, tied_parameters or [])
        size, _, _ = get_module_size_with_ties(outside, module_sizes.get(name, 0), module_sizes, searching)
        if size <= limit:
            (name, part), rest = _take(modules, name)
            return name, part, rest
        if is_splittable(part, no_split):
            assert isinstance(part, nn.Module)
            searching[:0] = direct_parts(name, part)
    return None, None, modules


def infer_auto_device_map(model: nn.Module, max_memory: Mapping[Device, int | str] | None = None,
                          no_split_module_classes: str | Iterable[str] | None = None,
                          dtype: str | torch.dtype | None = None,
                          special_dtypes: dict[str, str | torch.dtype] | None = None, verbose: bool = False,
                          clean_result: bool = True, offload_buffers: bool = False,
                          fallback_allocation: bool = False) -> DeviceMap:
    """Plan a device map for ``model`` within ``max_memory`` (default: what is free now), filling accelerators
    first, then the CPU, then the disk (see the module's description for the rules).

    ``no_split_module_classes``: class names kept whole on one device (blocks with residual connections).
    ``dtype``/``special_dtypes``: the dtype the weights will be loaded in (all / by tensor name), for their sizes.
    ``verbose`` prints each decision; ``clean_result`` merges entries that share a device (:func:`clean_device_map`).
    ``offload_buffers``: the buffers of offloaded layers stay offloaded too; without it they are brought to the
    main accelerator at once, and a warning says so when they fit in no accelerator's remaining memory.
    ``fallback_allocation``: when nothing fits on an empty device, look deeper for a smaller part that does.
    A log line names the devices that received nothing, with the memory that would have been needed."""
    planner = _Planner(model, max_memory, no_split_names(no_split_module_classes), dtype, special_dtypes,
                       verbose=verbose, offload_buffers=offload_buffers, fallback_allocation=fallback_allocation)
    device_map = planner.plan()
    if clean_result:
        clean_device_map(device_map)
    planner.report()
    return device_map


class _Planner:
    """One run of :func:`infer_auto_device_map`: the parts still to place and what each device holds."""

    def __init__(self, model: nn.Module, max_memory: Mapping[Device, int | str] | None, no_split: list[str],
                 dtype: str | torch.dtype | None, special_dtypes: dict[str, str | torch.dtype] | None, *,
                 verbose: bool, offload_buffers: bool, fallback_allocation: bool) -> None:
        self.budget = get_max_memory(max_memory)
        self.devices: list[Device] = [*self.budget, *([] if "disk" in self.budget else ["disk"])]
        self.accelerators = [device for device in self.devices if device not in ("cpu", "disk")]
        # devices where an offloaded layer is brought to run, so they keep room for the largest one
        self.reserving = (["mps"] if "mps" in self.accelerators
                          else [self.accelerators[0], "cpu"] if self.accelerators else ["cpu"])
        self.no_split, self.dtype, self.special_dtypes = no_split, dtype, special_dtypes
        self.verbose, self.offload_buffers, self.fallback_allocation = verbose, offload_buffers, fallback_allocation
        self.sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
        self.tied = find_tied_parameters(model)
        if self.tied == [] and check_tied_parameters_in_config(model):
            logger.warning("The model's config ties weights but none are tied: call model.tie_weights() before "
                           "planning its device map.")
        self.queue = direct_parts("", model)
        self.device_map: DeviceMap = OrderedDict()
        self.current = 0
        self.used = dict.fromkeys(self.devices, 0)
        self.buffers = dict.fromkeys(self.devices, 0)  # bytes of buffers brought along with the placed modules
        self.needed_by_empty: dict[Device, int] = {}
        self.largest, self.largest_names = get_max_layer_size(self.queue, self.sizes, no_split)

    def say(self, message: str) -> None:
        if self.verbose:
            print(message)

    def plan(self) -> DeviceMap:
        while self.queue:
            name, part = self.queue.pop(0)
            self.say(f"\nPlanning {name}.")
            self.largest_names = [other for other in self.largest_names if not is_inside(other, name)]
            if not self.largest_names:
                self.update_largest()
            self.treat(name, part)
        return self.device_map

    def update_largest(self) -> None:
        modules = [(name, part) for name, part in self.queue if isinstance(part, nn.Module)]
        self.largest, self.largest_names = get_max_layer_size(modules, self.sizes, self.no_split)

    def treat(self, name: str, part: nn.Module | torch.Tensor) -> None:
        """Place ``name`` on the current device, or split it (or a part tied to it), or move to the next device."""
        size = self.sizes.get(name, 0)
        tied = tied_outside(name, self.tied)
        device = self.devices[self.current]
        reserve = self.largest if device in self.reserving else 0
        limit = None if device == "disk" else self.budget[device] - reserve
        with_ties, tied_names, tied_modules = get_module_size_with_ties(tied, size, self.sizes, self.queue)
        used = self.used[device]
        if limit is None or used + with_ties <= limit:
            self.place(name, part, device, with_ties, tied_names)
            return
        self.say(f"{name} needs {with_ties} bytes (with its tied parts {tied_names}); {device} has {limit - used}.")
        if tied and used + size <= limit and self.split_tied(name, part, tied_names, tied_modules):
            return
        if used + size >= limit and is_splittable(part, self.no_split):
            self.say(f"Splitting {name}.")
            assert isinstance(part, nn.Module)
            self.queue[:0] = direct_parts(name, part)
            self.update_largest()
            return
        if used == 0 and self.fallback_allocation and self.fall_back(name, part, device, with_ties):
            return
        if used == 0:
            self.needed_by_empty[device] = with_ties + reserve
        self.say(f"Moving on from {device}.")
        self.used[device] += reserve
        self.current += 1
        self.queue.insert(0, (name, part))

    def place(self, name: str, part: nn.Module | torch.Tensor, device: Device, size: int,
              tied_names: list[str]) -> None:
        self.say(f"Putting {name}{f' and {tied_names}' if tied_names else ''} ({size} bytes) on {device}.")
        self.used[device] += size
        self.device_map[name] = device
        for tied_name in tied_names:
            self.queue = [(other, module) for other, module in self.queue if other != tied_name]
            self.device_map[tied_name] = device
        if not self.offload_buffers and isinstance(part, nn.Module):
            self.buffers[device] += compute_module_total_buffer_size(part, self.dtype, self.special_dtypes)

    def split_tied(self, name: str, part: nn.Module | torch.Tensor, tied_names: list[str],
                   tied_modules: list[nn.Module | torch.Tensor]) -> bool:
        """Open the first splittable part tied to ``name`` into its direct parts, and treat ``name`` again."""
        for tied_name, tied_module in zip(tied_names, tied_modules):
            if is_splittable(tied_module, self.no_split):
                assert isinstance(tied_module, nn.Module)
                self.say(f"Splitting {tied_name}, tied to {name}.")
                index = next(i for i, (other, _) in enumerate(self.queue) if other == tied_name)
                self.queue[index:index + 1] = direct_parts(tied_name, tied_module)
                self.queue.insert(0, (name, part))
                self.update_largest()
                return True
        return False

    def fall_back(self, name: str, part: nn.Module | torch.Tensor, device: Device, with_ties: int) -> bool:
        """Put first a later, smaller part that fits on the empty ``device`` (``fallback_allocation``)."""
        limit = self.budget[device] - max(self.largest, with_ties)
        found_name, found, rest = fallback_allocate(self.queue, self.sizes, limit, self.no_split, self.tied)
        if found_name is None or found is None:
            return False
        self.say(f"{found_name} fits on {device} instead.")
        self.queue = [(found_name, found), (name, part), *rest]
        return True

    def report(self) -> None:
        """Warn when the buffers of offloaded layers fit in no accelerator; log the devices that got nothing."""
        offloaded_buffers = self.buffers.get("cpu", 0) + self.buffers.get("disk", 0)
        if offloaded_buffers and not self.offload_buffers and self.accelerators:
            fits = any(size >= offloaded_buffers + self.used.get(device, 0)
                       for device, size in self.budget.items() if device not in ("cpu", "disk"))
            if not fits:
                warnings.warn(f"The offloaded layers have {offloaded_buffers} bytes of buffers, which are kept on the "
                              "main device while the model runs and fit in no accelerator's remaining memory; if it "
                              "runs out of memory, pass offload_buffers=True.", stacklevel=3)
        if self.needed_by_empty:
            needs = "\n".join(f"  - {device}: {size} bytes" for device, size in self.needed_by_empty.items())
            logger.info("No part of the model could be placed on these devices, for insufficient memory (the "
                        f"least each would have needed in this plan):\n{needs}\nGive them more memory in max_memory "
                        "to use them.")
