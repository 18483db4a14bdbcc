"""The cluster's environment (torchrun's ``PET_*``, ``MASTER_ADDR``/``MASTER_PORT``) and elastic machine counts,
against torchrun's own parser (the oracle: what ``torchrun`` alone would run with in the same environment).

CPU only. The unit tests start no process; ``test_pet_variables_alone_form_a_two_machine_job`` starts two
launchers (one gloo process each) on loopback, a few seconds.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
from torch.distributed.argparse_util import env as env_action
from torch.distributed.run import get_args_parser

from tests.cli.cli_helpers import SCRIPTS, cli_env, reports
from tests.distributed import REPO, free_port
from trainkit.cli.config_command import show
from trainkit.cli.config_flags import config_layers, resolve_config
from trainkit.cli.launch_command import add_arguments, torchrun_arguments
from trainkit.cli.torchrun_env import (
    DECIDED_BY_TRAINKIT,
    ENDPOINT_VARIABLE,
    NPROC_VARIABLE,
    PET_KEYS,
    RDZV_ID_VARIABLE,
    override_notice,
)
from trainkit.config import ConfigError, LaunchConfig

KUBEFLOW = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "3", "PET_NODE_RANK": "1",
            "PET_MASTER_ADDR": "job-node-0-0.job", "PET_MASTER_PORT": "29400"}
"""What Kubeflow Trainer's torch plugin sets in node 1 of a two-node TrainJob with numProcPerNode 3."""
COMPARED = ("nnodes", "nproc_per_node", "node_rank", "master_addr", "master_port", "max_restarts")


def _launch_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def _clear_cluster_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("TRAINKIT_CONFIG_FILE", str(tmp_path / "absent.yaml"))
    for name in [*PET_KEYS, NPROC_VARIABLE, ENDPOINT_VARIABLE, RDZV_ID_VARIABLE, *DECIDED_BY_TRAINKIT,
                 "MASTER_ADDR", "MASTER_PORT", "SLURM_STEP_ID", "SLURM_JOB_ID"]:
        monkeypatch.delenv(name, raising=False)


def _torchrun_reads(monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], argv: list[str]) -> argparse.Namespace:
    """torchrun's parse of ``argv`` in ``environment`` (its parser reads PET_* when it is built)."""
    with monkeypatch.context() as patch:
        for name, value in environment.items():
            patch.setenv(name, value)
        return get_args_parser().parse_args(argv)


def test_pet_variables_alone_resolve_as_torchrun_reads_them(monkeypatch, tmp_path, capsys):
    _clear_cluster_env(monkeypatch, tmp_path)
    oracle = _torchrun_reads(monkeypatch, KUBEFLOW, ["train.py"])
    for name, value in KUBEFLOW.items():
        monkeypatch.setenv(name, value)
    args = _launch_args("train.py")
    config = resolve_config(args, cuda_available=False)
    assert (config.num_machines, config.processes_per_machine, config.num_processes) == (2, 3, 6)
    assert config.source_of("machine_rank") == "env PET_NODE_RANK"
    assert config.source_of("num_processes") == "env PET_NPROC_PER_NODE x PET_NNODES"
    assert show(args) == 0  # `trainkit config --show` names each variable as the source
    shown = capsys.readouterr().out
    assert "< environment <" in shown
    for key, variable in (("num_machines", "PET_NNODES"), ("machine_rank", "PET_NODE_RANK"),
                          ("main_process_ip", "PET_MASTER_ADDR"), ("main_process_port", "PET_MASTER_PORT")):
        line = next(row for row in shown.splitlines() if row.split() and row.split()[0] == key)
        assert line.endswith(f"env {variable}"), line
    argv = torchrun_arguments(config, args)
    for name in KUBEFLOW:  # trainkit's command alone must carry what torchrun took from the environment
        monkeypatch.delenv(name)
    ours = get_args_parser().parse_args(argv)
    assert {key: str(getattr(ours, key)) for key in COMPARED} == {key: str(getattr(oracle, key)) for key in COMPARED}



def test_flags_win_over_the_environment_which_wins_over_files(monkeypatch, tmp_path):
    _clear_cluster_env(monkeypatch, tmp_path)
    file = tmp_path / "laptop.yaml"
    file.write_text("num_machines: 1\nmachine_rank: 0\nnum_processes: 2\nmixed_precision: bf16\n")
    for name, value in KUBEFLOW.items():
        monkeypatch.setenv(name, value)
    args = _launch_args("--config_file", str(file), "--machine_rank", "0", "train.py")
    config = resolve_config(args, cuda_available=False)
    assert (config.num_machines, config.machine_rank, config.mixed_precision) == (2, 0, "bf16")
    assert config.source_of("machine_rank") == "flag" and config.source_of("mixed_precision") == str(file)
    notice = override_notice(config_layers(args))
    assert notice and f"num_machines 1 from {file} -> 2 (env PET_NNODES)" in notice


def test_plain_master_variables_and_the_elastic_endpoint(monkeypatch, tmp_path):
    _clear_cluster_env(monkeypatch, tmp_path)
    monkeypatch.setenv("MASTER_ADDR", "10.1.1.1")
    monkeypatch.setenv("MASTER_PORT", "23456")
    config = resolve_config(_launch_args("--num_machines", "2", "t.py"), cuda_available=False)
    assert (config.main_process_ip, config.main_process_port) == ("10.1.1.1", 23456)
    assert config.source_of("main_process_ip") == "env MASTER_ADDR"
    # Kubeflow's elastic PyTorchJob: PET_RDZV_ENDPOINT, PET_NNODES MIN:MAX, PET_MAX_RESTARTS, PET_RDZV_BACKEND.
    elastic = {ENDPOINT_VARIABLE: "job-master-0:23456", "PET_NNODES": "1:3", "PET_MAX_RESTARTS": "4",
               "PET_RDZV_BACKEND": "c10d", NPROC_VARIABLE: "1", RDZV_ID_VARIABLE: "job-uid"}
    oracle = _torchrun_reads(monkeypatch, elastic, ["t.py"])
    for name, value in elastic.items():
        monkeypatch.setenv(name, value)
    args = _launch_args("t.py")
    config = resolve_config(args, cuda_available=False)
    assert (config.min_machines, config.num_machines, config.max_restarts) == (1, 3, 4)
    assert config.main_process_ip == "job-master-0"  # the endpoint's PET_ form wins over MASTER_ADDR
    argv = torchrun_arguments(config, args)
    for name in elastic:
        monkeypatch.delenv(name)
    ours = get_args_parser().parse_args(argv)
    for key in ("nnodes", "max_restarts", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "nproc_per_node"):
        assert str(getattr(ours, key)) == str(getattr(oracle, key)), key


def test_no_pet_variable_is_silently_overridden(monkeypatch, tmp_path):
    """Every torchrun option trainkit passes itself reads a PET_ variable; each one trainkit reads, or names
    as decided by its own settings (a notice at launch)."""
    _clear_cluster_env(monkeypatch, tmp_path)
    read = {*PET_KEYS, NPROC_VARIABLE, ENDPOINT_VARIABLE, RDZV_ID_VARIABLE}
    parser = get_args_parser()
    variable_of = {option: f"PET_{action.dest.upper()}" for action in parser._actions
                   if isinstance(action, env_action) for option in action.option_strings}
    for mapping in ({"num_processes": 4, "num_machines": 2, "main_process_ip": "h", "rdzv_backend": "static"},
                    {"num_machines": "1:2", "main_process_ip": "h", "max_restarts": 2, "rdzv_conf": "join_timeout=9"},
                    {"num_processes": 2, "rdzv_conf": "last_call_timeout=1"}):
        argv = torchrun_arguments(LaunchConfig.from_mapping(mapping, cuda_available=False), _launch_args("t.py"))
        passed = {variable_of[item] for item in argv if item in variable_of}
        assert passed - read - set(DECIDED_BY_TRAINKIT) == set(), mapping


def test_elastic_machine_counts_map_to_torchruns_c10d_rendezvous(monkeypatch, tmp_path):
    _clear_cluster_env(monkeypatch, tmp_path)
    args = _launch_args("--num_machines", "1:2", "--main_process_ip", "127.0.0.1", "--main_process_port", "29511",
                        "--machine_rank", "1", "--max_restarts", "3", "--rdzv_conf", "last_call_timeout=2", "t.py")
    config = resolve_config(args, cuda_available=False)
    assert (config.min_machines, config.num_machines, config.num_processes, config.elastic) == (1, 2, 2, True)
    assert config.rdzv_backend == "c10d" and config.source_of("rdzv_backend").startswith("derived")
    ours = get_args_parser().parse_args(torchrun_arguments(config, args))
    assert (ours.nnodes, ours.rdzv_backend, ours.rdzv_endpoint, ours.max_restarts) == ("1:2", "c10d",
                                                                                       "127.0.0.1:29511", 3)
    assert dict(pair.split("=") for pair in ours.rdzv_conf.split(",")) == {"is_host": "false", "last_call_timeout": "2"}
    assert LaunchConfig.from_mapping({"num_machines": 2, "min_machines": 1}).machine_range == "1:2"  # the YAML form
    with pytest.raises(ConfigError, match="rdzv_backend 'static'.*cannot run an elastic job"):
        LaunchConfig.from_mapping({"num_machines": "1:2", "rdzv_backend": "static"})
    with pytest.raises(ConfigError, match=r"MIN \(3\) is above MAX \(2\)"):
        LaunchConfig.from_mapping({"num_machines": "3:2"})
    with pytest.raises(ConfigError, match="rdzv_conf"):
        LaunchConfig.from_mapping({"rdzv_conf": "last_call_timeout"})


@pytest.mark.multiprocess
def test_pet_variables_alone_form_a_two_machine_job(tmp_path):
    """Two launchers on loopback, no flags at all: the PET_* variables Kubeflow sets make one 2-process job."""
    port = str(free_port())
    command = [sys.executable, "-m", "trainkit.cli.main", "launch", str(SCRIPTS / "allreduce_worker.py")]
    launches = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                                 env=cli_env(tmp_path, PET_NNODES="2", PET_NPROC_PER_NODE="1", PET_NODE_RANK=str(rank),
                                             PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=port))
                for rank in (0, 1)]
    found = {}
    for launch in launches:
        stdout, stderr = launch.communicate(timeout=120)
        assert launch.returncode == 0, stderr[-3000:]
        found.update(reports(stdout))
    assert sorted(found) == [0, 1]
    for report in found.values():
        assert report["world"] == 2 and report["sum"] == 3.0
        assert (report["config"]["num_machines"], report["config"]["num_processes"]) == (2, 2)
