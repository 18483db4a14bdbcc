"""ParallelismConfig against the installed Accelerate's (the oracle): field names, order and defaults, the
read-only views, validation, and the documented differences. Pure Python, no processes (CPU)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from trainkit.config.errors import ConfigError
from trainkit.config.parallelism import ParallelismConfig

accelerate_config = pytest.importorskip("accelerate.parallelism_config")
Accelerates = accelerate_config.ParallelismConfig
VIEWS = ("dp_replicate_enabled", "dp_shard_enabled", "tp_enabled", "cp_enabled", "sp_enabled", "dp_dim_names",
         "non_dp_dim_names", "dp_shard_cp_dim_names", "dp_cp_dim_names", "fsdp_dim_names", "active_mesh_dims",
         "total_size", "data_parallel_size", "non_data_parallel_size")


@pytest.fixture(autouse=True)
def _no_accelerate_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Accelerate's defaults read PARALLELISM_CONFIG_* (its launcher's hand-off); trainkit's never do."""
    import os

    for name in [name for name in os.environ if name.startswith("PARALLELISM_CONFIG_")]:
        monkeypatch.delenv(name)


def test_fields_and_defaults_are_accelerates() -> None:
    assert [f.name for f in dataclasses.fields(ParallelismConfig)] == [f.name for f in dataclasses.fields(Accelerates)]
    ours, theirs = ParallelismConfig(), Accelerates()
    for field in dataclasses.fields(Accelerates):
        assert getattr(ours, field.name) == getattr(theirs, field.name), field.name
    assert ParallelismConfig.device_mesh is None and Accelerates.device_mesh is None


def test_views_answer_as_accelerates_for_every_valid_layout() -> None:
    """Every layout both accept (sizes 1, 2, 4 for replicate, shard and tp): each view gives the same answer."""
    compared = 0
    for replicate, shard, tp in itertools.product((1, 2, 4), repeat=3):
        sizes = dict(dp_replicate_size=replicate, dp_shard_size=shard, tp_size=tp)
        try:
            theirs = Accelerates(**sizes)
        except ValueError:
            continue
        ours = ParallelismConfig(**sizes)
        for view in VIEWS:
            assert getattr(ours, view) == getattr(theirs, view), (sizes, view)
        compared += 1
    assert compared >= 20


@pytest.mark.parametrize("field", ["dp_replicate_size", "dp_shard_size", "tp_size"])
@pytest.mark.parametrize("value", [0, -2])
def test_sizes_below_one_are_refused_like_accelerate(field: str, value: int) -> None:
    with pytest.raises(ValueError):
        Accelerates(**{field: value})
    with pytest.raises(ConfigError, match=f"{field}={value}"):
        ParallelismConfig(**{field: value})


def test_backends_are_checked_like_accelerate() -> None:
    for field in ("cp_backend", "sp_backend"):
        with pytest.raises(ValueError):
            Accelerates(**{field: "other"})
        with pytest.raises(ConfigError, match=field):
            ParallelismConfig(**{field: "other"})


def test_context_and_sequence_parallelism_are_refused_with_the_reason() -> None:
    Accelerates(cp_size=2)  # Accelerate accepts it (and needs CUDA attention kernels to run it)
    with pytest.raises(ConfigError, match="cp_size=2.*CUDA attention kernels"):
        ParallelismConfig(cp_size=2)
    with pytest.raises(ConfigError, match="sp_size=2.*DeepSpeed"):
        ParallelismConfig(sp_size=2)


def test_tensor_parallel_with_pure_replication_is_trainkits_extension() -> None:
    """Accelerate refuses TP x DDP; trainkit runs it (gradients all-reduced over the replicas)."""
    with pytest.raises(ValueError, match="pure data parallelism"):
        Accelerates(dp_replicate_size=2, tp_size=2)
    assert ParallelismConfig(dp_replicate_size=2, tp_size=2).total_size == 4


def test_resolved_fills_the_rest_and_checks_the_world() -> None:
    assert ParallelismConfig(dp_shard_size=-1, tp_size=2).resolved(8).degrees() == {"dp_replicate": 1, "dp_shard": 4,
                                                                                    "tp": 2}
    assert ParallelismConfig().resolved(4).degrees() == {"dp_replicate": 4, "dp_shard": 1, "tp": 1}  # as Accelerate
    with pytest.raises(ConfigError, match="dp_shard_size=2 x tp_size=2 = 4 processes, but the run has 8"):
        ParallelismConfig(dp_shard_size=2, tp_size=2).resolved(8)
    with pytest.raises(ConfigError, match="divisible"):
        ParallelismConfig(dp_shard_size=-1, tp_size=3).resolved(4)
    with pytest.raises(ConfigError, match="only one degree may be -1"):
        ParallelismConfig(dp_shard_size=-1, tp_size=-1)


def test_launch_keys_are_accelerates_spelling() -> None:
    """The YAML block's keys are Accelerate's launch flags without their dashes (parallelism_config_tp_size)."""
    from accelerate.commands.launch import launch_command_parser

    flags = {action.dest for action in launch_command_parser()._actions if action.dest.startswith("parallelism_config_")}
    config = ParallelismConfig.from_mapping({"parallelism_config_dp_shard_size": 2, "parallelism_config_tp_size": "2",
                                             "parallelism_config_cp_comm_strategy": "allgather"}, where="test.yaml")
    assert (config.dp_shard_size, config.tp_size) == (2, 2)
    for flag in flags:  # every key Accelerate's launcher has is known (its default value is accepted)
        ParallelismConfig.from_mapping({flag: None}, where="test.yaml")
    with pytest.raises(ConfigError, match="unknown key 'parallelism_config_tp'"):
        ParallelismConfig.from_mapping({"parallelism_config_tp": 2}, where="test.yaml")


def test_accelerates_object_is_read_by_its_fields() -> None:
    from trainkit.config.engine import parse_parallelism

    parsed = parse_parallelism(Accelerates(dp_shard_size=2, tp_size=2), "Accelerator(parallelism_config=)")
    assert isinstance(parsed, ParallelismConfig) and (parsed.dp_shard_size, parsed.tp_size) == (2, 2)


def test_launch_yaml_block_and_flags_resolve_to_one_checked_block() -> None:
    """The launch config reads Accelerate's block, merges flags over the file key by key, checks the product against
    num_processes before anything starts, and writes the block back in Accelerate's spelling."""
    import argparse

    from accelerate.commands.launch import launch_command_parser

    from trainkit.cli.config_flags import add_config_flags, flags_to_mapping
    from trainkit.config.launch import LaunchConfig

    block = {"parallelism_config_dp_shard_size": 2, "parallelism_config_tp_size": 2}
    config = LaunchConfig.from_mapping({"num_processes": 4, "parallelism_config": block}, cuda_available=False)
    assert config.parallelism() == ParallelismConfig(dp_shard_size=2, tp_size=2)
    assert config.to_dict()["parallelism_config"]["parallelism_config_tp_size"] == 2
    assert LaunchConfig.from_mapping(config.to_dict(), cuda_available=False).parallelism() == config.parallelism()
    with pytest.raises(ConfigError, match="= 4 processes, but the run has 2"):
        LaunchConfig.from_mapping({"num_processes": 2, "parallelism_config": block}, cuda_available=False)
    assert LaunchConfig.from_mapping({"num_processes": 2, "parallelism_config": {}}, cuda_available=False).parallelism() is None

    ours = argparse.ArgumentParser()
    add_config_flags(ours)
    theirs = {action.dest for action in launch_command_parser()._actions if "parallelism_config" in action.dest}
    assert theirs <= {action.dest for action in ours._actions}  # every Accelerate flag of the group exists
    args = ours.parse_args(["--use_parallelism_config", "--parallelism_config_dp_shard_size", "-1",
                            "--parallelism_config_tp_size", "2"])
    layers = [({"num_processes": 8, "parallelism_config": {"parallelism_config_dp_shard_size": 4}}, "file.yaml"),
              (flags_to_mapping(args), "flag")]
    resolved = LaunchConfig.resolve(layers, cuda_available=False).parallelism()
    assert resolved is not None and (resolved.dp_shard_size, resolved.tp_size) == (-1, 2)
    assert resolved.resolved(8).degrees() == {"dp_replicate": 1, "dp_shard": 4, "tp": 2}


def test_the_scripts_config_wins_over_the_launchers_with_one_notice() -> None:
    from trainkit.config.engine import Setting, resolve_engine_config
    from trainkit.config.launch import LaunchConfig

    launch = LaunchConfig.resolve([({"num_processes": 4, "parallelism_config": {"parallelism_config_dp_shard_size": 4}},
                                    "cfg.yaml")], cuda_available=False)
    from_launcher = resolve_engine_config({}, launch=launch)
    assert from_launcher.parallelism == ParallelismConfig(dp_shard_size=4)
    assert from_launcher.source_of("parallelism") == "launcher config cfg.yaml"
    explicit = ParallelismConfig(dp_shard_size=2, tp_size=2)
    config = resolve_engine_config({"parallelism": Setting(explicit, "Accelerator(parallelism_config=)")}, launch=launch)
    assert config.parallelism == explicit and len(config.notices) == 1 and "parallelism" in config.notices[0]
