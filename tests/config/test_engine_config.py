"""The engine's configuration resolver: explicit > launcher > default for every key, with provenance (no torch)."""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys

import pytest

from tests.distributed import REPO, worker_env
from trainkit.config import LAUNCH_CONFIG_ENV, ConfigError, LaunchConfig, write_launch_handoff
from trainkit.config.engine import PRECEDENCE, EngineConfig, Setting, launcher_settings, resolve_engine_config


def launched(mapping: dict, source: str = "flag") -> LaunchConfig:
    return LaunchConfig.resolve([(mapping, source)])


def test_each_key_takes_explicit_then_launcher_then_default() -> None:
    launch = launched({"mixed_precision": "bf16", "gradient_accumulation_steps": 4, "collective_timeout": 30})
    config = resolve_engine_config({"gradient_accumulation_steps": Setting(2, "Accelerator(gradient_accumulation_steps=)")},
                                   launch=launch)
    assert PRECEDENCE == ("explicit", "launcher", "default")
    assert (config.mixed_precision, config.gradient_accumulation_steps, config.use_cpu) == ("bf16", 2, False)
    assert config.collective_timeout == 30.0
    assert config.source_of("mixed_precision") == "launcher flag --mixed_precision"
    assert config.source_of("gradient_accumulation_steps") == "Accelerator(gradient_accumulation_steps=)"
    assert config.source_of("use_cpu") == "default"


def test_without_a_launcher_explicit_values_and_defaults_only() -> None:
    config = resolve_engine_config({"use_cpu": Setting(True, "Accelerator(cpu=)")}, launch=None)
    assert config == EngineConfig(use_cpu=True)
    assert config.source_of("use_cpu") == "Accelerator(cpu=)" and config.notices == ()


def test_one_notice_line_names_every_override_and_its_winner() -> None:
    launch = launched({"mixed_precision": "bf16", "gradient_accumulation_steps": 4}, source="/cfg/run.yaml")
    config = resolve_engine_config({
        "mixed_precision": Setting("no", "Accelerator(mixed_precision=)"),
        "gradient_accumulation_steps": Setting(8, "TrainingArguments(gradient_accumulation_steps=)"),
    }, launch=launch)
    assert len(config.notices) == 1
    line = config.notices[0]
    assert "mixed_precision='no' from Accelerator(mixed_precision=) overrides 'bf16' from launcher config /cfg/run.yaml" in line
    assert "gradient_accumulation_steps=8 from TrainingArguments(gradient_accumulation_steps=) overrides 4" in line


def test_no_notice_when_values_agree_or_the_launcher_only_had_its_default() -> None:
    launch = launched({"mixed_precision": "bf16"})  # accumulation: the launcher's own default, not a request
    config = resolve_engine_config({"mixed_precision": Setting("bfloat16", "Accelerator(mixed_precision=)"),
                                    "gradient_accumulation_steps": Setting(3, "Accelerator(gradient_accumulation_steps=)")},
                                   launch=launch)
    assert config.mixed_precision == "bf16" and config.notices == ()
    assert "gradient_accumulation_steps" not in launcher_settings(launch)


def test_fsdp_options_merge_option_by_option() -> None:
    launch = launched({"distributed_type": "FSDP", "fsdp_config": {"fsdp_sharding_strategy": "SHARD_GRAD_OP",
                                                                   "fsdp_offload_params": True}})
    config = resolve_engine_config({"fsdp": Setting(True, "FullyShardedDataParallelPlugin"),
                                    "fsdp.offload_params": Setting(False, "FullyShardedDataParallelPlugin(offload_params=)")},
                                   launch=launch)
    assert config.fsdp.sharding_strategy == "SHARD_GRAD_OP" and config.fsdp.offload_params is False
    assert config.source_of("fsdp.sharding_strategy") == "launcher flag --fsdp_sharding_strategy"
    assert config.source_of("fsdp.offload_params") == "FullyShardedDataParallelPlugin(offload_params=)"
    assert config.source_of("fsdp.backward_prefetch") == "default"
    assert len(config.notices) == 1 and "fsdp.offload_params=False" in config.notices[0]


def test_fsdp_off_unless_some_source_turns_it_on() -> None:
    config = resolve_engine_config({}, launch=launched({"num_processes": 2}))
    assert config.fsdp is None and not any(key.startswith("fsdp.") for key in config.provenance)
    assert config.source_of("fsdp") == "default"


@pytest.mark.parametrize("key, value, fragment", [
    ("mixed_precision", "bf17", "Did you mean 'bf16'"),
    ("mixed_precision", "fp8", "not supported"),
    ("gradient_accumulation_steps", 0, "must be >= 1"),
    ("fsdp.sharding_strategy", "FULL_SHARDD", "Did you mean 'FULL_SHARD'"),
])
def test_bad_values_name_the_key_the_value_and_where_they_came_from(key, value, fragment) -> None:
    explicit = {key: Setting(value, "Accelerator(test=)")}
    if key.startswith("fsdp."):
        explicit["fsdp"] = Setting(True, "Accelerator(test=)")
    with pytest.raises(ConfigError) as error:
        resolve_engine_config(explicit, launch=None)
    assert fragment in str(error.value) and "Accelerator(test=)" in str(error.value)


def test_unknown_keys_are_a_programming_error() -> None:
    with pytest.raises(ValueError, match="mixed_precison"):
        resolve_engine_config({"mixed_precison": Setting("bf16", "x")}, launch=None)


def test_config_is_frozen_and_describes_itself(caplog) -> None:
    with caplog.at_level(logging.DEBUG, logger="trainkit.config"):
        config = resolve_engine_config({"mixed_precision": Setting("fp16", "Accelerator(mixed_precision=)")}, launch=None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.mixed_precision = "bf16"  # type: ignore[misc]
    assert config.describe()[0] == "mixed_precision = fp16  (Accelerator(mixed_precision=))"
    assert any("trainkit engine config: mixed_precision = fp16  (Accelerator(mixed_precision=))" in r.getMessage()
               for r in caplog.records)
    changed = config.replace("Trainer", gradient_accumulation_steps=1)
    assert changed.source_of("gradient_accumulation_steps") == "Trainer" and changed.mixed_precision == "fp16"


def test_the_launchers_handoff_is_read_by_the_resolver(tmp_path, monkeypatch) -> None:
    config = launched({"use_cpu": True, "gradient_accumulation_steps": 2}, source="my.yaml")
    monkeypatch.setenv(LAUNCH_CONFIG_ENV, str(write_launch_handoff(config, tmp_path / "launch.json")))
    resolved = resolve_engine_config()
    assert resolved.use_cpu and resolved.gradient_accumulation_steps == 2
    assert resolved.source_of("use_cpu") == "launcher config my.yaml"


def test_resolver_imports_no_torch() -> None:
    code = "import sys, trainkit.config.engine; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, env=worker_env(), cwd=REPO, timeout=60)


def test_informational_accelerate_keys_asking_for_something_are_listed_as_unused() -> None:
    config = LaunchConfig.from_mapping({"downcast_bf16": "yes", "same_network": False, "main_training_function": "run"})
    assert config.unused_keys == ["downcast_bf16", "same_network", "main_training_function"]
    assert LaunchConfig.from_mapping({"downcast_bf16": "no", "same_network": True}).unused_keys == []
