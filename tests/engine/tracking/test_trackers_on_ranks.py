"""Trackers on 2 gloo processes (CPU): as in Accelerate, every process builds the trackers, so ``get_tracker``
answers everywhere; the built-in ones create their run and write on the main process only, while a script's
tracker with ``main_process_only = False`` is started on every process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.distributed import run_torchrun

WORKER = Path(__file__).parents[1] / "workers" / "tracker_ranks.py"
pytestmark = pytest.mark.multiprocess


def test_trackers_exist_on_every_rank_and_write_once(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (extra 'tensorboard')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_torchrun(WORKER, tmp_path, nproc=2, timeout=300)
    r0, r1 = (json.loads((tmp_path / f"report_rank{rank}.json").read_text()) for rank in range(2))
    assert r0["names"] == r1["names"] == ["jsonl", "tensorboard", "every_rank"]
    assert r0["wrapper"] == r1["wrapper"] == "TensorBoardTracker"
    assert (r0["writer_here"], r1["writer_here"]) == (True, False)  # the run exists on the main process only
    assert r0["custom_started"] and r1["custom_started"]
    assert len(list((tmp_path / "ranks").glob("events.out.tfevents*"))) == 1
    events = EventAccumulator(str(tmp_path / "ranks"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 1.0)]  # rank 0's value only
    assert len((tmp_path / "ranks" / "metrics.jsonl").read_text().splitlines()) == 1
