"""Every ``deepspeed_config:`` block ``accelerate config`` writes is accepted; only real YAML/JSON conflicts fail.

The shapes below are the ones Accelerate's questionnaire writes (accelerate/commands/config/cluster.py):
with a JSON file it writes ``deepspeed_config_file`` and ``zero3_init_flag`` (plus launcher keys for
several machines); without one, ``zero_stage``, offload devices, ``gradient_accumulation_steps``,
optionally ``gradient_clipping``, ``zero3_save_16bit_model`` (stage 3) and ``zero3_init_flag``.
Plain data, no processes, no torch.
"""

from __future__ import annotations

import json

import pytest

from trainkit.config import ConfigError, LaunchConfig
from trainkit.config.deepspeed import AutoValues, DeepSpeedPlugin, translate


def _launch(block: dict) -> LaunchConfig:
    return LaunchConfig.from_mapping({"distributed_type": "DEEPSPEED", "num_processes": 2, "mixed_precision": "no",
                                      "deepspeed_config": block})


@pytest.fixture
def ds_json(tmp_path):
    def write(config: dict) -> str:
        path = tmp_path / "ds.json"
        path.write_text(json.dumps(config))
        return str(path)
    return write


@pytest.mark.parametrize("init_flag", [False, True])
@pytest.mark.parametrize("stage", [2, 3])
def test_config_file_with_zero3_init_flag_as_accelerate_config_writes_it(ds_json, stage, init_flag):
    path = ds_json({"zero_optimization": {"stage": stage}, "gradient_accumulation_steps": "auto"})
    plugin = _launch({"deepspeed_config_file": path, "zero3_init_flag": init_flag,
                      "deepspeed_multinode_launcher": "standard"}).deepspeed_plugin()
    assert plugin.zero_stage == stage
    settings = translate(plugin.deepspeed_config, AutoValues())
    assert settings.fsdp_config["fsdp_cpu_ram_efficient_loading"] is init_flag


@pytest.mark.parametrize("block", [
    {"zero_stage": 0, "gradient_accumulation_steps": 1, "zero3_init_flag": False},
    {"zero_stage": 1, "gradient_accumulation_steps": 1, "zero3_init_flag": False},
    {"zero_stage": 2, "offload_optimizer_device": "none", "offload_param_device": "none",
     "gradient_accumulation_steps": 1, "zero3_init_flag": False},
    {"zero_stage": 2, "offload_optimizer_device": "none", "offload_param_device": "none",
     "gradient_accumulation_steps": 4, "gradient_clipping": 1.0, "zero3_init_flag": False},
    {"zero_stage": 3, "offload_optimizer_device": "none", "offload_param_device": "none",
     "gradient_accumulation_steps": 1, "zero3_save_16bit_model": True, "zero3_init_flag": True},
    {"zero_stage": 3, "offload_optimizer_device": "cpu", "offload_param_device": "cpu",
     "gradient_accumulation_steps": 1, "zero3_save_16bit_model": False, "zero3_init_flag": False},
])
def test_blocks_without_a_file_as_accelerate_config_writes_them(block):
    plugin = _launch(block).deepspeed_plugin()
    settings = translate(plugin.deepspeed_config, AutoValues())
    assert settings.zero_stage == block["zero_stage"]
    assert settings.gradient_accumulation_steps == block["gradient_accumulation_steps"]
    assert settings.gradient_clipping == block.get("gradient_clipping")
    if block["zero_stage"] == 3:
        assert settings.fsdp_config["fsdp_offload_params"] is (block["offload_param_device"] == "cpu")
        assert settings.fsdp_config["fsdp_state_dict_type"] == (
            "FULL_STATE_DICT" if block["zero3_save_16bit_model"] else "SHARDED_STATE_DICT")
        assert settings.fsdp_config["fsdp_cpu_ram_efficient_loading"] is block["zero3_init_flag"]


def test_nvme_offload_from_the_questionnaire_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match="NVMe"):
        _launch({"zero_stage": 3, "offload_optimizer_device": "nvme", "offload_param_device": "nvme",
                 "offload_param_nvme_path": "/nvme", "offload_optimizer_nvme_path": "/nvme"})


@pytest.mark.parametrize("key, file_value, yaml_value", [
    ("gradient_accumulation_steps", 4, 4), ("gradient_clipping", 1.0, 1), ("gradient_accumulation_steps", "auto", 8),
    ("gradient_clipping", "auto", 0.5),
])
def test_equal_values_in_yaml_and_json_are_accepted_and_auto_is_filled(ds_json, key, file_value, yaml_value):
    path = ds_json({"zero_optimization": {"stage": 2}, key: file_value})
    plugin = _launch({"deepspeed_config_file": path, key: yaml_value}).deepspeed_plugin()
    assert float(plugin.deepspeed_config[key]) == float(yaml_value)
    assert float(getattr(plugin, key)) == float(yaml_value)


@pytest.mark.parametrize("yaml_key, yaml_value, file_config, file_words", [
    ("gradient_accumulation_steps", 8, {"gradient_accumulation_steps": 4}, "gradient_accumulation_steps is 4"),
    ("gradient_clipping", 0.5, {"gradient_clipping": 1.0}, "gradient_clipping is 1.0"),
    ("zero_stage", 3, {}, "zero_optimization.stage is 2"),
    ("zero3_init_flag", False, {"zero3_init_flag": True}, "zero_optimization.zero3_init_flag is True"),
    ("zero3_save_16bit_model", True, {"stage3_gather_16bit_weights_on_model_save": False},
     "stage3_gather_16bit_weights_on_model_save is False"),
    ("offload_param_device", "none", {"offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}},
     "offload_param.device is 'cpu'"),
])
def test_a_real_conflict_names_both_values_and_the_file(ds_json, yaml_key, yaml_value, file_config, file_words):
    top_level = yaml_key in ("gradient_accumulation_steps", "gradient_clipping")  # the others sit under zero_optimization
    zero = {"stage": 2} if top_level else {"stage": 2, **file_config}
    path = ds_json({"zero_optimization": zero, **(file_config if top_level else {})})
    with pytest.raises(ConfigError) as caught:
        _launch({"deepspeed_config_file": path, yaml_key: yaml_value})
    message = str(caught.value)
    assert f"{yaml_key} is {yaml_value!r} in deepspeed_config" in message
    assert file_words in message and path in message


def test_the_plugin_follows_the_same_rule(ds_json):
    path = ds_json({"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True}})
    plugin = DeepSpeedPlugin(hf_ds_config=path, zero_stage=3, zero3_init_flag=False, zero3_save_16bit_model=True)
    assert (plugin.zero_stage, plugin.zero3_save_16bit_model) == (3, True)
    with pytest.raises(ConfigError, match=r"zero_stage is 2 .* zero_optimization.stage is 3 .*ds.json"):
        DeepSpeedPlugin(hf_ds_config=path, zero_stage=2)


def test_deepspeed_config_file_none_means_no_file():
    plugin = _launch({"deepspeed_config_file": "none", "zero_stage": 2}).deepspeed_plugin()
    assert plugin.deepspeed_config["zero_optimization"]["stage"] == 2


@pytest.mark.parametrize("stage", [0, 1])
def test_zero3_init_flag_below_stage_2_is_named_as_having_no_effect(stage):
    settings = translate(_launch({"zero_stage": stage, "zero3_init_flag": True}).deepspeed_plugin().deepspeed_config,
                         AutoValues())
    assert settings.fsdp_config is None
    assert "zero_optimization.zero3_init_flag (stages 0 and 1 keep whole replicas)" in settings.notice()


def test_trainkit_config_writes_the_file_and_flag_pair_and_reads_it_back(ds_json):
    """`trainkit config`'s DeepSpeed answers with a JSON file: the same pair Accelerate writes, accepted as is."""
    import io

    from trainkit.cli.config_questions import Asker, ask_deepspeed_options

    path = ds_json({"zero_optimization": {"stage": 3}})
    block = ask_deepspeed_options(Asker(io.StringIO(f"{path}\nyes\n"), io.StringIO()))
    assert block == {"deepspeed_config_file": path, "zero3_init_flag": True}
    settings = translate(_launch(block).deepspeed_plugin().deepspeed_config, AutoValues())
    assert settings.fsdp_config["fsdp_cpu_ram_efficient_loading"] is True
