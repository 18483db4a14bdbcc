"""``Trainer.save_model`` writes what ``save_pretrained`` writes for a transformers model, under every strategy.

A tiny ViT classifier is the witness: transformers 5 keeps its weights under internal names
(``vit.layers.0.attention.k_proj.weight``) and ``save_pretrained`` converts them back to the checkpoint layout
(``vit.encoder.layer.0.attention.attention.key.weight``) that older releases and other tools read. The Trainer's
folder must hold the same files (plus ``training_args.json``), the same tensors (names, shapes, values) and the
same config, on one CPU process, under DDP and under FSDP2 (2 processes, gloo: the full weights gathered, then
written once). A model that is not a transformers model keeps its own state-dict names, as safetensors.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.distributed import run_torchrun
from tests.trainer.helpers import EchoModel
from tests.trainer.save_pretrained_worker import tiny_vit
from trainkit import Trainer, TrainingArguments

WORKER = Path(__file__).with_name("save_pretrained_worker.py")
TRAINER_ONLY_FILES = {"training_args.json"}  # transformers' Trainer writes training_args.bin (a pickle) there


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    found: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        found.update(load_file(path))
    return found


def assert_same_as_save_pretrained(saved: Path, reference: Path) -> None:
    reference_files = {p.name for p in reference.iterdir()}
    assert {p.name for p in saved.iterdir()} == reference_files | TRAINER_ONLY_FILES
    ours, theirs = tensors(saved), tensors(reference)
    assert sorted(ours) == sorted(theirs)
    assert any(".encoder.layer.0.attention.attention.key." in key for key in ours)  # the checkpoint layout
    for key in theirs:
        assert ours[key].shape == theirs[key].shape and torch.equal(ours[key], theirs[key]), key
    assert json.loads((saved / "config.json").read_text()) == json.loads((reference / "config.json").read_text())


def test_save_model_writes_what_save_pretrained_writes(tmp_path):
    """CPU, one process."""
    model = tiny_vit()
    assert any(".layers.0.attention.k_proj" in key for key in model.state_dict()) or \
        any(".encoder.layer.0." in key for key in model.state_dict())  # internal names (5.x) or the old ones (5.1)
    model.save_pretrained(tmp_path / "reference")
    trainer = Trainer(model=model, args=TrainingArguments(str(tmp_path / "run"), report_to="none", use_cpu=True))
    trainer.save_model(str(tmp_path / "trainer"))
    assert_same_as_save_pretrained(tmp_path / "trainer", tmp_path / "reference")


def test_other_models_keep_their_state_dict_names(tmp_path):
    """CPU, one process: a plain module's weights as safetensors under its own names, no config."""
    model = EchoModel()
    Trainer(model=model, args=TrainingArguments(str(tmp_path / "run"), report_to="none", use_cpu=True)).save_model(
        str(tmp_path / "out"))
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"model.safetensors", "training_args.json"}
    saved = load_file(tmp_path / "out" / "model.safetensors")
    assert saved.keys() == model.state_dict().keys() and torch.equal(saved["offset"], model.offset.detach())


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_save_model_on_two_processes_writes_what_save_pretrained_writes(tmp_path, kind):
    """CPU, gloo, 2 processes: DDP, and FSDP2 with the parameters really sharded (DTensors)."""
    run_torchrun(WORKER, kind, str(tmp_path), nproc=2, timeout=500)
    assert (tmp_path / "sharded.txt").read_text() == str(kind == "fsdp")
    assert_same_as_save_pretrained(tmp_path / "trainer", tmp_path / "reference")
