"""The engine's side of configuration: ``Accelerator(...)`` arguments and plugins as explicit settings,
and the one-time announcements (override notice, debug line) once the config is resolved.

Resolution itself lives in :mod:`trainkit.config.engine`; this module only says what the script set
(an argument left at None is "not set") and reports the result on the main process.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch

from trainkit.config.deepspeed import engine_values
from trainkit.config.dynamo import TorchDynamoPlugin
from trainkit.config.engine import FSDP_PREFIX, EngineConfig, Setting, resolve_engine_config
from trainkit.config.errors import ConfigError
from trainkit.config.options import declared_options
from trainkit.config.parallelism import ParallelismConfig

logger = logging.getLogger("trainkit.engine")


ACCELERATOR_KEYWORDS: dict[str, str] = {option.accelerator.name: name for name, option
                                        in declared_options(EngineConfig).items() if option.accelerator is not None}
"""``Accelerator(...)`` keyword -> the engine setting it sets, from the declarations (``config/engine_options.py``,
``config/precision.py``); ``timeout`` is ``InitProcessGroupKwargs``' field, which the Accelerator hands over."""


def accelerator_settings(*, fsdp_plugin: Any = None, gradient_accumulation_plugin: Any = None,
                         dynamo_backend: Any = None, dynamo_plugin: Any = None, deepspeed_plugin: Any = None,
                         parallelism_config: Any = None, torch_tp_plugin: Any = None, precision_options: Any = None,
                         **declared: Any) -> dict[str, Setting]:
    """The explicit settings of one ``Accelerator(...)`` call: only the arguments that were given.

    ``declared``: the keywords of :data:`ACCELERATOR_KEYWORDS` (``mixed_precision``, ``gradient_accumulation_steps``,
    ``cpu``, ``timeout``), each read by its option's :class:`~trainkit.config.options.Keyword` (None, and the values
    it names, are "not set"); the plugins below are structured and read here."""
    unknown = sorted(set(declared) - set(ACCELERATOR_KEYWORDS))
    if unknown:
        raise TypeError(f"accelerator_settings: unknown keywords {unknown}; declared: {sorted(ACCELERATOR_KEYWORDS)}.")
    settings: dict[str, Setting] = {}
    if deepspeed_plugin is not None:  # first: the script's own arguments must agree with its DeepSpeed config
        settings.update(deepspeed_plugin_settings(deepspeed_plugin))
    plugin_steps = getattr(gradient_accumulation_plugin, "num_steps", None)
    if plugin_steps is not None:
        settings["gradient_accumulation_steps"] = Setting(plugin_steps, "GradientAccumulationPlugin(num_steps=)")
    conflicts = []
    for name, option in declared_options(EngineConfig).items():
        keyword = option.accelerator
        if keyword is None or keyword.is_unset(declared.get(keyword.name)):
            continue
        value, source = keyword.setting(declared[keyword.name], "Accelerator")
        conflicts += _agree(settings, name, value)
        settings[name] = Setting(value, source)
    if fsdp_plugin is not None:
        if deepspeed_plugin is not None:
            conflicts.append("fsdp_plugin and deepspeed_plugin: choose one")
        settings.update(fsdp_plugin_settings(fsdp_plugin))
    if dynamo_plugin is not None or dynamo_backend is not None:
        settings["dynamo"] = Setting(dynamo_from_arguments(dynamo_backend, dynamo_plugin),
                                     "Accelerator(dynamo_plugin=)" if dynamo_plugin is not None else
                                     "Accelerator(dynamo_backend=)")
    if parallelism_config is not None:
        settings["parallelism"] = Setting(parallelism_config, "Accelerator(parallelism_config=)")
    elif torch_tp_plugin is not None:
        settings["parallelism"] = Setting(tp_plugin_parallelism(torch_tp_plugin), "Accelerator(torch_tp_plugin=)")
    if precision_options is not None:
        settings["precision_options"] = Setting(precision_options,
                                                f"Accelerator(kwargs_handlers=[{type(precision_options).__name__}])")
    if conflicts:
        raise ConfigError("Accelerator(...): " + "; ".join(conflicts) + ".")
    return settings


def tp_plugin_parallelism(plugin: Any) -> ParallelismConfig:
    """Accelerate's deprecated ``TorchTensorParallelPlugin(tp_size=...)`` as the ParallelismConfig it stands for
    (Accelerate converts it the same way, with a FutureWarning)."""
    tp_size = getattr(plugin, "tp_size", None)
    if tp_size is None:
        raise ConfigError(f"Accelerator(torch_tp_plugin=...): expected an object with tp_size (Accelerate's "
                          f"TorchTensorParallelPlugin), got {type(plugin).__name__}.")
    warnings.warn("Accelerator(torch_tp_plugin=...) is deprecated (as in Accelerate): pass "
                  f"parallelism_config=ParallelismConfig(tp_size={tp_size}) instead.", FutureWarning, stacklevel=4)
    return ParallelismConfig(tp_size=tp_size)


def _agree(settings: dict[str, Setting], key: str, value: Any) -> list[str]:
    """A conflict between an argument and the script's own DeepSpeed config, if any."""
    given = settings.get(key)
    if given is not None and str(given.value) != str(value):
        return [f"{key}={value!r} disagrees with {given.value!r} in the DeepSpeed config (write \"auto\" there)"]
    return []


def deepspeed_plugin_settings(plugin: Any, source: str = "DeepSpeedPlugin") -> dict[str, Setting]:
    """What a DeepSpeed config states, as explicit settings (``"auto"`` leaves a key unset)."""
    values = engine_values(plugin.deepspeed_config, where=source)
    return {key: Setting(value, source) for key, value in values.items()}


def dynamo_from_arguments(backend: Any, plugin: TorchDynamoPlugin | None) -> TorchDynamoPlugin:
    """``dynamo_plugin``, with ``dynamo_backend`` (when also given) as its backend; the backend is checked."""
    from trainkit.engine.step.compile import check_backend

    chosen = TorchDynamoPlugin(**{**vars(plugin), "backend": backend}) if plugin is not None and backend is not None \
        else plugin if plugin is not None else TorchDynamoPlugin(backend=backend)
    check_backend(chosen)
    return chosen


def fsdp_plugin_settings(plugin: Any, source: str = "FullyShardedDataParallelPlugin") -> dict[str, Setting]:
    """A plugin turns FSDP on, and each option it was given is explicit (the others stay unset). Its whole
    options object goes with "fsdp", so the resolver uses it as is when nothing else contributes."""
    settings = {"fsdp": Setting(plugin.options, source)}
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
    if config.deepspeed is not None and config.deepspeed.notice():
        logger.warning(config.deepspeed.notice())
    if config.fsdp is not None and not config.use_cpu and device.type == "cpu" and not torch.cuda.is_available() \
            and config.source_of("fsdp").startswith("launcher"):
        logger.warning("trainkit: no GPU found, so FSDP runs on CPU with gloo (use_cpu: false has no effect here).")
    if config.fsdp is not None and not config.fsdp.use_orig_params:
        logger.warning("trainkit: use_orig_params=False (%s) has no effect: FSDP2 always exposes the original "
                       "parameters.", config.source_of(FSDP_PREFIX + "use_orig_params"))
