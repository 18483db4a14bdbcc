"""Building a model without allocating its weights: ``init_empty_weights`` / ``init_on_device``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

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
