"""ParallelismConfig and its cp/sp handlers against the installed Accelerate's (the oracle): field names, order and
defaults, the read-only views, validation, and the documented differences. Pure Python, no processes (CPU)."""

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
    """Both read PARALLELISM_CONFIG_* for fields left at None (``accelerate launch``'s hand-off): clear them."""
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
    """Every layout both accept (sizes 1, 2, 4 for replicate, shard and tp; 1 or 2 for cp or sp): each view gives the
    same answer, except that trainkit names ``sp`` among the dimensions FSDP shards and the loss averages across
    (its sp ranks are a mesh dimension; Accelerate leaves sp to DeepSpeed)."""
    compared = 0
    for replicate, shard, tp, (cp, sp) in itertools.product((1, 2, 4), (1, 2, 4), (1, 2, 4), ((1, 1), (2, 1), (1, 2))):
        sizes = dict(dp_replicate_size=replicate, dp_shard_size=shard, tp_size=tp, cp_size=cp, sp_size=sp)
        try:
            theirs = Accelerates(**sizes)
        except ValueError:
            continue
        ours = ParallelismConfig(**sizes)
        for view in VIEWS:
            expected = getattr(theirs, view)
            if sp > 1 and view in ("dp_shard_cp_dim_names", "dp_cp_dim_names"):
                expected = expected + ["sp"]
            assert getattr(ours, view) == expected, (sizes, view)
        compared += 1
    assert compared >= 60


def test_fields_left_at_none_are_read_from_the_environment_as_accelerate_does(monkeypatch) -> None:
    """``accelerate launch`` exports the block as PARALLELISM_CONFIG_*; a bare ``ParallelismConfig()`` reads it,
    a value given in code wins, and the cp handler reads its strategy (both libraries, same answers)."""
    from accelerate.utils import TorchContextParallelConfig as TheirContext

    from trainkit.utils import TorchContextParallelConfig

    for name, value in (("DP_SHARD_SIZE", "2"), ("CP_SIZE", "2"), ("CP_COMM_STRATEGY", "alltoall")):
        monkeypatch.setenv(f"PARALLELISM_CONFIG_{name}", value)
    for build in (lambda cls: cls(), lambda cls: cls(dp_shard_size=4)):
        ours, theirs = build(ParallelismConfig), build(Accelerates)
        assert (ours.dp_shard_size, ours.cp_size, ours.cp_handler.cp_comm_strategy) == (
            theirs.dp_shard_size, theirs.cp_size, theirs.cp_handler.cp_comm_strategy)
    assert ParallelismConfig().dp_shard_size == 2 and ParallelismConfig(dp_shard_size=4).dp_shard_size == 4
    assert TorchContextParallelConfig().cp_comm_strategy == TheirContext().cp_comm_strategy == "alltoall"
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "ring")
    with pytest.raises(ConfigError, match="Invalid cp_comm_strategy: ring"):
        ParallelismConfig()
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "two")
    with pytest.raises(ConfigError, match="tp_size='two'"):
        ParallelismConfig(cp_size=1)


def test_get_mesh_lists_the_enabled_dimensions_in_accelerates_order() -> None:
    layouts = [dict(dp_replicate_size=r, dp_shard_size=s, tp_size=t, cp_size=c)
               for r, s, t, c in itertools.product((1, 2), (1, 4), (1, 2), (1, 2))]
    compared = 0
    for sizes in layouts:
        try:
            theirs = Accelerates(**sizes)._get_mesh()
        except ValueError:  # a layout Accelerate refuses (tp/cp over pure replication)
            continue
        assert ParallelismConfig(**sizes)._get_mesh() == theirs, sizes
        compared += 1
    assert compared >= 10
    assert ParallelismConfig()._get_mesh() == ()
    assert ParallelismConfig(dp_shard_size=2, sp_size=2)._get_mesh() == (("dp_shard", "sp"), (2, 2))


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


def test_context_and_sequence_parallelism_take_accelerates_handlers() -> None:
    """cp_size / sp_size above 1 get Accelerate's default handlers (its classes' fields and defaults, read by name
    from Accelerate's objects too); cp and sp together are refused, as by Accelerate."""
    from accelerate.utils import DeepSpeedSequenceParallelConfig as TheirSequence
    from accelerate.utils import TorchContextParallelConfig as TheirContext

    from trainkit.utils import DeepSpeedSequenceParallelConfig, TorchContextParallelConfig

    for ours, theirs in ((TorchContextParallelConfig, TheirContext), (DeepSpeedSequenceParallelConfig, TheirSequence)):
        assert [f.name for f in dataclasses.fields(ours)] == [f.name for f in dataclasses.fields(theirs)]
        assert dataclasses.asdict(ours()) == dataclasses.asdict(theirs())
    for sizes in (dict(cp_size=2), dict(sp_size=2)):
        ours, theirs = ParallelismConfig(**sizes), Accelerates(**sizes)
        for name in ("cp_handler", "sp_handler"):
            assert (getattr(ours, name) is None) == (getattr(theirs, name) is None), (sizes, name)
            if getattr(theirs, name) is not None:
                assert dataclasses.asdict(getattr(ours, name)) == dataclasses.asdict(getattr(theirs, name))
    given = ParallelismConfig(cp_size=2, cp_handler=TheirContext(cp_comm_strategy="alltoall"))
    assert given.cp_handler == TorchContextParallelConfig(cp_comm_strategy="alltoall")
    with pytest.raises(ValueError, match="mutually exclusive"):
        Accelerates(cp_size=2, sp_size=2)
    with pytest.raises(ConfigError, match="cp_size=2, sp_size=2.*set one of them to 1"):
        ParallelismConfig(cp_size=2, sp_size=2)


@pytest.mark.parametrize(("handler", "values", "match"), [
    ("TorchContextParallelConfig", dict(cp_comm_strategy="ring"), "Invalid cp_comm_strategy: ring.*allgather"),
    ("DeepSpeedSequenceParallelConfig", dict(sp_seq_length_is_variable=False), "needs sp_seq_length"),
    ("DeepSpeedSequenceParallelConfig", dict(sp_attn_implementation="eager"), "sp_attn_implementation='eager'"),
    ("DeepSpeedSequenceParallelConfig", dict(sp_attn_implementation="flex_attention"), "flex_attention"),
])
def test_handler_values_are_checked_like_accelerate(handler: str, values: dict, match: str) -> None:
    import accelerate.utils

    import trainkit.utils

    with pytest.raises(ValueError):
        getattr(accelerate.utils, handler)(**values)
    with pytest.raises(ConfigError, match=match):
        getattr(trainkit.utils, handler)(**values)


def test_handler_settings_travel_through_the_launch_block() -> None:
    """The cp/sp settings of the launch block (Accelerate's keys) build the handlers, and are written back."""
    block = {"parallelism_config_sp_size": "2", "parallelism_config_sp_seq_length": "512",
             "parallelism_config_sp_seq_length_is_variable": "false", "parallelism_config_sp_attn_implementation": "sdpa"}
    config = ParallelismConfig.from_mapping(block, where="test.yaml")
    assert (config.sp_size, config.sp_handler.sp_seq_length, config.sp_handler.sp_seq_length_is_variable,
            config.sp_handler.sp_attn_implementation) == (2, 512, False, "sdpa")
    assert ParallelismConfig.from_mapping(config.to_launch_dict(), where="again") == config
    context = ParallelismConfig.from_mapping({"parallelism_config_cp_size": 2, "parallelism_config_cp_comm_strategy":
                                              "alltoall"}, where="test.yaml")
    assert context.cp_handler.cp_comm_strategy == "alltoall"
    with pytest.raises(ConfigError, match="test.yaml.*Invalid cp_comm_strategy: ring"):
        ParallelismConfig.from_mapping({"parallelism_config_cp_size": 2, "parallelism_config_cp_comm_strategy": "ring"},
                                       where="test.yaml")


def test_settings_of_a_size_one_dimension_warn_and_are_dropped() -> None:
    """As Accelerate warns: a handler given while its size is 1 has no effect; trainkit drops it and says so."""
    from trainkit.utils import TorchContextParallelConfig

    with pytest.warns(UserWarning, match="cp_handler is set but cp_size is 1"):
        config = ParallelismConfig(cp_handler=TorchContextParallelConfig())
    assert config.cp_handler is None
    with pytest.warns(UserWarning, match="sp_handler"):
        ParallelismConfig.from_mapping({"parallelism_config_sp_seq_length": 128}, where="test.yaml")


def test_resolved_places_the_sequence_dimension_in_accelerates_mesh_order() -> None:
    config = ParallelismConfig(dp_shard_size=-1, sp_size=2, tp_size=2).resolved(8)
    assert config.degrees() == {"dp_replicate": 1, "dp_shard": 2, "cp": 1, "sp": 2, "tp": 2}
    assert list(config.degrees()) == ["dp_replicate", "dp_shard", "cp", "sp", "tp"]  # Accelerate's _get_mesh order
    with pytest.raises(ConfigError, match="dp_shard_size=2 x tp_size=1 x cp_size=2 = 4 processes, but the run has 8"):
        ParallelismConfig(dp_shard_size=2, cp_size=2).resolved(8)


def test_tensor_parallel_with_pure_replication_is_trainkits_extension() -> None:
    """Accelerate refuses TP x DDP; trainkit runs it (gradients all-reduced over the replicas)."""
    with pytest.raises(ValueError, match="pure data parallelism"):
        Accelerates(dp_replicate_size=2, tp_size=2)
    assert ParallelismConfig(dp_replicate_size=2, tp_size=2).total_size == 4


def test_resolved_fills_the_rest_and_checks_the_world() -> None:
    assert ParallelismConfig(dp_shard_size=-1, tp_size=2).resolved(8).degrees() == {
        "dp_replicate": 1, "dp_shard": 4, "cp": 1, "sp": 1, "tp": 2}
    assert ParallelismConfig().resolved(4).degrees() == {"dp_replicate": 4, "dp_shard": 1, "cp": 1, "sp": 1,
                                                         "tp": 1}  # as Accelerate
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
    config = ParallelismConfig.from_mapping({"parallelism_config_dp_shard_size": 2, "parallelism_config_tp_size": "2"},
                                            where="test.yaml")
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
    assert resolved.resolved(8).degrees() == {"dp_replicate": 1, "dp_shard": 4, "cp": 1, "sp": 1, "tp": 2}


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
