"""Streamed datasets in real processes (CPU, gloo): each rank reads only its share, each example once per epoch,
and a checkpoint continues the stream on 2 and on 1 process without reading anything again.

One torchrun launch (2 ranks) and one plain process run ``workers/stream_checks.py``, which logs every example
the datasets read (a counting torch IterableDataset with shards; a json stream through ``load_dataset(...,
streaming=True)`` and ``map``, where reading means tokenising) and every example consumed, with 0 and 2
DataLoader workers. These tests compare the logs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.distributed import ENGINE_WORKERS, run_python, run_torchrun

WORKER = ENGINE_WORKERS / "stream_checks.py"
SCENARIOS = ["counting_w0", "counting_w2", "json_w0", "json_w2"]
ALL_IDS = {
    "counting": sorted(shard * 100 + i for shard in range(8) for i in range(6)),
    "json": sorted(number * 100 + i for number, length in enumerate((10, 12, 9, 11)) for i in range(length)),
}
ALL_IDS["dispatch"] = ALL_IDS["counting"]
BATCH, WORLD = 4, 2
pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("streams")
    run_torchrun(WORKER, folder, "two", nproc=WORLD)
    run_python(WORKER, folder, "one")
    return folder


def _consumed(out: Path, scenario: str) -> dict[str, list[int]]:
    data = json.loads((out / f"consumed_{scenario}.json").read_text())
    data.update(json.loads((out / f"consumed1_{scenario}.json").read_text()))
    return data


def _reads(out: Path, scenario: str) -> dict[str, list[int]]:
    """Ids read, by rank, as logged by the dataset itself (in every worker process)."""
    by_rank: dict[str, list[int]] = {}
    for path in (out / "reads" / scenario).glob("*.txt"):
        by_rank.setdefault(path.name.split("_")[0], []).extend(int(x) for x in path.read_text().split())
    return by_rank


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_an_epoch_reads_and_yields_every_example_exactly_once_across_ranks(out, scenario):
    everything = ALL_IDS[scenario.split("_")[0]]
    consumed = _consumed(out, scenario)
    assert sorted(consumed["epoch0"]) == everything
    assert sorted(consumed["epoch1"]) == everything
    if scenario.startswith("counting"):  # shuffle_shards=True: each epoch deals the shards in a new order
        assert consumed["epoch1"] != consumed["epoch0"]
    else:  # an unshuffled stream keeps its order
        assert consumed["epoch1"] == consumed["epoch0"]
    reads = _reads(out, f"{scenario}_epoch0")
    assert sorted(x for ids in reads.values() for x in ids) == everything  # no example read by two ranks
    for rank, ids in reads.items():
        assert len(ids) <= len(everything) / WORLD + BATCH, (rank, len(ids))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_checkpoint_continues_the_stream_on_two_and_on_one_process_without_reading_again(out, scenario):
    consumed = _consumed(out, scenario)
    before = consumed["before"]
    # Same layout: the exact stream of an uninterrupted epoch.
    assert before + consumed["after2"] == consumed["epoch1"]
    # One process: every example not consumed before the stop, once (in another order).
    assert sorted(before + consumed["after1"]) == ALL_IDS[scenario.split("_")[0]]
    for resumed in ("resume2", "resume1"):
        read = [x for ids in _reads(out, f"{scenario}_{resumed}").values() for x in ids]
        assert not set(read) & set(before), f"{resumed} read again examples consumed before the checkpoint"
        assert sorted(read) == sorted(set(ALL_IDS[scenario.split("_")[0]]) - set(before))


def test_dispatch_batches_reads_on_the_main_process_only_and_resumes_the_same_stream(out):
    consumed = _consumed(out, "dispatch_w0")
    assert sorted(consumed["epoch0"]) == ALL_IDS["dispatch"]
    assert set(_reads(out, "dispatch_w0_epoch0")) == {"0"}  # rank 1 read nothing
    assert sorted(_reads(out, "dispatch_w0_epoch0")["0"]) == ALL_IDS["dispatch"]
    # One sequential reader has no shards to seek in: a resume re-reads the consumed part on the main process.
    assert consumed["before"] + consumed["after2"] == consumed["epoch1"] == consumed["epoch0"]
    assert consumed["before"] + consumed["after1"] == consumed["epoch0"]


def test_a_stream_shorter_than_the_processes_still_steps_on_every_rank(out):
    """One example, two ranks: rank 1 receives rank 0's batch as padding (transformers' distributed test evaluates
    such a stream); gather_for_metrics keeps the one real example."""
    ranks = [json.loads((out / f"one_example_rank{rank}.json").read_text()) for rank in range(WORLD)]
    assert all(len(r["steps"]) == 1 and set(r["steps"][0]) == {7} for r in ranks)  # one step, filled up (even_batches)
    assert ranks[0]["gathered"] == ranks[1]["gathered"] == [[7]]
