"""FullyShardedDataParallelPlugin: Accelerate's FSDP1-only / offload options are refused with a reason (CPU, no
process group: the plugin validates at construction)."""

from __future__ import annotations

import pytest

from trainkit.config.errors import ConfigError
from trainkit.engine.strategies.fsdp.plugin import FullyShardedDataParallelPlugin


def test_accelerate_positional_order_reaches_the_same_fields() -> None:
    plugin = FullyShardedDataParallelPlugin(2, "SHARD_GRAD_OP")  # Accelerate's order: fsdp_version, sharding_strategy
    assert plugin.fsdp_version == 2 and plugin.sharding_strategy == "SHARD_GRAD_OP"


def test_defaults_of_the_unsupported_options_are_accepted() -> None:
    plugin = FullyShardedDataParallelPlugin(param_init_fn=None, activation_checkpointing_offload=False,
                                            activation_checkpointing=True)
    assert plugin.param_init_fn is None and plugin.activation_checkpointing_offload is False


def test_param_init_fn_is_refused_naming_why() -> None:
    with pytest.raises(ConfigError, match="param_init_fn.*FSDP1.*FSDP2"):
        FullyShardedDataParallelPlugin(param_init_fn=lambda module: None)


def test_activation_checkpointing_offload_is_refused_naming_why() -> None:
    with pytest.raises(ConfigError, match="requires activation_checkpointing=True"):
        FullyShardedDataParallelPlugin(activation_checkpointing_offload=True)
    with pytest.raises(ConfigError, match="activation_checkpointing_offload=True.*not supported"):
        FullyShardedDataParallelPlugin(activation_checkpointing=True, activation_checkpointing_offload=True)
