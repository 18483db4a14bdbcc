"""Accumulation with a prepared optimizer and scheduler on 2 gloo processes (CPU): gradients are all-reduced
exactly at each window's end, the short last window included, and scaled as Accelerate scales them.

The worker (``workers/accumulation_sync.py``) records, after each backward, this process's gradient and the
two it may equal: from its own micro-batches only, or from every process's (see its docstring).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.distributed import ENGINE_WORKERS, run_torchrun

WORKER = ENGINE_WORKERS / "accumulation_sync.py"
pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> list[dict[str, torch.Tensor]]:
    out = tmp_path_factory.mktemp("accumulation_sync")
    run_torchrun(WORKER, out, nproc=2)
    return [load_file(out / f"rank{rank}.safetensors") for rank in range(2)]


def test_gradients_sync_at_each_window_end_including_the_short_last_one(records):
    steps = sorted({int(key.split(".")[0]) for key in records[0]})
    assert steps == [0, 1, 2, 3, 4]  # 40 samples, 4 per process and micro-batch, 2 processes: 5 micro-batches each
    assert [bool(records[0][f"{s}.synced"]) for s in steps] == [False, True, False, True, True]
    for rank_records in records:
        for step in steps:
            expected = rank_records[f"{step}.global_grad" if step in (1, 3, 4) else f"{step}.local_grad"]
            torch.testing.assert_close(rank_records[f"{step}.grad"], expected, rtol=1e-6, atol=1e-7)
    for step in (1, 3, 4):
        torch.testing.assert_close(records[0][f"{step}.grad"], records[1][f"{step}.grad"], rtol=0, atol=0)
    # Inside a window each process keeps its own gradient: they differ until the all-reduce.
    for step in (0, 2):
        assert not torch.allclose(records[0][f"{step}.grad"], records[1][f"{step}.grad"])


def test_the_scheduler_steps_once_per_process_at_each_window_end(records):
    for step in range(5):
        assert records[0][f"{step}.lr"].item() == pytest.approx(records[0][f"{step}.plain_lr"].item(), rel=1e-12)
