"""A bad FSDP value names its key and the file (or flag) it came from; reshard_after_forward has one parser.

No processes, no torch except the plugin test (which builds no model).
"""

from __future__ import annotations

import pytest
import yaml

from trainkit.config import ConfigError, LaunchConfig, load_fsdp_config
from trainkit.config.fsdp import FSDPOptions, parse_reshard_after_forward

# One bad value per FSDP option that has a parser (every field of FSDPOptions but the free-form ones).
BAD_VALUES = {
    "fsdp_sharding_strategy": ("FULL_SHRAD", "sharding_strategy"),
    "fsdp_offload_params": ("maybe", "offload_params"),
    "fsdp_auto_wrap_policy": ("BY_SIZE", "auto_wrap_policy"),
    "fsdp_transformer_layer_cls_to_wrap": (3, "transformer_layer_cls_to_wrap"),
    "fsdp_min_num_params": ("lots", "min_num_params"),
    "fsdp_backward_prefetch": ("SOMETIMES", "backward_prefetch"),
    "fsdp_forward_prefetch": ("2", "forward_prefetch"),
    "fsdp_state_dict_type": ("LOCAL", "state_dict_type"),
    "fsdp_cpu_ram_efficient_loading": ("perhaps", "cpu_ram_efficient_loading"),
    "fsdp_sync_module_states": ("nah", "sync_module_states"),
    "fsdp_use_orig_params": ("x", "use_orig_params"),
    "fsdp_activation_checkpointing": (7, "activation_checkpointing"),
    "fsdp_hybrid_shard_group_size": ("x", "hybrid_shard_group_size"),
    "fsdp_reshard_after_forward": ("maybe", "fsdp_reshard_after_forward"),
}


def test_every_option_with_a_parser_is_covered():
    covered = {key[len("fsdp_"):] for key in BAD_VALUES} - {"reshard_after_forward"}
    assert covered == set(FSDPOptions.field_names())


@pytest.mark.parametrize("key", sorted(BAD_VALUES))
def test_a_bad_value_in_a_launch_yaml_names_the_file_and_the_key(tmp_path, key):
    value, named = BAD_VALUES[key]
    path = tmp_path / "my.yaml"
    path.write_text(yaml.safe_dump({"distributed_type": "FSDP", "fsdp_config": {key: value}}))
    with pytest.raises(ConfigError) as caught:
        LaunchConfig.resolve([(yaml.safe_load(path.read_text()), str(path))])
    assert f"'{named}'" in str(caught.value) and f"fsdp_config ({path})" in str(caught.value)


@pytest.mark.parametrize("key", sorted(BAD_VALUES))
def test_a_bad_value_in_a_trainer_fsdp_config_file_names_the_file(tmp_path, key):
    value, named = BAD_VALUES[key]
    path = tmp_path / "fsdp.yaml"
    path.write_text(yaml.safe_dump({key: value}))
    with pytest.raises(ConfigError, match=rf"'{named}' in fsdp_config \({path}\)"):
        load_fsdp_config(str(path))


def test_a_flag_beside_a_file_is_blamed_on_the_flag_not_the_file(tmp_path):
    file_layer = {"distributed_type": "FSDP", "fsdp_config": {"fsdp_state_dict_type": "SHARDED_STATE_DICT"}}
    with pytest.raises(ConfigError, match=r"'min_num_params' in fsdp_config \(flag\)"):
        LaunchConfig.resolve([(file_layer, "my.yaml"), ({"fsdp_config": {"fsdp_min_num_params": "lots"}}, "flag")])
    with pytest.raises(ConfigError, match=r"'state_dict_type' in fsdp_config \(my.yaml\)"):
        LaunchConfig.resolve([({"distributed_type": "FSDP", "fsdp_config": {"fsdp_state_dict_type": "X"}}, "my.yaml"),
                              ({"fsdp_config": {"fsdp_min_num_params": 10}}, "flag")])


SPELLINGS = [(True, "FULL_SHARD"), (False, "SHARD_GRAD_OP"), (1, "FULL_SHARD"), (0, "SHARD_GRAD_OP"),
             ("1", "FULL_SHARD"), ("0", "SHARD_GRAD_OP"), ("true", "FULL_SHARD"), ("False", "SHARD_GRAD_OP"),
             ("yes", "FULL_SHARD"), ("off", "SHARD_GRAD_OP"), ("SHARD_GRAD_OP", "SHARD_GRAD_OP"),
             ("hybrid_shard", "HYBRID_SHARD"), (2, "SHARD_GRAD_OP"), ("3", "NO_SHARD")]


@pytest.mark.parametrize("value, strategy", SPELLINGS)
def test_reshard_after_forward_reads_the_same_everywhere(value, strategy):
    from trainkit import FullyShardedDataParallelPlugin  # CPU: builds options only, no model

    assert parse_reshard_after_forward(value, key="reshard_after_forward", where="t") == strategy
    assert FullyShardedDataParallelPlugin(reshard_after_forward=value).sharding_strategy == strategy
    launch = LaunchConfig.from_mapping({"distributed_type": "FSDP", "fsdp_config": {"fsdp_reshard_after_forward": value}})
    assert launch.fsdp_config.sharding_strategy == strategy
    assert load_fsdp_config({"reshard_after_forward": value}).sharding_strategy == strategy


def test_reshard_after_forward_and_sharding_strategy_are_one_option_across_layers():
    config = LaunchConfig.resolve([({"distributed_type": "FSDP", "fsdp_config": {"fsdp_reshard_after_forward": False}},
                                    "my.yaml"), ({"fsdp_config": {"fsdp_sharding_strategy": "FULL_SHARD"}}, "flag")])
    assert config.fsdp_config.sharding_strategy == "FULL_SHARD"
    assert config.source_of("fsdp_config.fsdp_sharding_strategy") == "flag"
