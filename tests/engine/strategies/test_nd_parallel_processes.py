"""Tensor parallelism x FSDP2 / DDP and HSDP on 4 gloo processes (CPU) equal one process.

One launch (``trainkit launch --config_file`` of tests/engine/workers/nd_parallel.py, the YAML's
``parallelism_config:`` block saying HSDP 2x2) trains a tiny Llama, untied and tied embeddings, fp32,
accumulation 2, clipping 1.0, AdamW, under TP2 x FSDP2, TP2 x DDP2 and HSDP 2x2 (each named in
``Accelerator(parallelism_config=...)``) and under the block's layout, and a hand-written one-process torch loop
on rank 0. Device: CPU with gloo, whatever the machine has.
"""

from __future__ import annotations

import pytest
import torch

import subprocess
import sys

from tests.distributed import ENGINE_WORKERS, REPO, worker_env

pytestmark = pytest.mark.multiprocess  # 4 gloo processes (CPU)

WORKER = ENGINE_WORKERS / "nd_parallel.py"
LAYOUTS = ("tp2_fsdp2", "tp2_ddp2", "hsdp2x2")
TIES = ("untied", "tied")
RELATIVE = 1e-5
CONFIG = """compute_environment: LOCAL_MACHINE
distributed_type: MULTI_CPU
num_processes: 4
parallelism_config:
  parallelism_config_dp_replicate_size: 2
  parallelism_config_dp_shard_size: 2
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("nd")
    (out / "hsdp2x2.yaml").write_text(CONFIG)
    launched = subprocess.run([sys.executable, "-m", "trainkit.cli.main", "launch", "--config_file",
                               str(out / "hsdp2x2.yaml"), str(WORKER), str(out)], capture_output=True, text=True,
                              timeout=300, env=worker_env(), cwd=REPO)
    assert launched.returncode == 0, launched.stdout[-4000:] + launched.stderr[-6000:]
    return torch.load(out / "results.pt", weights_only=False)


def _relative(values: list[float], reference: list[float]) -> float:
    assert len(values) == len(reference)
    return max(abs(a - b) / abs(b) for a, b in zip(values, reference))


@pytest.mark.parametrize("ties", TIES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_trains_as_one_process(results: dict, layout: str, ties: str) -> None:
    """Per-step loss (averaged over the data ranks) and gradient norm within 1e-5 relative of one process;
    every final full parameter within 1e-5 relative (norm of the difference over the reference's norm)."""
    run, reference = results[f"{layout}/{ties}"], results[f"reference/{ties}"]
    assert len(run["losses"]) == 8 and len(run["norms"]) == 4
    assert _relative(run["losses"], reference["losses"]) < RELATIVE
    assert _relative(run["norms"], reference["norms"]) < RELATIVE
    assert sorted(run["params"]) == sorted(reference["params"])
    for name, expected in reference["params"].items():
        difference = (run["params"][name] - expected).norm() / expected.norm()
        assert difference < RELATIVE, (name, float(difference))


def test_the_launch_configs_block_sets_the_layout_of_an_accelerator_not_told_one(results: dict) -> None:
    """``Accelerator()`` under ``trainkit launch --config_file`` with a HSDP 2x2 ``parallelism_config:`` block:
    that layout, and the same per-step loss, gradient norm and final parameters as one process (1e-5)."""
    run, reference = results["launcher_block/untied"], results["reference/untied"]
    assert run["mesh"] == "dp_replicate=2 x dp_shard=2 x tp=1 (HSDP)"
    assert _relative(run["losses"], reference["losses"]) < RELATIVE
    assert _relative(run["norms"], reference["norms"]) < RELATIVE
    for name, expected in reference["params"].items():
        assert (run["params"][name] - expected).norm() / expected.norm() < RELATIVE, name


@pytest.mark.parametrize("layout", LAYOUTS)
def test_evaluation_gathers_each_sample_once(results: dict, layout: str) -> None:
    """gather_for_metrics gathers across the data ranks only: 10 samples, each once, in order, as one process."""
    for ties in TIES:
        gathered, expected = results[f"{layout}/{ties}"]["eval"], results[f"reference/{ties}"]["eval"]
        assert gathered.shape == expected.shape == (10,)
        torch.testing.assert_close(gathered, expected, rtol=1e-5, atol=0)


def test_mesh_layouts_and_tensor_parallel_halves_parameters(results: dict) -> None:
    """The layouts are what their names say; with TP=2 each rank holds half the parameter elements it holds
    with the same data-parallel layout without TP (norms and other replicated parameters aside)."""
    assert results["tp2_fsdp2/untied"]["mesh"] == "dp_replicate=1 x dp_shard=2 x tp=2 (TP x FSDP)"
    assert results["tp2_ddp2/untied"]["mesh"] == "dp_replicate=2 x dp_shard=1 x tp=2 (TP x DDP)"
    assert results["hsdp2x2/untied"]["mesh"] == "dp_replicate=2 x dp_shard=2 x tp=1 (HSDP)"
    full = sum(value.numel() for value in results["reference/untied"]["params"].values())
    ddp_tp = results["tp2_ddp2/untied"]["local_numel"]
    fsdp_tp = results["tp2_fsdp2/untied"]["local_numel"]
    assert fsdp_tp * 2 == ddp_tp  # FSDP over 2 ranks halves what TP x DDP holds
    norms = sum(value.numel() for name, value in results["reference/untied"]["params"].items() if "norm" in name)
    assert ddp_tp == (full - norms) // 2 + norms  # TP splits every planned matrix in two; norms stay whole


def _update_distance(run: dict[str, torch.Tensor], reference: dict[str, torch.Tensor],
                     initial: dict[str, torch.Tensor]) -> float:
    """How far a run's update of the weights is from the reference's: ||(run - initial) - (reference - initial)||
    over ||reference - initial||, all parameters together. 0 for the same update, 1.0 for a run that never steps."""
    difference = sum(float((run[k].float() - reference[k].float()).pow(2).sum()) for k in reference) ** 0.5
    update = sum(float((reference[k].float() - initial[k].float()).pow(2).sum()) for k in reference) ** 0.5
    return difference / update


def test_bf16_with_tensor_parallel_stays_close_to_bf16_without_it_and_to_fp32(results: dict) -> None:
    """bf16 (FSDP2's parameter policy plus autocast): TP2 x FSDP2 against HSDP 2x2 differ only by TP's summation
    order in bf16; both stay within bf16's rounding of the fp32 one-process run. Measured on CPU: TP vs no TP
    3.6e-4 (loss) and 1.6e-3 (norm); against fp32 7.6e-4 and 7.4e-3 (TP), 6.3e-4 and 9.0e-3 (HSDP).

    The weights' check is against the effect of training: each bf16 run's update of the weights is 0.077 (TP)
    and 0.082 (HSDP) away from the fp32 run's, relative to that update's size, where a run that took no
    optimizer step (or lost its updates) scores 1.0; the bound 0.2 sits 5x below that. The per-step loss
    and norm bounds guard bf16's rounding only: the reference's own losses spread 1.3e-2 and its norms 0.13
    over the run (different data each step), 2.5x and 4x above them."""
    tp, hsdp, fp32 = results["tp2_fsdp2/bf16"], results["hsdp2x2/bf16"], results["reference/untied"]
    initial = results["initial/untied"]
    assert _relative(tp["losses"], hsdp["losses"]) < 2e-3 and _relative(tp["norms"], hsdp["norms"]) < 1e-2
    for run in (tp, hsdp):
        assert _relative(run["losses"], fp32["losses"]) < 5e-3
        assert _relative(run["norms"], fp32["norms"]) < 3e-2
        assert all(value.dtype == torch.float32 for value in run["params"].values())  # fp32 master weights
        assert _update_distance(run["params"], fp32["params"], initial) < 0.2
    assert _update_distance(initial, fp32["params"], initial) == 1.0  # the scale: no step taken
