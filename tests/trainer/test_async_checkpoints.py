"""The Trainer with ``async_save=True`` on one process (CPU): the same checkpoint-N folders as synchronous saves,
byte for byte; rotation and ``get_last_checkpoint`` see complete checkpoints only; exact resume from them.
The 2-process kill, preemption and disk-full cases are in tests/engine/checkpoint/test_async_checkpoint_processes.py."""

from __future__ import annotations

import os

import pytest
import torch

from tests.trainer.checkpoint_workload import final_weights, make_trainer
from trainkit.engine.checkpoint import read_manifest
from trainkit.trainer import checkpoints

pytestmark = pytest.mark.timeout(240)
STEPS = 16


def _checksums(folder: str) -> dict[str, str]:
    files = read_manifest(folder)["files"]
    # training_args.json records async_save itself, trainer_state.json the measured step times: the others are equal.
    varying = {checkpoints.TRAINING_ARGS_NAME, checkpoints.TRAINER_STATE_NAME}
    return {name: entry["sha256"] for name, entry in files.items() if name not in varying}


def test_async_checkpoints_are_the_synchronous_ones_and_resume_exactly(tmp_path):
    synchronous = make_trainer(str(tmp_path / "sync"), save_total_limit=3)
    synchronous.train()
    asynchronous = make_trainer(str(tmp_path / "async"), save_total_limit=3, async_save=True)
    asynchronous.train()
    assert asynchronous.accelerator.project_configuration.async_save
    expected = final_weights(synchronous)
    assert all(torch.equal(expected[k], v) for k, v in final_weights(asynchronous).items())
    # Rotation ran after each commit; train() returned with the last checkpoint durable; no staging left.
    names = sorted(os.listdir(tmp_path / "async"))
    assert [n for n in names if n.startswith("checkpoint-")] == ["checkpoint-14", "checkpoint-15", "checkpoint-16"]
    assert not [n for n in names if n.startswith(".")]
    for step in (14, 15, 16):
        assert _checksums(checkpoints.checkpoint_folder(str(tmp_path / "sync"), step)) == \
            _checksums(checkpoints.checkpoint_folder(str(tmp_path / "async"), step))

    # An interrupted async run resumes (synchronously saving, to show they mix) to the same weights.
    interrupted = make_trainer(str(tmp_path / "mixed"), stop_after=8, async_save=True)
    interrupted.train()
    assert checkpoints.latest_checkpoint(str(tmp_path / "mixed")).endswith("checkpoint-8")
    resumed = make_trainer(str(tmp_path / "mixed"))
    assert resumed.train(resume_from_checkpoint=True).global_step == STEPS
    assert all(torch.equal(expected[k], v) for k, v in final_weights(resumed).items())


def test_last_checkpoint_and_rotation_ignore_a_checkpoint_still_being_written(tmp_path, monkeypatch):
    import threading

    from trainkit.engine.checkpoint import async_writer, state_io, storage

    gate = threading.Event()
    real_write = state_io.write_tensors_now
    monkeypatch.setattr(async_writer, "write_tensors_now", lambda *a: (gate.wait(60), real_write(*a)))
    output_dir = str(tmp_path / "out")
    trainer = make_trainer(output_dir, max_steps=2, save_total_limit=1, eval_strategy="no", async_save=True)
    threading.Timer(1.0, gate.set).start()
    trainer.train()  # the first save waits for the gate; the second waits for the first; train() flushes
    assert sorted(n for n in os.listdir(output_dir) if n.startswith("checkpoint")) == ["checkpoint-2"]

    gate.clear()
    trainer.args.max_steps = 3
    writer = trainer.accelerator._checkpoint_writer
    writer.save(storage.DEFAULT_CHECKPOINT_IO, os.path.join(output_dir, "checkpoint-3"),
                lambda staging: state_io.save_tensors({"w": torch.ones(2)}, os.path.join(staging, "w.safetensors")),
                metadata={})
    assert writer.busy
    assert checkpoints.latest_checkpoint(output_dir).endswith("checkpoint-2")  # the one in flight is invisible
    assert checkpoints.sorted_checkpoints(output_dir) == [os.path.join(output_dir, "checkpoint-2")]
    gate.set()
    writer.flush()
    assert checkpoints.latest_checkpoint(output_dir).endswith("checkpoint-3")
