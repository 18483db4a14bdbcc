"""Sequence (Ulysses) and context (ring) parallelism train the one-process model (CPU, gloo, 4 processes).

Three runs of tests/engine/workers/sequence_parallel.py (see its docstring): ``layouts`` (torchrun: SP2 x FSDP2,
SP2 x TP2, SP2 x DDP2, CP2 x FSDP2 with both ``cp_comm_strategy`` values, CP2 x TP2, activation checkpointing
under both TP layouts; SP2 x FSDP2's sharded checkpoint resumed under CP2 x FSDP2 and SP2 x TP2), ``launched``
(``trainkit launch --config_file`` whose block says FSDP2, with ``--parallelism_config_sp_size 2``: ``Accelerator()``
and the Trainer under SP2 x FSDP2 and SP4), and ``single`` (one process: the Trainer reference, the checkpoint
resumed). A tiny Llama (4 heads, 2 key/value heads), sequences of 258 tokens, fp32, AdamW, accumulation 2,
clipping 1.0.

Tolerance: 1e-5 relative (measured: loss and gradient norm within 2e-7, parameters within 4e-6). The effects it
guards are far larger: the halves of each sequence hold 129 and 128 labelled tokens, positions offset by 129 move
every rotary angle, and a label shifted after splitting loses one target per rank boundary.

Context parallelism runs torch's ring attention algorithm with SDPA's CPU kernel as its block kernel, registered
by the worker as the CPU ring kernel: torch's own dispatch has no CPU kernel (``test_torch_ring_attention_does_not
_run_on_cpu`` pins the error); tests/engine/parallel/test_context_parallel_gpu.py runs torch's real one on GPUs.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.distributed import ENGINE_WORKERS, REPO, run_python, run_torchrun, worker_env

pytestmark = pytest.mark.multiprocess  # 4 gloo processes (CPU)

WORKER = ENGINE_WORKERS / "sequence_parallel.py"
RELATIVE = 1e-5
CONFIG = """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
num_processes: 4
gradient_accumulation_steps: 2
fsdp_config:
  fsdp_version: 2
parallelism_config:
  parallelism_config_dp_shard_size: 2
"""
LAYOUT_NAMES = {
    "sp2_fsdp2": "dp_replicate=1 x dp_shard=2 x sp=2 x tp=1 (SP x FSDP)",
    "sp2_tp2": "dp_replicate=1 x dp_shard=1 x sp=2 x tp=2 (TP x SP)",
    "sp2_ddp2": "dp_replicate=2 x dp_shard=1 x sp=2 x tp=1 (SP x DDP)",
    "cp2_fsdp2": "dp_replicate=1 x dp_shard=2 x cp=2 x tp=1 (CP x FSDP)",
    "cp2_fsdp2_alltoall": "dp_replicate=1 x dp_shard=2 x cp=2 x tp=1 (CP x FSDP)",
    "cp2_tp2": "dp_replicate=1 x dp_shard=1 x cp=2 x tp=2 (TP x CP)",
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("sequence_parallel")
    run_torchrun(WORKER, "layouts", str(out), nproc=4, timeout=600)
    (out / "config.yaml").write_text(CONFIG)
    launched = subprocess.run([sys.executable, "-m", "trainkit.cli.main", "launch", "--config_file",
                               str(out / "config.yaml"), "--parallelism_config_sp_size", "2", str(WORKER), "launched",
                               str(out)], capture_output=True, text=True, timeout=600, env=worker_env(), cwd=REPO)
    assert launched.returncode == 0, launched.stdout[-4000:] + launched.stderr[-6000:]
    run_python(WORKER, "single", str(out), timeout=300)
    return {mode: torch.load(out / f"{mode}.pt", weights_only=False) for mode in ("layouts", "launched", "single")}


def _relative(values: list[float], reference: list[float]) -> float:
    assert len(values) == len(reference) and values
    return max(abs(a - b) / abs(b) for a, b in zip(values, reference))


def _same_parameters(params: dict, reference: dict) -> None:
    assert sorted(params) == sorted(reference)
    for name, expected in reference.items():
        assert (params[name] - expected).norm() / expected.norm() < RELATIVE, name


@pytest.mark.parametrize("layout", sorted(LAYOUT_NAMES))
def test_split_sequences_train_as_one_process(runs: dict, layout: str) -> None:
    """Per-micro-batch loss, per-step gradient norm, final parameters and an evaluation loss (model.eval(): whole
    sequences on every rank) within 1e-5 relative of one process; the model ran trainkit's attention."""
    run, reference = runs["layouts"][layout], runs["layouts"]["reference"]
    assert run["layout"] == LAYOUT_NAMES[layout]
    assert run["attention"] == ("trainkit_ring" if layout.startswith("cp") else "trainkit_ulysses")
    assert len(run["losses"]) == 8 and len(run["norms"]) == 4
    assert _relative(run["losses"], reference["losses"]) < RELATIVE
    assert _relative(run["norms"], reference["norms"]) < RELATIVE
    assert abs(run["eval"] - reference["eval"]) / reference["eval"] < RELATIVE
    _same_parameters(run["params"], reference["params"])


def test_cp_comm_strategy_reaches_torchs_ring(runs: dict) -> None:
    """``cp_handler`` with ``cp_comm_strategy="alltoall"`` sets torch's rotate method; the default is allgather."""
    layouts = runs["layouts"]
    assert layouts["cp2_fsdp2_alltoall"]["rotate_method"] == "ALL_TO_ALL"
    assert layouts["cp2_fsdp2"]["rotate_method"] == layouts["cp2_tp2"]["rotate_method"] == "ALL_GATHER"


@pytest.mark.parametrize("where", ["resumed_cp2_fsdp2", "resumed_sp2_tp2", "single"])
def test_sp_fsdp_checkpoint_resumes_in_another_layout(runs: dict, where: str) -> None:
    """SP2 x FSDP2's sharded checkpoint (after 2 of 4 steps) resumed under CP2 x FSDP2, under SP2 x TP2 and on one
    process: the last 2 steps' losses and gradient norms, and the final parameters, are the uninterrupted run's."""
    resumed = runs["single"]["resumed"] if where == "single" else runs["layouts"][where]
    reference = runs["layouts"]["reference"]
    assert _relative(resumed["losses"], reference["losses"][4:]) < RELATIVE
    assert _relative(resumed["norms"], reference["norms"][2:]) < RELATIVE
    _same_parameters(resumed["params"], reference["params"])


def test_launch_block_and_sp_flag_reach_a_plain_accelerator(runs: dict) -> None:
    """``trainkit launch`` with ``parallelism_config_dp_shard_size: 2`` in the file and ``--parallelism_config_sp_size
    2`` on the command line: ``Accelerator()`` runs SP2 x FSDP2 and trains as one process."""
    run, reference = runs["launched"]["accelerator"], runs["layouts"]["reference"]
    assert run["layout"] == LAYOUT_NAMES["sp2_fsdp2"]
    assert _relative(run["losses"], reference["losses"]) < RELATIVE
    assert _relative(run["norms"], reference["norms"]) < RELATIVE
    _same_parameters(run["params"], reference["params"])


@pytest.mark.parametrize(("name", "layout"), [("trainer", "dp_replicate=1 x dp_shard=2 x sp=2 x tp=1 (SP x FSDP)"),
                                              ("trainer_sp4", "dp_replicate=1 x dp_shard=1 x sp=4 x tp=1 (SP)")])
def test_trainer_with_parallelism_config_trains_as_one_process(runs: dict, name: str, layout: str) -> None:
    """TrainingArguments(parallelism_config=SP2 x FSDP2 / SP4) on right-padded rows of different lengths (labelled
    tokens differ per rank and per micro-batch; the Trainer weights by the items of the whole batch): logged loss,
    gradient norm, final parameters and eval_loss are the one-process Trainer's."""
    run, reference = runs["launched"][name], runs["single"]["trainer"]
    assert run["layout"] == layout and len(run["losses"]) == 4
    assert _relative(run["losses"], reference["losses"]) < RELATIVE
    assert _relative(run["norms"], reference["norms"]) < RELATIVE
    assert abs(run["eval_loss"] - reference["eval_loss"]) / reference["eval_loss"] < RELATIVE
    _same_parameters(run["params"], reference["params"])


def test_torch_ring_attention_does_not_run_on_cpu(runs: dict) -> None:
    """torch's own ``context_parallel`` around SDPA on a CPU mesh fails in DTensor's dispatch (no sharding strategy
    for the CPU flash kernel), and trainkit refuses cp_size > 1 on CPU at Accelerator() with that reason. When a torch
    release runs it, this test fails: then let context parallelism run on CPU."""
    found = runs["layouts"]["ring_on_cpu"]
    assert found["torch"].startswith("NotImplementedError")
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding strategy" in found["torch"]
    assert found["trainkit"].startswith("ConfigError: cp_size > 1 on cpu")
    assert "_scaled_dot_product_flash_attention_for_cpu" in found["trainkit"] and "sp_size" in found["trainkit"]

