"""A precision with options of its own: one declaration (config/precision.py) plus one class reaches every
surface — the launch YAML block, its flags, the hand-off to the workers, the resolver with provenance, and
``Accelerator(kwargs_handlers=[...])`` — and the class receives the parsed options (CPU only)."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
import torch
from torch import nn

from trainkit import Accelerator
from trainkit.cli.config_flags import add_config_flags, flags_to_mapping
from trainkit.config import ConfigError, LaunchConfig, resolve_engine_config, write_launch_handoff
from trainkit.config import precision as declarations
from trainkit.config.handoff import LAUNCH_CONFIG_ENV
from trainkit.config.options import Option, integer
from trainkit.engine.precision import registry
from trainkit.engine.precision.base import Precision


@dataclasses.dataclass
class ScaledOptions:
    """The toy precision's settings, declared once."""

    loss_scale: int = Option(help="Multiply every loss by this before backward.", default=1,
                             parse=integer(1)).field()


class ScaledPrecision(Precision):
    """Full precision whose backward multiplies the loss by its options' ``loss_scale`` (an effect a test sees)."""

    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        (loss * self.options.loss_scale).backward(**kwargs)


@pytest.fixture
def scaled_precision(monkeypatch):
    """Declare the mode "scaled" (options in the ``scaled_config:`` block, flags ``--scaled_<option>``)."""
    declaration = declarations.PrecisionDeclaration(f"{__name__}:ScaledPrecision", options=ScaledOptions,
                                                    block="scaled_config", flag_prefix="scaled_")
    monkeypatch.setitem(declarations.PRECISIONS, "scaled", declaration)
    monkeypatch.setitem(registry.PRECISION_REGISTRY, "scaled", registry.PrecisionEntry(declaration.target))
    monkeypatch.delenv(LAUNCH_CONFIG_ENV, raising=False)
    monkeypatch.setenv("TRAINKIT_CONFIG_FILE", "/nonexistent/trainkit.yaml")


def _gradient(accelerator: Accelerator) -> torch.Tensor:
    torch.manual_seed(0)
    model = accelerator.prepare(nn.Linear(3, 1))
    accelerator.backward(model(torch.ones(2, 3)).sum())
    return model.weight.grad.clone()


def test_yaml_block_and_flags_are_parsed_by_the_declaration(scaled_precision):
    config = LaunchConfig.from_mapping({"mixed_precision": "scaled", "scaled_config": {"loss_scale": "3"}})
    assert config.precision_config == {"scaled_config": {"loss_scale": 3}}
    assert config.to_dict()["scaled_config"] == {"loss_scale": 3}
    with pytest.raises(ConfigError, match="loss_scal'.*loss_scale"):
        LaunchConfig.from_mapping({"mixed_precision": "scaled", "scaled_config": {"loss_scal": 3}})
    with pytest.raises(ConfigError, match="'loss_scale'.*>= 1"):
        LaunchConfig.from_mapping({"mixed_precision": "scaled", "scaled_config": {"loss_scale": 0}})
    other = LaunchConfig.from_mapping({"mixed_precision": "bf16", "scaled_config": {"loss_scale": 3}})
    assert other.precision_config is None and "scaled_config" in other.unused_keys

    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    flags = parser.parse_args(["--mixed_precision", "scaled", "--scaled_loss_scale", "5"])
    assert flags_to_mapping(flags)["scaled_config"] == {"loss_scale": "5"}
    resolved = resolve_engine_config(launch=LaunchConfig.resolve([(flags_to_mapping(flags), "flag")]))
    assert resolved.precision_options == ScaledOptions(loss_scale=5)
    assert resolved.source_of("precision_options") == "launcher flag --scaled_config"


def test_the_class_receives_the_options_from_the_launcher_or_the_script(scaled_precision, tmp_path, monkeypatch):
    plain = _gradient(Accelerator(mixed_precision="no"))
    scaled = _gradient(Accelerator(mixed_precision="scaled", kwargs_handlers=[ScaledOptions(loss_scale=4)]))
    torch.testing.assert_close(scaled, 4 * plain, rtol=0, atol=0)  # 1e-7 would still tell 4x from 1x

    launch = LaunchConfig.from_mapping({"mixed_precision": "scaled", "scaled_config": {"loss_scale": 3}},
                                       source=str(tmp_path / "launch.yaml"))
    monkeypatch.setenv(LAUNCH_CONFIG_ENV, str(write_launch_handoff(launch, tmp_path / "handoff.json")))
    launched = Accelerator()  # the worker's view: through the hand-off file
    assert launched.precision.options == ScaledOptions(loss_scale=3)
    assert launched.config.source_of("precision_options").startswith("launcher config")
    torch.testing.assert_close(_gradient(launched), 3 * plain, rtol=0, atol=0)
    explicit = Accelerator(kwargs_handlers=[ScaledOptions(loss_scale=2)])  # the script's own object wins
    assert explicit.precision.options == ScaledOptions(loss_scale=2)
    assert Accelerator(mixed_precision="scaled").precision.options == ScaledOptions(loss_scale=3)


def test_options_for_another_mode_are_an_error_naming_both(scaled_precision):
    assert registry.build_precision("scaled", torch.device("cpu")).options == ScaledOptions()  # the defaults
    with pytest.raises(ConfigError, match=r"ScaledOptions .*configures mixed precision 'scaled'.*'bf16'"):
        Accelerator(mixed_precision="bf16", kwargs_handlers=[ScaledOptions(loss_scale=2)])
