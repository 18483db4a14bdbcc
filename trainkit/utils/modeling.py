"""Building a model without allocating its weights: ``init_empty_weights`` / ``init_on_device``.

The module is also ``accelerate.utils.modeling``'s path: its size and tying helpers resolve to
:mod:`trainkit.utils.model_tensors`, and its big-model inference functions (device maps, offload) are named and
refuse when used (:mod:`trainkit.utils.unsupported`)."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


@contextlib.contextmanager
def init_on_device(device: torch.device | str, include_buffers: bool | None = None) -> Iterator[None]:
    """Create the parameters (and, with ``include_buffers``, the buffers) of modules built inside on ``device``.

    ``include_buffers=None`` reads ``ACCELERATE_INIT_INCLUDE_BUFFERS`` (false when unset), as Accelerate does."""
    if include_buffers is None:
        from trainkit.utils.environment import parse_flag_from_env

        include_buffers = parse_flag_from_env("ACCELERATE_INIT_INCLUDE_BUFFERS", False)
    if include_buffers:
        with torch.device(device):
            yield
        return
    original = nn.Module.register_parameter

    def register_on_device(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        registered = module._parameters[name]
        if param is not None and registered is not None:
            moved = registered.to(device)
            module._parameters[name] = type(param)(moved, requires_grad=param.requires_grad)

    # Patched on the class for the duration of the block, as Accelerate's init_on_device does; mypy refuses any
    # assignment to a method, and register_on_device's module parameter is nn.Module rather than Self.
    nn.Module.register_parameter = register_on_device  # type: ignore[method-assign, assignment]  # patched inside the context only
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]  # restored


def init_empty_weights(include_buffers: bool | None = None) -> contextlib.AbstractContextManager:
    """Build modules on the ``meta`` device (shapes only, no memory); materialise them later (e.g. FSDP2)."""
    return init_on_device(torch.device("meta"), include_buffers=include_buffers)


_ELSEWHERE = {
    **{name: "trainkit.utils.model_tensors" for name in (
        "compute_module_sizes", "convert_file_size_to_int", "dtype_byte_size", "find_tied_parameters",
        "id_tensor_storage", "load_state_dict", "named_module_tensors", "retie_parameters",
        "get_non_persistent_buffers", "compute_module_total_buffer_size")},
    "set_module_tensor_to_device": "trainkit.utils.tensor_placement",
    "is_peft_model": "trainkit.utils.other",
    "load_checkpoint_in_model": "trainkit.engine.inference.loading",
    "get_grad_scaler": "trainkit.utils.environment",
    "WEIGHTS_INDEX_NAME": "trainkit.utils.constants",
    **{name: "trainkit.engine.inference.align" for name in (
        "align_module_device", "get_state_dict_from_offload", "get_state_dict_offloaded_model",
        "has_offloaded_params")},
    "load_offloaded_weights": "trainkit.engine.inference.offload",
    # big-model inference: planning device maps (trainkit/engine/inference/)
    **{name: "trainkit.engine.inference.device_map" for name in (
        "check_device_map", "check_device_same", "clean_device_map", "check_tied_parameters_in_config",
        "check_tied_parameters_on_same_device", "fallback_allocate", "infer_auto_device_map")},
    **{name: "trainkit.engine.inference.memory_budget" for name in ("get_balanced_memory", "get_max_memory")},
    **{name: "trainkit.engine.inference.layer_sizes" for name in (
        "calculate_maximum_sizes", "get_max_layer_size", "get_module_leaves", "get_module_size_with_ties")},
}
_REFUSED = ("get_mixed_precision_context_manager",)


def __getattr__(name: str) -> Any:
    if name in _ELSEWHERE:
        return getattr(importlib.import_module(_ELSEWHERE[name]), name)
    from trainkit.utils.unsupported import refusing_module

    return refusing_module(__name__, _REFUSED)(name)
