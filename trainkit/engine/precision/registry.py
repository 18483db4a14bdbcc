"""Which class runs each mixed-precision mode, and on which device types: the engine's view of the modes that
``trainkit.config.precision.PRECISIONS`` declares, which ``Accelerator(mixed_precision=...)`` and
``TrainingArguments(fp16=, bf16=, use_cpu=)`` are checked against.

Adding a precision is a file with a :class:`~trainkit.engine.precision.base.Precision` subclass and its
declaration in ``config/precision.py`` (its mode, class, dtype and options); this table follows. Classes are
imported when first built, so a precision whose library is heavy costs nothing until it is asked for.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import torch

from trainkit.config.errors import ConfigError
from trainkit.config.precision import PRECISIONS as DECLARED, parse_mixed_precision
from trainkit.engine.precision.base import Precision
from trainkit.engine.process.devices import DEVICE_TYPES


@dataclass(frozen=True)
class PrecisionEntry:
    """One mode: the class that implements it (``"module:Class"``) and the device types it runs on."""

    target: str
    runs_on: tuple[str, ...] = DEVICE_TYPES


PRECISION_REGISTRY: dict[str, PrecisionEntry] = {
    mode: PrecisionEntry(declared.target, declared.runs_on or DEVICE_TYPES) for mode, declared in DECLARED.items()}
"""Mode -> its class and device types, from the declarations (tests may register a class of their own here)."""

PRECISIONS: tuple[str, ...] = tuple(PRECISION_REGISTRY)
"""The modes the engine implements (``trainkit.config.precision.MIXED_PRECISIONS``)."""

PRECISION_DEVICES: dict[str, tuple[str, ...]] = {mode: entry.runs_on for mode, entry in PRECISION_REGISTRY.items()}
"""The device types each precision runs on (:func:`check_precision_device` reads it)."""


def check_precision_device(mode: str, device_type: str, *, where: str) -> None:
    """Raise when precision ``mode`` does not run on ``device_type`` (per :data:`PRECISION_DEVICES`)."""
    entry = PRECISION_REGISTRY.get(mode)  # read now: a test may register a mode
    runs_on = entry.runs_on if entry is not None else ()
    if device_type not in runs_on:
        raise ConfigError(f"{where}: mixed precision {mode!r} does not run on {device_type}; it runs on "
                          f"{', '.join(runs_on) or 'no device'}.")


def precision_class(mode: str) -> type[Precision]:
    """The class registered for ``mode`` (imported on first use)."""
    module_name, _, class_name = PRECISION_REGISTRY[mode].target.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(cls, type) and issubclass(cls, Precision)):
        raise TypeError(f"{PRECISION_REGISTRY[mode].target} is registered for mixed precision {mode!r} "
                        "but is not a trainkit.engine.precision.base.Precision subclass.")
    return cls


def compute_dtype(mode: str) -> torch.dtype | None:
    """The low-precision compute dtype of ``mode`` (its declared torch name), None in full precision."""
    name = DECLARED[mode].dtype
    return getattr(torch, name) if name else None


def build_precision(mode: str, device: torch.device, scaler_kwargs: dict[str, Any] | None = None,
                    scaler_class: type[torch.amp.GradScaler] | None = None,
                    where: str = "Accelerator(mixed_precision=...)", options: Any = None) -> Precision:
    """Validate ``mode`` (a name other than a declared mode's is parsed, with a did-you-mean) and its device,
    then build its precision object.

    ``options``: the mode's own settings (its declared options object, resolved with provenance); a mode that
    declares options and is given none gets its declaration's defaults."""
    # The resolved config's mode is canonical already (parsed once, where it entered): only another name is parsed.
    if not (isinstance(mode, str) and mode in DECLARED):
        mode = parse_mixed_precision(mode, where=where)
    check_precision_device(mode, device.type, where=where)
    declared = DECLARED.get(mode)
    if options is None and declared is not None and declared.options is not None:
        options = declared.options()
    precision = precision_class(mode)(mode, device, scaler_kwargs, scaler_class=scaler_class)
    precision.options = options
    return precision
