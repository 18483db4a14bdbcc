"""`trainkit launch` end to end: real worker processes on loopback, each launch under a hard timeout.

About ten launches of one or two processes (roughly a minute on 2 cores).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.cli.cli_helpers import SCRIPTS, cli_env, explain, reports, trainkit
from tests.distributed import FSDP_ISSUE_YAML, REPO, free_port

pytestmark = pytest.mark.multiprocess

FSDP_YAML = FSDP_ISSUE_YAML


def test_one_process_runs_the_script_directly(tmp_path):
    result = trainkit("launch", "--mixed_precision", "bf16", SCRIPTS / "allreduce_worker.py", "--out", "x",
                      tmp_path=tmp_path, timeout=90)
    assert result.returncode == 0, explain(result)
    report = reports(result.stdout)[0]
    assert report["world"] == 1 and report["argv"] == ["--out", "x"]
    assert report["config"]["mixed_precision"] == "bf16" and report["config"]["distributed_type"] == "NO"
    assert "torch.distributed.elastic" not in result.stderr  # no agent, no rendezvous


def test_two_processes_with_flags_overriding_the_file(tmp_path):
    config_file = tmp_path / "ddp.yaml"
    config_file.write_text("distributed_type: MULTI_CPU\nnum_processes: 4\nmixed_precision: fp16\n")
    result = trainkit("launch", "--config_file", config_file, "--num_processes", "2", "--mixed_precision", "bf16",
                      SCRIPTS / "allreduce_worker.py", tmp_path=tmp_path, timeout=120)
    assert result.returncode == 0, explain(result)
    found = reports(result.stdout)
    assert sorted(found) == [0, 1]
    cores = len(os.sched_getaffinity(0))
    for report in found.values():
        assert report["world"] == 2 and report["sum"] == 3.0  # 1 + 2 all-reduced
        assert report["config"]["mixed_precision"] == "bf16" and report["config"]["num_processes"] == 2
        assert report["omp"] == str(max(1, cores // 2))


def test_fsdp_yaml_verbatim_workers_report_fsdp_and_bf16(tmp_path):
    config_file = tmp_path / "fsdp.yaml"
    config_file.write_text(FSDP_YAML)
    result = trainkit("launch", "--config_file", config_file, "--fsdp_sharding_strategy", "SHARD_GRAD_OP",
                      SCRIPTS / "accelerator_worker.py", tmp_path=tmp_path, timeout=180)
    assert result.returncode == 0, explain(result)
    found = reports(result.stdout)
    assert sorted(found) == [0, 1]
    for report in found.values():
        assert report["distributed_type"] == "FSDP" and report["mixed_precision"] == "bf16"
        assert report["world"] == 2 and report["sharding_strategy"] == "SHARD_GRAD_OP"  # the flag won


def test_dynamo_flags_compile_each_block_before_fsdp_shards_it(tmp_path):
    """CPU, 2 gloo ranks: --dynamo_* flags reach Accelerator(); regional compilation under FSDP2."""
    result = trainkit("launch", "--num_processes", "2", "--cpu", "--use_fsdp", "--fsdp_auto_wrap_policy",
                      "TRANSFORMER_BASED_WRAP", "--dynamo_backend", "AOT_EAGER",
                      "--dynamo_use_regional_compilation", "true", SCRIPTS / "accelerator_worker.py",
                      tmp_path=tmp_path, timeout=180)
    assert result.returncode == 0, explain(result)
    found = reports(result.stdout)
    assert sorted(found) == [0, 1]
    for report in found.values():
        assert report["distributed_type"] == "FSDP" and report["compiled"] == ["FSDPBertLayer"]  # compiled, then sharded
        assert report["loss_finite"]
        assert report["state_dict_keys"] == ["0.linear.bias", "0.linear.weight", "1.linear.bias", "1.linear.weight",
                                             "2.bias", "2.weight"]  # no _orig_mod. prefixes


def test_a_rank_raising_fails_the_job_and_the_last_line_names_it(tmp_path):
    started = time.monotonic()
    result = trainkit("launch", "--num_processes", "2", SCRIPTS / "allreduce_worker.py", "--mode", "raise",
                      tmp_path=tmp_path, timeout=90)
    assert time.monotonic() - started < 60
    assert result.returncode == 1, explain(result)
    last = result.stderr.strip().splitlines()[-1]
    assert "rank 1" in last and "ValueError: boom from rank 1" in last, explain(result)


def test_a_skipped_collective_is_reported_within_the_timeout(tmp_path):
    started = time.monotonic()
    result = trainkit("launch", "--num_processes", "2", "--collective_timeout", "4", SCRIPTS / "allreduce_worker.py",
                      "--mode", "skip", tmp_path=tmp_path, timeout=90)
    elapsed = time.monotonic() - started
    assert result.returncode != 0, explain(result)
    last = result.stderr.strip().splitlines()[-1]
    assert "rank 0" in last and "all_reduce" in last and "Timed out" in last, explain(result)
    assert elapsed < 40, f"took {elapsed:.0f}s"


def test_debug_catches_mismatched_collectives_at_once(tmp_path):
    result = trainkit("launch", "--num_processes", "2", "--debug", SCRIPTS / "allreduce_worker.py",
                      "--mode", "mismatch", tmp_path=tmp_path, timeout=90)
    assert result.returncode != 0
    assert "mismatch between collectives" in result.stderr.strip().splitlines()[-1], explain(result)


@pytest.mark.parametrize("backend", ["static", "c10d"])
def test_two_machines_on_loopback_form_one_job(tmp_path, backend):
    port = free_port()
    common = ["--num_processes", "2", "--num_machines", "2", "--main_process_ip", "127.0.0.1",
              "--main_process_port", str(port), "--rdzv_backend", backend]
    command = [sys.executable, "-m", "trainkit.cli.main", "launch", *common]
    launches = [subprocess.Popen([*command[:4], *common, "--machine_rank", str(rank),
                                  str(SCRIPTS / "allreduce_worker.py")], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=cli_env(tmp_path), cwd=REPO)
                for rank in (0, 1)]
    outputs = [launch.communicate(timeout=120) for launch in launches]
    found = {}
    for launch, (stdout, stderr) in zip(launches, outputs):
        assert launch.returncode == 0, stderr[-3000:]
        found.update(reports(stdout))
    assert sorted(found) == [0, 1] and all(r["world"] == 2 and r["sum"] == 3.0 for r in found.values())


def _expected_weights() -> list[float]:
    weights = torch.zeros(4, dtype=torch.float64)
    for step in range(6):
        mean_target = sum(torch.arange(4, dtype=torch.float64) * (rank + 1) + step for rank in (0, 1)) / 2
        weights -= 0.5 * (weights - mean_target)
    return weights.tolist()


def test_max_restarts_resumes_after_a_killed_worker(tmp_path):
    result = trainkit("launch", "--num_processes", "2", "--max_restarts", "1", SCRIPTS / "restart_worker.py",
                      tmp_path, tmp_path=tmp_path, timeout=150)
    assert result.returncode == 0, explain(result)
    found = reports(result.stdout)
    assert sorted(found) == [0, 1]
    for report in found.values():
        assert report["attempt"] == 1 and report["resumed_from"] == 3
        assert report["weights"] == pytest.approx(_expected_weights(), abs=1e-12)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_no_worker_survives_the_launcher_being_killed(tmp_path):
    launcher = subprocess.Popen(
        [sys.executable, "-m", "trainkit.cli.main", "launch", "--num_processes", "2",
         str(SCRIPTS / "allreduce_worker.py"), "--mode", "sleep", "--out", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=cli_env(tmp_path), cwd=REPO)
    try:
        deadline = time.monotonic() + 90
        while len(list(tmp_path.glob("pid-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        pids = [int(path.read_text()) for path in tmp_path.glob("pid-*")]
        assert len(pids) == 2, "workers did not start"
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        survivors = [pid for pid in pids if _alive(pid)]
        for pid in survivors:  # clean up before failing
            os.kill(pid, signal.SIGKILL)
        assert not survivors, f"workers {survivors} outlived the launcher"
    finally:
        if launcher.poll() is None:
            launcher.kill()


def test_trainkit_test_runs_the_self_check_on_two_processes(tmp_path):
    config = tmp_path / "two.yaml"
    config.write_text("distributed_type: MULTI_CPU\nnum_processes: 2\nuse_cpu: true\n")
    result = trainkit("test", "--config_file", config, tmp_path=tmp_path, timeout=180)
    assert result.returncode == 0, explain(result)
    assert "trainkit test: 2 process(es), device cpu, distributed type MULTI_CPU" in result.stdout
    assert result.stdout.count("all checks passed") == 1  # printed by the main process only
