"""`trainkit launch`'s steps under Accelerate's names: flags read Accelerate's defaults while only typed flags
override the config file; ``_validate_launch_command`` writes the resolved settings onto ``args``;
``prepare_simple_launcher_cmd_env`` gives the one-process command and environment; ``launch_command`` launches from
Python. CPU only; units in-process, plus two one-process launches (a few seconds)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from tests.cli.cli_helpers import SCRIPTS
from trainkit.cli.config_flags import ACCELERATE_DEFAULTS, resolve_config
from trainkit.cli.launch_command import launch_command, launch_command_parser
from trainkit.cli.launch_steps import INTEL_OPENMP_CPU_SETTINGS, _validate_launch_command
from trainkit.config import LAUNCH_CONFIG_ENV
from trainkit.utils.launch import prepare_simple_launcher_cmd_env


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("TRAINKIT_CONFIG_FILE", str(tmp_path / "absent.yaml"))
    for name in [*INTEL_OPENMP_CPU_SETTINGS, "PET_NNODES", "PET_NPROC_PER_NODE", "MASTER_ADDR", "MASTER_PORT",
                 "SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_PROCID"]:
        monkeypatch.delenv(name, raising=False)


def test_untyped_flags_read_accelerates_defaults_and_never_override_the_file(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"distributed_type": "FSDP", "num_processes": 2, "debug": True,
                                      "fsdp_config": {"fsdp_sync_module_states": False,
                                                      "fsdp_sharding_strategy": "SHARD_GRAD_OP"}}))
    args = launch_command_parser().parse_args(["--config_file", str(config), "--num-processes", "2", "train.py"])
    assert args.multi_gpu is False and args.debug is None and args.fsdp_sync_module_states == "true"
    assert args.typed_flags == {"config_file", "num_processes"}
    resolved = resolve_config(args, cuda_available=False)
    assert resolved.debug is True and resolved.fsdp_config.sync_module_states is False
    assert resolved.fsdp_config.sharding_strategy == "SHARD_GRAD_OP"
    typed = launch_command_parser().parse_args(["--config_file", str(config), "--fsdp_sync_module_states", "true",
                                                "train.py"])
    assert resolve_config(typed, cuda_available=False).fsdp_config.sync_module_states is True


def test_the_defaults_are_accelerates_own():
    launch = pytest.importorskip("accelerate.commands.launch", reason="Accelerate (the oracle) is a dev-venv package")
    theirs = {action.dest: action.default for action in launch.launch_command_parser()._actions}
    ours = {action.dest: action.default for action in launch_command_parser()._actions}
    theirs["use_cpu"] = theirs.pop("cpu")  # Accelerate's --cpu; trainkit's dest is the config key
    assert {name: ours[name] for name in ACCELERATE_DEFAULTS} == {name: theirs[name] for name in ACCELERATE_DEFAULTS}


def test_validate_writes_the_resolved_settings_onto_args(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"distributed_type": "MULTI_CPU", "num_processes": 4, "debug": True,
                                      "mixed_precision": "bf16"}))
    args = launch_command_parser().parse_args(["--config_file", str(config), "--num_processes", "2", "train.py"])
    args, resolved, precision_from_file = _validate_launch_command(args)
    assert (args.num_processes, args.debug, args.mixed_precision, args.distributed_type) == (2, True, "bf16",
                                                                                            "MULTI_CPU")
    assert args.launch_config is resolved and precision_from_file is True
    assert resolve_config(args) == resolved  # written-back values are not typed: resolving again gives the same
    elastic = launch_command_parser().parse_args(["--num_machines", "1:2", "--main_process_ip", "10.0.0.1",
                                                  "--num_processes", "2", "train.py"])
    args, resolved, _ = _validate_launch_command(elastic)
    assert args.num_machines == "1:2" and resolved.min_machines == 1  # a typed value stays as typed
    assert resolve_config(args) == resolved


def test_a_one_process_cpu_launch_sets_intel_openmp_placement_only_when_asked(monkeypatch):
    command, environment = prepare_simple_launcher_cmd_env(
        launch_command_parser().parse_args(["--cpu", "train.py", "--lr", "1"]))
    assert command == [sys.executable, "train.py", "--lr", "1"]
    assert {name: environment[name] for name in INTEL_OPENMP_CPU_SETTINGS} == INTEL_OPENMP_CPU_SETTINGS
    assert os.path.isfile(environment[LAUNCH_CONFIG_ENV])
    _, environment = prepare_simple_launcher_cmd_env(launch_command_parser().parse_args(["-m", "pkg.train"]))
    assert not set(INTEL_OPENMP_CPU_SETTINGS) & set(environment)
    monkeypatch.setenv("KMP_AFFINITY", "disabled")  # the user's own setting wins
    _, environment = prepare_simple_launcher_cmd_env(launch_command_parser().parse_args(["--cpu", "train.py"]))
    assert environment["KMP_AFFINITY"] == "disabled"


@pytest.mark.multiprocess
def test_launch_command_runs_from_python_and_leaves_the_callers_environment(tmp_path):
    script = tmp_path / "ok.py"
    script.write_text("import os, sys\nassert os.environ['TRAINKIT_LAUNCH_CONFIG']\nsys.exit(int(sys.argv[1]))\n")
    before = dict(os.environ)
    launch_command(launch_command_parser().parse_args([str(script), "0"]))
    assert dict(os.environ) == before
    with pytest.raises(subprocess.CalledProcessError):
        launch_command(launch_command_parser().parse_args([str(script), "3"]))
    with pytest.raises(ValueError, match="num_processes"):  # a bad config: ConfigError before anything starts
        launch_command(launch_command_parser().parse_args(["--num_processes", "0", str(SCRIPTS / "x.py")]))
