"""The engine's side of configuration: ``Accelerator(...)`` arguments and plugins as explicit settings,
and the one-time announcements (override notice, debug line) once the config is resolved.

Resolution itself lives in :mod:`trainkit.config.engine`; this module only says what the script set
(an argument left at None is "not set") and reports the result on the main process.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import torch

from trainkit.config.engine import FSDP_PREFIX, EngineConfig, Setting, resolve_engine_config

logger = logging.getLogger("trainkit.engine")


def accelerator_settings(*, mixed_precision: Any = None, gradient_accumulation_steps: Any = None,
                         cpu: Any = None, fsdp_plugin: Any = None, gradient_accumulation_plugin: Any = None,
                         timeout: timedelta | None = None) -> dict[str, Setting]:
    """The explicit settings of one ``Accelerator(...)`` call: only the arguments that were given."""
    settings: dict[str, Setting] = {}
    if mixed_precision is not None:
        settings["mixed_precision"] = Setting(mixed_precision, "Accelerator(mixed_precision=)")
    plugin_steps = getattr(gradient_accumulation_plugin, "num_steps", None)
    if plugin_steps is not None:
        settings["gradient_accumulation_steps"] = Setting(plugin_steps, "GradientAccumulationPlugin(num_steps=)")
    if gradient_accumulation_steps is not None:
        settings["gradient_accumulation_steps"] = Setting(gradient_accumulation_steps,
                                                          "Accelerator(gradient_accumulation_steps=)")
    if cpu is not None:
        settings["use_cpu"] = Setting(cpu, "Accelerator(cpu=)")
    if timeout is not None:
        settings["collective_timeout"] = Setting(timeout.total_seconds(), "InitProcessGroupKwargs(timeout=)")
    if fsdp_plugin is not None:
        settings.update(fsdp_plugin_settings(fsdp_plugin))
    return settings


def fsdp_plugin_settings(plugin: Any, source: str = "FullyShardedDataParallelPlugin") -> dict[str, Setting]:
    """A plugin turns FSDP on, and each option it was given is explicit (the others stay unset)."""
    settings = {"fsdp": Setting(True, source)}
    for option, value in plugin.explicit_options.items():
        settings[FSDP_PREFIX + option] = Setting(value, f"{source}({option}=)")
    return settings


def resolve_for_accelerator(**arguments: Any) -> EngineConfig:
    """Resolve the engine's configuration for one ``Accelerator(...)`` call (see :func:`accelerator_settings`)."""
    return resolve_engine_config(accelerator_settings(**arguments))


def announce(config: EngineConfig, *, is_main_process: bool, device: torch.device) -> None:
    """Say once, on the main process, what the resolution decided that a user could not see otherwise
    (the resolver itself logs the whole config on one DEBUG line)."""
    if not is_main_process:
        return
    for notice in config.notices:
        logger.warning(notice)
    if config.fsdp is not None and not config.use_cpu and device.type == "cpu" and not torch.cuda.is_available() \
            and config.source_of("fsdp").startswith("launcher"):
        logger.warning("trainkit: no GPU found, so FSDP runs on CPU with gloo (use_cpu: false has no effect here).")
    if config.fsdp is not None and not config.fsdp.use_orig_params:
        logger.warning("trainkit: use_orig_params=False (%s) has no effect: FSDP2 always exposes the original "
                       "parameters.", config.source_of(FSDP_PREFIX + "use_orig_params"))
