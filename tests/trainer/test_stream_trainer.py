"""The Trainer on a streamed json dataset (``load_dataset(..., streaming=True)`` + ``map``), in real processes
(CPU, gloo): 2 ranks with 2 DataLoader workers each, a resume through ``checkpoint-3`` on 2 ranks and on 1
process, and ``predict``/``evaluate`` on the stream. ``stream_worker.py`` records what the model trained on
and what ``map`` tokenised; these tests compare them.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.distributed import run_python, run_torchrun

WORKER = Path(__file__).parent / "stream_worker.py"
ALL_IDS = sorted(number * 100 + i for number, length in enumerate((10, 12, 9, 11)) for i in range(length))
pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("stream_trainer")
    run_torchrun(WORKER, folder, "two", nproc=2, timeout=300)
    run_python(WORKER, folder, "one", timeout=200)
    return folder


def _run(out: Path, name: str, world: int) -> list[dict]:
    return [json.loads((out / f"{name}_rank{rank}.json").read_text()) for rank in range(world)]


def _reads(out: Path, name: str) -> list[int]:
    return [int(x) for path in (out / "reads" / name).glob("*.txt") for x in path.read_text().split()]


def _trained_before_checkpoint(out: Path) -> set[int]:
    return {i for rank in _run(out, "full", 2) for batch in rank["trained_on"][:3] for i in batch}


def test_trains_on_a_mapped_stream_with_workers_and_counts_tokens(out):
    full = _run(out, "full", 2)
    assert [len(rank["trained_on"]) for rank in full] == [8, 8]
    assert all(rank["global_step"] == 8 for rank in full)
    assert full[0]["tokens_seen"] == 8 * 2 * 4 * 3  # steps x ranks x batch x tokens per example
    assert sorted(_reads(out, "full_e0")) == ALL_IDS  # epoch 0 tokenised each example once across the job


def test_resume_through_checkpoint_continues_the_exact_stream_without_reading_again(out):
    full, resumed = _run(out, "full", 2), _run(out, "resumed2", 2)
    for rank in range(2):
        assert resumed[rank]["trained_on"] == full[rank]["trained_on"][3:]
    before = _trained_before_checkpoint(out)
    read = _reads(out, "resumed2_e0")
    assert not set(read) & before
    assert sorted(read) == sorted(set(ALL_IDS) - before)


def test_resume_on_one_process_reads_each_unseen_example_once(out):
    before = _trained_before_checkpoint(out)
    (resumed,) = _run(out, "resumed1", 1)
    trained = [i for batch in resumed["trained_on"] for i in batch]
    # One process keeps the global batch of two (accumulation 1 -> 2), so the 5 remaining steps read the rest
    # of epoch 0, each example once, and go on into epoch 1.
    rest_of_epoch = trained[:len(ALL_IDS) - len(before)]
    assert sorted(list(before) + rest_of_epoch) == ALL_IDS
    assert resumed["global_step"] == 8
    read = _reads(out, "resumed1_e0")
    assert Counter(read) == Counter(set(ALL_IDS) - before)


def test_predict_and_evaluate_on_a_stream_gather_each_example_once(out):
    result = json.loads((out / "predict.json").read_text())
    assert sorted(int(i) for i in result["ids"]) == ALL_IDS
    assert "eval_loss" in result["eval"]
