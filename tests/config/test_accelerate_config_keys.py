"""Keys `accelerate config` writes load unchanged (no processes, no torch): Accelerate 1.15's own
``tests/test_configs/latest_fsdp.yaml`` carries ``fsdp_ignored_modules: null``, which trainkit refused as unknown."""

from __future__ import annotations

import pytest

from trainkit.config import ConfigError, load_fsdp_config


def test_fsdp_ignored_modules_null_is_accepted_and_a_value_is_refused_by_name():
    options = load_fsdp_config({"distributed_type": "FSDP", "fsdp_config": {
        "fsdp_sharding_strategy": "FULL_SHARD", "fsdp_ignored_modules": None}})
    assert options is not None and options.sharding_strategy == "FULL_SHARD"
    with pytest.raises(ConfigError, match="fsdp_ignored_modules.*FullyShardedDataParallelPlugin"):
        load_fsdp_config({"fsdp_ignored_modules": "encoder.*"})
