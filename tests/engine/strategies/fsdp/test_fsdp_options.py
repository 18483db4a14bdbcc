"""FSDP options without processes: the plugin's accepted spellings, errors before training, wrap units, meshes."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import (
    BackwardPrefetch,
    CPUOffload,
    FullOptimStateDictConfig,
    FullStateDictConfig,
    ShardedStateDictConfig,
    ShardingStrategy,
    StateDictType,
)
from transformers import BertConfig, BertForSequenceClassification

from trainkit.config import ConfigError, FSDPOptions, LaunchConfig
from trainkit.engine.strategies.fsdp import sharding
from trainkit.engine.strategies.fsdp.plugin import FullyShardedDataParallelPlugin


@pytest.fixture(scope="module")
def bert() -> BertForSequenceClassification:
    return BertForSequenceClassification(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                                    num_attention_heads=2, intermediate_size=64))


@pytest.mark.parametrize("given, expected", [
    ("full_shard", "FULL_SHARD"), (1, "FULL_SHARD"), ("2", "SHARD_GRAD_OP"), (3, "NO_SHARD"),
    (4, "HYBRID_SHARD"), (5, "HYBRID_SHARD_ZERO2"), (ShardingStrategy.SHARD_GRAD_OP, "SHARD_GRAD_OP"),
    (ShardingStrategy._HYBRID_SHARD_ZERO2, "HYBRID_SHARD_ZERO2"),
])
def test_sharding_strategy_spellings(given, expected) -> None:
    assert FullyShardedDataParallelPlugin(sharding_strategy=given).options.sharding_strategy == expected


def test_accelerate_fields_and_torch_objects() -> None:
    plugin = FullyShardedDataParallelPlugin(
        backward_prefetch=BackwardPrefetch.BACKWARD_POST, cpu_offload=CPUOffload(offload_params=True),
        state_dict_type=StateDictType.SHARDED_STATE_DICT, transformer_cls_names_to_wrap="BertLayer, BertEmbeddings",
        state_dict_config=FullStateDictConfig(offload_to_cpu=False, rank0_only=False),
        optim_state_dict_config=FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=False),
        use_orig_params=False, limit_all_gathers=True,
    )
    options = plugin.options
    assert options.backward_prefetch == "BACKWARD_POST" and options.offload_params is True
    assert options.state_dict_type == "SHARDED_STATE_DICT"
    assert options.transformer_layer_cls_to_wrap == ["BertLayer", "BertEmbeddings"]
    assert not plugin.state_dict_rank0_only and not plugin.state_dict_offload_to_cpu
    assert not plugin.optim_state_dict_rank0_only
    assert plugin.sharding_strategy == "FULL_SHARD"  # resolved values are visible on the plugin too


def test_defaults_follow_torch_full_state_dict_config() -> None:
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.state_dict_rank0_only and plugin.state_dict_offload_to_cpu
    assert plugin.options.state_dict_type == "FULL_STATE_DICT"
    only_config = FullyShardedDataParallelPlugin(state_dict_config=ShardedStateDictConfig())
    assert only_config.options.state_dict_type == "SHARDED_STATE_DICT"


def test_reshard_after_forward_is_accelerates_fsdp2_spelling() -> None:
    assert FullyShardedDataParallelPlugin(reshard_after_forward=False).options.sharding_strategy == "SHARD_GRAD_OP"
    assert FullyShardedDataParallelPlugin(reshard_after_forward=True).options.reshard_after_forward


def test_from_options_round_trip() -> None:
    options = FSDPOptions.from_mapping({"fsdp_sharding_strategy": "HYBRID_SHARD", "fsdp_offload_params": "true",
                                        "fsdp_backward_prefetch_policy": "NO_PREFETCH",
                                        "fsdp_hybrid_shard_group_size": 2})
    plugin = FullyShardedDataParallelPlugin.from_options(options)
    assert plugin.options == options


def test_cpu_ram_efficient_loading_tells_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FSDP_CPU_RAM_EFFICIENT_LOADING", raising=False)
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    plugin = FullyShardedDataParallelPlugin(cpu_ram_efficient_loading=True)
    assert plugin.options.sync_module_states
    import os

    assert os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "true" and os.environ["ACCELERATE_USE_FSDP"] == "true"


@pytest.mark.parametrize("kwargs, fragment", [
    ({"sharding_strategy": "FULL_SHARDD"}, "Did you mean 'FULL_SHARD'"),
    ({"sharding_strategy": 7}, "numbers run 1-5"),
    ({"backward_prefetch": "BACKWARD_PREE"}, "Did you mean 'BACKWARD_PRE'"),
    ({"auto_wrap_policy": "TRANSFORMER_WRAP"}, "TRANSFORMER_BASED_WRAP"),
    ({"state_dict_type": "LOCAL_STATE_DICT"}, "no FSDP2 equivalent"),
    ({"cpu_ram_efficient_loading": True, "sync_module_states": False}, "sync_module_states"),
    ({"mixed_precision_policy": "bf17"}, "mixed_precision_policy"),
])
def test_invalid_plugin_values_fail_at_construction(kwargs, fragment) -> None:
    with pytest.raises(ConfigError, match="FullyShardedDataParallelPlugin|numbers|sync_module|mixed_precision") as error:
        FullyShardedDataParallelPlugin(**kwargs)
    assert fragment in str(error.value)


def test_unknown_config_key_names_valid_ones() -> None:
    with pytest.raises(ConfigError) as error:
        LaunchConfig.from_mapping({"distributed_type": "FSDP", "fsdp_config": {"fsdp_sharding_stratgy": "FULL_SHARD"}})
    assert "Did you mean 'fsdp_sharding_strategy'" in str(error.value)


def test_wrap_class_not_in_model_lists_its_classes(bert) -> None:
    with pytest.raises(ConfigError) as error:
        sharding.resolve_wrap_class_names(bert, ["BertLayr"])
    message = str(error.value)
    assert "'BertLayr'" in message and "Did you mean 'BertLayer'" in message and "BertSelfAttention" in message


def test_strategy_rejects_bad_wrap_class_before_touching_the_model(bert) -> None:
    from trainkit.engine.precision.base import Precision
    from trainkit.engine.process.state import ProcessState
    from trainkit.engine.strategies.fsdp.strategy import FSDPStrategy

    state = ProcessState.__new__(ProcessState)  # no process group: the error must come first
    state.device, state.rank, state.world_size, state.local_world_size = torch.device("cpu"), 0, 1, 1
    strategy = FSDPStrategy(state, FullyShardedDataParallelPlugin(auto_wrap_policy="TRANSFORMER_BASED_WRAP",
                                                                  transformer_cls_names_to_wrap="GPT2Block"),
                            Precision("no", torch.device("cpu")))
    weight = bert.classifier.weight
    with pytest.raises(ConfigError, match="GPT2Block"):
        strategy.wrap_model(bert)
    assert bert.classifier.weight is weight and not isinstance(weight, torch.distributed.tensor.DTensor)


def test_transformer_wrap_defaults_to_no_split_modules(bert) -> None:
    names = sharding.resolve_wrap_class_names(bert, None)
    assert names == set(bert._no_split_modules)
    units = sharding.describe_units(sharding.select_units(bert, policy="TRANSFORMER_BASED_WRAP", class_names={"BertLayer"}), bert)
    assert units == ["bert.encoder.layer.0", "bert.encoder.layer.1"]


def test_size_based_wrap_is_bottom_up_and_skips_containers() -> None:
    model = nn.Sequential(nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 10)), nn.ModuleList([nn.Linear(10, 10)]),
                          nn.Linear(100, 10))
    units = sharding.select_units(model, policy="SIZE_BASED_WRAP", min_num_params=200)
    assert sharding.describe_units(units, model) == ["0", "2"]  # 220 params, ModuleList skipped, 1010 params
    assert sharding.select_units(model, policy="NO_WRAP") == []
    callable_units = sharding.select_units(model, policy=lambda module, recurse, nonwrapped_numel: isinstance(module, nn.Linear))
    assert len(callable_units) == 4


@pytest.mark.parametrize("strategy, world, local, group, shape", [
    ("FULL_SHARD", 4, 4, None, (4,)), ("SHARD_GRAD_OP", 2, 2, None, (2,)), ("NO_SHARD", 2, 2, None, (2, 1)),
    ("HYBRID_SHARD", 4, 4, 2, (2, 2)), ("HYBRID_SHARD_ZERO2", 8, 4, None, (2, 4)), ("HYBRID_SHARD", 4, 4, None, (1, 4)),
])
def test_mesh_shapes(strategy, world, local, group, shape) -> None:
    assert sharding.mesh_shape(strategy, world, local, group) == shape


def test_hybrid_group_must_divide_world() -> None:
    with pytest.raises(ConfigError, match="must divide"):
        sharding.mesh_shape("HYBRID_SHARD", 4, 4, 3)


def test_mixed_precision_policies_leave_outputs_in_the_compute_dtype() -> None:
    units, root = sharding.mixed_precision_policies(torch.bfloat16)
    assert units.param_dtype == root.param_dtype == torch.bfloat16
    assert units.reduce_dtype == root.reduce_dtype == torch.float32
    assert units.output_dtype is None and root.output_dtype is None  # no fp32 copy of the logits


def test_autocast_is_left_to_units_only_where_the_policy_keeps_fp32() -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    assert sharding.computes_in_low_precision(MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    assert sharding.computes_in_low_precision(MixedPrecisionPolicy(param_dtype=torch.float16))
    assert not sharding.computes_in_low_precision(MixedPrecisionPolicy())  # fp32 shards: autocast does the work
