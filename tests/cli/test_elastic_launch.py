"""Elastic `trainkit launch --num_machines 1:2` on loopback: a machine leaves, the job shrinks, one rejoins, it grows;
the run keeps its global batch and data order throughout and ends where a fixed 2-process run ends.

CPU/gloo, one process per launcher. Two launches: a fixed ``--num_processes 2`` reference (~16 s) and the elastic
job (~70 s on 2 shared cores: two launchers, a kill, a rejoin, 36 optimizer steps with a checkpoint each).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.cli_helpers import SCRIPTS, cli_env, explain, trainkit
from tests.distributed import REPO, free_port

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
WORKER = SCRIPTS / "elastic_train.py"
STEPS, EXAMPLES, STEPS_PER_EPOCH = 36, 48, 12
HOLD_AT, REJOIN_AFTER = 10, 14


def _records(out: Path) -> list[dict]:
    path = out / "ids.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _wait_for(condition, what: str, launches: list[subprocess.Popen], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if any(launch.poll() not in (None, 0) for launch in launches[:1]) or time.monotonic() > deadline:
            for launch in launches:
                _kill(launch)
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.2)


def _kill(launch: subprocess.Popen) -> None:
    if launch.poll() is None:
        os.killpg(launch.pid, signal.SIGKILL)  # the launcher and its worker (their own session)
        launch.wait(timeout=30)


def _steps(records: list[dict]) -> dict[int, dict]:
    """Each step's record; a step re-done after a restart must have read the same examples."""
    final: dict[int, dict] = {}
    for record in records:
        earlier = final.get(record["step"])
        assert earlier is None or sorted(earlier["ids"]) == sorted(record["ids"]), f"step {record['step']} re-read other data"
        final[record["step"]] = record
    return final


def test_elastic_job_shrinks_and_regrows_with_the_same_global_batch(tmp_path):
    reference = tmp_path / "fixed"
    result = trainkit("launch", "--num_processes", "2", WORKER, "--out", reference, tmp_path=tmp_path, timeout=180)
    assert result.returncode == 0, explain(result)

    out, port = tmp_path / "elastic", str(free_port())
    out.mkdir()

    def launch(machine_rank: int, name: str) -> subprocess.Popen:
        command = [sys.executable, "-m", "trainkit.cli.main", "launch", "--num_machines", "1:2", "--max_restarts", "3",
                   "--main_process_ip", "127.0.0.1", "--main_process_port", port, "--machine_rank", str(machine_rank),
                   "--rdzv_conf", "last_call_timeout=1", "--monitor_interval", "0.5",
                   str(WORKER), "--out", str(out), "--hold-rank1-at", str(HOLD_AT), "--slow-when-alone", "1"]
        with open(tmp_path / f"{name}.log", "w") as log:
            return subprocess.Popen(command, cwd=REPO, env=cli_env(tmp_path), stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    host, leaving = launch(0, "host"), launch(1, "leaving")
    joining = None
    try:
        _wait_for(lambda: (out / "held").exists(), f"step {HOLD_AT} on two machines", [host, leaving], 180)
        _kill(leaving)  # machine 1 disappears (its launcher and worker SIGKILLed) after step HOLD_AT
        alone = lambda: any(r["world"] == 1 and r["step"] >= REJOIN_AFTER for r in _records(out))  # noqa: E731
        _wait_for(alone, "the job to continue on one machine", [host], 180)
        joining = launch(1, "joining")
        host.wait(timeout=240)
        joining.wait(timeout=60)
    finally:
        for launch_ in (host, leaving, joining):
            if launch_ is not None:
                _kill(launch_)
    host_log = (tmp_path / "host.log").read_text()
    assert host.returncode == 0 and joining.returncode == 0, host_log[-4000:]

    steps = _steps(_records(out))
    assert sorted(steps) == list(range(1, STEPS + 1)), "a step is missing"
    shapes = [(steps[s]["world"], steps[s]["accumulation"]) for s in sorted(steps)]
    assert shapes[:HOLD_AT] == [(2, 1)] * HOLD_AT
    assert shapes[HOLD_AT] == (1, 2), "after the machine left: one process, doubled accumulation"
    assert shapes[-1] == (2, 1), "the job did not grow back"
    for epoch in range(STEPS // STEPS_PER_EPOCH):  # every example exactly once per epoch: no repeat, no gap
        ids = [i for s in range(epoch * STEPS_PER_EPOCH + 1, (epoch + 1) * STEPS_PER_EPOCH + 1) for i in steps[s]["ids"]]
        assert sorted(ids) == list(range(EXAMPLES)), f"epoch {epoch}"
    fixed = _steps(_records(reference))
    assert all(sorted(fixed[s]["ids"]) == sorted(steps[s]["ids"]) for s in fixed), "the global batches differ"
    assert "World size 2 -> 1" in host_log and "gradient_accumulation_steps 1 -> 2" in host_log
    assert "World size 1 -> 2" in host_log and "gradient_accumulation_steps 2 -> 1" in host_log

    expected = json.loads((reference / "final.json").read_text())
    got = json.loads((out / "final.json").read_text())
    assert got["lr"] == pytest.approx(expected["lr"], rel=1e-12)  # the schedule stepped as the fixed run's did
    for name, values in expected["weights"].items():
        for a, b in zip(got["weights"][name], values):
            assert abs(a - b) <= 1e-5 * max(abs(b), 1e-12), f"{name}: {a} vs {b}"
