"""Two processes (torchrun, gloo on CPU): trainkit's Trainer against transformers' own 2-process run in the same
processes, and trainkit's exact resume on two processes (one launch of tests/trainer/oracle_worker.py)."""

from __future__ import annotations

import json

import pytest

from tests.distributed import REPO, run_torchrun, worker_env

pytest.importorskip("accelerate", reason="transformers' Trainer needs Accelerate to run (the oracle)")
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("oracle")
    run_torchrun(REPO / "tests" / "trainer" / "oracle_worker.py", "--out", str(out), nproc=2,
                 env=worker_env(device="cpu"), timeout=360)
    return json.loads((out / "results.json").read_text())


@pytest.mark.parametrize("run", ["gpt2", "bert_local"])
def test_two_processes_give_transformers_numbers(results, run):
    assert results["world_size"] == 2
    ours, theirs = results[run]["trainkit"], results[run]["transformers"]
    assert len(ours["losses"]) == 6
    assert ours == theirs  # losses, gradient norms, evaluation losses, train loss, digest of the final weights


def test_transformers_doubles_a_bert_loss_over_two_processes_and_trainkit_does_not(results):
    """transformers hands num_items_in_batch to any model with **kwargs and multiplies the loss by the processes;
    BERT's heads ignore the count and return their own mean, so transformers' loss (and gradient) is doubled: its
    first step reads twice trainkit's, and the runs part from there."""
    ours, theirs = results["bert_default"]["trainkit"], results["bert_default"]["transformers"]
    assert ours["losses"] == results["bert_local"]["trainkit"]["losses"]  # a mean is a mean either way
    assert theirs["losses"][0] == 2 * ours["losses"][0]
    assert theirs["weights"] != ours["weights"]


def test_resume_on_two_processes_ends_bitwise_like_the_uninterrupted_run(results):
    full, first, resumed = (results["resume"][key] for key in ("full", "first", "resumed"))
    assert first["losses"] + resumed["losses"] == full["losses"]
    assert resumed["eval_losses"] == full["eval_losses"] and resumed["weights"] == full["weights"]
