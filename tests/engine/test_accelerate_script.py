"""An Accelerate script, changed only in its imports, runs and learns on 1 and on 2 processes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.distributed import run_python, run_torchrun

SCRIPT = Path(__file__).parent / "workers" / "accelerate_style_script.py"


@pytest.mark.multiprocess
@pytest.mark.parametrize("nproc,extra", [(1, ["--mixed_precision", "bf16"]), (2, ["--gradient_accumulation_steps", "2"])])
def test_accelerate_script_runs_unchanged(tmp_path, nproc, extra):
    args = ["--output_dir", str(tmp_path), *extra]
    result = run_python(SCRIPT, *args) if nproc == 1 else run_torchrun(SCRIPT, *args, nproc=nproc)
    final = re.search(r"FINAL accuracy=([\d.]+) total=(\d+) processes=(\d+)", result.stdout)
    assert final, result.stdout
    accuracy, total, processes = float(final[1]), int(final[2]), int(final[3])
    assert processes == nproc and total == 200 and accuracy > 0.9
    assert result.stdout.count("FINAL") == 1, "accelerator.print prints on the main process only"
    weights = load_file(tmp_path / "model.safetensors")
    assert set(weights) == {"0.weight", "0.bias", "3.weight", "3.bias"}
    # log_with="all": the installed trackers, as Accelerate's (trainkit's JSONL log only when named).
    assert not (tmp_path / "accelerate_style" / "metrics.jsonl").exists()
    pytest.importorskip("tensorboard", reason="the logged steps are read back from TensorBoard's event files")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "accelerate_style"))
    events.Reload()
    assert [event.step for event in events.Scalars("accuracy")] == [0, 1, 2]
