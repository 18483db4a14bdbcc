"""Launcher pieces without processes: flags to config, torchrun's argv, SLURM, failure summaries."""

from __future__ import annotations

import argparse
import types

import pytest

from trainkit.cli.config_flags import add_config_flags, flags_to_mapping
from trainkit.cli.failures import describe_failure, exit_status
from trainkit.cli.launch_command import add_arguments, torchrun_arguments
from trainkit.cli.launch_steps import worker_environment
from trainkit.cli.slurm import first_hostname, slurm_layer
from trainkit.config import ConfigError, LaunchConfig


def _launch_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_only_typed_flags_become_a_layer():
    args = _launch_args("--num_processes", "2", "--fsdp_offload_params", "true", "--fsdp_backward_prefetch_policy",
                        "BACKWARD_POST", "train.py", "--lr", "3")
    mapping = flags_to_mapping(args)
    assert mapping == {"num_processes": 2, "distributed_type": "FSDP", "fsdp_config": {
        "fsdp_offload_params": "true", "fsdp_backward_prefetch_policy": "BACKWARD_POST"}}
    assert args.training_script == "train.py" and args.training_script_args == ["--lr", "3"]
    config = LaunchConfig.resolve([(mapping, "flag")])
    assert config.fsdp_config.offload_params is True and config.fsdp_config.backward_prefetch == "BACKWARD_POST"


def test_config_flags_cover_every_fsdp_option():
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    flags = {action.dest for action in parser._actions}
    from trainkit.config import FSDPOptions

    assert {f"fsdp_{name}" for name in FSDPOptions.field_names()} <= flags


def test_torchrun_arguments_single_machine_uses_c10d_on_loopback():
    config = LaunchConfig.from_mapping({"num_processes": 2, "max_restarts": 2}, cuda_available=False)
    argv = torchrun_arguments(config, _launch_args("-m", "pkg.train", "--x", "1"))
    assert argv[argv.index("--nproc_per_node") + 1] == "2" and argv[argv.index("--max_restarts") + 1] == "2"
    assert argv[argv.index("--rdzv_backend") + 1] == "c10d"
    assert argv[argv.index("--rdzv_endpoint") + 1] == "127.0.0.1:0"
    assert argv[-5:] == ["trainkit.cli.worker", "-m", "pkg.train", "--x", "1"]


def test_torchrun_arguments_several_machines(capsys):
    base = {"num_processes": 4, "num_machines": 2, "machine_rank": 1, "main_process_ip": "10.0.0.1"}
    static = torchrun_arguments(LaunchConfig.from_mapping(base), _launch_args("t.py"))
    assert static[static.index("--nproc_per_node") + 1] == "2"
    assert static[static.index("--node_rank") + 1] == "1" and static[static.index("--master_port") + 1] == "29500"
    restarting = torchrun_arguments(LaunchConfig.from_mapping({**base, "max_restarts": 1}), _launch_args("t.py"))
    assert restarting[restarting.index("--rdzv_backend") + 1] == "c10d"
    assert "c10d rendezvous" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="main_process_ip"):
        torchrun_arguments(LaunchConfig.from_mapping({**base, "main_process_ip": None}), _launch_args("t.py"))


def test_worker_environment_threads_and_debug(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    config = LaunchConfig.from_mapping({"num_processes": 2, "debug": True}, cuda_available=False)
    env = worker_environment(config, tmp_path / "h.json")
    import os

    assert env["OMP_NUM_THREADS"] == str(max(1, len(os.sched_getaffinity(0)) // 2))
    assert env["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL" and env["TRAINKIT_LAUNCH_CONFIG"] == str(tmp_path / "h.json")
    explicit = LaunchConfig.from_mapping({"num_cpu_threads_per_process": 3})
    assert worker_environment(explicit, tmp_path / "h.json")["OMP_NUM_THREADS"] == "3"


def test_slurm_layer_only_under_srun_on_several_nodes():
    assert first_hostname("gpu[01-04,07],cpu3") == "gpu01" and first_hostname("node7") == "node7"
    env = {"SLURM_STEP_ID": "0", "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "n[3-4]"}
    assert slurm_layer(env) == ({"num_machines": 2, "machine_rank": 1, "main_process_ip": "n3"}, "env SLURM_*")
    assert slurm_layer({**env, "SLURM_NNODES": "1"}) is None
    assert slurm_layer({k: v for k, v in env.items() if k != "SLURM_STEP_ID"}) is None


def _failure(exitcode, message=None, callstack=None):
    data = {"message": {"message": message, "extraInfo": {"py_callstack": callstack}}} if message else {}
    return types.SimpleNamespace(exitcode=exitcode, error_file_data=data, local_rank=1, pid=42)


def test_failure_summary_ends_with_rank_and_exception():
    callstack = ('Traceback (most recent call last):\n  File "/x/torch/distributed/distributed_c10d.py", line 9, '
                 'in all_reduce\n    work.wait()\nRuntimeError: Timed out waiting 5000ms')
    failures = {1: _failure(1, "RuntimeError: Timed out waiting 5000ms", callstack), 0: _failure(-15)}
    error = types.SimpleNamespace(failures=failures, get_first_failure=lambda: (1, failures[1]))
    lines = describe_failure(error, world_size=2)
    assert lines[-1] == ("trainkit launch: rank 1 (local rank 1, pid 42) failed with RuntimeError: "
                         "Timed out waiting 5000ms (in torch.distributed.all_reduce)")
    assert any("rank 0 (was killed by signal SIGTERM)" in line for line in lines)
    assert exit_status(error) == 1
    # A peer's "connection closed" echo with an earlier (or tied) timestamp does not hide the real cause.
    echo = _failure(1, "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:1")
    echo.timestamp, failures[1].timestamp = 100, 101
    failures = {0: echo, 1: failures[1]}
    error = types.SimpleNamespace(failures=failures, get_first_failure=lambda: (0, echo))
    assert describe_failure(error, world_size=2)[-1].startswith("trainkit launch: rank 1 ")
    killed_and_echo = {0: echo, 1: _failure(-9)}
    error = types.SimpleNamespace(failures=killed_and_echo, get_first_failure=lambda: (0, echo))
    assert "rank 1 (local rank 1, pid 42) was killed by signal SIGKILL" in describe_failure(error, world_size=2)[-1]
    killed = {0: _failure(-9)}
    error = types.SimpleNamespace(failures=killed, get_first_failure=lambda: (0, killed[0]))
    assert "killed by signal SIGKILL" in describe_failure(error, world_size=2)[-1]
    assert exit_status(error) == 137
