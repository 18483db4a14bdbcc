"""Checkpoint promises in real processes: exact resume (1 process, DDP 2, FSDP 2), a SIGKILL while writing,
resharding (DDP 2 -> 1, FSDP 2 -> 1 through DCP) and ``trainkit merge-weights``.

Every launch runs ``workers/ckpt_train.py`` (dropout, shuffling, accumulation of 2 with a short last window,
a LambdaLR schedule, fp16 loss scaling on CPU) for 9 optimizer steps, saving after steps 4 and 7. Resumed
runs use a different seed, so anything not restored from the checkpoint would show.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.distributed import ENGINE_WORKERS, run_python, run_torchrun

WORKER = ENGINE_WORKERS / "ckpt_train.py"
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
COMMON = ("--save-at", "4", "7", "--fp16")


def _train(out: Path, name: str, project: Path, *extra: str, nproc: int = 1) -> None:
    args = ("--out", out, "--name", name, "--project", project, *extra)
    if nproc == 1:
        run_python(WORKER, *args, "--per-rank-batch", "8")
    else:
        run_torchrun(WORKER, *args, nproc=nproc)


def _weights(out: Path, name: str) -> dict[str, torch.Tensor]:
    return load_file(str(out / f"{name}.safetensors"))


def _record(out: Path, name: str) -> dict:
    return json.loads((out / f"{name}.json").read_text())


def assert_bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"weights differ in {different}"


def assert_order_continues(reference: dict, resumed: dict, from_step: int) -> None:
    """The resumed run consumed, step by step, exactly the global samples the reference run did."""
    assert resumed["first_step"] == from_step
    assert resumed["order"], "the resumed run trained on nothing"
    for step, indices in resumed["order"].items():
        assert indices == reference["order"][step], f"step {step}: sample order differs"


def test_single_process_resume_is_bitwise_exact(tmp_path):
    project = tmp_path / "run"
    _train(tmp_path, "reference", project, *COMMON)
    _train(tmp_path, "resumed", tmp_path / "other", "--resume", str(project / "checkpoints" / "checkpoint_0"), "--seed", "5",
           "--fp16")
    assert_bitwise_equal(_weights(tmp_path, "reference"), _weights(tmp_path, "resumed"))
    assert_order_continues(_record(tmp_path, "reference"), _record(tmp_path, "resumed"), from_step=4)


def test_ddp_survives_sigkill_while_writing_and_resumes_exactly(tmp_path, caplog):
    _train(tmp_path, "reference", tmp_path / "reference", *COMMON, nproc=2)
    project = tmp_path / "killed"
    # Rank 1 dies in the middle of writing checkpoint_1 (rank 0 has written the model and optimizer files).
    killed = run_torchrun(WORKER, "--out", tmp_path, "--name", "killed", "--project", project, *COMMON,
                          "--kill-rank", "1", "--kill-at-save", "2", nproc=2, check=False)
    assert killed.returncode != 0
    checkpoints = project / "checkpoints"
    assert (checkpoints / "checkpoint_0" / "manifest.json").is_file()
    assert not (checkpoints / "checkpoint_1").exists()
    assert (checkpoints / ".checkpoint_1.staging").is_dir()  # the interrupted write, out of sight

    # A new run resumes automatically from the newest complete checkpoint, says it skipped the other,
    # writes checkpoint_1 again, and ends bitwise where the uninterrupted run ended.
    result = run_torchrun(WORKER, "--out", tmp_path, "--name", "resumed", "--project", project, *COMMON,
                          "--resume", "latest", "--seed", "7", nproc=2)
    assert "Skipping incomplete checkpoints" in result.stderr and ".checkpoint_1.staging" in result.stderr
    assert (checkpoints / "checkpoint_1" / "manifest.json").is_file()
    assert not (checkpoints / ".checkpoint_1.staging").exists()
    assert_bitwise_equal(_weights(tmp_path, "reference"), _weights(tmp_path, "resumed"))
    reference = _record(tmp_path, "reference")
    assert_order_continues(reference, _record(tmp_path, "resumed"), from_step=4)

    # Saved on 2 processes, resumed on 1 with the same global batch: the sample order continues exactly.
    _train(tmp_path, "one", tmp_path / "one", "--resume", str(tmp_path / "reference" / "checkpoints" / "checkpoint_0"),
           "--seed", "9", "--fp16")
    assert_order_continues(reference, _record(tmp_path, "one"), from_step=4)
    saved = load_file(str(tmp_path / "reference" / "checkpoints" / "checkpoint_0" / "model.safetensors"))
    assert_bitwise_equal(saved, load_file(str(tmp_path / "one.loaded.safetensors")))


def test_fsdp_sharded_resume_is_exact_and_reshards_to_one_process(tmp_path):
    fsdp = ("--fsdp", "SHARDED_STATE_DICT")
    _train(tmp_path, "reference", tmp_path / "reference", *COMMON, *fsdp, nproc=2)
    checkpoint = tmp_path / "reference" / "checkpoints" / "checkpoint_0"
    assert (checkpoint / "pytorch_model_fsdp_0" / ".metadata").is_file()
    assert not (checkpoint / "model.safetensors").exists()

    _train(tmp_path, "resumed", tmp_path / "resumed", "--resume", str(checkpoint), "--seed", "3", "--fp16", *fsdp, nproc=2)
    assert_bitwise_equal(_weights(tmp_path, "reference"), _weights(tmp_path, "resumed"))
    reference = _record(tmp_path, "reference")
    assert_order_continues(reference, _record(tmp_path, "resumed"), from_step=4)

    # DCP reshards 2 -> 1: FSDP on one process, and a plain (unsharded) model on one process.
    _train(tmp_path, "fsdp_one", tmp_path / "fsdp_one", "--resume", str(checkpoint), "--seed", "3", "--fp16", *fsdp)
    _train(tmp_path, "plain_one", tmp_path / "plain_one", "--resume", str(checkpoint), "--seed", "3", "--fp16")
    loaded_on_two = load_file(str(tmp_path / "resumed.loaded.safetensors"))
    for name in ("fsdp_one", "plain_one"):
        assert_order_continues(reference, _record(tmp_path, name), from_step=4)
        assert_bitwise_equal(loaded_on_two, load_file(str(tmp_path / f"{name}.loaded.safetensors")))

    # merge-weights: the shards become one safetensors file that load_state_dict accepts.
    from trainkit.cli.main import main as trainkit_main

    assert trainkit_main(["merge-weights", str(checkpoint), str(tmp_path / "merged")]) == 0
    merged = load_file(str(tmp_path / "merged" / "model.safetensors"))
    assert_bitwise_equal(loaded_on_two, merged)
    sys.path.insert(0, str(WORKER.parent))
    from ckpt_train import build_model

    build_model().load_state_dict(merged, strict=True)
