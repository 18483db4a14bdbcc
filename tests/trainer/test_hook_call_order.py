"""A subclass overriding every hook sees the same calls under trainkit's Trainer as under transformers' (CPU, gloo).

``hook_order_worker.py`` runs one scenario (train with evaluation, checkpoints and the best model; a resumed
train; evaluate; predict; save_model) under transformers' Trainer (the oracle, needing Accelerate) and under
trainkit's, recording every hook call: name, depth and arguments (bound to transformers' signature, summarised
as kinds, tensor shapes, keys, checkpoint names). The sequences must be equal, on 1 process and on 2 (torchrun,
gloo: transformers' Trainer runs distributed on CPU with ``use_cpu=True``), rank by rank.

The differences that remain are by design, each applied by :func:`normalised` below:

- at the end of training transformers looks up the run's folder (``_get_output_dir``) to delete the newest checkpoint
  when ``save_total_limit=1`` and it is not the best; trainkit never deletes the newest checkpoint (the one a resume
  needs), so it has no such lookup there: that call of transformers' ``_finalize_training`` is left out;
- trainkit's checkpoint is written in a hidden staging folder renamed when complete: ``save_model`` and ``_save``
  get ``.checkpoint-N.staging-...``, compared as ``checkpoint-N`` (the worker's summary does it);
- trainkit's training logs also carry throughput (``samples_per_second``, ``step_time``, ``tokens_per_second``,
  ``mfu``), left out of ``log``'s summary (the worker's summary does it);
- hooks trainkit does not have are not recorded: those of :data:`trainkit.trainer.hooks.NOT_CALLED`, and those
  other engineers are adding (``_get_train_sampler``, ``_get_eval_sampler``, the hyperparameter-search hooks):
  the worker records the hooks both Trainers have, read at run time, so those join the comparison when added.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import pytest

from tests.distributed import run_python, run_torchrun

pytest.importorskip("accelerate", reason="transformers' Trainer, the oracle, needs accelerate (a test-only dependency)")
pytestmark = pytest.mark.timeout(900)

WORKER = Path(__file__).with_name("hook_order_worker.py")
FRAMEWORKS = ("transformers", "trainkit")


def normalised(phases: dict[str, list], framework: str) -> dict[str, list]:
    """Calls comparable across the two Trainers: transformers' final checkpoint lookup left out (see the module
    doc)."""
    result = {}
    for phase, calls in phases.items():
        kept, callers = [], []
        for name, depth, received in calls:
            callers[depth:] = [name]
            if framework == "transformers" and name == "_get_output_dir" and callers[depth - 1:depth] == ["_finalize_training"]:
                continue
            kept.append([name, depth, received])
        result[phase] = kept
    return result


def _lines(calls: list) -> list[str]:
    return [f"{'  ' * depth}{name} {json.dumps(received, sort_keys=True)}" for name, depth, received in calls]


def _phases(out: Path, framework: str, rank: int) -> dict[str, list]:
    recorded = json.loads((out / f"{framework}-rank{rank}.json").read_text())
    recorded.pop("processes")  # how the run was launched, not a hook call
    return normalised(recorded, framework)


def assert_same_calls(out: Path, rank: int) -> dict[str, int]:
    theirs, ours = (_phases(out, framework, rank) for framework in FRAMEWORKS)
    assert list(theirs) == list(ours)
    for phase in theirs:
        expected, got = _lines(theirs[phase]), _lines(ours[phase])
        diff = "\n".join(difflib.unified_diff(expected, got, "transformers", "trainkit", lineterm="", n=2))
        assert expected == got, f"rank {rank}, {phase}: the hook calls differ\n{diff[:6000]}"
    return {phase: len(calls) for phase, calls in theirs.items()}


@pytest.mark.slow
def test_the_same_hook_calls_on_one_process(tmp_path, record_property):
    """CPU, one process each, in its own interpreter (Accelerate's and trainkit's process states stay apart)."""
    for framework in FRAMEWORKS:
        run_python(WORKER, framework, str(tmp_path), timeout=600)
    counts = assert_same_calls(tmp_path, 0)
    record_property("calls", counts)
    assert counts["train"] > 150 and counts["resume"] > 80  # the scenario really ran (many steps, evaluations)


@pytest.mark.multiprocess
def test_the_same_hook_calls_on_two_processes(tmp_path, record_property):
    """CPU, gloo, two processes per Trainer (torchrun); every rank's calls equal transformers' same rank's."""
    for framework in FRAMEWORKS:
        run_torchrun(WORKER, framework, str(tmp_path), nproc=2, timeout=900)
    for rank in (0, 1):
        record_property(f"calls_rank{rank}", assert_same_calls(tmp_path, rank))
    processes = json.loads((tmp_path / "transformers-rank1.json").read_text())["processes"][0]
    assert processes[:2] == ["ParallelMode.DISTRIBUTED", 2]  # transformers' Trainer really ran on 2 processes
