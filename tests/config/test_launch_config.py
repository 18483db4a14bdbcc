"""LaunchConfig: Accelerate's files load as they are, layers resolve in order, errors name the fix."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.distributed import FSDP_ISSUE_YAML
from trainkit.config import (
    ConfigError,
    FSDPOptions,
    LaunchConfig,
    default_config_path,
    load_fsdp_config,
    read_mapping_file,
    write_config_file,
)

FSDP_YAML = FSDP_ISSUE_YAML  # Hugging Face's FSDP docs file (issue 3), shipped verbatim


@pytest.fixture
def fsdp_file(tmp_path):
    path = tmp_path / "fsdp.yaml"
    path.write_text(FSDP_YAML)
    return path


def test_fsdp_yaml_from_the_docs_loads_verbatim(fsdp_file):
    config = LaunchConfig.from_file(str(fsdp_file))
    assert config.distributed_type == "FSDP"
    assert config.mixed_precision == "bf16"
    assert config.num_processes == 2 and config.processes_per_machine == 2
    assert config.use_cpu is False and config.downcast_bf16 is False
    fsdp = config.fsdp_config
    assert isinstance(fsdp, FSDPOptions)
    assert fsdp.backward_prefetch == "BACKWARD_PRE"  # the docs' *_policy spelling is accepted
    assert fsdp.transformer_layer_cls_to_wrap == ["BertLayer"]
    assert fsdp.state_dict_type == "SHARDED_STATE_DICT"
    assert fsdp.cpu_ram_efficient_loading and fsdp.sync_module_states
    assert config.unused_keys == []  # tpu_* with empty values ask for nothing
    assert config.source_of("mixed_precision") == str(fsdp_file)
    assert config.source_of("collective_timeout") == "default"
    assert config.source_of("fsdp_config.fsdp_sharding_strategy") == str(fsdp_file)


def test_to_dict_round_trips_and_stays_readable_by_accelerate(fsdp_file, tmp_path):
    config = LaunchConfig.from_file(str(fsdp_file))
    written = config.to_dict()
    assert written["downcast_bf16"] == "no"
    assert written["fsdp_config"]["fsdp_sharding_strategy"] == "FULL_SHARD"
    assert all(key.startswith("fsdp_") for key in written["fsdp_config"])
    # trainkit-only keys at their defaults are left out: Accelerate rejects keys it does not know.
    assert "collective_timeout" not in written and "max_restarts" not in written
    assert "collective_timeout" in config.to_dict(full=True)
    for suffix in ("yaml", "json"):
        path = write_config_file(written, tmp_path / f"again.{suffix}")
        again = LaunchConfig.from_file(str(path))
        assert again.to_dict() == written
        assert again.fsdp_config == config.fsdp_config


def test_layers_resolve_in_order_with_provenance():
    file_layer = {"distributed_type": "FSDP", "num_processes": 2, "mixed_precision": "fp16",
                  "fsdp_config": {"fsdp_sharding_strategy": "FULL_SHARD", "fsdp_offload_params": True}}
    flags = {"mixed_precision": "bf16", "fsdp_config": {"fsdp_sharding_strategy": "SHARD_GRAD_OP"}}
    config = LaunchConfig.resolve([({"num_processes": 4}, "default.yaml"), (file_layer, "my.yaml"), (flags, "flag")])
    assert config.mixed_precision == "bf16" and config.source_of("mixed_precision") == "flag"
    assert config.num_processes == 2 and config.source_of("num_processes") == "my.yaml"
    assert config.fsdp_config.sharding_strategy == "SHARD_GRAD_OP"
    assert config.fsdp_config.offload_params is True  # merged option by option, not replaced
    assert config.source_of("fsdp_config.fsdp_offload_params") == "my.yaml"
    assert config.source_of("fsdp_config.fsdp_sharding_strategy") == "flag"


def test_num_processes_above_one_promotes_no_to_a_multi_type():
    assert LaunchConfig.from_mapping({"num_processes": 2}, cuda_available=True).distributed_type == "MULTI_GPU"
    assert LaunchConfig.from_mapping({"num_processes": 2}, cuda_available=False).distributed_type == "MULTI_CPU"
    assert LaunchConfig.from_mapping({"num_processes": 2, "use_cpu": True}).distributed_type == "MULTI_CPU"
    config = LaunchConfig.from_mapping({"distributed_type": "NO"})
    assert config.distributed_type == "NO" and config.fsdp_config is None


def test_defaults_match_accelerate_semantics():
    config = LaunchConfig()
    config_from_empty = LaunchConfig.from_mapping({})
    assert config_from_empty.to_dict() == LaunchConfig.from_mapping(config_from_empty.to_dict()).to_dict()
    assert config.collective_timeout == 600.0 and config.gradient_accumulation_steps == 1
    # Accelerate's -1 ("unspecified") and its legacy fp16 key
    legacy = LaunchConfig.from_mapping({"num_processes": -1, "fp16": True, "distributed_type": "NO"})
    assert legacy.num_processes == 1 and legacy.mixed_precision == "fp16"


def test_unused_accelerate_keys_are_accepted_and_listed():
    config = LaunchConfig.from_mapping({
        "distributed_type": "MULTI_GPU", "deepspeed_config": {"zero_stage": 2}, "dynamo_config": {},
        "enable_cpu_affinity": True, "tpu_env": [], "fsdp_config": {},
    })
    assert config.unused_keys == ["deepspeed_config", "enable_cpu_affinity"]
    assert "deepspeed_config" in config.unused_keys_notice()
    non_fsdp_with_section = LaunchConfig.from_mapping({"distributed_type": "MULTI_CPU",
                                                       "fsdp_config": {"fsdp_offload_params": True}})
    assert non_fsdp_with_section.fsdp_config is None and "fsdp_config" in non_fsdp_with_section.unused_keys


@pytest.mark.parametrize(
    ("mapping", "expected"),
    [
        ({"mixed_precison": "bf16"}, ["'mixed_precison'", "Did you mean 'mixed_precision'"]),
        ({"mixed_precision": "bf61"}, ["'bf61'", "Did you mean 'bf16'", "no, fp16, bf16"]),
        ({"distributed_type": "FDSP"}, ["'FDSP'", "Did you mean 'FSDP'", "MULTI_CPU"]),
        ({"distributed_type": "FSDP", "fsdp_config": {"fsdp_sharding_stratgy": "FULL_SHARD"}},
         ["'fsdp_sharding_stratgy'", "Did you mean 'fsdp_sharding_strategy'"]),
        ({"distributed_type": "FSDP", "fsdp_config": {"fsdp_sharding_strategy": "FULL_SHRAD"}},
         ["'FULL_SHRAD'", "Did you mean 'FULL_SHARD'"]),
        ({"rdzv_backend": "c10"}, ["'c10'", "Did you mean 'c10d'", "static"]),
        ({"distributed_type": "MEGATRON_LM"}, ["not support", "NO, MULTI_CPU, MULTI_GPU, FSDP, DEEPSPEED"]),
        ({"distributed_type": "multi_npu"}, ["not support"]),
        ({"mixed_precision": "fp8"}, ["fp8", "not supported"]),
        ({"num_processes": 3, "num_machines": 2}, ["multiple of num_machines"]),
        ({"num_machines": 2, "machine_rank": 2}, ["machine_rank"]),
        ({"num_processes": "two"}, ["'num_processes'", "integer"]),
        ({"use_cpu": "maybe"}, ["'use_cpu'", "true, false"]),
        ({"collective_timeout": 0}, ["'collective_timeout'", "> 0"]),
        ({"main_process_port": 70000}, ["main_process_port"]),
        ({"compute_environment": "AMAZON_SAGEMAKER"}, ["not supported"]),
    ],
)
def test_invalid_keys_and_values_name_the_fix(mapping, expected):
    with pytest.raises(ConfigError) as caught:
        LaunchConfig.from_mapping(mapping, source="my.yaml")
    for fragment in expected:
        assert fragment in str(caught.value)


def test_errors_name_the_file(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("distributed_type: NO\nnum_proceses: 2\n")
    with pytest.raises(ConfigError, match=r"num_proceses.*typo\.yaml.*Did you mean 'num_processes'"):
        LaunchConfig.from_file(str(path))
    path.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        LaunchConfig.from_file(str(path))
    with pytest.raises(ConfigError, match="does not exist"):
        LaunchConfig.from_file(str(tmp_path / "missing.yaml"))


def test_default_config_path_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TRAINKIT_CONFIG_FILE", str(tmp_path / "x.yaml"))
    assert default_config_path() == tmp_path / "x.yaml"
    monkeypatch.delenv("TRAINKIT_CONFIG_FILE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_config_path() == tmp_path / "cache" / "trainkit" / "default_config.yaml"


def test_load_fsdp_config_accepts_every_form(fsdp_file, tmp_path):
    from_launch_file = load_fsdp_config(str(fsdp_file))
    assert from_launch_file.transformer_layer_cls_to_wrap == ["BertLayer"]
    assert load_fsdp_config(read_mapping_file(fsdp_file)) == from_launch_file
    bare = tmp_path / "fsdp.json"
    bare.write_text(json.dumps({"sharding_strategy": 2, "min_num_params": 1e6, "backward_prefetch": "backward_post"}))
    options = load_fsdp_config(bare)
    assert options.sharding_strategy == "SHARD_GRAD_OP" and options.min_num_params == 1_000_000
    assert options.backward_prefetch == "BACKWARD_POST"
    assert load_fsdp_config({"fsdp_offload_params": "true"}).offload_params is True
    assert load_fsdp_config(None) is None and load_fsdp_config(options) is options
    no_section = tmp_path / "ddp.yaml"
    no_section.write_text("distributed_type: MULTI_GPU\n")
    with pytest.raises(ConfigError, match="fsdp_config"):
        load_fsdp_config(str(no_section))


def test_config_package_imports_no_torch():
    code = "import sys, trainkit.config; assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
