"""Every `trainkit launch` setting acts on a one-process launch, or one line says it cannot and why.

Units without processes, then two real one-process launches on CPU (a few seconds each).
"""

from __future__ import annotations

import argparse

import pytest

from tests.cli.cli_helpers import SCRIPTS, explain, reports, trainkit
from trainkit.cli.config_flags import FLAG_SOURCE
from trainkit.cli.launch_settings import AGENT_ONLY_FLAGS, agent_settings_given, no_effect_notice
from trainkit.cli.main import build_parser
from trainkit.config import LaunchConfig


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["launch", *argv, "script.py"])


def _flags(**mapping) -> LaunchConfig:
    return LaunchConfig.resolve([(mapping, FLAG_SOURCE)], cuda_available=False)


def test_agent_only_flags_are_launch_flags():
    parsed = vars(_args())
    assert all(name in parsed for name in AGENT_ONLY_FLAGS)


@pytest.mark.parametrize("argv, mapping, expected", [
    ((), {}, []),
    (("--tee", "3", "--log_dir", "logs"), {}, ["--tee", "--log_dir"]),
    ((), {"max_restarts": 2}, ["max_restarts"]),
    ((), {"monitor_interval": 1.0}, ["monitor_interval"]),
    ((), {"preemption_grace_period": 30}, ["preemption_grace_period"]),
    ((), {"monitor_interval": 0.1, "max_restarts": 0}, []),  # the defaults, written out, ask for nothing
])
def test_settings_that_need_torchruns_agent(argv, mapping, expected):
    assert agent_settings_given(_flags(**mapping), _args(*argv)) == expected


def test_settings_without_effect_are_named_in_one_line():
    config = _flags(main_process_ip="10.0.0.1", rdzv_backend="c10d", main_process_port=1234, use_cpu=True,
                    gpu_ids="0,1")
    line = no_effect_notice(config, single_process=True)
    assert line.count("\n") == 0
    for words in ("main_process_ip (one machine", "rdzv_backend (one machine", "main_process_port (one process",
                  "gpu_ids (use_cpu"):
        assert words in line
    # Through torchrun on one machine the port is the rendezvous port: it acts.
    assert "main_process_port" not in no_effect_notice(config, single_process=False)
    assert no_effect_notice(_flags(num_processes=2, main_process_port=1234), single_process=False) is None
    several = _flags(num_machines=2, num_processes=2, main_process_ip="10.0.0.1", rdzv_backend="c10d")
    assert no_effect_notice(several, single_process=False) is None
    assert no_effect_notice(_flags(), single_process=True) is None


def test_tee_and_log_dir_write_logs_for_one_process(tmp_path):
    """CPU, one process: --tee/--log_dir send it through torchrun, whose agent writes the log files."""
    logs = tmp_path / "logs"
    result = trainkit("launch", "--num_processes", "1", "--tee", "3", "--log_dir", logs,
                      SCRIPTS / "allreduce_worker.py", "--out", "x", tmp_path=tmp_path, timeout=120)
    assert result.returncode == 0, explain(result)
    assert reports(result.stdout)[0]["world"] == 1
    stdout_logs = sorted(logs.rglob("stdout.log"))
    assert len(stdout_logs) == 1 and "REPORT" in stdout_logs[0].read_text()


def test_a_one_process_exec_says_which_settings_do_nothing(tmp_path):
    """CPU, one process exec'd directly: a rendezvous port cannot act; one stderr line says so."""
    result = trainkit("launch", "--main_process_port", "29999", SCRIPTS / "allreduce_worker.py", "--out", "x",
                      tmp_path=tmp_path, timeout=90)
    assert result.returncode == 0, explain(result)
    lines = [line for line in result.stderr.splitlines() if "no effect on this launch" in line]
    assert len(lines) == 1 and "main_process_port (one process needs no rendezvous)" in lines[0]
    assert "torch.distributed.elastic" not in result.stderr  # still the direct exec


def test_multi_gpu_without_a_gpu_says_it_runs_on_cpu():
    config = LaunchConfig.resolve([({"distributed_type": "MULTI_GPU", "num_processes": 2}, "ddp.yaml")],
                                  cuda_available=False)
    line = no_effect_notice(config, single_process=False, gpus=False)
    assert "distributed_type MULTI_GPU (no GPU found: the processes run on CPU with gloo)" in line
    assert no_effect_notice(config, single_process=False, gpus=True) is None
    on_cpu = LaunchConfig.resolve([({"distributed_type": "MULTI_GPU", "num_processes": 2, "use_cpu": True}, "f")])
    assert no_effect_notice(on_cpu, single_process=False, gpus=False) is None
    chosen = LaunchConfig.resolve([({"gpu_ids": "0,1", "num_processes": 2}, "flag")], cuda_available=False)
    assert "gpu_ids (no GPU found)" in no_effect_notice(chosen, single_process=False, gpus=False)
    assert no_effect_notice(chosen, single_process=False, gpus=True) is None
