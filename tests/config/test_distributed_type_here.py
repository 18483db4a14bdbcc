"""``num_processes > 1`` becomes what would run on this machine: MULTI_CPU without a GPU (no torch, no processes)."""

from __future__ import annotations

import pytest

from tests.cli.cli_helpers import cli_env, explain, trainkit
from trainkit.config import LaunchConfig
from trainkit.config import launch as launch_module
from trainkit.config.machine import gpus_probably_present


@pytest.mark.parametrize("gpus, expected", [(False, "MULTI_CPU"), (True, "MULTI_GPU")])
def test_the_resolver_asks_the_machine_when_the_caller_does_not_know(monkeypatch, gpus, expected):
    monkeypatch.setattr(launch_module, "gpus_probably_present", lambda: gpus)
    config = LaunchConfig.from_mapping({"num_processes": 2})
    assert config.distributed_type == expected
    assert config.source_of("distributed_type").startswith("derived from num_processes > 1")
    # What the caller knows (trainkit launch asks torch) still decides, and use_cpu always means CPU.
    assert LaunchConfig.from_mapping({"num_processes": 2}, cuda_available=not gpus).distributed_type != expected
    assert LaunchConfig.from_mapping({"num_processes": 2, "use_cpu": True}).distributed_type == "MULTI_CPU"


def test_hidden_gpus_count_as_none(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpus_probably_present() is False


def test_config_show_says_multi_cpu_where_no_gpu_is_visible(tmp_path):
    """CPU: with every GPU hidden, --show names MULTI_CPU, the type the launch would run."""
    result = trainkit("config", "--show", "--num_processes", "2", tmp_path=tmp_path,
                      env=cli_env(tmp_path, CUDA_VISIBLE_DEVICES=""))
    assert result.returncode == 0, explain(result)
    row = next(line for line in result.stdout.splitlines() if line.strip().startswith("distributed_type"))
    assert row.split()[1] == "MULTI_CPU" and "no GPU found" in row, row
