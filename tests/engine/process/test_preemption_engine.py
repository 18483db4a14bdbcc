"""``Accelerator.check_preemption()`` in real processes (CPU, 2 gloo ranks, `trainkit launch --max_restarts 1`):
a SIGTERM to one worker stops both at the same step, ``save_state()`` writes the automatic checkpoint, the
workers exit 75, torchrun restarts them, ``load_state()`` resumes, and the weights equal an uninterrupted run's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.cli_helpers import trainkit
from trainkit.engine.checkpoint import verify_checkpoint
from tests.distributed import ENGINE_WORKERS

pytestmark = pytest.mark.multiprocess

WORKER = ENGINE_WORKERS / "preemption_loop.py"


def test_check_preemption_saves_exits_75_and_a_restart_resumes_bitwise(tmp_path):
    result = trainkit("launch", "--num_processes", "2", "--cpu", "--max_restarts", "1", WORKER, tmp_path,
                      tmp_path=tmp_path, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    # Rank 1 alone was signalled; rank 0 learnt it through the agreement and stopped at the same step.
    assert "Rank 1 received SIGTERM" in output and "Rank 0 received" not in output
    assert "Preemption (a stop signal on another process)" in output
    assert "failed (exitcode: 75)" in output  # torchrun saw the preemption exit code, then restarted
    checkpoint = tmp_path / "run" / "checkpoints" / "checkpoint_0"
    verify_checkpoint(str(checkpoint))
    assert not (tmp_path / "run" / "checkpoints" / "checkpoint_1").exists()  # exactly one save
    report = json.loads(output.split("REPORT ", 1)[1].splitlines()[0])
    assert report["started_at"] > 5  # resumed from the step where both ranks stopped, after the signal at 5
    assert report["bitwise_equal"] is True
