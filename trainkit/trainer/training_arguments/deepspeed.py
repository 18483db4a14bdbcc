"""``TrainingArguments(deepspeed=...)``: a DeepSpeed JSON (or dict) run by the Trainer on trainkit's engine.

The config's ``"auto"`` values are filled from the arguments, as transformers fills them: the micro-batch
from ``per_device_train_batch_size``, accumulation from ``gradient_accumulation_steps``, clipping from
``max_grad_norm``, the optimizer's hyper-parameters from ``learning_rate``/``adam_*``/``weight_decay``, the
schedule's from the warm-up and total steps, bf16/fp16 from the precision flags. A value written in the
config must agree with the argument it shadows. The Trainer keeps doing what it does anyway (accumulation
windows, clipping, the optimizer step and the schedule), with the config's optimizer and schedule when
it has those blocks; the engine gets the ZeRO stage (FSDP2/DDP), offload and precision.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from trainkit.config.deepspeed import AutoValues, DeepSpeedPlugin, DeepSpeedSettings, read_deepspeed_config, translate
from trainkit.config.errors import ConfigError


@dataclasses.dataclass
class TrainerDeepSpeed:
    """The translated config (for the optimizer and schedule) and the plugin the engine receives."""

    settings: DeepSpeedSettings
    plugin: DeepSpeedPlugin


def deepspeed_for_trainer(args: Any, world_size: int | None = None) -> TrainerDeepSpeed:
    """Translate ``args.deepspeed`` with its ``"auto"`` values filled from ``args`` (see module doc)."""
    config = read_deepspeed_config(args.deepspeed)
    where = "TrainingArguments(deepspeed=...)"
    auto = AutoValues(mixed_precision=args.mixed_precision, gradient_accumulation_steps=args.gradient_accumulation_steps,
                      gradient_clipping=args.max_grad_norm, micro_batch_size=args.per_device_train_batch_size,
                      world_size=world_size, learning_rate=args.learning_rate,
                      betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon, weight_decay=args.weight_decay)
    settings = translate(config, auto, where=where)
    for name, config_value, argument in (
            ("gradient_accumulation_steps", settings.gradient_accumulation_steps, args.gradient_accumulation_steps),
            ("train_micro_batch_size_per_gpu", settings.micro_batch_size, args.per_device_train_batch_size),
            ("gradient_clipping", settings.gradient_clipping, args.max_grad_norm)):
        if config_value is not None and float(config_value) != float(argument):
            raise ConfigError(f"{name} is {config_value} in the DeepSpeed config but the TrainingArguments say "
                              f"{argument}; make them agree, or write \"auto\" in the config.")
    # The Trainer accumulates, clips and steps the optimizer and schedule itself: the engine gets the rest.
    engine_config = {key: value for key, value in config.items()
                     if key not in ("gradient_accumulation_steps", "gradient_clipping", "optimizer", "scheduler",
                                    "train_batch_size", "train_micro_batch_size_per_gpu")}
    for block in ("bf16", "fp16"):
        engine_config.pop(block, None)
    if settings.mixed_precision not in (None, "no"):  # resolved by translate(): "no", "fp16" or "bf16"
        engine_config[settings.mixed_precision] = {"enabled": True}
    return TrainerDeepSpeed(settings=settings, plugin=DeepSpeedPlugin(hf_ds_config=engine_config))


def optimizer_from_config(deepspeed: TrainerDeepSpeed | None, groups: list[dict[str, Any]],
                          args: Any) -> torch.optim.Optimizer | None:
    """The optimizer the config's ``optimizer`` block names, over ``groups``; None without such a block."""
    if deepspeed is None or deepspeed.settings.optimizer is None:
        return None
    from trainkit.engine import deepspeed_optimizer

    return deepspeed_optimizer(deepspeed.settings.optimizer, groups, lr=args.learning_rate,
                               weight_decay=args.weight_decay)


def scheduler_from_config(deepspeed: TrainerDeepSpeed | None, optimizer: torch.optim.Optimizer, args: Any,
                          num_training_steps: int) -> Any:
    """The schedule the config's ``scheduler`` block names; None without such a block."""
    if deepspeed is None or deepspeed.settings.scheduler is None:
        return None
    from trainkit.engine import deepspeed_scheduler

    return deepspeed_scheduler(deepspeed.settings.scheduler, optimizer, total_num_steps=num_training_steps,
                               warmup_num_steps=args.warmup_steps_for(num_training_steps))
