"""The engine's foundation claims, checked in real processes (one plain process, then 2 gloo ranks).

Both launches run ``workers/engine_checks.py``; these tests compare the tensors and values it wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.distributed import run_python, run_torchrun

WORKER = Path(__file__).parent / "workers" / "engine_checks.py"
pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module", params=[1, 2], ids=["1proc", "2procs"])
def run(request, tmp_path_factory) -> tuple[int, Path]:
    out = tmp_path_factory.mktemp(f"engine_{request.param}")
    if request.param == 1:
        run_python(WORKER, out)
    else:
        run_torchrun(WORKER, out, nproc=2)
    return request.param, out


def _reports(out: Path, world: int) -> list[dict]:
    return [json.loads((out / f"report_rank{r}.json").read_text()) for r in range(world)]


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_data_parallel_matches_one_process_with_the_global_batch(run):
    world, out = run
    ours = load_file(out / "ddp_b4_k1_n32.safetensors")
    reference = load_file(out / "reference_n32.safetensors")
    assert _max_diff(ours, reference) <= 1e-5


@pytest.mark.parametrize("per_rank", [2, 1])
def test_accumulation_matches_a_bigger_batch_and_scales_the_short_last_window_like_accelerate(run, per_rank):
    world, out = run
    steps = 8 // (per_rank * world)
    ours = load_file(out / f"acc_b{per_rank}_k{steps}_n36.safetensors")
    reference = load_file(out / "reference_n36.safetensors")
    assert _max_diff(ours, reference) <= 1e-5


def test_save_model_writes_the_full_state_as_safetensors(run):
    _, out = run
    saved = load_file(out / "saved_model" / "model.safetensors")
    trained = load_file(out / "ddp_b4_k1_n32.safetensors")
    assert {k.removeprefix("module.") for k in saved} == set(trained)
    assert _max_diff({k: saved[k] for k in trained}, trained) == 0


def test_gather_for_metrics_returns_each_sample_exactly_once(run):
    world, out = run
    for report in _reports(out, world):
        for size in (13, 7, 1):
            for split in (0, 1):
                result = report["gather_for_metrics"][f"n{size}_split{split}"]
                assert result["tensors"] == list(range(size))
                assert result["objects"] == list(range(size))
                assert result["dataset_len"] == size


def test_collectives(run):
    world, out = run
    for rank, report in enumerate(_reports(out, world)):
        c = report["collectives"]
        assert c["gather"] == [v for r in range(world) for v in (r, r * 10)]
        assert c["gather_scalar"] == (list(range(world)) if world > 1 else 0)
        assert c["gather_nested"]["x"] == list(range(world))
        assert c["gather_object"] == [f"r{r}" for r in range(world)]
        assert c["reduce_sum"] == [sum(range(1, world + 1))]
        assert c["reduce_mean"] == [sum(range(1, world + 1)) / world]
        assert c["padded"] == [float(i) for i in range(rank + 2)] + [-1.0] * (world - 1 - rank)
        assert c["padded_first"] == [[-1.0] * (world - 1 - rank) + [float(i) for i in range(rank + 2)]]
        assert c["broadcast"] == [float(world - 1)]
        assert c["split"] == [0, 1, 2, 3, 4]
        assert c["padded_split_len"] == -(-5 // world)
        expected_a = [0, 1, 2, 3] if world == 1 else ([0, 1] if rank == 0 else [2, 3])
        assert c["dict_split"]["a"] == expected_a
        assert c["trigger"] == [True, False]
        assert c["main_first"] is True
        assert c["main_only"] == ("ran" if rank == 0 else None)
        assert c["shared_state"] is True


def test_mixed_precision_on_cpu(run):
    world, out = run
    for report in _reports(out, world):
        bf16, fp16 = report["precision"]["bf16"], report["precision"]["fp16"]
        for result in (bf16, fp16):
            assert result["changed"] and all(torch.isfinite(torch.tensor(result["losses"])))
            assert result["output_dtypes"] == ["torch.float32"]  # outputs handed back in float32
        assert not bf16["has_scaler"] and fp16["has_scaler"]
        assert fp16["overflow_skipped"] and fp16["overflow_weights_unchanged"] and fp16["overflow_scheduler_unchanged"]


def test_scheduler_steps_once_per_process_per_optimizer_step(run):
    world, out = run
    steps = _reports(out, world)[0]["scheduler_steps"]
    assert steps["optimizer_steps"] == 12 // world // 2
    assert steps["scheduler_steps"] == steps["optimizer_steps"] * world


def test_sharded_data_covers_the_dataset_and_skips_without_reordering(run):
    world, out = run
    for report in _reports(out, world):
        data = report["data"]
        assert data["len"] == 8 // world
        assert data["skipped"] == data["full"][2:]
        assert data["next_epoch_differs"] and data["epoch_covers_dataset"]
    assert _reports(out, world)[0]["distributed_type"] == ("NO" if world == 1 else "MULTI_CPU")
