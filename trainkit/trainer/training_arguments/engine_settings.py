"""``TrainingArguments`` projected into the engine's explicit settings, with "not set" kept apart from a default.

A field counts as set when its value differs from transformers' default for it: ``bf16=True``,
``gradient_accumulation_steps=4``, ``use_cpu=True``, an ``fsdp`` value. A field left at its default (also
when passed explicitly, e.g. by ``HfArgumentParser``, which passes every field) is not set, so the
launcher's value applies: ``trainkit launch --mixed_precision bf16 --gradient_accumulation_steps 4`` reaches
a Trainer script whose arguments name neither — transformers itself treats ``fp16=bf16=False`` that way.

The arguments are only read, never written: the run's settings (accumulation, precision and the rest) are the
resolved :class:`~trainkit.config.engine.EngineConfig`, which the Trainer reads from ``accelerator.config``,
each with where it came from. ``TrainingArguments`` stay what the script wrote, as in transformers.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trainkit.config.checkpointing import training_arguments_fields as checkpointing_fields
from trainkit.config.dynamo import TorchDynamoPlugin
from trainkit.config.engine import FSDP_PREFIX, EngineConfig, Setting, parse_parallelism, resolve_engine_config
from trainkit.config.errors import ConfigError, check_choice
from trainkit.config.fsdp import FSDPOptions
from trainkit.config.options import declared_options

from trainkit.engine import deepspeed_plugin_settings, dynamo_from_arguments, transformers_layout

from .arguments import FSDP_SHARDING_WORDS, TrainingArguments

SOURCE = "TrainingArguments"
_TRANSFORMERS_DEFAULTS = {field.name: field.default for field in dataclasses.fields(TrainingArguments)}
"""Each field's default (transformers' own: ``trainer/training_arguments/fields.py`` compares them); a field left
there is not set."""


def training_arguments_settings(args: TrainingArguments, deepspeed_plugin: Any = None,
                                model: Any = None) -> dict[str, Setting]:
    """The engine settings ``args`` sets (see the module docstring for what "set" means).

    ``deepspeed_plugin`` is ``args.deepspeed`` already translated for the Trainer (trainer/training_arguments/deepspeed.py).
    """
    settings: dict[str, Setting] = {}
    if deepspeed_plugin is not None:
        settings.update(deepspeed_plugin_settings(deepspeed_plugin, f"{SOURCE}(deepspeed=)"))
    if args.torch_compile:
        plugin = TorchDynamoPlugin(backend=args.torch_compile_backend or "inductor", mode=args.torch_compile_mode)
        settings["dynamo"] = Setting(dynamo_from_arguments(None, plugin), f"{SOURCE}(torch_compile=True)")
    for name, declared in declared_options(EngineConfig).items():
        for keyword in declared.training_arguments:  # the first field set wins (fp16 before bf16)
            given = getattr(args, keyword.name)
            if not keyword.is_unset(given, _TRANSFORMERS_DEFAULTS[keyword.name]):
                settings[name] = Setting(*keyword.setting(given, SOURCE))
                break
    layout = transformers_layout(model)  # a model from_pretrained(distributed_config=...) already sharded
    if args.parallelism_config is not None:
        settings["parallelism"] = Setting(args.parallelism_config, f"{SOURCE}(parallelism_config=)")
        given = parse_parallelism(args.parallelism_config, SOURCE)
        if layout is not None and given is not None and given.degrees() != layout.degrees():
            raise ConfigError(f"parallelism_config in {SOURCE} ({given.degrees()}) differs from the layout the model "
                              f"was loaded with ({layout.degrees()}, its distributed_config); leave parallelism_config "
                              "unset to follow the model.")
    elif layout is not None:
        settings["parallelism"] = Setting(layout, "the model's distributed_config (from_pretrained)")
    options = args.fsdp_options
    if options is not None:
        words = args.fsdp if isinstance(args.fsdp, list) else str(args.fsdp).split()  # a list once resolved
        settings["fsdp"] = Setting(options, f"{SOURCE}(fsdp={' '.join(words)!r})")
        named_strategy = any(word in FSDP_SHARDING_WORDS for word in words)
        for option in FSDPOptions.field_names():
            value = getattr(options, option)
            if value != FSDPOptions.default_of(option) or (option == "sharding_strategy" and named_strategy):
                settings[FSDP_PREFIX + option] = Setting(value, f"{SOURCE}(fsdp/fsdp_config: {option})")
    return settings


def resolve_for_trainer(args: TrainingArguments, deepspeed_plugin: Any = None, model: Any = None) -> EngineConfig:
    """The engine's configuration for a Trainer: what ``args`` set > the launcher's flags and file > defaults
    (:func:`~trainkit.config.engine.resolve_engine_config`); ``model`` brings the layout it was loaded with
    (``from_pretrained(distributed_config=...)``); ``args`` are read only."""
    return resolve_engine_config(training_arguments_settings(args, deepspeed_plugin, model))


def accelerator_arguments(args: TrainingArguments, deepspeed_plugin: Any = None, model: Any = None) -> dict[str, Any]:
    """The ``Accelerator(...)`` keywords of the Trainer's engine, configured from ``args`` (the engine itself never
    sees TrainingArguments): the resolved ``engine_config``, DDP and process-group keywords, the DataLoader
    configuration, trackers and the checkpoint project.

    ``accelerator.config`` then holds the resolved settings, the run's accumulation among them (one number, the
    engine's: also ``accelerator.gradient_accumulation_steps``); the Trainer's loop opens each accumulation window
    itself (``open_accumulation_window``) and says so to the engine (``caller_opens_accumulation_windows``).
    """
    from trainkit.engine import ProjectConfiguration

    return {
        "engine_config": resolve_for_trainer(args, deepspeed_plugin, model),
        **engine_options(args),  # DDP keywords, process-group backend/timeout, DataLoader configuration
        "log_with": (args.report_to[0] if args.report_to == ["all"] else args.report_to) or None,
        "project_dir": args.output_dir,
        "project_config": ProjectConfiguration.from_parsed(  # the checkpointing section, parsed by the checks
            **{project_field: getattr(args, field) for field, (project_field, _) in checkpointing_fields().items()}),
    }


__all__ = ["accelerator_arguments", "resolve_for_trainer", "training_arguments_settings"]


def engine_options(args: TrainingArguments) -> dict[str, Any]:
    """Accelerator keyword arguments the ddp_* fields and accelerator_config decide."""
    from trainkit.engine import (
        DataLoaderConfiguration,
        DistributedDataParallelKwargs,
        GradientAccumulationPlugin,
        InitProcessGroupKwargs,
    )

    ddp_fields = {"find_unused_parameters": args.ddp_find_unused_parameters, "bucket_cap_mb": args.ddp_bucket_cap_mb,
                  "broadcast_buffers": args.ddp_broadcast_buffers, "static_graph": args.ddp_static_graph}
    handlers: list[Any] = [InitProcessGroupKwargs(backend=args.ddp_backend, timeout=args.ddp_timeout_if_set)]
    chosen: dict[str, Any] = {key: value for key, value in ddp_fields.items() if value is not None}
    if chosen:
        handlers.append(DistributedDataParallelKwargs(**chosen))
    # The Trainer resumes at the exact next batch: its loader's position is restored, never replayed.
    # transformers' Trainer shuffles with the seedable sampler (its accelerator_config default), from data_seed.
    # data_seed None: the engine takes torch's initial seed, what the Trainer's set_seed(seed) left (Accelerate's rule).
    data_config = DataLoaderConfiguration(data_seed=args.data_seed, use_stateful_dataloader=True,
                                          use_seedable_sampler=True)
    options: dict[str, Any] = {"kwargs_handlers": handlers, "dataloader_config": data_config}
    config = _accelerator_config_dict(args.accelerator_config)
    for key, value in config.items():
        if key == "use_configured_state":
            continue  # trainkit always reuses the process's existing state: what True asks for
        if key == "gradient_accumulation_kwargs":  # read by TrainingArguments; only sync_each_batch reaches the engine
            if (value or {}).get("sync_each_batch"):
                options["gradient_accumulation_plugin"] = GradientAccumulationPlugin(num_steps=1, sync_each_batch=True)
            continue
        if not hasattr(data_config, key):
            raise ValueError(f"accelerator_config[{key!r}] is not supported by this trainkit engine's DataLoaderConfiguration.")
        setattr(data_config, key, value)
    return options


def _accelerator_config_dict(config: Any) -> dict[str, Any]:
    """``args.accelerator_config`` (an AcceleratorConfig, which a script may have changed since the arguments were
    built) as a dict, checked again: an attribute set afterwards names a key too."""
    from trainkit.trainer.training_arguments.accelerator_config import ACCELERATOR_CONFIG_KEYS

    values = config.to_dict() if hasattr(config, "to_dict") else dict(config or {})
    for key in values:
        check_choice("accelerator_config key", key, ACCELERATOR_CONFIG_KEYS, where="TrainingArguments")
    return values
