"""Module hooks that run around a module's ``forward`` with its arguments (Accelerate's ``accelerate.hooks``).

Unlike torch's forward hooks, a :class:`ModelHook` sees and may replace the keyword arguments too, and can run
the forward under ``no_grad``. :func:`add_hook_to_module` keeps the module's own ``forward`` as ``_old_forward``
and the hook as ``_hf_hook`` (the attribute names Accelerate's and transformers' code look for), and installs a
wrapper with the original's name and signature; :func:`remove_hook_from_module` restores it.

The hooks defined here are the whole-module ones: :class:`CpuOffload` (the model lives on the CPU and moves to
the execution device on its first forward) and :class:`LayerwiseCastingHook` (weights stored in a small dtype,
cast up for each forward). The per-tensor device alignment and offload hooks are in
:mod:`trainkit.engine.inference.align`.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch
from torch import nn

# Methods dispatch_model wraps on a dispatched model (to warn or refuse a move); removing the hooks drops them.
DISPATCH_WRAPPED_METHODS = ("to", "cuda", "npu", "xpu", "mlu", "sdaa", "musa", "neuron")


class ModelHook:
    """Callbacks around a module's forward: ``init_hook`` when attached, ``pre_forward`` (may change the
    arguments), ``post_forward`` (may change the output), ``detach_hook`` when removed. With the class attribute
    ``no_grad`` true, the forward itself runs under ``torch.no_grad()``."""

    no_grad = False

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Called when the hook is attached; returns the module (possibly modified)."""
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        """Called before the forward with its arguments; returns the ``(args, kwargs)`` the forward receives."""
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        """Called after the forward; returns the output the caller receives."""
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        """Called when the hook is removed; returns the module."""
        return module


class SequentialHook(ModelHook):
    """Several hooks run in order at each event (``pre_forward`` passes the arguments along the chain,
    ``post_forward`` the output)."""

    def __init__(self, *hooks: ModelHook) -> None:
        self.hooks = hooks

    def init_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.init_hook(module)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        for hook in self.hooks:
            args, kwargs = hook.pre_forward(module, *args, **kwargs)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        for hook in self.hooks:
            output = hook.post_forward(module, output)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.detach_hook(module)
        return module


def hook_of(module: nn.Module) -> ModelHook | None:
    """The hook :func:`add_hook_to_module` attached to ``module`` (its ``_hf_hook``), or None."""
    hook: ModelHook | None = getattr(module, "_hf_hook", None)
    return hook


def _hooked_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    hook: ModelHook = module._hf_hook  # type: ignore[assignment]  # set by add_hook_to_module (nn.Module types attributes as Tensor | Module)
    args, kwargs = hook.pre_forward(module, *args, **kwargs)
    with torch.no_grad() if hook.no_grad else contextlib.nullcontext():
        output = module._old_forward(*args, **kwargs)  # type: ignore[operator]  # the forward saved by add_hook_to_module
    return hook.post_forward(module, output)


def _is_fx_graph_module(module: nn.Module) -> bool:
    # torch.fx gives each GraphModule its own class; recompile() rewrites that class's forward, so the wrapper
    # goes on the class (an instance attribute would freeze the graph's code at the time of hooking).
    return type(module).__qualname__.endswith("GraphModuleImpl")  # its __name__ is the traced class's


def _set_forward(module: nn.Module, forward: Any) -> None:
    setattr(type(module) if _is_fx_graph_module(module) else module, "forward", forward)


def add_hook_to_module(module: nn.Module, hook: ModelHook, append: bool = False) -> nn.Module:
    """Run ``hook`` around ``module``'s forward (in place; returns the module). An existing hook is replaced, or
    with ``append=True`` chained before ``hook`` in a :class:`SequentialHook`. The wrapper keeps the forward's
    name and signature; the original forward stays reachable as ``module._old_forward``."""
    previous = hook_of(module)
    if append and previous is not None:
        remove_hook_from_module(module)
        hook = SequentialHook(previous, hook)
    if hasattr(module, "_hf_hook") and hasattr(module, "_old_forward"):
        original = getattr(module, "_old_forward")  # replacing a hook: keep the forward from before any hook
    else:
        original = module.forward
        setattr(module, "_old_forward", original)
    module = hook.init_hook(module)
    setattr(module, "_hf_hook", hook)
    # A partial (not a closure) holds the module, so copy.deepcopy of a hooked model binds the copy's own forward.
    _set_forward(module, functools.update_wrapper(functools.partial(_hooked_forward, module), original))
    return module


def remove_hook_from_module(module: nn.Module, recurse: bool = False) -> nn.Module:
    """Detach the hook of ``module`` (its ``detach_hook`` runs) and restore its own forward; with ``recurse``,
    of every submodule too. Returns the module."""
    hook = hook_of(module)
    if hook is not None:
        hook.detach_hook(module)
        del module._hf_hook
    if hasattr(module, "_old_forward"):
        _set_forward(module, getattr(module, "_old_forward"))
        del module._old_forward
    for name in DISPATCH_WRAPPED_METHODS:
        module.__dict__.pop(name, None)
    if recurse:
        for child in module.children():
            remove_hook_from_module(child, recurse)
    return module


def remove_hook_from_submodules(module: nn.Module) -> None:
    """Remove the hooks of ``module`` and of all its submodules."""
    remove_hook_from_module(module, recurse=True)


class CpuOffload(ModelHook):
    """Keeps a model on the CPU until its forward: the first forward moves it (and the inputs) to
    ``execution_device`` (default: the process's device), where it stays until :meth:`init_hook` runs again
    (:meth:`UserCpuOffloadHook.offload`). ``prev_module_hook`` (from :func:`cpu_offload_with_hook`) names the
    previous model of a pipeline, sent back to the CPU when this one starts."""

    def __init__(self, execution_device: str | int | torch.device | None = None,
                 prev_module_hook: UserCpuOffloadHook | None = None) -> None:
        self.prev_module_hook = prev_module_hook
        if execution_device is None:
            from trainkit.state import PartialState

            execution_device = PartialState().default_device
        self.execution_device = execution_device

    def init_hook(self, module: nn.Module) -> nn.Module:
        return module.to("cpu")

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        from trainkit.utils.operations import send_to_device

        previous = self.prev_module_hook
        if isinstance(previous, UserCpuOffloadHook) and _device_of(previous.model) != torch.device("cpu"):
            previous.offload()
            from trainkit.utils.memory import clear_device_cache

            clear_device_cache()
        target = _as_device(self.execution_device)
        if _device_of(module) == target:
            return args, kwargs
        module.to(target)
        return send_to_device(args, target), send_to_device(kwargs, target)


def _as_device(device: str | int | torch.device) -> torch.device:
    return torch.device(device)  # an int is the accelerator's index, as torch reads it


def _device_of(module: nn.Module) -> torch.device | None:
    first = next(module.parameters(), None)
    return None if first is None else first.device


class UserCpuOffloadHook:
    """What :func:`cpu_offload_with_hook` returns: the model and its :class:`CpuOffload` hook, with
    :meth:`offload` (send the model back to the CPU) and :meth:`remove` (take the hook off)."""

    def __init__(self, model: nn.Module, hook: ModelHook) -> None:
        self.model = model
        self.hook = hook

    def offload(self) -> None:
        """Move the model back to the CPU (its next forward brings it to the execution device again)."""
        self.hook.init_hook(self.model)

    def remove(self) -> None:
        """Remove the hook from the model."""
        remove_hook_from_module(self.model)


class LayerwiseCastingHook(ModelHook):
    """Stores a module's weights in ``storage_dtype`` (e.g. float8) and casts them to ``compute_dtype`` for each
    forward only, then back: less memory at rest, at some loss of precision."""

    _is_stateful = False

    def __init__(self, storage_dtype: torch.dtype, compute_dtype: torch.dtype, non_blocking: bool) -> None:
        self.storage_dtype = storage_dtype
        self.compute_dtype = compute_dtype
        self.non_blocking = non_blocking

    def init_hook(self, module: nn.Module) -> nn.Module:
        return module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        module.to(dtype=self.compute_dtype, non_blocking=self.non_blocking)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        return output
