"""Keeping a module's weights and inputs on one device per forward, and offloading weights between forwards.

:class:`AlignDevicesHook` (Accelerate's name and behaviour) moves a module's inputs to its execution device
before the forward and, with ``offload=True``, keeps its weights on the ``meta`` device between forwards: each
forward loads them from ``weights_map`` (a state dict, or an :class:`~trainkit.engine.inference.offload.
OffloadedWeightsLoader` over a disk folder) onto the execution device, and puts them back on ``meta`` after.
The ``attach_*`` functions put these hooks on a model's submodules: one per module with its own tensors
(:func:`attach_align_device_hook`), or one per block of a device map (:func:`attach_align_device_hook_on_blocks`,
what ``dispatch_model`` uses).

Tied weights: ``tied_params_map`` maps the data pointer of a weight shared by several modules to the copies
already placed on each device, so a tied weight is loaded once per device (reused by the other modules, freed
after the forward that loaded it). Weights read back from disk get a new pointer each time, so they are not
shared across modules (correct, at the cost of a copy per module).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from trainkit.engine.inference.hooks import ModelHook, add_hook_to_module, hook_of
from trainkit.engine.inference.offload import PrefixedDataset
from trainkit.utils.model_tensors import get_non_persistent_buffers, named_module_tensors
from trainkit.utils.tensor_placement import set_module_tensor_to_device

Device = int | str | torch.device
TiedParamsMap = dict[int, dict[Any, torch.Tensor]]


class AlignDevicesHook(ModelHook):
    """Puts a module's inputs (and, without offload, its tensors) on ``execution_device``; with ``offload``, its
    weights live on ``meta`` between forwards and are loaded from ``weights_map`` (default: a CPU copy taken when
    attached) for each forward. ``offload_buffers`` offloads the buffers too (else they stay on the execution
    device); ``place_submodules`` covers the submodules' tensors as well; ``io_same_device`` returns the output on
    the device the input came from; ``skip_keys`` names keyword arguments left where they are."""

    def __init__(self, execution_device: Device | None = None, offload: bool = False, io_same_device: bool = False,
                 weights_map: Mapping | None = None, offload_buffers: bool = False, place_submodules: bool = False,
                 skip_keys: str | list[str] | None = None, tied_params_map: TiedParamsMap | None = None) -> None:
        self.execution_device = execution_device
        self.offload = offload
        self.io_same_device = io_same_device
        self.weights_map = weights_map
        self.offload_buffers = offload_buffers
        self.place_submodules = place_submodules
        self.skip_keys = skip_keys
        self.tied_params_map = tied_params_map
        self.input_device: torch.device | None = None
        self.original_devices: dict[str, torch.device] = {}
        self._tied_loaded_here: list[tuple[int, Any]] = []  # (pointer, device) entries one forward added

    def __repr__(self) -> str:
        return (f"AlignDevicesHook(execution_device={self.execution_device}, offload={self.offload}, "
                f"io_same_device={self.io_same_device}, offload_buffers={self.offload_buffers}, "
                f"place_submodules={self.place_submodules}, skip_keys={self.skip_keys!r})")

    def _offloaded(self, module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        """The tensors that live on ``meta`` between forwards (non-persistent buffers never do: no state dict
        holds them)."""
        return named_module_tensors(module, include_buffers=self.offload_buffers, recurse=self.place_submodules,
                                    remove_non_persistent=True)

    def _place(self, module: nn.Module, name: str, value: torch.Tensor, for_one_forward: bool = False) -> None:
        """Put ``value`` as ``name`` on the execution device, sharing a tied weight's copy already placed there."""
        tied, device = self.tied_params_map, self.execution_device
        assert device is not None, "AlignDevicesHook places tensors only with an execution_device"
        if for_one_forward and tied is not None and device not in tied.get(value.data_ptr(), {device: None}):
            self._tied_loaded_here.append((value.data_ptr(), device))  # this forward placed it: drop it after
        set_module_tensor_to_device(module, name, device, value=value, tied_params_map=tied)

    def init_hook(self, module: nn.Module) -> nn.Module:
        if str(self.execution_device) == "meta":
            self.tied_params_map = None  # every meta tensor has data pointer 0: nothing to share
        everything = dict(named_module_tensors(module, recurse=self.place_submodules))
        if not self.offload:
            if self.execution_device is not None:
                for name, tensor in everything.items():
                    self._place(module, name, tensor)
            return module
        self.original_devices = {name: tensor.device for name, tensor in everything.items()}
        if self.weights_map is None:
            self.weights_map = {name: tensor.to("cpu") for name, tensor in named_module_tensors(
                module, include_buffers=self.offload_buffers, recurse=self.place_submodules)}
        for name, _ in list(self._offloaded(module)):
            set_module_tensor_to_device(module, name, "meta")
        if self.execution_device is not None:
            if self.offload_buffers:  # only the non-persistent buffers stayed: they go to the execution device
                kept = get_non_persistent_buffers(module, recurse=self.place_submodules, fqns=True)
            else:
                kept = {name for name, _ in module.named_buffers(recurse=self.place_submodules)}
            for name in kept:
                buffer = module.get_buffer(name)
                if buffer is not None:
                    self._place(module, name, buffer)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        from trainkit.utils.operations import find_device, send_to_device

        if self.io_same_device:
            self.input_device = find_device([args, kwargs])
        if self.offload:
            assert self.weights_map is not None  # init_hook set it
            for name, _ in list(self._offloaded(module)):
                self._place(module, name, self.weights_map[name], for_one_forward=True)
        if self.execution_device is None:
            return args, kwargs
        return (send_to_device(args, self.execution_device),
                send_to_device(kwargs, self.execution_device, skip_keys=self.skip_keys))

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        if self.offload:
            for name, _ in list(self._offloaded(module)):
                # No cache flush per tensor: the allocator's cached blocks serve the next forward's loads.
                set_module_tensor_to_device(module, name, "meta", clear_cache=False)
            for pointer, device in self._tied_loaded_here:
                self.tied_params_map[pointer].pop(device, None)  # type: ignore[index]  # set when the list is not empty
            self._tied_loaded_here = []
        if self.io_same_device and self.input_device is not None:
            from trainkit.utils.operations import send_to_device

            output = send_to_device(output, self.input_device, skip_keys=self.skip_keys)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        if self.offload:
            assert self.weights_map is not None
            for name, device in self.original_devices.items():
                if device.type != "meta":
                    set_module_tensor_to_device(module, name, device, value=self.weights_map.get(name))
        return module


def attach_execution_device_hook(module: nn.Module, execution_device: Device | None,
                                 skip_keys: str | list[str] | None = None,
                                 preload_module_classes: list[str] | None = None,
                                 tied_params_map: TiedParamsMap | None = None) -> None:
    """Give every submodule with a state (and no hook yet) an :class:`AlignDevicesHook` to ``execution_device``,
    so inputs reach each one on the right device; the submodules of a ``preload_module_classes`` module are
    left alone (it loads their weights itself)."""
    if not hasattr(module, "_hf_hook") and len(module.state_dict()) > 0:
        add_hook_to_module(module, AlignDevicesHook(execution_device, skip_keys=skip_keys,
                                                    tied_params_map=tied_params_map))
    if preload_module_classes is not None and type(module).__name__ in preload_module_classes:
        return
    for child in module.children():
        attach_execution_device_hook(child, execution_device, skip_keys, preload_module_classes, tied_params_map)


def attach_align_device_hook(module: nn.Module, execution_device: Device | None = None,
                             offload: bool = False, weights_map: Mapping | None = None,
                             offload_buffers: bool = False, module_name: str = "",
                             skip_keys: str | list[str] | None = None,
                             preload_module_classes: list[str] | None = None,
                             tied_params_map: TiedParamsMap | None = None) -> None:
    """Attach (appending to any hook already there) an :class:`AlignDevicesHook` to every submodule of
    ``module`` that holds tensors of its own. ``weights_map`` is keyed by full names under ``module_name``.

    An instance of a class in ``preload_module_classes`` gets one hook for all its tensors, submodules
    included (for modules that read a child's weights without calling the child)."""
    preload_all = offload and preload_module_classes is not None and type(module).__name__ in preload_module_classes
    if preload_all or next(named_module_tensors(module), None) is not None:
        prefix = f"{module_name}." if module_name else ""
        hook = AlignDevicesHook(
            execution_device=execution_device, offload=offload,
            weights_map=None if weights_map is None else PrefixedDataset(weights_map, prefix),
            offload_buffers=offload_buffers, place_submodules=preload_all, skip_keys=skip_keys,
            tied_params_map=tied_params_map)
        add_hook_to_module(module, hook, append=True)
    if preload_all:
        return
    for child_name, child in module.named_children():
        attach_align_device_hook(
            child, execution_device=execution_device, offload=offload, weights_map=weights_map,
            offload_buffers=offload_buffers, module_name=f"{module_name}.{child_name}" if module_name else child_name,
            skip_keys=skip_keys, preload_module_classes=preload_module_classes, tied_params_map=tied_params_map)


def attach_align_device_hook_on_blocks(module: nn.Module,
                                       execution_device: Device | Mapping[str, Device | None] | None = None,
                                       offload: bool | Mapping[str, bool] = False,
                                       weights_map: Mapping | None = None, offload_buffers: bool = False,
                                       module_name: str = "", skip_keys: str | list[str] | None = None,
                                       preload_module_classes: list[str] | None = None,
                                       tied_params_map: TiedParamsMap | None = None) -> None:
    """Attach the hooks of a device map: ``execution_device`` and ``offload`` are one value for the whole module
    or map block names to values. A block kept on its device gets one hook placing all its tensors there; an
    offloaded block gets per-module offload hooks reading ``weights_map``; the root returns outputs on the
    input's device."""
    shared: dict[str, Any] = {"skip_keys": skip_keys, "tied_params_map": tied_params_map}
    if not isinstance(execution_device, Mapping) and not isinstance(offload, Mapping):
        if offload:
            attach_align_device_hook(module, execution_device, offload=True, weights_map=weights_map,
                                     offload_buffers=offload_buffers, module_name=module_name, **shared)
        else:
            add_hook_to_module(module, AlignDevicesHook(execution_device, io_same_device=True,
                                                        place_submodules=True, **shared))
        return
    devices: Mapping[str, Device | None] = (
        execution_device if isinstance(execution_device, Mapping) else dict.fromkeys(offload, execution_device))  # type: ignore[arg-type]  # offload is a Mapping here
    offloads: Mapping[str, bool] = offload if isinstance(offload, Mapping) else dict.fromkeys(devices, offload)
    is_root = module_name == ""
    if module_name in devices and module_name in offloads:
        _hook_block(module, devices[module_name], offloads[module_name], is_root, weights_map, offload_buffers,
                    module_name, preload_module_classes, shared)
    elif is_root:
        add_hook_to_module(module, AlignDevicesHook(devices.get(""), io_same_device=True, **shared))
    for child_name, child in module.named_children():
        attach_align_device_hook_on_blocks(
            child, execution_device=devices, offload=offloads, weights_map=weights_map,
            offload_buffers=offload_buffers, module_name=f"{module_name}.{child_name}" if module_name else child_name,
            preload_module_classes=preload_module_classes, **shared)


def _hook_block(module: nn.Module, device: Device | None, offloaded: bool, is_root: bool, weights_map: Mapping | None,
                offload_buffers: bool, module_name: str, preload_module_classes: list[str] | None,
                shared: dict[str, Any]) -> None:
    """The hooks of one block of a device map (see :func:`attach_align_device_hook_on_blocks`)."""
    if not offloaded:
        add_hook_to_module(module, AlignDevicesHook(device, offload_buffers=offload_buffers, io_same_device=is_root,
                                                    place_submodules=True, **shared))
        attach_execution_device_hook(module, device, **shared)
        return
    attach_align_device_hook(module, device, offload=True, weights_map=weights_map, offload_buffers=offload_buffers,
                             module_name=module_name, preload_module_classes=preload_module_classes, **shared)
    if not hasattr(module, "_hf_hook"):  # a block without tensors of its own still moves its inputs
        add_hook_to_module(module, AlignDevicesHook(device, io_same_device=is_root, **shared))
    attach_execution_device_hook(module, device, preload_module_classes=preload_module_classes, **shared)


def has_offloaded_params(module: nn.Module) -> bool:
    """Whether ``module`` carries an :class:`AlignDevicesHook` that offloads its weights."""
    hook = hook_of(module)
    return isinstance(hook, AlignDevicesHook) and hook.offload


@contextlib.contextmanager
def align_module_device(module: nn.Module, execution_device: Device | None = None) -> Iterator[None]:
    """Within the block, ``module``'s own parameters are on ``execution_device``: an offloaded module's weights
    are loaded (on its hook's execution device when none is given) and offloaded again after; a plain module's
    parameters are moved there and back. Without offload or device, nothing moves."""
    hook = hook_of(module)
    if isinstance(hook, AlignDevicesHook) and hook.offload:
        original = hook.execution_device
        if execution_device is not None:
            hook.execution_device = execution_device
        try:
            hook.pre_forward(module)
            yield
        finally:
            hook.post_forward(module, None)
            hook.execution_device = original
        return
    if execution_device is None:
        yield
        return
    devices = {name: param.device for name, param in module.named_parameters(recurse=False)}
    try:
        for name in devices:
            set_module_tensor_to_device(module, name, execution_device)
        yield
    finally:
        for name, device in devices.items():
            set_module_tensor_to_device(module, name, device)


def get_state_dict_offloaded_model(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict of a model whose weights may be offloaded, on the CPU: each submodule's weights are loaded
    in turn (so one module at a time must fit in CPU memory). Tensors still on ``meta`` are left out, with a
    warning naming them."""
    state_dict: dict[str, torch.Tensor] = {}
    on_meta: set[str] = set()
    for name, submodule in model.named_modules():
        if not name:
            continue
        with align_module_device(submodule, "cpu"):
            for key, tensor in submodule.state_dict().items():
                full_name = f"{name}.{key}"
                if tensor.device.type == "meta":
                    on_meta.add(full_name)
                else:
                    state_dict[full_name] = tensor.to("cpu")
    missing = on_meta - set(state_dict)
    if missing:
        import logging

        logging.getLogger(__name__).warning("These tensors are still on the meta device and were not saved: %s",
                                            sorted(missing))
    return state_dict


def get_state_dict_from_offload(module: nn.Module, module_name: str, state_dict: dict[str, Any],
                                device_to_put_offload: Device = "cpu") -> dict[str, Any]:
    """Fill the entries of ``state_dict`` that belong to ``module`` (named by ``module_name``, a tensor's full
    name: the part before the last dot is the module) with its tensors, loading offloaded ones on
    ``device_to_put_offload``; returns ``state_dict``."""
    root = module_name.rpartition(".")[0]
    device = device_to_put_offload if has_offloaded_params(module) else None
    with align_module_device(module, device):
        for key, tensor in module.state_dict().items():
            if f"{root}.{key}" in state_dict:
                state_dict[f"{root}.{key}"] = tensor
    return state_dict
