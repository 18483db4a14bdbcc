"""The N-D layouts through the public entry points, and a TP x FSDP checkpoint in other layouts (CPU, gloo).

Three runs of tests/engine/workers/nd_launched.py: ``trainkit launch --config_file`` with an FSDP2 config writing
sharded (DCP) checkpoints and a ``parallelism_config:`` block (TP2 x FSDP2: ``Accelerator()`` loop saving a
checkpoint after 2 of 4 steps, then a ``Trainer`` with ``TrainingArguments(parallelism_config=...)`` under TP2 x
FSDP2, TP2 x DDP2 and HSDP 2x2); one plain process (the references, then the checkpoint resumed on one process);
``trainkit launch --config_file`` with a MULTI_CPU config whose block says TP2 x DDP2 (``Accelerator()`` under it,
then the checkpoint resumed under FSDP4 and DDP, and FSDP4's checkpoint back under TP2 x FSDP2), 4 processes each.
Tiny untied Llama, fp32, accumulation 2, clipping 1.0, AdamW.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from tests.distributed import ENGINE_WORKERS, REPO, run_python, worker_env

pytestmark = pytest.mark.multiprocess  # 4 gloo processes (CPU)

WORKER = ENGINE_WORKERS / "nd_launched.py"
RELATIVE = 1e-5
CONFIG = """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
num_processes: 4
gradient_accumulation_steps: 2
fsdp_config:
  fsdp_version: 2
  fsdp_state_dict_type: SHARDED_STATE_DICT
parallelism_config:
  parallelism_config_dp_shard_size: 2
  parallelism_config_tp_size: 2
"""
TP2_DDP2_CONFIG = """compute_environment: LOCAL_MACHINE
distributed_type: MULTI_CPU
num_processes: 4
parallelism_config:
  parallelism_config_dp_replicate_size: 2
  parallelism_config_tp_size: 2
"""
LAYOUT_NAMES = {"TP2 x FSDP2": "dp_replicate=1 x dp_shard=2 x tp=2 (TP x FSDP)",
                "TP2 x DDP2": "dp_replicate=2 x dp_shard=1 x tp=2 (TP x DDP)",
                "HSDP 2x2": "dp_replicate=2 x dp_shard=2 x tp=1 (HSDP)"}


def _launch(config: Path, *args: str) -> None:
    import subprocess

    launched = subprocess.run([sys.executable, "-m", "trainkit.cli.main", "launch", "--config_file", str(config),
                               str(WORKER), *args], capture_output=True, text=True, timeout=300, env=worker_env(),
                              cwd=REPO)
    assert launched.returncode == 0, launched.stdout[-4000:] + launched.stderr[-6000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    import subprocess

    out = tmp_path_factory.mktemp("nd_entry")
    (out / "config.yaml").write_text(CONFIG)
    (out / "tp2_ddp2.yaml").write_text(TP2_DDP2_CONFIG)
    _launch(out / "config.yaml", "launched", str(out))
    run_python(WORKER, "single", str(out), timeout=300)
    _launch(out / "tp2_ddp2.yaml", "relaunched", str(out))
    merged = subprocess.run([sys.executable, "-m", "trainkit.cli.main", "merge-weights",
                             str(out / "tp2_fsdp2_checkpoint"), str(out / "merged")],
                            capture_output=True, text=True, timeout=300, env=worker_env(), cwd=REPO)
    assert merged.returncode == 0, merged.stderr[-4000:]
    runs = {mode: torch.load(out / f"{mode}.pt", weights_only=False) for mode in ("launched", "single", "relaunched")}
    return {**runs, "out": out}


def _relative(values: list[float], reference: list[float]) -> float:
    assert len(values) == len(reference)
    return max(abs(a - b) / abs(b) for a, b in zip(values, reference))


def _same_parameters(params: dict, reference: dict) -> None:
    assert sorted(params) == sorted(reference)
    for name, expected in reference.items():
        assert (params[name] - expected).norm() / expected.norm() < RELATIVE, name


@pytest.mark.parametrize(("launch", "entry", "layout"), [
    ("launched", "accelerator", "TP2 x FSDP2"), ("relaunched", "accelerator", "TP2 x DDP2"),
    ("launched", "trainer", "TP2 x FSDP2"), ("launched", "trainer_tp2_ddp2", "TP2 x DDP2"),
    ("launched", "trainer_hsdp2x2", "HSDP 2x2")])
def test_launch_config_and_training_arguments_train_as_one_process(runs: dict, launch: str, entry: str,
                                                                   layout: str) -> None:
    """``trainkit launch`` with the YAML block (Accelerator() with no arguments; TP2 x FSDP2 and TP2 x DDP2) and
    TrainingArguments(parallelism_config=) in a launched run (TP2 x FSDP2, TP2 x DDP2, HSDP 2x2): per-step loss and
    gradient norm within 1e-5 relative of one process, same final parameters."""
    run, reference = runs[launch][entry], runs["single"]["trainer" if entry.startswith("trainer") else entry]
    assert run["layout"] == LAYOUT_NAMES[layout]
    assert len(run["norms"]) == 4  # 4 optimizer steps: accumulation of 2 acted (the launcher's, or the arguments')
    assert _relative(run["losses"], reference["losses"]) < RELATIVE
    assert _relative(run["norms"], reference["norms"]) < RELATIVE
    _same_parameters(run["params"], reference["params"])


@pytest.mark.parametrize("where", ["single", "relaunched"])
def test_tp_fsdp_checkpoint_continues_the_run_in_another_layout(runs: dict, where: str) -> None:
    """The TP2 x FSDP2 checkpoint (after 2 of 4 steps) resumed on one process and on FSDP4: the last 2 steps'
    losses and gradient norms are the uninterrupted run's, and so are the final parameters."""
    resumed, uninterrupted = runs[where]["resumed"], runs["single"]["accelerator"]
    assert resumed["layout"] == ("one process" if where == "single" else "dp_replicate=1 x dp_shard=4 x tp=1 (FSDP)")
    assert _relative(resumed["losses"], uninterrupted["losses"][4:]) < RELATIVE
    assert _relative(resumed["norms"], uninterrupted["norms"][2:]) < RELATIVE
    _same_parameters(resumed["params"], uninterrupted["params"])
    _same_parameters(resumed["params"], runs["launched"]["accelerator"]["params"])


def test_checkpoint_is_sharded_and_merges_into_one_safetensors_file(runs: dict) -> None:
    """The TP2 x FSDP2 checkpoint holds DCP shards; ``trainkit merge-weights`` writes one safetensors file with the
    full weights, equal to what one process loaded from the same checkpoint."""
    from safetensors.torch import load_file

    checkpoint = runs["out"] / "tp2_fsdp2_checkpoint"
    assert not (checkpoint / "model.safetensors").exists() and any(checkpoint.rglob("*.distcp"))
    merged = load_file(runs["out"] / "merged" / "model.safetensors")
    loaded = runs["single"]["resumed"]["loaded"]
    assert sorted(merged) == sorted(loaded)
    for name, expected in loaded.items():
        torch.testing.assert_close(merged[name], expected, rtol=0, atol=0)


def test_back_and_forth_between_layouts(runs: dict) -> None:
    """The TP2 x FSDP2 checkpoint resumed under plain DDP continues the run; FSDP4's own sharded checkpoint (after
    3 steps) resumed back under TP2 x FSDP2 continues it too (the last step's losses, norm, final parameters)."""
    uninterrupted = runs["single"]["accelerator"]
    ddp, back = runs["relaunched"]["resumed_ddp"], runs["relaunched"]["back_to_tp"]
    assert ddp["distributed_type"] == "MULTI_CPU" and back["layout"] == "dp_replicate=1 x dp_shard=2 x tp=2 (TP x FSDP)"
    assert _relative(ddp["losses"], uninterrupted["losses"][4:]) < RELATIVE
    assert _relative(ddp["norms"], uninterrupted["norms"][2:]) < RELATIVE
    assert _relative(back["losses"], uninterrupted["losses"][6:]) < RELATIVE
    assert _relative(back["norms"], uninterrupted["norms"][3:]) < RELATIVE
    for run in (ddp, back):
        _same_parameters(run["params"], uninterrupted["params"])
