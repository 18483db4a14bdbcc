"""The DeepSpeed mapping (no processes, no torch): every key maps, fills "auto", or is refused by name."""

from __future__ import annotations

import json

import pytest

from trainkit.config import ConfigError, LaunchConfig
from trainkit.config.deepspeed import AutoValues, DeepSpeedPlugin, plugin_from_yaml_block, translate

HF_STYLE = {  # transformers' documented ZeRO-3 template: almost everything "auto"
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                          "offload_param": {"device": "cpu", "pin_memory": True}, "overlap_comm": True,
                          "contiguous_gradients": True, "sub_group_size": 1e9, "reduce_bucket_size": "auto",
                          "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
                          "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
                          "stage3_gather_16bit_weights_on_model_save": True},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": False,
}
AUTO = AutoValues(mixed_precision="bf16", gradient_accumulation_steps=4, gradient_clipping=1.0, micro_batch_size=8,
                  world_size=2, learning_rate=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01, warmup_steps=10,
                  total_steps=100)


def test_zero3_offload_template_maps_to_fsdp2_with_autos_filled():
    settings = translate(HF_STYLE, AUTO)
    assert settings.zero_stage == 3 and settings.fsdp_config == {
        "fsdp_sharding_strategy": "FULL_SHARD", "fsdp_offload_params": True, "fsdp_state_dict_type": "FULL_STATE_DICT",
        "fsdp_cpu_ram_efficient_loading": False, "fsdp_sync_module_states": True}
    assert (settings.mixed_precision, settings.gradient_accumulation_steps, settings.gradient_clipping) == ("bf16", 4, 1.0)
    assert settings.micro_batch_size == 8
    assert settings.optimizer == {"type": "AdamW", "params": {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8,
                                                               "weight_decay": 0.01}}
    assert settings.scheduler["params"] == {"warmup_min_lr": 0.0, "warmup_max_lr": 3e-4, "warmup_num_steps": 10}
    assert "zero_optimization.overlap_comm" in settings.no_effect and "steps_per_print" in settings.no_effect
    assert "have no effect on FSDP2" in settings.notice()


@pytest.mark.parametrize("stage, expected", [(0, None), (1, None), (2, "SHARD_GRAD_OP"), (3, "FULL_SHARD")])
def test_each_stage_has_its_fsdp2_meaning(stage, expected):
    settings = translate({"zero_optimization": {"stage": stage}}, AutoValues())
    assert (settings.fsdp_config or {}).get("fsdp_sharding_strategy") == expected
    assert settings.shard_optimizer_state is (stage == 1)
    assert settings.fsdp_config is None or settings.fsdp_config["fsdp_state_dict_type"] == (
        "FULL_STATE_DICT" if stage == 2 else "SHARDED_STATE_DICT")  # stage 3 gathers only when asked


@pytest.mark.parametrize("config, words", [
    ({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/nvme"}}}, "nvme_path"),
    ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}, "offload_optimizer to cpu alone"),
    ({"zero_optimization": {"stage": 3, "zero_quantized_weights": True}}, r"ZeRO\+\+"),  # escaped: "++" is a possessive quantifier from Python 3.11, an error on 3.10
    ({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8}}, "HYBRID_SHARD"),
    ({"amp": {"enabled": True}}, "Apex"),
    ({"pipeline": {"stages": 2}}, "pipeline parallelism"),
    ({"fp16": {"enabled": True, "loss_scale": 128}}, "static loss scale"),
    ({"optimizer": {"type": "OneBitAdam"}}, "'OneBitAdam'.*Adam, AdamW, SGD"),
    ({"scheduler": {"type": "OneCycle"}}, "'OneCycle'.*WarmupLR"),
    ({"zero_optimization": {"stage": 3, "stage3_max_live_paramters": 1}}, "Did you mean 'zero_optimization.stage3_max_live_parameters'"),
    ({"bf16": {"enabled": True}, "fp16": {"enabled": True}}, "both bf16 and fp16"),
])
def test_what_cannot_map_is_refused_by_name(config, words):
    with pytest.raises(ConfigError, match=words):
        translate(config, AutoValues())


def test_switched_off_features_are_accepted():
    settings = translate({"activation_checkpointing": {"partition_activations": False}, "amp": {"enabled": False},
                          "zero_optimization": {"stage": 2, "zero_hpz_partition_size": 1, "mics_shard_size": -1}},
                         AutoValues())
    assert settings.zero_stage == 2


def test_explicit_values_must_agree_with_the_run():
    with pytest.raises(ConfigError, match=r"asks for fp16 but mixed_precision is 'bf16'"):
        translate({"fp16": {"enabled": True}}, AutoValues(mixed_precision="bf16"))
    with pytest.raises(ConfigError, match=r"train_batch_size 64 .* = 32"):
        translate({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2},
                  AutoValues(world_size=2))


def test_accelerate_yaml_block_and_launch_config(tmp_path):
    block = {"zero_stage": 3, "offload_optimizer_device": "cpu", "offload_param_device": "cpu",
             "zero3_init_flag": "true", "zero3_save_16bit_model": False, "gradient_accumulation_steps": 2,
             "gradient_clipping": 1.0}
    settings = translate(plugin_from_yaml_block(block, where="test").deepspeed_config, AutoValues())
    assert settings.fsdp_config["fsdp_cpu_ram_efficient_loading"] is True
    assert settings.fsdp_config["fsdp_state_dict_type"] == "SHARDED_STATE_DICT"
    assert (settings.gradient_accumulation_steps, settings.gradient_clipping) == (2, 1.0)
    config = LaunchConfig.from_mapping({"distributed_type": "DEEPSPEED", "num_processes": 2, "deepspeed_config": block})
    assert config.deepspeed_plugin().deepspeed_config["zero_optimization"]["stage"] == 3
    with pytest.raises(ConfigError, match=r"Unknown key 'zero_stag'.*Did you mean 'zero_stage'"):
        LaunchConfig.from_mapping({"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stag": 2}})
    with pytest.raises(ConfigError, match=r"deepspeed_multinode_launcher 'pdsh'"):
        plugin_from_yaml_block({"deepspeed_multinode_launcher": "pdsh"}, where="test")
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2}, "gradient_accumulation_steps": "auto"}))
    plugin = plugin_from_yaml_block({"deepspeed_config_file": str(path), "gradient_accumulation_steps": 4}, where="t")
    assert plugin.deepspeed_config["gradient_accumulation_steps"] == 4  # the YAML fills the file's "auto"
    with pytest.raises(ConfigError, match=r"zero_stage is 3 .* but zero_optimization.stage is 2 in the DeepSpeed config .*ds.json"):
        DeepSpeedPlugin(hf_ds_config=str(path), zero_stage=3)
