"""What trainer libraries built on Accelerate rely on, on 2 gloo processes (CPU); see the worker's docstring."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.distributed import run_torchrun

WORKER = Path(__file__).parent / "workers" / "library_patterns.py"
pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("library_patterns")
    run_torchrun(WORKER, folder, nproc=2)
    return folder


def _ranks(out: Path) -> list[dict[str, torch.Tensor]]:
    return [load_file(out / f"rank{rank}.safetensors") for rank in (0, 1)]


def test_manual_no_sync_accumulation_syncs_only_at_window_ends(out):
    first, second = _ranks(out)
    facts = json.loads((out / "rank0.json").read_text())
    assert facts == {"len": 5, "scaler_is_none": True}  # 40 samples, 4 per process: 5 batches each
    for step in range(5):
        synced = (step + 1) % 2 == 0 or step == 4
        same = torch.equal(first[f"grad{step}"], second[f"grad{step}"])
        assert same == synced, f"micro-batch {step}: gradients {'differ' if synced else 'agree'} across processes"


def test_best_model_saved_through_unwrap_model_reloads(out):
    for tensors in _ranks(out):
        assert torch.equal(tensors["restored"], tensors["trained"])
        assert torch.equal(tensors["state_dict_weight"], tensors["trained"])


def test_an_endless_loop_over_a_prepared_loader_crosses_epochs(out):
    first, second = _ranks(out)
    epochs = [torch.cat([first["endless"][e * 5:(e + 1) * 5], second["endless"][e * 5:(e + 1) * 5]]) for e in range(3)]
    rows = [{tuple(row.tolist()) for row in epoch.reshape(-1, 3)} for epoch in epochs]
    assert all(len(r) == 40 for r in rows) and rows[0] == rows[1] == rows[2]  # each epoch covers the data once
    assert not torch.equal(epochs[0], epochs[1])  # reshuffled from one epoch to the next
