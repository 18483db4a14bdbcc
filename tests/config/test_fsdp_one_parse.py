"""One parser per FSDP key: every accepted spelling gives the same value on every surface, and a launch
builds its FSDP options once per process.

The four surfaces: a launch YAML (``LaunchConfig``), a ``trainkit launch`` flag, the Accelerator plugin
(``FullyShardedDataParallelPlugin``) and ``TrainingArguments(fsdp_config=...)``. CPU only, no processes;
the plugin and TrainingArguments build options, never a model.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging

import pytest

from trainkit.config import LaunchConfig
from trainkit.config.engine import resolve_engine_config
from trainkit.config.fsdp import ALIASES, FSDPOptions, PREFIX, option_name
from trainkit.config.handoff import LAUNCH_CONFIG_ENV, _load_cached, write_launch_handoff

# Per option: values as users write them (YAML scalars, flag text, Python values) -> the one value they mean.
SPELLINGS: dict[str, list[tuple[object, object]]] = {
    "sharding_strategy": [("shard_grad_op", "SHARD_GRAD_OP"), (2, "SHARD_GRAD_OP"), ("1", "FULL_SHARD"),
                          ("HYBRID_SHARD", "HYBRID_SHARD")],
    "offload_params": [(True, True), ("on", True), ("t", True), ("1", True), ("off", False), ("no", False)],
    "auto_wrap_policy": [("size_based_wrap", "SIZE_BASED_WRAP"), ("NO_WRAP", "NO_WRAP")],
    "transformer_layer_cls_to_wrap": [("BertLayer, BertEmbeddings", ["BertLayer", "BertEmbeddings"])],
    "min_num_params": [("1e3", 1000), (2000, 2000)],
    "backward_prefetch": [("backward_post", "BACKWARD_POST"), ("NO_PREFETCH", "NO_PREFETCH")],
    "forward_prefetch": [("yes", True), ("y", True), ("false", False)],
    "state_dict_type": [("sharded_state_dict", "SHARDED_STATE_DICT")],
    "cpu_ram_efficient_loading": [("false", False), ("f", False), ("true", True), ("t", True), ("yes", True),
                                  (1, True)],
    "sync_module_states": [("true", True), ("n", False)],
    "use_orig_params": [("True", True), ("0", False)],
    "activation_checkpointing": [("ON", True), ("off", False)],
    "hybrid_shard_group_size": [("2", 2), (4, 4)],
}
# reshard_after_forward: FSDP2's boolean spelling of sharding_strategy (Accelerate's str_to_bool words), or an
# FSDP1 strategy name/number. 1 is FULL_SHARD in every type, as Accelerate's launcher and FSDP1 plugin read it.
RESHARD_SPELLINGS = [(True, "FULL_SHARD"), (1, "FULL_SHARD"), ("1", "FULL_SHARD"), ("yes", "FULL_SHARD"),
                     ("on", "FULL_SHARD"), ("t", "FULL_SHARD"), (False, "SHARD_GRAD_OP"), (0, "SHARD_GRAD_OP"),
                     ("0", "SHARD_GRAD_OP"), ("off", "SHARD_GRAD_OP"), ("n", "SHARD_GRAD_OP"),
                     ("SHARD_GRAD_OP", "SHARD_GRAD_OP"), ("3", "NO_SHARD")]


def _plugin_fields_for(option: str) -> list[str]:
    from trainkit import FullyShardedDataParallelPlugin

    return [f.name for f in dataclasses.fields(FullyShardedDataParallelPlugin)
            if f.init and option_name(f.name) == option]


def _keys_for(option: str) -> list[str]:
    """Every key spelling the config surfaces accept for ``option`` (with and without the ``fsdp_`` prefix)."""
    bare = [option] + [alias for alias, name in ALIASES.items() if name == option]
    return bare + [PREFIX + key for key in bare]


def _flag_value(value: object) -> str:
    return str(value)


def _companions(option: str, expected: object) -> dict[str, object]:
    """Bare option -> value that ``option`` set to ``expected`` needs beside it (checked at construction)."""
    return {"sync_module_states": True} if option == "cpu_ram_efficient_loading" and expected else {}


def _through_every_surface(key: str, value: object, option: str, tmp_path, companions: dict) -> dict[str, object]:
    """``option``'s value after ``key: value`` (with ``companions``) passed through each surface that accepts it."""
    from trainkit import FullyShardedDataParallelPlugin, TrainingArguments
    from trainkit.cli.config_flags import add_config_flags, resolve_config

    bare = key[len(PREFIX):] if key.startswith(PREFIX) else key
    seen: dict[str, object] = {}
    prefixed = {PREFIX + name: other for name, other in companions.items()}
    launch = LaunchConfig.from_mapping({"distributed_type": "FSDP", "fsdp_config": {key: value, **prefixed}})
    seen["yaml"] = getattr(launch.fsdp_config, option)
    args = TrainingArguments(output_dir=str(tmp_path), fsdp=True, fsdp_config={key: value, **companions},
                             report_to="none")
    seen["TrainingArguments"] = getattr(args.fsdp_options, option)
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    if key.startswith(PREFIX) and key in {action.dest for action in parser._actions}:  # Accelerate's flag names
        extra = [text for name, other in prefixed.items() for text in (f"--{name}", _flag_value(other))]
        flags = parser.parse_args([f"--{key}", _flag_value(value), *extra])
        seen["flag"] = getattr(resolve_config(flags, cuda_available=False).fsdp_config, option)
    if bare in _plugin_fields_for(option):
        seen["plugin"] = getattr(FullyShardedDataParallelPlugin(**{bare: value, **companions}).options, option)
    return seen


CASES = [(option, key, value, expected) for option, values in SPELLINGS.items() for key in _keys_for(option)
         if not key.endswith("reshard_after_forward") for value, expected in values]
CASES += [("sharding_strategy", key, value, expected) for key in ("reshard_after_forward", "fsdp_reshard_after_forward")
          for value, expected in RESHARD_SPELLINGS]


@pytest.mark.parametrize("option, key, value, expected", CASES)
def test_every_spelling_means_the_same_on_every_surface(option, key, value, expected, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINKIT_CONFIG_FILE", str(tmp_path / "absent.yaml"))
    seen = _through_every_surface(key, value, option, tmp_path, _companions(option, expected))
    assert {"yaml", "TrainingArguments"} <= set(seen)
    assert seen == dict.fromkeys(seen, expected), (key, value, seen)


def test_every_option_has_one_parser_a_flag_a_plugin_field_and_help():
    """What a new FSDP key must have: this test names the missing piece (config/fsdp.py or the plugin)."""
    from trainkit.cli.config_flags import add_config_flags
    from trainkit.config import fsdp as fsdp_config

    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    flags = {action.dest for action in parser._actions}
    for option in FSDPOptions.field_names():
        assert option in fsdp_config._PARSERS, f"{option}: no parser in config/fsdp.py _PARSERS"
        assert FSDPOptions.help_of(option), f"{option}: no help metadata"
        assert f"fsdp_{option}" in flags, f"{option}: no --fsdp_{option} flag"
        assert _plugin_fields_for(option), f"{option}: FullyShardedDataParallelPlugin has no field for it"
    assert set(fsdp_config._PARSERS) == set(FSDPOptions.field_names())
    assert set(ALIASES.values()) <= set(FSDPOptions.field_names())
    assert set(SPELLINGS) == set(FSDPOptions.field_names())  # every option is covered above


@pytest.mark.parametrize("text", ["1", "0", "true", "False", "yes", "no", "on", "off", "y", "n", "t", "f"])
def test_reshard_after_forward_reads_as_accelerates_fsdp2_plugin(text):
    """Oracle: Accelerate's own FSDP2 plugin (installed) on each boolean spelling its str_to_bool accepts."""
    accelerate_utils = pytest.importorskip("accelerate.utils")
    from trainkit import FullyShardedDataParallelPlugin

    theirs = accelerate_utils.FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=text)
    ours = FullyShardedDataParallelPlugin(reshard_after_forward=text)
    assert ours.reshard_after_forward is theirs.reshard_after_forward
    assert ours.sharding_strategy == ("FULL_SHARD" if theirs.reshard_after_forward else "SHARD_GRAD_OP")


@pytest.mark.parametrize("text", ["FULL_SHARD", "shard_grad_op", "NO_SHARD", "1", "2", "4", "5"])
def test_reshard_after_forward_strategy_names_read_as_accelerates_fsdp1_plugin(text):
    """Oracle: Accelerate's FSDP1 plugin maps a strategy name or number to torch's ShardingStrategy."""
    accelerate_utils = pytest.importorskip("accelerate.utils")
    from trainkit import FullyShardedDataParallelPlugin

    theirs = accelerate_utils.FullyShardedDataParallelPlugin(fsdp_version=1, reshard_after_forward=text)
    assert FullyShardedDataParallelPlugin(reshard_after_forward=text).sharding_strategy == \
        theirs.reshard_after_forward.name.lstrip("_")


def _count_builds(monkeypatch) -> list[str]:
    built: list[str] = []
    original = FSDPOptions.__init__

    def counting_init(self, *args, **kwargs):
        built.append("FSDPOptions")
        original(self, *args, **kwargs)

    monkeypatch.setattr(FSDPOptions, "__init__", counting_init)
    return built


def test_a_launch_builds_its_fsdp_options_once_per_process(tmp_path, monkeypatch):
    """The launcher's resolve, then a worker's hand-off, its model-loading check and its Accelerator:
    one FSDPOptions in the launcher, one in the worker (before this change: 2 and 4)."""
    from trainkit import Accelerator
    from trainkit.cli.config_flags import add_config_flags, resolve_config
    from trainkit.engine.strategies.fsdp.strategy import FSDPStrategy

    monkeypatch.setenv("TRAINKIT_CONFIG_FILE", str(tmp_path / "absent.yaml"))
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    built = _count_builds(monkeypatch)
    launch = resolve_config(parser.parse_args(["--cpu", "--use_fsdp", "--fsdp_reshard_after_forward", "false"]),
                            cuda_available=False)
    assert len(built) == 1, "launcher process"
    handoff = write_launch_handoff(launch, tmp_path / "launch.json")
    built.clear()
    _load_cached.cache_clear()
    monkeypatch.setenv(LAUNCH_CONFIG_ENV, str(handoff))
    try:
        assert resolve_engine_config().fsdp.sharding_strategy == "SHARD_GRAD_OP"  # the worker's loading check
        accelerator = Accelerator()
        assert isinstance(accelerator.strategy, FSDPStrategy)
        assert accelerator.state.fsdp_plugin.sharding_strategy == "SHARD_GRAD_OP"  # shows the options in force
        assert accelerator.state.fsdp_plugin.reshard_after_forward is False
        assert len(built) == 1, "worker process"
    finally:
        _load_cached.cache_clear()


def test_a_trainer_builds_its_fsdp_options_once(tmp_path, monkeypatch, caplog):
    """TrainingArguments(fsdp=..., fsdp_config=...) and the Trainer's engine config: one FSDPOptions (before: 5
    with the strategy's default plugin)."""
    from trainkit import TrainingArguments
    from trainkit.trainer.training_arguments.engine_settings import resolve_for_trainer

    monkeypatch.delenv(LAUNCH_CONFIG_ENV, raising=False)
    built = _count_builds(monkeypatch)
    caplog.set_level(logging.WARNING)
    args = TrainingArguments(output_dir=str(tmp_path), fsdp="shard_grad_op offload", report_to="none",
                             fsdp_config={"backward_prefetch": "BACKWARD_POST", "version": 2})
    config = resolve_for_trainer(args)
    assert config.fsdp is args.fsdp_options and len(built) == 1
    assert (config.fsdp.sharding_strategy, config.fsdp.offload_params) == ("SHARD_GRAD_OP", True)
    assert config.source_of("fsdp.backward_prefetch") == "TrainingArguments(fsdp/fsdp_config: backward_prefetch)"
