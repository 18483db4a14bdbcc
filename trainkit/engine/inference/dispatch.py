"""Running a model whose weights do not all fit on its device (Accelerate's ``accelerate.big_modeling`` API).

- :func:`cpu_offload` / :func:`disk_offload`: every module keeps its weights on ``meta`` and loads them for its
  own forward only, from a CPU state dict or from a disk folder (``index.json`` and ``.dat`` files).
- :func:`cpu_offload_with_hook`: the whole model moves to the execution device on its first forward and stays
  there until the returned hook's ``offload()`` (pipelines of models run one after the other).
- :func:`dispatch_model`: a device map (module name -> device, ``"cpu"`` or ``"disk"``) is put in place with
  :func:`~trainkit.engine.inference.align.attach_align_device_hook_on_blocks`; ``"cpu"`` and ``"disk"`` blocks
  run on the main device with their weights loaded per forward.
- :func:`attach_layerwise_casting_hooks`: weights stored in a small dtype, computed in a larger one.

Warnings go to the ``trainkit.big_modeling`` logger (Accelerate's scripts and tests watch ``accelerate.big_modeling``).
"""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from trainkit.engine.inference.align import (
    AlignDevicesHook,
    Device,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
)
from trainkit.engine.inference.hooks import (
    CpuOffload,
    LayerwiseCastingHook,
    UserCpuOffloadHook,
    add_hook_to_module,
)
from trainkit.engine.inference.device_map import check_device_map
from trainkit.engine.inference.offload import INDEX_FILE, OffloadedWeightsLoader, offload_state_dict
from trainkit.utils.model_tensors import extract_submodules_state_dict, find_tied_parameters, retie_parameters

logger = logging.getLogger("trainkit.big_modeling")

OFFLOAD_TARGETS = ("cpu", "disk")
"""Device-map values that keep weights off the execution device, loaded for each forward."""

SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING = (
    nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d, nn.Linear)
"""The layers :func:`attach_layerwise_casting_hooks` casts (Accelerate's list: their weights are plain tensors
that a cast does not break; normalisation and embedding layers stay in their dtype)."""


def _first_device(model: nn.Module) -> torch.device:
    parameter = next(model.parameters(), None)
    if parameter is None:
        raise ValueError(f"{type(model).__name__} has no parameters: pass execution_device explicitly.")
    return parameter.device


def _offload_from(model: nn.Module, weights_map: Mapping, execution_device: Device | None, offload_buffers: bool,
                  preload_module_classes: list[str] | None) -> nn.Module:
    """Offload every module of ``model`` to ``weights_map``, loaded for each forward on ``execution_device``."""
    if execution_device is None:
        execution_device = _first_device(model)
    add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)
    attach_align_device_hook(model, execution_device=execution_device, offload=True, offload_buffers=offload_buffers,
                             weights_map=weights_map, preload_module_classes=preload_module_classes)
    return model


def cpu_offload(model: nn.Module, execution_device: torch.device | None = None, offload_buffers: bool = False,
                state_dict: dict[str, torch.Tensor] | None = None,
                preload_module_classes: list[str] | None = None) -> nn.Module:
    """Keep ``model``'s weights on the CPU (``state_dict``, default a CPU copy of the model's) and load each
    module's onto ``execution_device`` (default: where the first parameter is) for its own forward only; the
    output comes back on the input's device. ``preload_module_classes`` names classes whose instances load all
    their submodules' weights at once."""
    if state_dict is None:
        state_dict = {name: tensor.to("cpu") for name, tensor in model.state_dict().items()}
    return _offload_from(model, state_dict, execution_device, offload_buffers, preload_module_classes)


def cpu_offload_with_hook(model: nn.Module, execution_device: int | str | torch.device | None = None,
                          prev_module_hook: UserCpuOffloadHook | None = None) -> tuple[nn.Module, UserCpuOffloadHook]:
    """Keep ``model`` on the CPU until its forward, which moves it to ``execution_device`` where it stays; the
    returned hook's ``offload()`` sends it back. Passing the previous model's hook as ``prev_module_hook``
    offloads that model when this one starts (one model on the device at a time)."""
    hook = CpuOffload(execution_device=execution_device, prev_module_hook=prev_module_hook)
    add_hook_to_module(model, hook, append=True)
    return model, UserCpuOffloadHook(model, hook)


def _has_offload_index(folder: str | os.PathLike) -> bool:
    return os.path.isfile(os.path.join(folder, INDEX_FILE))


def disk_offload(model: nn.Module, offload_dir: str | os.PathLike, execution_device: torch.device | None = None,
                 offload_buffers: bool = False, preload_module_classes: list[str] | None = None) -> nn.Module:
    """Write ``model``'s weights to ``offload_dir`` (unless it already holds an ``index.json``, which is then
    used as is) and load each module's from there onto ``execution_device`` for its own forward only."""
    if not _has_offload_index(offload_dir):
        offload_state_dict(offload_dir, model.state_dict())
    weights_map = OffloadedWeightsLoader(save_folder=offload_dir)
    return _offload_from(model, weights_map, execution_device, offload_buffers, preload_module_classes)


def dispatch_model(model: nn.Module, device_map: dict[str, Device], main_device: torch.device | None = None,
                   state_dict: dict[str, torch.Tensor] | None = None, offload_dir: str | os.PathLike | None = None,
                   offload_index: dict[str, str] | None = None, offload_buffers: bool = False,
                   skip_keys: str | list[str] | None = None, preload_module_classes: list[str] | None = None,
                   force_hooks: bool = False) -> nn.Module:
    """Place ``model`` as ``device_map`` says (module name -> device, ``"cpu"`` or ``"disk"``).

    With one device and no hooks forced, the model is simply moved there. Otherwise each block gets hooks: blocks
    on a device run there, ``"cpu"`` and ``"disk"`` blocks run on ``main_device`` (default: the first device of
    the map that is neither, else the CPU) with their weights loaded per forward from ``state_dict`` (default:
    the model's own CPU weights) or ``offload_dir`` (written there unless it holds an ``index.json``;
    ``offload_index`` describes weights already offloaded, e.g. in safetensors files). The model's output comes
    back on its input's device. Sets ``model.hf_device_map``."""
    check_device_map(model, device_map)
    devices = set(device_map.values())
    if len(devices) > 1 or "disk" in devices or force_hooks:
        _attach_device_map(model, device_map, main_device, state_dict, offload_dir, offload_index,
                           offload_buffers, skip_keys, preload_module_classes)
    else:
        model.to(next(iter(devices)))
    setattr(model, "hf_device_map", dict(device_map))
    return model


def _attach_device_map(model: nn.Module, device_map: dict[str, Device], main_device: Device | None,
                       state_dict: dict[str, torch.Tensor] | None, offload_dir: str | os.PathLike | None,
                       offload_index: dict[str, str] | None, offload_buffers: bool,
                       skip_keys: str | list[str] | None, preload_module_classes: list[str] | None) -> None:
    """The hooked half of :func:`dispatch_model`."""
    if main_device is None:
        main_device = next((d for d in device_map.values() if d not in OFFLOAD_TARGETS), "cpu")
    # "cpu" blocks need no offload when the model runs on the CPU (or MPS's shared memory): weights stay put.
    runs_on_host = str(main_device) in ("cpu", "mps")
    on_cpu = [name for name, device in device_map.items() if device == "cpu"]
    on_disk = [name for name, device in device_map.items() if device == "disk"]
    if not runs_on_host and state_dict is None and on_cpu:
        state_dict = extract_submodules_state_dict(model.state_dict(), on_cpu)
    if on_disk and offload_index is None:
        if offload_dir is None:
            raise ValueError(f"dispatch_model: the device_map puts {', '.join(on_disk)} on 'disk'; pass offload_dir "
                             "(a folder to write their weights to) or offload_index.")
        if not _has_offload_index(offload_dir):
            offload_state_dict(offload_dir, extract_submodules_state_dict(model.state_dict(), on_disk))
    save_folder = offload_dir if on_disk else None
    weights_map = None
    if state_dict is not None or save_folder is not None or offload_index is not None:
        weights_map = OffloadedWeightsLoader(state_dict=state_dict, save_folder=save_folder, index=offload_index,
                                             device=main_device if offload_index is not None else None)
    offloaded = ("disk",) if runs_on_host else OFFLOAD_TARGETS
    execution = {name: main_device if device in OFFLOAD_TARGETS else device for name, device in device_map.items()}
    execution[""] = main_device
    tied_groups = find_tied_parameters(model)
    tied_params_map: dict[int, dict[Any, torch.Tensor]] = {
        model.get_parameter(name).data_ptr(): {} for group in tied_groups for name in group
        if model.get_parameter(name).device.type != "meta"}
    attach_align_device_hook_on_blocks(
        model, execution_device=execution, offload={name: d in offloaded for name, d in device_map.items()},
        offload_buffers=offload_buffers, weights_map=weights_map, skip_keys=skip_keys,
        preload_module_classes=preload_module_classes, tied_params_map=tied_params_map)
    kept_off = sorted({str(device) for device in device_map.values() if device in OFFLOAD_TARGETS})
    if kept_off:
        logger.warning("Some parameters are on the meta device because they were offloaded to the %s.",
                       " and ".join(kept_off))
    retie_parameters(model, tied_groups)  # the hooks replaced parameters one module at a time
    model.to = _refusing_moves(model.to, model)  # type: ignore[method-assign]  # instance attribute, dropped by remove_hook_from_module
    model.cuda = _refusing_moves(model.cuda, model)  # type: ignore[method-assign]  # likewise


def _refusing_moves(move: Callable[..., Any], model: nn.Module) -> Callable[..., Any]:
    """``move`` (a dispatched model's ``to``/``cuda``) warning that the hooks decide placement, and refusing
    when some weights are offloaded (on ``meta``)."""

    @functools.wraps(move)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        moves_device = move.__name__ != "to" or torch._C._nn._parse_to(*args, **kwargs)[0] is not None
        if moves_device:
            logger.warning("You shouldn't move a model that is dispatched with big-model hooks (dispatch_model).")
        if any(parameter.device.type == "meta" for parameter in model.parameters()):
            raise RuntimeError("You can't move a model that has some modules offloaded to cpu or disk.")
        return move(*args, **kwargs)

    return guarded


def attach_layerwise_casting_hooks(module: nn.Module, storage_dtype: torch.dtype, compute_dtype: torch.dtype,
                                   skip_modules_pattern: str | tuple[str, ...] | None = None,
                                   skip_modules_classes: tuple[type[nn.Module], ...] | None = None,
                                   non_blocking: bool = False) -> None:
    """Store the weights of ``module``'s layers of :data:`SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING` in
    ``storage_dtype``, cast to ``compute_dtype`` for each forward. Layers whose dotted name matches a regular
    expression of ``skip_modules_pattern``, or of a class in ``skip_modules_classes``, are left as they are."""
    patterns = (skip_modules_pattern,) if isinstance(skip_modules_pattern, str) else skip_modules_pattern or ()

    def visit(submodule: nn.Module, name: str) -> None:
        if (skip_modules_classes and isinstance(submodule, skip_modules_classes)) or any(
                re.search(pattern, name) for pattern in patterns):
            return
        if isinstance(submodule, SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING):
            add_hook_to_module(submodule, LayerwiseCastingHook(storage_dtype, compute_dtype, non_blocking),
                               append=True)
            return
        for child_name, child in submodule.named_children():
            visit(child, f"{name}.{child_name}" if name else child_name)

    visit(module, "")
