"""Accelerate's process-level names in real processes: 1 plain process and 2 gloo ranks on CPU (loopback).

Both launches run ``workers/surface_checks.py`` (state methods, ``trainkit.utils`` collectives, debug-mode
shape checks, DDP comm hook, ``trigger_sync_in_backward``, ``join_uneven_inputs``, ``profile``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.distributed import run_python, run_torchrun

WORKER = Path(__file__).parent / "workers" / "surface_checks.py"
pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> tuple[list[dict], Path]:
    out = tmp_path_factory.mktemp("surface_2procs")
    run_torchrun(WORKER, out, nproc=2, timeout=300)
    return [json.loads((out / f"report_rank{r}.json").read_text()) for r in range(2)], out


def test_state_names_on_two_ranks(two_ranks):
    (r0, r1), _ = two_ranks
    assert r0["distributed_type"] == r1["distributed_type"] == "MULTI_CPU" and r0["num_processes"] == 2
    assert (r0["is_last"], r1["is_last"]) == (False, True) and r0["same_object"] and r1["same_object"]
    assert r0["ran"] == ["main"] and r1["ran"] == ["last", "p1"]  # on_main/on_last/on_process decorators
    assert r0["share"] == [0, 1, 2] and r1["share"] == [3, 4, 4]  # split_between_processes(apply_padding=True)
    assert r0["printed"] == "hello\n" and r1["printed"] == ""


def test_utils_collectives_on_two_ranks(two_ranks):
    for report in two_ranks[0]:
        assert report["gather"] == [0, 10, 1, 11] and report["gather_object"] == ["r0", "r1"]
        assert report["broadcast"] == [1.0] and report["broadcast_object_list"] == ["from1"]
        assert report["reduce_default"] == [0.5]  # accelerate.utils.reduce averages by default
        assert report["reduce_sum"] == [1.0]
        assert report["copied"] == [0.0, 1.0, 2.0]  # copy_tensor_to_devices: only rank 1 held it
        assert "shapes differ across processes" in report["debug_mismatch"]
        assert "process 0: [1]" in report["debug_mismatch"] and "process 1: [2]" in report["debug_mismatch"]
        assert "shapes differ across processes" in report["debug_attribute_mismatch"]  # PartialState().debug = True
        assert report["debug_attribute_off"] == [False, [0.0]]
        assert "numbers of dimensions differ" in report["debug_pad_mismatch"]
        assert "process 0: {'t': 2}" in report["debug_pad_mismatch"] and report["debug_pad_sizes"] == 2
    r0, r1 = two_ranks[0]
    assert r0["pad"] == [1.0, 1.0, -1.0] and r1["pad"] == [1.0, 1.0, 1.0]
    assert (two_ranks[1] / "saved.pt").exists()


def test_accelerator_contexts_on_two_ranks(two_ranks):
    (r0, r1), out = two_ranks
    assert r0["comm_hook"] == r1["comm_hook"] == "fp16_compress_hook"
    assert r0["wrapped_comm_hook"].startswith("fp16_compress_wrapper")  # wrapping the PowerSGD hook
    # no_sync keeps each rank's own gradient (inputs 1 and 2 -> 2 and 4); trigger_sync_in_backward averages them.
    assert r0["grad_no_sync"] == [[2.0] * 3] and r1["grad_no_sync"] == [[4.0] * 3]
    assert r0["grad_triggered"] == r1["grad_triggered"] == [[3.0] * 3]
    # join_uneven_inputs(even_batches=False): 3 and 2 batches, no hang, weights still identical, padding restored.
    assert (r0["uneven_batches"], r1["uneven_batches"]) == (3, 2)
    assert r0["weights_after_join"] == r1["weights_after_join"]
    assert r0["even_batches_restored"] is True and r0["gradient_state_shared"]
    # even_batches=False reaches the map-style loader only; the iterable one keeps padding and a UserWarning says so.
    assert r0["map_even_batches_inside"] is False and r0["iterable_switches_inside"] == r0["iterable_switches_before"]
    assert True in r0["iterable_switches_before"].values()  # the stream pads (even_batches' default), still inside
    assert len(r0["join_warnings"]) == 1 and r0["join_warnings"][0].startswith("UserWarning: ")
    assert "only supported for map-style datasets" in r0["join_warnings"][0]
    # LocalSGD: different after step 0 (local), equal after step 1 (averaged every 2), equal again at exit.
    assert r0["local_sgd_step0"] != r1["local_sgd_step0"] and r0["local_sgd_step1"] == r1["local_sgd_step1"]
    assert r0["local_sgd_step2"] != r1["local_sgd_step2"] and r0["local_sgd_exit"] == r1["local_sgd_exit"]
    assert r0["profiled_events"] and sorted(p.name for p in (out / "traces").iterdir()) == [
        "trace_rank_0.json", "trace_rank_1.json"]


def test_same_names_on_one_process(tmp_path):
    run_python(WORKER, tmp_path, timeout=300)
    report = json.loads((tmp_path / "report_rank0.json").read_text())
    assert report["distributed_type"] == "NO" and report["ran"] == ["main", "last"]
    assert report["gather"] == [0, 10] and report["copied"] == [0.0, 1.0, 2.0]
    assert report["debug_mismatch"] == report["debug_attribute_mismatch"] == "no error"  # one process: nothing to compare
    assert report["debug_pad_mismatch"] == "no error"
    assert report["uneven_batches"] == 5 and report["grad_triggered"] == [[2.0] * 3]
