"""How many bytes each device may hold when a device map is planned: ``get_max_memory`` and
``get_balanced_memory``.

A budget maps devices to bytes: integer keys are accelerator (CUDA) indices, then ``"mps"``, ``"cpu"`` and
``"disk"``, always in that order (the planner fills devices in it). Budgets are pure numbers, so a map for GPUs can
be planned on a machine without them.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Iterable, Mapping
from typing import Union

import torch
from torch import nn

from trainkit.engine.inference.layer_sizes import get_module_leaves, no_split_names
from trainkit.utils.model_tensors import compute_module_sizes, convert_file_size_to_int

logger = logging.getLogger(__name__)

Device = Union[int, str]
_NAMED_DEVICES = ("mps", "cpu", "disk")


def _host_memory_available() -> int:
    """Bytes of RAM available now (psutil when installed, else the kernel's MemAvailable, else free pages)."""
    try:
        return int(importlib.import_module("psutil").virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def _memory_available_now() -> dict[Device, int]:
    """Free memory of each CUDA device, then the host's RAM (under ``"mps"`` on Apple silicon; left out where the
    GPU is integrated and shares the host's RAM, so it is not counted twice)."""
    budget: dict[Device, int] = {}
    shares_host_memory = False
    for index in range(torch.cuda.device_count()):
        try:
            budget[index] = torch.cuda.mem_get_info(index)[0]
        except RuntimeError:
            logger.info(f"CUDA device {index} did not answer; it is left out of the memory budget.")
            continue
        shares_host_memory |= bool(getattr(torch.cuda.get_device_properties(index), "is_integrated", False))
    if torch.backends.mps.is_available():
        budget["mps"] = _host_memory_available()
    elif not shares_host_memory:
        budget["cpu"] = _host_memory_available()
    return budget


def get_max_memory(max_memory: Mapping[Device, int | str] | None = None) -> dict[Device, int]:
    """The memory budget: what is free now when ``max_memory`` is None, else ``max_memory`` with sizes in bytes
    (``"10GiB"`` -> int) and its devices ordered accelerators first, then ``"mps"``, ``"cpu"``, ``"disk"``."""
    if max_memory is None:
        return _memory_available_now()
    unknown = [key for key in max_memory if not isinstance(key, int) and key not in _NAMED_DEVICES]
    if unknown:
        raise ValueError(f"max_memory has devices {unknown} that are not known: use integers (accelerator indices), "
                         f"'mps', 'cpu' or 'disk'.")
    accelerators = sorted(key for key in max_memory if isinstance(key, int))
    present = torch.cuda.device_count()
    for index in accelerators:
        if not 0 <= index < present:
            logger.warning(f"Device {index} is not available here (available: {list(range(present))}); the map is "
                           "planned for it all the same.")
    ordered = accelerators + [name for name in _NAMED_DEVICES if name in max_memory]
    return {key: convert_file_size_to_int(max_memory[key]) for key in ordered}


def _no_split_block_size(model: nn.Module, sizes: Mapping[str, int], no_split: list[str]) -> int:
    """The largest of the first block of each class not to split, in the model's order (Accelerate's measure:
    the blocks of one class are usually alike)."""
    first: dict[str, int] = {}
    for name, module in model.named_modules():
        if name and type(module).__name__ in no_split:
            first.setdefault(type(module).__name__, sizes.get(name, 0))
    return max(first.values(), default=0)


def get_balanced_memory(model: nn.Module, max_memory: Mapping[Device, int | str] | None = None,
                        no_split_module_classes: str | Iterable[str] | None = None,
                        dtype: str | torch.dtype | None = None,
                        special_dtypes: dict[str, str | torch.dtype] | None = None,
                        low_zero: bool = False) -> dict[Device, int]:
    """A budget for :func:`infer_auto_device_map` that spreads the model evenly over the accelerators.

    Each accelerator but the last gets the model's size divided by their number, plus a margin of 1.25 times the
    larger of a block not to split and the mean size of the model's last-level modules (so that layers
    are not pushed to the CPU by rounding); the last keeps its whole budget. ``low_zero`` puts on accelerator 0
    only what the others cannot hold (it keeps room for ``generate``). With one accelerator and no ``max_memory``,
    10 % of its free memory is left unplanned for activations."""
    budget = get_max_memory(max_memory)
    accelerators = [key for key, size in budget.items() if isinstance(key, int) and size > 0]
    if not accelerators:
        return budget
    if len(accelerators) == 1:
        low_zero = False
        if max_memory is None:
            first = next(key for key in budget if isinstance(key, int))
            budget[first] = int(budget[first] * 0.9)
            logger.info(f"Planning with 90% of device {first}'s free memory; the rest stays free for activations "
                        "(give max_memory to plan with more).")
    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    total = sizes.get("", 0)
    per_device = total // (len(accelerators) - 1 if low_zero else len(accelerators))
    tensors = set(get_module_leaves(sizes))
    last_modules = get_module_leaves({name: size for name, size in sizes.items() if name not in tensors})
    mean_last_module = int(sum(sizes[name] for name in last_modules) / max(len(last_modules), 1))
    largest_block = _no_split_block_size(model, sizes, no_split_names(no_split_module_classes))
    per_device += int(1.25 * max(largest_block, mean_last_module))
    first = accelerators[0]
    for index in accelerators[:-1]:
        budget[index] = min(budget[first] if low_zero and index == first else per_device, budget[index])
    if low_zero:
        budget[first] = min(max(0, total - sum(budget[index] for index in accelerators[1:])), budget[first])
    return budget
