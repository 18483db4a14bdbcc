"""TrainingArguments projected into the engine's configuration: a field at its default is "not set"."""

from __future__ import annotations

from trainkit import TrainingArguments
from trainkit.config import LaunchConfig
from trainkit.config.engine import resolve_engine_config
from trainkit.trainer.engine_settings import engine_config_for_trainer, training_arguments_settings


def arguments(tmp_path, **kwargs) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path), report_to="none", **kwargs)


def test_defaults_set_nothing_so_the_launcher_decides(tmp_path) -> None:
    # HfArgumentParser passes every field: explicitly passing a default must not count as setting it.
    args = arguments(tmp_path, bf16=False, fp16=False, gradient_accumulation_steps=1, use_cpu=False)
    assert training_arguments_settings(args) == {}
    launch = LaunchConfig.resolve([({"mixed_precision": "bf16", "gradient_accumulation_steps": 4}, "flag")])
    config = resolve_engine_config(training_arguments_settings(args), launch=launch)
    assert (config.mixed_precision, config.gradient_accumulation_steps) == ("bf16", 4) and config.notices == ()


def test_fields_the_script_set_are_explicit(tmp_path) -> None:
    args = arguments(tmp_path, bf16=True, gradient_accumulation_steps=2, use_cpu=True, fsdp="shard_grad_op offload")
    settings = training_arguments_settings(args)
    assert settings["mixed_precision"].value == "bf16" and settings["mixed_precision"].source == "TrainingArguments(bf16=True)"
    assert settings["gradient_accumulation_steps"].value == 2 and settings["use_cpu"].value is True
    assert settings["fsdp"].value is args.fsdp_options  # "on, with these options": the resolver reuses them
    assert settings["fsdp.sharding_strategy"].value == "SHARD_GRAD_OP" and settings["fsdp.offload_params"].value is True
    assert "fsdp.backward_prefetch" not in settings  # left at its default: the launcher's value may apply


def test_a_named_full_shard_is_explicit_although_it_is_the_default(tmp_path) -> None:
    settings = training_arguments_settings(arguments(tmp_path, fsdp="full_shard"))
    assert settings["fsdp.sharding_strategy"].value == "FULL_SHARD"


def test_the_trainers_engine_steps_every_call_and_says_why(tmp_path) -> None:
    launch = LaunchConfig.resolve([({"gradient_accumulation_steps": 4}, "flag")])
    config = resolve_engine_config(training_arguments_settings(arguments(tmp_path)), launch=launch)
    engine = engine_config_for_trainer(config)
    assert engine.gradient_accumulation_steps == 1
    assert engine.source_of("gradient_accumulation_steps") == (
        "Trainer (runs its own windows of 4, from launcher flag --gradient_accumulation_steps)")
