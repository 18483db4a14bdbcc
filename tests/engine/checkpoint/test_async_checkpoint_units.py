"""Asynchronous checkpoints in one process (CPU): the storage seam, staging buffers, the background writer's
visibility rule, its errors in the loop, wait/skip, the host-memory fallback, and sync/async interchangeability."""

from __future__ import annotations

import errno
import logging
import os
import sys

import pytest
import torch
from torch import nn

from trainkit import Accelerator
from trainkit.engine.checkpoint import CheckpointError, read_manifest, storage
from trainkit.engine.checkpoint import async_writer, sinks, staging


def _in_writer() -> bool:
    import threading

    return threading.current_thread().name == async_writer.WRITER_THREAD_NAME


def _hold_writer(monkeypatch, gate):
    """The background writer waits at its first tensor file until ``gate`` is set (synchronous saves do not)."""
    real_write = sinks.write_tensors_now
    monkeypatch.setattr(sinks, "write_tensors_now",
                        lambda *a: (gate.wait(30) if _in_writer() else None, real_write(*a)))
from trainkit.utils.dataclasses import ProjectConfiguration


def _setup(project, **project_options):
    """A CPU accelerator with a small model, AdamW (state after one step) and automatic naming."""
    torch.manual_seed(0)
    config = ProjectConfiguration(project_dir=str(project), automatic_checkpoint_naming=True, **project_options)
    accelerator = Accelerator(cpu=True, project_config=config)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    _step(accelerator, model, optimizer)
    return accelerator, model, optimizer


def _step(accelerator, model, optimizer):
    loss = model(torch.randn(3, 4)).pow(2).mean()
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()


def _checksums(folder) -> dict[str, str]:
    return {name: entry["sha256"] for name, entry in read_manifest(str(folder))["files"].items()}


def test_the_default_storage_is_the_atomic_posix_protocol(tmp_path):
    accelerator, _, _ = _setup(tmp_path / "run")
    io = accelerator.checkpointer.storage_for(str(tmp_path))
    assert isinstance(io, storage.SharedFolderStorage) and isinstance(io, storage.CheckpointStorage)
    folder = accelerator.save_state()
    parent = os.path.dirname(folder)
    assert [entry.path for entry in io.list(parent, "checkpoint_")] == [folder]
    assert io.latest(parent, "checkpoint_") == folder
    assert io.read(folder)["metadata"] == {"kind": "accelerator_state"}


def test_a_storage_backend_set_on_the_accelerator_is_used_for_every_step(tmp_path):
    calls = []

    class Recording(storage.AtomicPosixIO):
        def stage(self, final_dir, **kwargs):
            calls.append("stage")
            return super().stage(final_dir, **kwargs)

        def commit(self, staging_dir, final_dir, **kwargs):
            calls.append("commit")
            return super().commit(staging_dir, final_dir, **kwargs)

        def read(self, folder, **kwargs):
            calls.append("read")
            return super().read(folder, **kwargs)

    for async_save in (False, True):
        calls.clear()
        accelerator, _, _ = _setup(tmp_path / f"run{async_save}", async_save=async_save)
        accelerator.checkpoint_storage = Recording()
        folder = accelerator.save_state()
        accelerator.load_state(folder)
        assert calls == ["stage", "commit", "read"]


def test_an_async_save_appears_only_when_committed_and_matches_a_synchronous_one(tmp_path, monkeypatch):
    synchronous, model_a, _ = _setup(tmp_path / "sync")
    asynchronous, model_b, _ = _setup(tmp_path / "async", async_save=True)
    # Hold the writer until the loop has moved on: the checkpoint must hold the state as of save_state().
    gate = __import__("threading").Event()
    _hold_writer(monkeypatch, gate)
    sync_folder = synchronous.save_state()
    async_folder = asynchronous.save_state()
    assert not os.path.exists(async_folder)  # staged, not yet visible
    assert os.path.isdir(os.path.join(os.path.dirname(async_folder), ".checkpoint_0.staging"))
    with torch.no_grad():
        for parameter in model_b.parameters():
            parameter.add_(1.0)  # training goes on: the staged copy is unaffected
    gate.set()
    asynchronous.end_training()  # flushes
    assert _checksums(sync_folder) == _checksums(async_folder)  # byte for byte the same files
    assert asynchronous.checkpointer.writer.last_durable_s is not None
    # Interchangeable: the synchronous checkpoint loads into the async run and vice versa.
    asynchronous.load_state(sync_folder)
    synchronous.load_state(async_folder)
    for a, b in zip(model_a.parameters(), model_b.parameters()):
        assert torch.equal(a, b)


def test_staging_buffers_are_reused_and_their_size_logged_once(tmp_path, caplog):
    accelerator, model, optimizer = _setup(tmp_path / "run", async_save=True)
    with caplog.at_level(logging.INFO, logger="trainkit.engine.checkpoint.staging"):
        accelerator.save_state()
        accelerator.end_training()
        pool = accelerator.checkpointer.writer.pool
        first = {slot: buffer.data_ptr() for slot, buffer in pool._buffers.items()}
        _step(accelerator, model, optimizer)
        accelerator.save_state()
        accelerator.end_training()
    assert first and first == {slot: buffer.data_ptr() for slot, buffer in pool._buffers.items()}
    params = sum(p.numel() for p in model.parameters())
    tensors = len(list(model.parameters()))
    assert pool.nbytes == 3 * params * 4 + tensors * 4  # weights, exp_avg, exp_avg_sq (fp32), one fp32 step each
    assert sum("MiB of host memory" in r.getMessage() for r in caplog.records) == 1


def test_a_failed_background_write_is_raised_in_the_loop_with_path_and_cause(tmp_path, monkeypatch):
    accelerator, model, optimizer = _setup(tmp_path / "run", async_save=True, total_limit=1)
    first = accelerator.save_state()
    accelerator.end_training()

    def disk_full(storage, tensors, path):
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr(sinks, "write_tensors_now", disk_full)
    second = accelerator.save_state()
    accelerator.checkpointer.writer._thread.join()
    with pytest.raises(CheckpointError) as raised:
        _step(accelerator, model, optimizer)  # the next backward
    message = str(raised.value)
    assert second in message and "No space left on device" in message and "OSError" in message
    assert isinstance(raised.value.__cause__, CheckpointError)
    # Nothing half there: the previous checkpoint is intact, the failed one absent, its staging removed.
    assert not os.path.exists(second) and read_manifest(first)
    assert os.listdir(os.path.dirname(first)) == ["checkpoint_0"]
    _step(accelerator, model, optimizer)  # raised once; training may go on (e.g. after freeing space)


def test_a_busy_writer_makes_the_next_save_wait_or_skip(tmp_path, monkeypatch, caplog):
    import threading

    gate = threading.Event()
    _hold_writer(monkeypatch, gate)
    skipping, _, _ = _setup(tmp_path / "skip", async_save=True, async_save_when_busy="skip")
    first = skipping.save_state()
    with caplog.at_level(logging.WARNING):
        assert skipping.save_state() is None
    assert "skipped: the previous one is still being written" in caplog.text
    gate.set()
    skipping.end_training()
    assert skipping.save_state().endswith("checkpoint_1") and os.path.isdir(first)  # the numbering goes on
    skipping.end_training()
    writer = skipping.checkpointer.writer
    assert (writer.written, writer.skipped) == (2, 1) and writer.blocked_s_total > 0

    gate.clear()
    waiting, _, _ = _setup(tmp_path / "wait", async_save=True)
    waiting.save_state()
    threading.Timer(0.3, gate.set).start()
    second = waiting.save_state()  # waits for the first, then stages the second
    assert os.path.isfile(os.path.join(os.path.dirname(second), "checkpoint_0", "manifest.json"))
    waiting.end_training()
    assert os.path.isfile(os.path.join(second, "manifest.json"))


def test_too_little_host_memory_falls_back_to_a_synchronous_save_and_says_so(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(staging, "available_host_memory", lambda: 100)  # bytes: less than the 604 staged
    accelerator, _, _ = _setup(tmp_path / "run", async_save=True)  # nothing can be reserved ahead either
    with caplog.at_level(logging.WARNING, logger="trainkit.engine.checkpoint.async_writer"):
        folder = accelerator.save_state()
    assert os.path.isfile(os.path.join(folder, "manifest.json"))  # written before save_state returned
    assert not accelerator.checkpointer.writer.busy and accelerator.checkpointer.writer.pool.nbytes == 0
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "is written synchronously: staging needs" in lines[0]


def test_async_options_are_checked_early():
    with pytest.raises(ValueError, match=r"async_save_when_busy='later'.*'wait'.*'skip'"):
        ProjectConfiguration(async_save_when_busy="later")
    with pytest.raises(ValueError, match=r"async_save='yes'"):
        ProjectConfiguration(async_save="yes")


def _fsdp_async_round_trip(tmp_path, monkeypatch, cpu: bool):
    """FSDP2 sharded state on one process, saved in the background while the loop changes the weights right
    after ``save_state``; returns the writer's buffer pool after checking that the checkpoint holds the state
    as of the save (DCP shards written from the writer's thread, loaded back)."""
    import threading

    from trainkit import FullyShardedDataParallelPlugin

    config = ProjectConfiguration(project_dir=str(tmp_path / "run"), automatic_checkpoint_naming=True, async_save=True)
    accelerator = Accelerator(cpu=cpu, project_config=config,
                              fsdp_plugin=FullyShardedDataParallelPlugin(state_dict_type="SHARDED_STATE_DICT"))
    model = accelerator.prepare(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)))
    optimizer = accelerator.prepare(torch.optim.AdamW(model.parameters(), lr=0.1))
    for _ in range(2):
        loss = model(torch.randn(8, 64, device=accelerator.device)).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    expected = {k: v.detach().cpu().clone() for k, v in accelerator.get_state_dict(model).items()}
    gate = threading.Event()
    from trainkit.engine.checkpoint import sharded_io

    real_sharded = sharded_io.write_sharded_now
    monkeypatch.setattr(sharded_io, "write_sharded_now",
                        lambda *a: (gate.wait(30) if _in_writer() else None, real_sharded(*a)))
    folder = accelerator.save_state()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(-3.0)  # right after save_state returned, while the writer waits
    gate.set()
    accelerator.end_training()
    assert os.path.isfile(os.path.join(folder, "pytorch_model_fsdp_0", ".metadata"))
    accelerator.load_state(folder)
    loaded = {k: v.detach().cpu() for k, v in accelerator.get_state_dict(model).items()}
    assert loaded.keys() == expected.keys() and all(torch.equal(loaded[k], expected[k]) for k in expected)
    return accelerator.checkpointer.writer.pool


def test_sharded_state_is_staged_as_dtensors_and_written_by_the_writer(tmp_path, monkeypatch):
    """Device: CPU (FSDP2 on one gloo process)."""
    pool = _fsdp_async_round_trip(tmp_path, monkeypatch, cpu=True)
    assert pool._buffers and not any(buffer.is_pinned() for buffer in pool._buffers.values())


@pytest.mark.gpu
def test_on_cuda_the_staged_copy_is_pinned_and_holds_the_state_as_of_the_save(tmp_path, monkeypatch):
    """Device: CUDA. The device shards are copied into pinned host buffers (asynchronous copies, synchronised
    before save_state returns) and stay on the host: DCP writes them from there."""
    pool = _fsdp_async_round_trip(tmp_path, monkeypatch, cpu=False)
    # Every device tensor was staged in pinned memory (AdamW's scalar step counters live on the CPU already).
    assert pool._buffers and all(b.is_pinned() for b in pool._buffers.values() if b.numel() > 1)
    assert all(b.device.type == "cpu" for b in pool._buffers.values())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread CPU priority is Linux's")
@pytest.mark.parametrize("when_busy, lowered", [("skip", async_writer.WRITER_NICENESS), ("wait", 0)])
def test_a_skipping_writer_yields_cores_to_training_and_a_waited_for_one_does_not(tmp_path, monkeypatch, when_busy, lowered):
    """CPU, one process: the writer thread's niceness, read inside it while it writes."""
    import threading

    seen = []
    real_write = sinks.write_tensors_now

    def write(*args):
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        real_write(*args)

    monkeypatch.setattr(sinks, "write_tensors_now", write)
    accelerator, _, _ = _setup(tmp_path / when_busy, async_save=True, async_save_when_busy=when_busy)
    accelerator.save_state()
    accelerator.end_training()
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())  # the loop's thread: unchanged
    assert seen and set(seen) == {min(base + lowered, 19)}
