"""Accelerate's data and splitting semantics on 2 gloo processes (CPU), with installed Accelerate as the oracle.

``workers/semantics_checks.py`` runs the same code under trainkit and under Accelerate (a test-only
dependency; trainkit never imports it). Training: a shuffled DataLoader built with the user's own
``torch.Generator`` (and the same with Accelerate's seedable sampler), SGD and AdamW, global batch 16 on
2 processes, with and without ``split_batches``, must give the parameters a plain one-process loop gives.
Splitting: ``split_between_processes`` of lists, tuples, tensors, dicts and ``datasets.Dataset``.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.distributed import run_torchrun, worker_env

WORKER = Path(__file__).parent / "workers" / "semantics_checks.py"
pytestmark = pytest.mark.multiprocess
RECIPES = [f"seedable{s}_{o}" for s in (0, 1) for o in ("sgd", "adamw")]


def _run(tmp_path_factory, engine: str) -> Path:
    out = tmp_path_factory.mktemp(f"semantics_{engine}")
    run_torchrun(WORKER, out, engine, nproc=2, env=worker_env(ACCELERATE_USE_CPU="true"))
    return out


@pytest.fixture(scope="module")
def trainkit_out(tmp_path_factory) -> Path:
    return _run(tmp_path_factory, "trainkit")


@pytest.fixture(scope="module")
def accelerate_out(tmp_path_factory) -> Path:
    if importlib.util.find_spec("accelerate") is None:
        pytest.skip("the oracle comparison needs Accelerate installed (a test-only dependency)")
    return _run(tmp_path_factory, "accelerate")


def _params(out: Path, rank: int, key: str) -> dict[str, torch.Tensor]:
    stored = load_file(out / f"training_rank{rank}.safetensors")
    return {name: stored[f"{key}.{name}"] for name in ("a", "b")}


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("split", [0, 1])
def test_two_processes_train_the_one_process_model(trainkit_out, recipe, split):
    plain = _params(trainkit_out, 0, f"{recipe}_plain")
    for rank in (0, 1):
        ours = _params(trainkit_out, rank, f"{recipe}_split{split}")
        for name in plain:  # Accelerate's own check uses these tolerances
            torch.testing.assert_close(ours[name], plain[name], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("recipe", RECIPES)
def test_trainkit_and_accelerate_train_the_same_model(trainkit_out, accelerate_out, recipe):
    for rank in (0, 1):
        for split in (0, 1):
            ours = _params(trainkit_out, rank, f"{recipe}_split{split}")
            theirs = _params(accelerate_out, rank, f"{recipe}_split{split}")
            for name in ours:
                torch.testing.assert_close(ours[name], theirs[name], atol=1e-6, rtol=1e-6)


def _splits(out: Path) -> list[dict]:
    return [json.loads((out / f"split_rank{rank}.json").read_text()) for rank in (0, 1)]


def test_split_between_processes_shares(trainkit_out):
    first, second = _splits(trainkit_out)
    assert (first["list_pad0"]["value"], second["list_pad0"]["value"]) == ([0, 1, 2, 3], [4, 5, 6])
    assert (first["list_pad1"]["value"], second["list_pad1"]["value"]) == ([0, 1, 2, 3], [4, 5, 6, 6])
    assert second["tuple_pad0"] == {"type": "tuple", "value": [4, 5, 6]}
    assert second["tensor_pad1"] == {"type": "tensor", "value": [[8, 9], [10, 11], [12, 13], [12, 13]]}
    assert second["dict_pad1"]["value"]["names"]["value"] == ["n4", "n5", "n6", "n6"]
    # A datasets.Dataset gives a Dataset of this process's rows, as Dataset.select does (not a dict of columns).
    assert second["dataset_pad0"] == {"type": "Dataset", "len": 3, "value": [4, 5, 6]}
    assert second["dataset_pad1"] == {"type": "Dataset", "len": 4, "value": [4, 5, 6, 6]}
    assert (first["short_pad1"]["value"], second["short_pad1"]["value"]) == ([0], [0])
    assert (first["short_pad0"]["value"], second["short_pad0"]["value"]) == ([0], [])


def test_split_between_processes_matches_accelerate(trainkit_out, accelerate_out):
    assert _splits(trainkit_out) == _splits(accelerate_out)
