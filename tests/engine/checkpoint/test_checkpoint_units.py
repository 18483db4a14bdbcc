"""Checkpoint building blocks in one process: pickle-free state, RNG, atomic folders, verification, clear errors."""

from __future__ import annotations

import logging
import math
import os
import pickle
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from trainkit import Accelerator
from trainkit.engine.checkpoint import (
    CheckpointError,
    CheckpointMismatchError,
    CorruptedCheckpointError,
    IncompleteCheckpointError,
    atomic_checkpoint,
    is_complete,
    latest_complete_checkpoint,
    list_checkpoints,
    rotate_checkpoints,
)
from trainkit.engine.checkpoint import sharded_io, state_io
from trainkit.engine.checkpoint.sinks import WriteNow
from trainkit.engine.checkpoint.storage import SharedFolderStorage
from trainkit.engine.checkpoint.rng import capture_rng_state, restore_rng_state
from trainkit.utils.dataclasses import ProjectConfiguration

PACKAGE = Path(__file__).resolve().parents[3] / "trainkit" / "engine" / "checkpoint"
DISK = SharedFolderStorage()


# -- pickle-free state ------------------------------------------------------------------------------
def test_state_round_trips_through_json_and_safetensors(tmp_path):
    state = {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(2, 3)}},
             "param_groups": [{"betas": (0.9, 0.999), "lr": 0.1, "params": [0], "foreach": None}],
             "odd": [math.inf, -math.inf, np.float32(0.5), np.arange(3), "text", True, {"__tensor__": "not one"}]}
    files = state_io.save_state(WriteNow(DISK), state, str(tmp_path), "thing")
    assert files == ["thing.json", "thing.safetensors"]
    again = state_io.load_state(DISK, str(tmp_path), "thing")
    assert again["param_groups"] == state["param_groups"]  # tuples stay tuples, ints stay ints
    assert torch.equal(again["state"][0]["exp_avg"], state["state"][0]["exp_avg"])
    assert again["odd"][:2] == [math.inf, -math.inf] and again["odd"][2:6] == [0.5, [0, 1, 2], "text", True]
    assert again["odd"][6] == {"__tensor__": "not one"}
    nan = state_io.decode_state(*state_io.encode_state(float("nan")))
    assert math.isnan(nan)


def test_state_that_would_need_pickle_is_refused_with_its_path(tmp_path):
    with pytest.raises(TypeError, match=r"function at '/schedule/0'"):
        state_io.save_state(WriteNow(DISK), {"schedule": [lambda step: step]}, str(tmp_path), "bad")


def test_rng_states_round_trip_as_json():
    state = capture_rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(3))
    restore_rng_state(state_io.decode_state(*state_io.encode_state(state)))
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert expected[:2] == again[:2] and torch.equal(expected[2], again[2])


def test_no_code_path_unpickles():
    """Static guard: no pickle.load and no torch.load without weights_only=True in the checkpoint code."""
    sources = {str(path.relative_to(PACKAGE)): path.read_text() for path in PACKAGE.rglob("*.py")}
    sources["merge_weights.py"] = (PACKAGE.parents[1] / "cli" / "merge_weights.py").read_text()
    for name, text in sources.items():
        assert "pickle.load(" not in text and "pickle.loads(" not in text, name
        for call in re.findall(r"torch\.load\([^)]*\)", text):
            assert "weights_only=True" in call, f"{name}: {call}"


def test_dcp_metadata_with_foreign_globals_is_refused(tmp_path):
    class Exploit:
        def __reduce__(self):
            return (os.system, ("echo pwned > " + str(tmp_path / "pwned"),))

    (tmp_path / ".metadata").write_bytes(pickle.dumps(Exploit()))
    with pytest.raises(CheckpointError, match="Refusing to load posix.system|Refusing to load os.system"):
        sharded_io.read_dcp_metadata(str(tmp_path))
    assert not (tmp_path / "pwned").exists()


# -- atomic folders -------------------------------------------------------------------------------------
def _write(folder: str, name: str, data: bytes = b"0123456789") -> None:
    with open(os.path.join(folder, name), "wb") as handle:
        handle.write(data)


def _make(parent: Path, number: int, prefix: str = "checkpoint_") -> str:
    with atomic_checkpoint(str(parent / f"{prefix}{number}")) as staging:
        _write(staging, "weights.bin")
    return str(parent / f"{prefix}{number}")


def test_commit_writes_a_manifest_last_and_renames_once(tmp_path):
    folder = _make(tmp_path, 1)
    assert sorted(os.listdir(folder)) == ["manifest.json", "weights.bin"]
    manifest = state_io.read_json(DISK, os.path.join(folder, "manifest.json"))
    assert manifest["files"]["weights.bin"]["size"] == 10 and len(manifest["files"]["weights.bin"]["sha256"]) == 64
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".")]
    with pytest.raises(CheckpointError, match="never written into an existing folder"):
        _make(tmp_path, 1)
    # Replacing a complete checkpoint swaps a new folder in; a folder with foreign files is never touched.
    with atomic_checkpoint(folder, replace=True) as staging:
        _write(staging, "new.bin")
    assert sorted(os.listdir(folder)) == ["manifest.json", "new.bin"]
    os.makedirs(tmp_path / "mine")
    _write(str(tmp_path / "mine"), "notes.txt")
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        with atomic_checkpoint(str(tmp_path / "mine"), replace=True):
            pass
    assert os.listdir(tmp_path / "mine") == ["notes.txt"]


def test_a_failed_write_leaves_no_checkpoint(tmp_path):
    with pytest.raises(OSError):
        with atomic_checkpoint(str(tmp_path / "checkpoint_3")) as staging:
            _write(staging, "half")
            raise OSError("disk full")
    assert os.listdir(tmp_path) == []


def test_latest_complete_skips_interrupted_and_damaged_ones_and_says_so(tmp_path, caplog):
    _make(tmp_path, 1)
    _make(tmp_path, 2)
    os.makedirs(tmp_path / ".checkpoint_5.staging")  # a write that was killed
    os.makedirs(tmp_path / "checkpoint_4")  # a folder without a manifest
    truncated = _make(tmp_path, 3)
    with open(os.path.join(truncated, "weights.bin"), "r+b") as handle:
        handle.truncate(4)
    with caplog.at_level(logging.WARNING):
        assert latest_complete_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint_2")
    for skipped in ("checkpoint_3", "checkpoint_4", ".checkpoint_5.staging"):
        assert skipped in caplog.text
    assert [(e.number, e.complete, e.staging) for e in list_checkpoints(str(tmp_path))] == [
        (1, True, False), (2, True, False), (3, False, False), (4, False, False), (5, False, True)]
    # A new write of checkpoint_5 clears the leftover of the killed one.
    _make(tmp_path, 5)
    assert is_complete(str(tmp_path / "checkpoint_5")) and not (tmp_path / ".checkpoint_5.staging").exists()


def test_rotation_never_deletes_the_newest_nor_the_protected(tmp_path):
    folders = [_make(tmp_path, n, prefix="checkpoint-") for n in (10, 20, 30, 40)]
    deleted = rotate_checkpoints(str(tmp_path), keep=1, protected=[folders[1]], prefix="checkpoint-")
    assert deleted == [folders[0], folders[2]]
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-20", "checkpoint-40"]


def test_verification_names_truncated_and_corrupted_files(tmp_path):
    from trainkit.engine.checkpoint import verify_checkpoint

    folder = _make(tmp_path, 1)
    path = os.path.join(folder, "weights.bin")
    _write(folder, "weights.bin", b"0123456780")  # same size, one byte changed
    with pytest.raises(CorruptedCheckpointError, match="weights.bin has the wrong SHA-256"):
        verify_checkpoint(folder)
    _write(folder, "weights.bin", b"01234")
    with pytest.raises(CorruptedCheckpointError, match=r"weights.bin is 5 bytes, the manifest says 10 \(truncated"):
        verify_checkpoint(folder)
    os.remove(path)
    with pytest.raises(CorruptedCheckpointError, match="weights.bin is missing"):
        verify_checkpoint(folder)
    with pytest.raises(IncompleteCheckpointError, match="no manifest.json"):
        verify_checkpoint(str(tmp_path))


# -- the Accelerator's state ------------------------------------------------------------------------------
def _setup(project: Path | None = None, hidden: int = 4, **config):
    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=str(project) if project else None, **config))
    model = nn.Sequential(nn.Linear(3, hidden), nn.ReLU(), nn.Linear(hidden, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def _step(model, optimizer) -> None:
    model(torch.randn(5, 3)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def test_saving_before_any_step_leaves_the_optimizer_untouched(tmp_path):
    accelerator, model, optimizer = _setup()
    accelerator.save_state(tmp_path / "ckpt")
    assert not optimizer.state
    assert state_io.load_state(DISK, str(tmp_path / "ckpt"), "optimizer")["state"] == {}


def test_loading_into_a_different_model_names_the_keys_and_changes_nothing(tmp_path):
    accelerator, model, optimizer = _setup()
    _step(model, optimizer)
    accelerator.save_state(tmp_path / "ckpt")
    other, other_model, other_optimizer = _setup(hidden=5)
    other_model.add_module("extra", nn.Linear(2, 2))
    before = {k: v.clone() for k, v in other_model.state_dict().items()}
    with pytest.raises(CheckpointMismatchError) as caught:
        other.load_state(tmp_path / "ckpt")
    message = str(caught.value)
    assert "missing keys (in the object, not in the checkpoint): extra.bias, extra.weight" in message
    assert "0.weight (checkpoint [4, 3], model [5, 3])" in message and "2.weight (checkpoint [2, 4], model [2, 5])" in message
    assert all(torch.equal(before[k], v) for k, v in other_model.state_dict().items())
    assert not other_optimizer.state


def test_a_corrupted_file_is_reported_and_nothing_is_loaded(tmp_path):
    accelerator, model, optimizer = _setup()
    _step(model, optimizer)
    accelerator.save_state(tmp_path / "ckpt")
    data = bytearray((tmp_path / "ckpt" / "optimizer.safetensors").read_bytes())
    data[-3] ^= 0xFF
    (tmp_path / "ckpt" / "optimizer.safetensors").write_bytes(bytes(data))
    fresh, fresh_model, fresh_optimizer = _setup()
    before = {k: v.clone() for k, v in fresh_model.state_dict().items()}
    with pytest.raises(CorruptedCheckpointError, match="optimizer.safetensors has the wrong SHA-256"):
        fresh.load_state(tmp_path / "ckpt")
    assert all(torch.equal(before[k], v) for k, v in fresh_model.state_dict().items())


def test_sharded_format_on_one_process_round_trips_and_dcp_failures_become_clear_errors(tmp_path):
    accelerator, model, optimizer = _setup()
    _step(model, optimizer)
    accelerator.save_state(tmp_path / "ckpt", sharded=True)
    assert (tmp_path / "ckpt" / "pytorch_model_fsdp_0" / ".metadata").is_file()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    saved_exp_avg = optimizer.state[optimizer.param_groups[0]["params"][0]]["exp_avg"].clone()
    _step(model, optimizer)
    accelerator.load_state(tmp_path / "ckpt")
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    assert torch.equal(optimizer.state[optimizer.param_groups[0]["params"][0]]["exp_avg"], saved_exp_avg)

    # Without the checksum pass, a damaged shard reaches DCP, whose CheckpointException is a BaseException.
    shard = next((tmp_path / "ckpt" / "pytorch_model_fsdp_0").glob("*.distcp"))
    shard.write_bytes(bytes(len(shard.read_bytes())))  # same size, zeroed: only a checksum would notice
    with pytest.raises(CheckpointError, match="torch.distributed.checkpoint could not load"):
        accelerator.load_state(tmp_path / "ckpt", verify_checksums=False)


def test_automatic_naming_rotation_keeps_the_checkpoint_resumed_from(tmp_path):
    accelerator, model, optimizer = _setup(tmp_path, automatic_checkpoint_naming=True, total_limit=2)
    for _ in range(2):
        _step(model, optimizer)
        accelerator.save_state()
    accelerator.load_state(tmp_path / "checkpoints" / "checkpoint_0")
    assert accelerator.project_configuration.iteration == 1
    accelerator.project_configuration.iteration = 2
    for _ in range(2):
        accelerator.save_state()
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["checkpoint_0", "checkpoint_3"]
    assert accelerator.load_state() is None  # the Accelerator's load_state returns nothing, like Accelerate's


def test_engine_state_inside_a_larger_atomic_checkpoint_is_verified_by_the_outer_manifest(tmp_path):
    """The Trainer's way: one atomic checkpoint-N folder holding its own files and the engine's state."""
    from trainkit.engine.checkpoint import write_state_files

    accelerator, model, optimizer = _setup()
    _step(model, optimizer)
    with atomic_checkpoint(str(tmp_path / "checkpoint-10")) as staging:
        os.makedirs(os.path.join(staging, "engine_state"))
        write_state_files(accelerator, os.path.join(staging, "engine_state"))
        _write(staging, "trainer_state.json", b"{}")
    assert latest_complete_checkpoint(str(tmp_path), prefix="checkpoint-") == str(tmp_path / "checkpoint-10")
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    _step(model, optimizer)
    accelerator.load_state(tmp_path / "checkpoint-10" / "engine_state")
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    (tmp_path / "checkpoint-10" / "engine_state" / "scheduler.json").write_text("[]")  # not in the manifest: ignored
    (tmp_path / "checkpoint-10" / "engine_state" / "dataloaders.json").write_text("[]")
    with pytest.raises(CorruptedCheckpointError, match="engine_state/dataloaders.json"):
        accelerator.load_state(tmp_path / "checkpoint-10" / "engine_state")
