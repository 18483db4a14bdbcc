"""TrainingArguments projected into the engine's configuration: a field at its default is "not set" (CPU only)."""

from __future__ import annotations

from tests.trainer.helpers import EchoModel, IndexDataset
from trainkit import Trainer, TrainingArguments
from trainkit.config import LAUNCH_CONFIG_ENV, LaunchConfig, write_launch_handoff
from trainkit.config.engine import resolve_engine_config
from trainkit.trainer.training_arguments.engine_settings import training_arguments_settings


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


def test_the_launchers_accumulation_reaches_the_run_not_the_arguments(tmp_path, monkeypatch) -> None:
    """CPU, one process, started as `trainkit launch --gradient_accumulation_steps 4` starts it (its hand-off file).

    The arguments stay what the script wrote: transformers never writes a launcher's value into them (its
    Trainer ignores Accelerate's accumulation variable and hands Accelerate num_steps=1). The run accumulates
    4 micro-batches per optimizer step: one number, the engine's (``accelerator.gradient_accumulation_steps`` and
    ``accelerator.config``, with where the value came from); the Trainer opens each window itself.
    (transformers' own Trainer hands Accelerate num_steps=1, so there its ``accelerator.gradient_accumulation_steps``
    reads 1 while the run accumulates 4.)
    """
    launch = LaunchConfig.resolve([({"gradient_accumulation_steps": 4}, "flag")])
    monkeypatch.setenv(LAUNCH_CONFIG_ENV, str(write_launch_handoff(launch, tmp_path / "launch.json")))
    args = arguments(tmp_path, per_device_train_batch_size=2, num_train_epochs=1, save_strategy="no",
                     disable_tqdm=True)
    for _ in range(2):  # a second Trainer on the same arguments: still not set by the script, still the launcher's
        trainer = Trainer(model=EchoModel(), args=args, train_dataset=IndexDataset(16))
        assert args.gradient_accumulation_steps == 1
        config = trainer.accelerator.config
        assert config.gradient_accumulation_steps == 4
        assert config.source_of("gradient_accumulation_steps") == "launcher flag --gradient_accumulation_steps"
        assert trainer.accelerator.gradient_accumulation_steps == 4
        assert trainer.train().global_step == 2  # 16 samples in batches of 2: 8 micro-batches, windows of 4


def test_accumulation_the_arguments_set_wins_over_the_launcher(tmp_path, monkeypatch) -> None:
    """CPU, one process: TrainingArguments(gradient_accumulation_steps=2) under a launcher that says 4."""
    launch = LaunchConfig.resolve([({"gradient_accumulation_steps": 4}, "flag")])
    monkeypatch.setenv(LAUNCH_CONFIG_ENV, str(write_launch_handoff(launch, tmp_path / "launch.json")))
    args = arguments(tmp_path, per_device_train_batch_size=2, num_train_epochs=1, save_strategy="no",
                     disable_tqdm=True, gradient_accumulation_steps=2)
    trainer = Trainer(model=EchoModel(), args=args, train_dataset=IndexDataset(16))
    assert (args.gradient_accumulation_steps, trainer.accelerator.config.gradient_accumulation_steps) == (2, 2)
    assert trainer.accelerator.config.source_of("gradient_accumulation_steps") == "TrainingArguments(gradient_accumulation_steps=)"
    assert trainer.train().global_step == 4
