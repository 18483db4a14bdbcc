"""``TrainingArguments`` projected into the engine's explicit settings, with "not set" kept apart from a default.

A field counts as set when its value differs from transformers' default for it: ``bf16=True``,
``gradient_accumulation_steps=4``, ``use_cpu=True``, an ``fsdp`` value. A field left at its default (also
when passed explicitly, e.g. by ``HfArgumentParser``, which passes every field) is not set, so the
launcher's value applies: ``trainkit launch --mixed_precision bf16 --gradient_accumulation_steps 4`` reaches
a Trainer script whose arguments name neither — transformers itself treats ``fp16=bf16=False`` that way.
"""

from __future__ import annotations

from typing import Any

from trainkit.config.dynamo import TorchDynamoPlugin
from trainkit.config.engine import FSDP_PREFIX, EngineConfig, Setting, resolve_engine_config
from trainkit.config.fsdp import FSDPOptions

from trainkit.engine.api.configuration import deepspeed_plugin_settings, dynamo_from_arguments

from .arguments import TrainingArguments

SOURCE = "TrainingArguments"
_LAUNCHER_FILLED = "_trainkit_launcher_filled"  # fields the Trainer copied from the launcher into the arguments


def training_arguments_settings(args: TrainingArguments, deepspeed_plugin: Any = None) -> dict[str, Setting]:
    """The engine settings ``args`` sets (see the module docstring for what "set" means).

    ``deepspeed_plugin`` is ``args.deepspeed`` already translated for the Trainer (trainer/deepspeed.py).
    """
    filled: dict[str, object] = getattr(args, _LAUNCHER_FILLED, {})
    settings: dict[str, Setting] = {}
    if deepspeed_plugin is not None:
        settings.update(deepspeed_plugin_settings(deepspeed_plugin, f"{SOURCE}(deepspeed=)"))
    if args.torch_compile:
        plugin = TorchDynamoPlugin(backend=args.torch_compile_backend or "inductor", mode=args.torch_compile_mode)
        settings["dynamo"] = Setting(dynamo_from_arguments(None, plugin), f"{SOURCE}(torch_compile=True)")
    if args.fp16 or args.bf16:
        settings["mixed_precision"] = Setting(args.mixed_precision, f"{SOURCE}({'fp16' if args.fp16 else 'bf16'}=True)")
    if args.gradient_accumulation_steps not in (1, filled.get("gradient_accumulation_steps")):
        settings["gradient_accumulation_steps"] = Setting(args.gradient_accumulation_steps,
                                                          f"{SOURCE}(gradient_accumulation_steps=)")
    if args.use_cpu:
        settings["use_cpu"] = Setting(True, f"{SOURCE}(use_cpu=True)")
    if args.ddp_timeout_if_set is not None:  # 1800 (transformers' default) counts as not set
        settings["collective_timeout"] = Setting(float(args.ddp_timeout), f"{SOURCE}(ddp_timeout=)")
    options = args.fsdp_options
    if options is not None:
        words = args.fsdp if isinstance(args.fsdp, list) else str(args.fsdp).split()  # a list once resolved
        settings["fsdp"] = Setting(options, f"{SOURCE}(fsdp={' '.join(words)!r})")
        named_strategy = any(word in ("full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "hybrid_shard_zero2")
                             for word in words)
        for option in FSDPOptions.field_names():
            value = getattr(options, option)
            if value != FSDPOptions.default_of(option) or (option == "sharding_strategy" and named_strategy):
                settings[FSDP_PREFIX + option] = Setting(value, f"{SOURCE}(fsdp/fsdp_config: {option})")
    return settings


def resolve_for_trainer(args: TrainingArguments, deepspeed_plugin: Any = None) -> EngineConfig:
    """Resolve the engine's configuration for a Trainer, then give the arguments the launcher's accumulation.

    The Trainer runs its own accumulation windows from ``args.gradient_accumulation_steps``, so a value that
    came from the launcher is written there (and remembered as the launcher's, so a second Trainer on the
    same arguments still sees it as not set by the script).
    """
    config = resolve_engine_config(training_arguments_settings(args, deepspeed_plugin))
    steps = config.gradient_accumulation_steps
    if steps != args.gradient_accumulation_steps:
        args.gradient_accumulation_steps = steps
        setattr(args, _LAUNCHER_FILLED, {"gradient_accumulation_steps": steps})
    return config


def engine_config_for_trainer(config: EngineConfig) -> EngineConfig:
    """What the Trainer's Accelerator runs with: the Trainer accumulates itself, so its engine steps every call."""
    steps, source = config.gradient_accumulation_steps, config.source_of("gradient_accumulation_steps")
    return config.replace(f"Trainer (runs its own windows of {steps}, from {source})", gradient_accumulation_steps=1)


__all__ = ["engine_config_for_trainer", "resolve_for_trainer", "training_arguments_settings"]
