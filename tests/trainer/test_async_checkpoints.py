"""The Trainer with ``async_save=True`` on one process (CPU): the same checkpoint-N folders as synchronous saves,
byte for byte; rotation and ``get_last_checkpoint`` see complete checkpoints only; exact resume from them.
The 2-process kill, preemption and disk-full cases are in tests/engine/checkpoint/test_async_checkpoint_processes.py."""

from __future__ import annotations

import os

import pytest
import torch

from tests.trainer.checkpoint_workload import final_weights, make_trainer
from trainkit.engine.checkpoint import read_manifest
from trainkit.trainer.checkpointing import files as checkpoints

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

    from trainkit.engine.checkpoint import async_writer, sinks

    gate = threading.Event()
    real_write = sinks.write_tensors_now
    in_writer = lambda: threading.current_thread().name == async_writer.WRITER_THREAD_NAME  # noqa: E731
    monkeypatch.setattr(sinks, "write_tensors_now",
                        lambda *a: (gate.wait(60) if in_writer() else None, real_write(*a)))
    output_dir = str(tmp_path / "out")
    trainer = make_trainer(output_dir, max_steps=2, save_total_limit=1, eval_strategy="no", async_save=True)
    threading.Timer(1.0, gate.set).start()
    trainer.train()  # the first save waits for the gate; the second waits for the first; train() flushes
    assert sorted(n for n in os.listdir(output_dir) if n.startswith("checkpoint")) == ["checkpoint-2"]

    gate.clear()
    trainer.args.max_steps = 3
    checkpointer = trainer.accelerator.checkpointer
    checkpointer.save(os.path.join(output_dir, "checkpoint-3"),
                      lambda staged: staged.sink.tensors({"w": torch.ones(2)}, staged.file("w.safetensors")))
    writer = checkpointer.writer
    assert writer is not None and writer.busy
    assert checkpoints.latest_checkpoint(output_dir).endswith("checkpoint-2")  # the one in flight is invisible
    assert checkpoints.sorted_checkpoints(output_dir) == [os.path.join(output_dir, "checkpoint-2")]
    gate.set()
    writer.flush()
    assert checkpoints.latest_checkpoint(output_dir).endswith("checkpoint-3")


def test_sigterm_during_a_background_save_finishes_it_saves_again_and_the_rerun_resumes(tmp_path, monkeypatch):
    """One process (CPU): SIGTERM arrives while checkpoint-3 is written in the background. The Trainer finishes
    that write, writes its preemption checkpoint synchronously, raises Preempted (exit code 75); the same
    command resumes and ends bitwise where an uninterrupted run ends."""
    import signal
    import time

    from trainkit.engine.checkpoint import sinks
    from trainkit.engine.process.preemption import PREEMPTED_EXIT_CODE, Preempted

    reference = make_trainer(str(tmp_path / "reference"), save_strategy="no", eval_strategy="no")
    reference.train()
    real_write, sent = sinks.write_tensors_now, []

    def write_then_signal(storage, tensors, path):
        if ".checkpoint-3.staging" in path and not sent:
            sent.append(path)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.3)  # the loop reaches its step boundary while this write is still going on
        real_write(storage, tensors, path)

    monkeypatch.setattr(sinks, "write_tensors_now", write_then_signal)
    output_dir = str(tmp_path / "out")
    with pytest.raises(Preempted) as stopped:
        make_trainer(output_dir, eval_strategy="no", async_save=True).train()
    assert stopped.value.code == PREEMPTED_EXIT_CODE and sent
    kept = checkpoints.sorted_checkpoints(output_dir)
    assert kept and kept[0].endswith("checkpoint-1")
    assert all(read_manifest(folder) for folder in kept)  # every visible checkpoint is complete
    assert checkpoints.latest_checkpoint(output_dir) in (checkpoints.checkpoint_folder(output_dir, 3),
                                                         checkpoints.checkpoint_folder(output_dir, 4))
    assert not [n for n in os.listdir(output_dir) if n.startswith(".")]

    monkeypatch.undo()
    resumed = make_trainer(output_dir, eval_strategy="no", async_save=True)
    assert resumed.train().global_step == STEPS  # resumes by itself after a preemption
    expected = final_weights(reference)
    assert all(torch.equal(expected[k], v) for k, v in final_weights(resumed).items())


def test_async_save_when_busy_skip_skips_the_saves_that_find_a_write_in_flight(tmp_path, monkeypatch, caplog):
    """``TrainingArguments(async_save_when_busy="skip")``: while checkpoint-1 is held in its background write,
    the saves of steps 2 and 3 are skipped with a warning each; once it is committed, step 4's save is written."""
    import logging
    import threading

    from trainkit import TrainerCallback
    from trainkit.engine.checkpoint import async_writer, sinks

    gate = threading.Event()
    real_write = sinks.write_tensors_now
    in_writer = lambda: threading.current_thread().name == async_writer.WRITER_THREAD_NAME  # noqa: E731
    monkeypatch.setattr(sinks, "write_tensors_now",
                        lambda *a: (gate.wait(60) if in_writer() else None, real_write(*a)))

    class ReleaseBeforeStep4(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 3:
                gate.set()
                trainer.accelerator.checkpointer.writer.flush()  # checkpoint-1 is committed before step 4 saves

    output_dir = str(tmp_path / "out")
    trainer = make_trainer(output_dir, max_steps=4, eval_strategy="no", async_save=True, async_save_when_busy="skip")
    trainer.add_callback(ReleaseBeforeStep4())
    assert trainer.accelerator.project_configuration.async_save_when_busy == "skip"
    with caplog.at_level(logging.WARNING, logger="trainkit.engine.checkpoint.async_writer"):
        trainer.train()
    assert sorted(n for n in os.listdir(output_dir) if n.startswith("checkpoint")) == ["checkpoint-1", "checkpoint-4"]
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skipped) == 2 and "checkpoint-2" in skipped[0] and "checkpoint-3" in skipped[1]
    writer = trainer.accelerator.checkpointer.writer
    assert (writer.written, writer.skipped) == (2, 2)
