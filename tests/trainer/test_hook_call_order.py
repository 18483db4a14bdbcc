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

trainkit calls the hooks in the order of transformers 5.17 and later. transformers 5.1 (the oldest declared
release) ordered some calls differently; there the comparison is of the same call tree with each caller's calls
in any order, after the three differences of 5.1's own signatures and arguments: ``set_initial_training_values``
took the global batch from its caller (allow-listed in test_transformers_signatures.py), ``evaluation_loop``
passed its loader to ``_wrap_model``, and the end-of-training folder lookup sat in ``_inner_training_loop``.
Before 5.24 ``save_model`` called ``_save`` on the saving process only (:data:`SAVE_ON_MAIN_ONLY`).

Where transformers' own Trainer fails in a phase (:data:`KNOWN_TRANSFORMERS_FAILURES`: only failures named
there are accepted), the phases before it are compared and the rest are not run.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import pytest
import transformers
from packaging.version import Version

from tests.distributed import run_python, run_torchrun

pytest.importorskip("accelerate", reason="transformers' Trainer, the oracle, needs accelerate (a test-only dependency)")
pytestmark = pytest.mark.timeout(900)

WORKER = Path(__file__).with_name("hook_order_worker.py")
FRAMEWORKS = ("transformers", "trainkit")


INSTALLED = Version(transformers.__version__)
OLDER_ORDER = INSTALLED < Version("5.17")
"""transformers 5.1: some calls in another order than later releases (see the module doc)."""
SAVE_ON_MAIN_ONLY = INSTALLED < Version("5.24")
"""Before transformers 5.24 save_model called ``_save`` on the saving process only; from 5.24 on (and in trainkit)
on every process, ``_save`` itself writing on the saving one: trainkit's other ranks' calls are left out there."""
KNOWN_TRANSFORMERS_FAILURES = {
    "don't know how to restore data location": "transformers' own resume on 2 CPU processes under torch 2.11 "
    "(torch.load of optimizer.pt cannot map the 'cpu:0' storage; transformers 5.1 and 5.17 there, not on torch 2.13)",
}


def normalised(phases: dict[str, list], framework: str, rank: int = 0) -> dict[str, list]:
    """Calls comparable across the two Trainers: transformers' final checkpoint lookup left out; on older
    transformers releases their other argument, signature and per-rank differences too (see the module doc)."""
    lookup_callers = {"_finalize_training", "_inner_training_loop"} if OLDER_ORDER else {"_finalize_training"}
    result = {}
    for phase, calls in phases.items():
        kept, callers, skip_below = [], [], None
        for name, depth, received in calls:
            callers[depth:] = [name]
            if skip_below is not None and depth > skip_below:
                continue
            skip_below = None
            if (SAVE_ON_MAIN_ONLY and framework == "trainkit" and rank != 0 and name == "_save"
                    and callers[depth - 1] == "save_model"):
                skip_below = depth
                continue
            if framework == "transformers" and name == "_get_output_dir" and callers[depth - 1] in lookup_callers:
                continue
            if OLDER_ORDER:
                if name == "get_total_train_batch_size":
                    continue  # 5.1: called by set_initial_training_values' caller; later, by it
                if name == "set_initial_training_values":
                    received = {}
                if name == "_wrap_model" and callers[depth - 1] == "evaluation_loop":
                    received = {**received, "dataloader": None}
            kept.append([name, depth, received])
        result[phase] = kept
    return result


def _tree_lines(calls: list) -> list[str]:
    """The calls as a tree, each caller's calls sorted (their order left out), rendered as indented lines."""
    root: list = []
    stack = [root]
    for name, depth, received in calls:
        node = (f"{name} {json.dumps(received, sort_keys=True)}", [])
        stack[depth].append(node)
        stack[depth + 1:] = [node[1]]

    def render(nodes: list, depth: int) -> list[str]:
        blocks = sorted([f"{'  ' * depth}{label}", *render(children, depth + 1)] for label, children in nodes)
        return [line for block in blocks for line in block]

    return render(root, 0)


def _lines(calls: list) -> list[str]:
    if OLDER_ORDER:
        return _tree_lines(calls)
    return [f"{'  ' * depth}{name} {json.dumps(received, sort_keys=True)}" for name, depth, received in calls]


def _phases(out: Path, framework: str, rank: int) -> dict[str, list]:
    recorded = json.loads((out / f"{framework}-rank{rank}.json").read_text())
    recorded.pop("processes")  # how the run was launched, not a hook call
    failed = recorded.pop("failed", None)
    if failed:  # transformers' own Trainer failed in this phase (the worker ran no later one)
        phase, error = failed[0][0], failed[0][2]["error"]
        known = [why for text, why in KNOWN_TRANSFORMERS_FAILURES.items() if text in error]
        assert known, f"transformers' own Trainer failed in {phase!r}, not a known failure: {error}"
        print(f"rank {rank}: transformers' Trainer failed in {phase!r} ({known[0]}); the phases before are compared")
    return normalised(recorded, framework, rank)


def assert_same_calls(out: Path, rank: int) -> dict[str, int]:
    theirs, ours = (_phases(out, framework, rank) for framework in FRAMEWORKS)
    assert list(theirs) == list(ours)[:len(theirs)] and theirs, (list(theirs), list(ours))
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
