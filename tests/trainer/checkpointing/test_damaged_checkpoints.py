"""A damaged checkpoint never costs the run (CPU, one process): auto-resume takes the newest checkpoint that
verifies, the replayed steps save over the damaged folder (kept aside as ``checkpoint-N.damaged-*``), the final
weights are bitwise the uninterrupted run's, and an explicit or best checkpoint that does not verify is named.

The same under ``trainkit launch --max_restarts`` on 2 gloo ranks: tests/trainer/checkpointing/test_damaged_checkpoints_processes.py.
"""

import logging
import os

import pytest
import torch

from tests.trainer.checkpoint_workload import final_weights, make_trainer
from trainkit.engine.checkpoint import CorruptedCheckpointError, list_checkpoints, verify_checkpoint
from trainkit.engine.checkpoint.atomic import DAMAGED_MARK, atomic_checkpoint
from trainkit.trainer.checkpointing import files as checkpoints

pytestmark = pytest.mark.timeout(180)
STEPS, DAMAGED_STEP = 6, 4  # the damaged checkpoint lies before max_steps: the resumed run saves over it


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The final weights of the workload run for STEPS steps without interruption."""
    trainer = make_trainer(str(tmp_path_factory.mktemp("uninterrupted") / "out"), max_steps=STEPS)
    assert trainer.accelerator.device.type == "cpu"  # as the tests' runs (conftest), on a GPU machine too
    assert trainer.train().global_step == STEPS
    return final_weights(trainer)


def truncate(folder: str, name: str = "model.safetensors") -> None:
    with open(os.path.join(folder, name), "r+b") as handle:
        handle.truncate(64)


def flip_a_byte(folder: str, name: str = "model.safetensors") -> None:
    """Same size, wrong checksum: only a full verification notices."""
    path = os.path.join(folder, name)
    with open(path, "r+b") as handle:
        handle.seek(os.path.getsize(path) - 3)
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0xFF]))


def assert_bitwise_equal(expected: dict, actual: dict) -> None:
    assert expected.keys() == actual.keys()
    assert not [key for key in expected if not torch.equal(expected[key], actual[key])]


def damaged_folders(output_dir: str) -> list[str]:
    return sorted(name for name in os.listdir(output_dir) if DAMAGED_MARK in name)


@pytest.mark.parametrize("damage", [truncate, flip_a_byte], ids=["truncated", "checksum"])
def test_resume_skips_the_damaged_newest_checkpoint_and_saves_over_it(uninterrupted, tmp_path, caplog, damage):
    output_dir = str(tmp_path / "out")
    make_trainer(output_dir, max_steps=STEPS, stop_after=DAMAGED_STEP).train()
    damaged = checkpoints.checkpoint_folder(output_dir, DAMAGED_STEP)
    damage(damaged)
    with caplog.at_level(logging.INFO, logger="trainkit"):
        resumed = make_trainer(output_dir, max_steps=STEPS)
        assert resumed.train(resume_from_checkpoint=True).global_step == STEPS
    assert resumed.checkpoint_manager.resumed_from.endswith(f"checkpoint-{DAMAGED_STEP - 1}")
    assert_bitwise_equal(uninterrupted, final_weights(resumed))
    # The damaged folder is kept aside, said once; the new checkpoint-4 verifies; finders ignore the old one.
    aside = damaged_folders(output_dir)
    assert len(aside) == 1 and aside[0].startswith(f"checkpoint-{DAMAGED_STEP}{DAMAGED_MARK}")
    assert caplog.text.count("does not verify (incomplete or corrupted); kept as") == 1
    verify_checkpoint(damaged)
    numbers = [entry.number for entry in list_checkpoints(output_dir, checkpoints.PREFIX)]
    assert numbers == list(range(1, STEPS + 1))
    from transformers.trainer_utils import get_last_checkpoint

    assert get_last_checkpoint(output_dir) == checkpoints.checkpoint_folder(output_dir, STEPS)


def test_a_damaged_checkpoint_is_set_aside_by_every_later_save_and_rotation_ignores_it(tmp_path):
    output_dir = str(tmp_path / "out")
    make_trainer(output_dir, max_steps=3, stop_after=3).train()
    truncate(checkpoints.checkpoint_folder(output_dir, 3))
    resumed = make_trainer(output_dir, max_steps=STEPS, save_total_limit=2)
    resumed.train(resume_from_checkpoint=True)
    names = sorted(os.listdir(output_dir))
    # Rotation kept the newest, the one resumed from and within the limit; it never touched the damaged copy.
    assert [n for n in names if n.startswith("checkpoint-") and DAMAGED_MARK not in n] == ["checkpoint-2", "checkpoint-6"]
    assert len(damaged_folders(output_dir)) == 1


def test_an_explicit_damaged_checkpoint_is_refused_with_the_way_out(tmp_path):
    output_dir = str(tmp_path / "out")
    make_trainer(output_dir, max_steps=2, stop_after=2).train()
    flip_a_byte(checkpoints.checkpoint_folder(output_dir, 2))
    trainer = make_trainer(output_dir, max_steps=STEPS)
    with pytest.raises(CorruptedCheckpointError, match=r"checkpoint-2 is damaged.*resume_from_checkpoint=True"):
        trainer.train(resume_from_checkpoint=checkpoints.checkpoint_folder(output_dir, 2))


def test_a_best_checkpoint_damaged_during_training_is_named_and_the_last_weights_kept(tmp_path, caplog):
    output_dir = str(tmp_path / "out")

    class DamageTheBest(__import__("trainkit").TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3 and state.best_model_checkpoint:
                truncate(state.best_model_checkpoint)

    trainer = make_trainer(output_dir, max_steps=3, load_best_model_at_end=True,
                           compute_metrics=lambda prediction: {"score": 1.0}, metric_for_best_model="score")
    trainer.add_callback(DamageTheBest())
    with caplog.at_level(logging.WARNING, logger="trainkit"):
        assert trainer.train().global_step == 3
    assert "the best checkpoint cannot be loaded, so the model keeps its last weights" in caplog.text


def test_a_sound_checkpoint_of_the_same_name_is_replaced_and_a_foreign_file_refused(tmp_path):
    folder = str(tmp_path / "checkpoint-1")
    for value in (b"first", b"second"):
        with atomic_checkpoint(folder, replace=True, set_aside_damaged=True) as staging:
            with open(os.path.join(staging, "data.bin"), "wb") as handle:
                handle.write(value)
    assert open(os.path.join(folder, "data.bin"), "rb").read() == b"second"
    assert os.listdir(tmp_path) == ["checkpoint-1"]  # a sound one is replaced, nothing set aside
    not_a_folder = str(tmp_path / "checkpoint-2")
    open(not_a_folder, "w").close()
    with pytest.raises(Exception, match="never written into an existing folder"):
        with atomic_checkpoint(not_a_folder, replace=True, set_aside_damaged=True):
            pass


def test_accelerator_automatic_naming_resumes_past_a_damaged_checkpoint_and_saves_over_it(tmp_path):
    """The engine's own convention (project_dir/checkpoints/checkpoint_N), on CPU: load_state() takes the newest
    checkpoint that verifies, and the next save_state() sets the damaged one aside instead of refusing."""
    from torch import nn

    from trainkit import Accelerator
    from trainkit.utils.dataclasses import ProjectConfiguration

    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(
        project_dir=str(tmp_path), automatic_checkpoint_naming=True))
    model = accelerator.prepare(nn.Linear(3, 2))
    for _ in range(2):
        accelerator.save_state()
    flip_a_byte(str(tmp_path / "checkpoints" / "checkpoint_1"))
    assert accelerator.load_state() is None
    assert accelerator.project_configuration.iteration == 1  # checkpoint_0 was loaded
    accelerator.save_state()
    verify_checkpoint(str(tmp_path / "checkpoints" / "checkpoint_1"))
    assert len(damaged_folders(str(tmp_path / "checkpoints"))) == 1
    del model


def test_an_explicit_save_state_folder_damaged_since_is_set_aside_and_foreign_folders_refused(tmp_path):
    """Accelerate's habit save_state("ckpt") every epoch (CPU): a damaged previous save no longer blocks it."""
    from torch import nn

    from trainkit import Accelerator

    accelerator = Accelerator(cpu=True)
    accelerator.prepare(nn.Linear(3, 2))
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    truncate(folder)
    accelerator.save_state(folder)
    verify_checkpoint(folder)
    assert len(damaged_folders(str(tmp_path))) == 1
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not a checkpoint")
    with pytest.raises(Exception, match="not a complete checkpoint that could be replaced"):
        accelerator.save_state(str(foreign))
    assert (foreign / "notes.txt").read_text() == "not a checkpoint"


def test_automatic_resume_hashes_the_chosen_checkpoint_once(tmp_path, monkeypatch):
    """The finder checksums the candidate; loading it then checks sizes only (CPU)."""
    from trainkit.engine.checkpoint.storage import SharedFolderStorage

    output_dir = str(tmp_path / "out")
    make_trainer(output_dir, max_steps=3, stop_after=2, eval_strategy="no").train()
    chosen = checkpoints.checkpoint_folder(output_dir, 2)
    hashed: list[str] = []
    original = SharedFolderStorage.checksum
    monkeypatch.setattr(SharedFolderStorage, "checksum", lambda self, path: (hashed.append(path), original(self, path))[1])
    make_trainer(output_dir, max_steps=3, eval_strategy="no").train(resume_from_checkpoint=True)
    in_chosen = [path for path in hashed if os.path.dirname(path) == chosen]
    assert in_chosen and len(in_chosen) == len(set(in_chosen))  # every file once


def reshard_weights(folder: str) -> None:
    """Replace model.safetensors by one shard per tensor and model.safetensors.index.json, as save_pretrained lays
    out a large model (transformers' Trainer tests rewrite a checkpoint so)."""
    import json

    from safetensors.torch import load_file, save_file

    path = os.path.join(folder, "model.safetensors")
    state = load_file(path)
    os.remove(path)
    names = {key: f"model-{i + 1:05d}-of-{len(state):05d}.safetensors" for i, key in enumerate(sorted(state))}
    for key, name in names.items():
        save_file({key: state[key]}, os.path.join(folder, name))
    with open(os.path.join(folder, "model.safetensors.index.json"), "w", encoding="utf-8") as handle:
        json.dump({"metadata": {}, "weight_map": names}, handle)


def test_a_checkpoint_whose_weights_were_resharded_with_an_index_resumes_exactly(uninterrupted, tmp_path):
    """The manifest lists model.safetensors; the folder now holds shards and their index instead: the rest is
    verified against the manifest, the weights are read from the shards, and the run ends as the uninterrupted one.
    A shard the index names but that is gone is still a damaged checkpoint."""
    output_dir = str(tmp_path / "out")
    make_trainer(output_dir, max_steps=STEPS, stop_after=DAMAGED_STEP).train()
    folder = checkpoints.checkpoint_folder(output_dir, DAMAGED_STEP)
    reshard_weights(folder)
    trainer = make_trainer(output_dir, max_steps=STEPS)
    assert trainer.train(resume_from_checkpoint=folder).global_step == STEPS
    assert_bitwise_equal(uninterrupted, final_weights(trainer))
    os.remove(os.path.join(folder, sorted(n for n in os.listdir(folder) if n.startswith("model-0"))[0]))
    with pytest.raises(CorruptedCheckpointError, match="model.safetensors is missing"):
        make_trainer(str(tmp_path / "again"), max_steps=STEPS).train(resume_from_checkpoint=folder)
