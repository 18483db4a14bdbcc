"""torchrun's spellings on `trainkit launch`, against torchrun's own parser (the oracle: what ``torchrun`` alone
would run with, given the same words).

CPU only. The unit tests start no process; ``test_nnodes_nproc_per_node_trains_on_two_processes`` runs one
two-process launch (gloo on loopback, a few seconds).
"""

from __future__ import annotations

import argparse

import pytest
from torch.distributed.run import get_args_parser

from tests.cli.cli_helpers import SCRIPTS, explain, reports, trainkit
from tests.cli.test_cluster_env import _clear_cluster_env
from trainkit.cli.config_flags import resolve_config
from trainkit.cli.launch_command import add_arguments, torchrun_arguments
from trainkit.cli.torchrun_flags import torchrun_actions
from trainkit.config import ConfigError


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_table_read_from_torchruns_source_is_its_parser():
    """The spellings come from torch/distributed/run.py's source (no torch import); the parser itself agrees."""
    parsed = {(action.dest, tuple(action.option_strings), action.nargs != 0)
              for action in get_args_parser()._actions if action.option_strings and action.dest != "help"}
    assert set(torchrun_actions()) == parsed
    assert {"nnodes", "nproc_per_node", "node_rank", "master_addr", "master_port"} <= {d for d, _, _ in parsed}


# torchrun's words, and Accelerate's words for the same job.
SAME_JOB = [
    (["--nnodes", "1", "--nproc_per_node", "2"], ["--num_machines", "1", "--num_processes", "2"]),
    (["--nnodes", "2", "--nproc-per-node", "4", "--node_rank", "1", "--master_addr", "10.0.0.1", "--master_port",
      "29400"], ["--num_machines", "2", "--num_processes", "8", "--machine_rank", "1", "--main_process_ip",
                 "10.0.0.1", "--main_process_port", "29400"]),
    (["--nnodes", "2", "--nproc_per_node", "1", "--node-rank", "0", "--rdzv-backend", "c10d", "--rdzv_endpoint",
      "host0:29500", "--rdzv-id", "job7", "--max-restarts", "2"],
     ["--num_machines", "2", "--num_processes", "2", "--machine_rank", "0", "--rdzv_backend", "c10d",
      "--main_process_ip", "host0", "--main_process_port", "29500", "--rdzv_id", "job7", "--max_restarts", "2"]),
    (["--nnodes", "1:3", "--nproc_per_node", "2", "--rdzv_endpoint", "host0:29500", "--max-restarts", "1"],
     ["--num_machines", "1:3", "--num_processes", "6", "--main_process_ip", "host0", "--main_process_port", "29500",
      "--max_restarts", "1"]),
]


@pytest.mark.parametrize("torchrun_words, accelerate_words", SAME_JOB)
def test_torchrun_words_run_the_job_torchrun_would(torchrun_words, accelerate_words, monkeypatch, tmp_path):
    _clear_cluster_env(monkeypatch, tmp_path)
    ours = _args(*torchrun_words, "train.py")
    config = resolve_config(ours, cuda_available=False)
    theirs = resolve_config(_args(*accelerate_words, "train.py"), cuda_available=False)
    assert config.to_dict(full=True) == theirs.to_dict(full=True)
    oracle = get_args_parser().parse_args([*torchrun_words, "train.py"])
    handed = get_args_parser().parse_args(torchrun_arguments(config, ours))
    for key in ("nnodes", "nproc_per_node", "node_rank", "max_restarts"):
        assert str(getattr(handed, key)) == str(getattr(oracle, key)), key
    if config.num_machines > 1:  # where the machines meet and under which run id
        address = oracle.rdzv_endpoint or f"{oracle.master_addr}:{oracle.master_port}"
        assert (handed.rdzv_endpoint or f"{handed.master_addr}:{handed.master_port}") == address
        if oracle.rdzv_id != "none":
            assert handed.rdzv_id == oracle.rdzv_id
    source = config.source_of("num_processes")
    assert source == "flag --nproc_per_node", source  # provenance names the spelling typed


def test_a_conflict_between_spellings_names_both(monkeypatch, tmp_path):
    _clear_cluster_env(monkeypatch, tmp_path)
    for words, named in ((["--num_processes", "4", "--nproc_per_node", "2"], ("--nproc_per_node", "--num_processes")),
                         (["--num_machines", "2", "--nnodes", "3"], ("--nnodes", "--num_machines")),
                         (["--max_restarts", "1", "--max-restarts", "2"], ("--max-restarts", "--max_restarts")),
                         (["--master_addr", "a", "--rdzv_endpoint", "b:1"], ("--master_addr", "--rdzv_endpoint")),
                         (["--log_dir", "a", "--log-dir", "b"], ("--log-dir", "--log_dir"))):
        with pytest.raises(ConfigError) as error:
            resolve_config(_args(*words, "train.py"), cuda_available=False)
        assert all(name in str(error.value) for name in named), (words, str(error.value))
    same = resolve_config(_args("--num_processes", "2", "--nnodes", "1", "--nproc_per_node", "2", "t.py"),
                          cuda_available=False)
    assert same.num_processes == 2  # the same value under both spellings is no conflict


def test_torchrun_options_trainkit_decides_are_refused_by_name(monkeypatch, tmp_path):
    _clear_cluster_env(monkeypatch, tmp_path)
    installed = {option for _, options, _ in torchrun_actions() for option in options}
    for words, reason in ((["--signals_to_handle", "SIGTERM"], "--preemption_signals"),  # torch >= 2.11
                          (["--shutdown-timeout", "5"], "--preemption_grace_period"),  # torch >= 2.13
                          (["--start-method", "fork"], "not taken by trainkit launch"),
                          (["--no-python"], "Python scripts")):
        if words[0] not in installed:
            continue  # this torch's torchrun has no such option: argparse refuses it as unknown
        with pytest.raises(ConfigError, match=reason):
            resolve_config(_args(*words, "train.py"), cuda_available=False)


@pytest.mark.multiprocess
def test_nnodes_nproc_per_node_trains_on_two_processes(tmp_path):
    result = trainkit("launch", "--nnodes", "1", "--nproc_per_node", "2", SCRIPTS / "accelerator_worker.py",
                      tmp_path=tmp_path, timeout=180)
    assert result.returncode == 0, explain(result)
    found = reports(result.stdout)
    assert sorted(found) == [0, 1]
    for report in found.values():
        assert report["world"] == 2 and report["distributed_type"] in ("MULTI_CPU", "MULTI_GPU")
        assert report["loss_finite"] and report["optimizer"] == "SGD"
