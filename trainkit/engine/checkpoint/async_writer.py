"""Asynchronous checkpoints: the training loop stages a copy of the state, a background thread writes it.

``ProjectConfiguration(async_save=True)`` (``TrainingArguments(async_save=True)`` for the Trainer) turns it on.
A save then blocks training only while the state is captured: small JSON files written, every tensor copied
into host buffers reused between saves (:mod:`.staging`). A thread of the same process writes the tensor
files, checksums and commits them with the same atomic protocol as a synchronous save, on a process group of
its own, so its collectives never interleave with the loop's; then it rotates old checkpoints. A full-state
checkpoint of a sharded model is gathered onto rank 0 by the writers too, on that group
(:mod:`.background_gather`). A checkpoint becomes visible only when every rank's part is written and checked,
exactly as before: a kill at any moment leaves the previous checkpoint valid and the new one absent.

At most one save is in flight. A save that finds one still running waits for it (``async_save_when_busy="wait"``,
the default: no requested checkpoint is lost) or is skipped on every rank with a warning (``"skip"``; the writer
thread then also runs at a lower CPU priority, so training keeps its cores). The writer is a thread, not a
process: its heavy parts run without the GIL, and it reads the staged buffers in place (docs/checkpoints.md has
the measurement). A failure of the writer is raised in the training loop at the next ``backward``,
``save_state``, ``load_state`` or ``end_training``, naming the checkpoint and the cause. ``load_state``,
``end_training`` and interpreter exit wait for the save in flight. Where the host cannot hold the staged copy,
that save is written synchronously, with a one-line notice.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from trainkit.config.values import check_async_save_when_busy

from .atomic import _all_gather
from .background_gather import WriterMesh, gather_full
from .errors import CheckpointError
from .staging import DeferredWrites, HostBufferPool, describe, recording, staging_fits
from .state_io import write_tensors_now, write_text_now
from .storage import CheckpointIO

logger = logging.getLogger(__name__)

WRITER_THREAD_NAME = "trainkit-checkpoint-writer"

WriteFiles = Callable[[str], None]
"""Writes a checkpoint's files into the staging folder it is given (every rank calls it)."""
AfterCommit = Callable[[str], None]
"""Runs on every rank once the checkpoint is visible (rotation, uploads); it is given the final folder."""


class BackgroundCheckpointWriter:
    """One process's background checkpoint writer: at most one save in flight, its error kept for the loop."""

    def __init__(self, when_busy: str = "wait") -> None:
        self.when_busy = check_async_save_when_busy(when_busy, where="the background checkpoint writer")
        self.pool = HostBufferPool()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._group: Any = None
        self._group_ready = False
        self._mesh: WriterMesh | None = None
        self.last_blocked_s: float | None = None
        """Seconds the last save kept its caller (the training loop) waiting."""
        self.last_durable_s: float | None = None
        """Seconds from the start of the last save until its checkpoint was committed (durable and visible)."""
        self.skipped = 0
        """Saves skipped because one was in flight (``when_busy="skip"``)."""
        self.blocked_s_total = 0.0
        """Seconds all saves of this writer kept the loop waiting (staging, and waits for a save in flight)."""
        self.written = 0
        """Saves this writer committed (in the background or, where staging did not fit, synchronously)."""
        _flush_at_exit.add(self)

    # -- state of the save in flight ------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """True while a background write runs."""
        return self._thread is not None and self._thread.is_alive()

    def raise_pending_error(self) -> None:
        """Raise the error of a background write that has failed (once), without waiting for one in flight."""
        if self._error is not None and not self.busy:
            error, self._error = self._error, None
            raise error

    def flush(self) -> None:
        """Wait for the save in flight (if any) and raise its error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.raise_pending_error()

    # -- saving -----------------------------------------------------------------------------------------
    def save(self, io: CheckpointIO, final_dir: str, write_files: WriteFiles, *, metadata: dict[str, Any] | None,
             replace: bool = False, set_aside_damaged: bool = False, after_commit: AfterCommit | None = None) -> str | None:
        """Collective: capture the checkpoint and start writing it in the background; return its final folder
        (visible once written), or None when skipped because another save is in flight (``when_busy="skip"``)."""
        started = time.perf_counter()
        self.raise_pending_error()
        if self.when_busy == "skip" and any(_all_gather(self.busy)):  # every rank skips, or none does
            self.skipped += 1
            if _rank() == 0:
                logger.warning("Checkpoint %s skipped: the previous one is still being written "
                               "(async_save_when_busy='skip').", final_dir)
            self._blocked_since(started)
            return None
        self.flush()
        group = self._writer_group()
        staging = io.stage(final_dir, replace=replace, set_aside_damaged=set_aside_damaged)
        recorder = DeferredWrites(staging)
        try:
            with recording(recorder):
                write_files(staging)
            fits, figures = staging_fits(self.pool.missing_bytes(recorder.writes, staging))
            if fits:
                self.pool.stage(recorder.writes, staging)
        except Exception as error:
            # The other ranks' writers meet this one in the commit on the writer group: all abandon it.
            with contextlib.suppress(CheckpointError):
                io.commit(staging, final_dir, error=error, group=group)
            raise

        def write() -> None:
            self._write(io, recorder, staging, final_dir, metadata, after_commit, group, started)

        if not fits:
            logger.warning("Checkpoint %s is written synchronously: %s.", final_dir, figures)
            write()
            self.raise_pending_error()
            self._blocked_since(started)
            return final_dir
        self._thread = threading.Thread(target=write, name=WRITER_THREAD_NAME, daemon=False)
        self._thread.start()
        self._blocked_since(started)
        return final_dir

    def _blocked_since(self, started: float) -> None:
        self.last_blocked_s = time.perf_counter() - started
        self.blocked_s_total += self.last_blocked_s

    def _write(self, io: CheckpointIO, recorder: DeferredWrites, staging: str, final_dir: str,
               metadata: dict[str, Any] | None, after_commit: AfterCommit | None, group: Any, started: float) -> None:
        from .sharded_io import write_sharded_now  # DCP is imported when first needed, as model_state does

        if self.when_busy == "skip" and threading.current_thread().name == WRITER_THREAD_NAME:
            _yield_cores_to_training()  # training first; with "wait" the loop may wait for this thread, so not

        def write_gathered(tensors: dict[str, Any], path: str, write: bool) -> None:
            assert self._mesh is not None  # gathered writes are recorded only where the writer has a group
            full = gather_full(tensors, self._mesh)  # every rank takes part; rank 0 keeps the full tensors
            if write and full:
                write_tensors_now(full, path)

        try:
            # Text files are not fsynced one by one: the commit's checksum pass fsyncs every file before the
            # manifest, as it does the tensor files (one fsync per file instead of two).
            failure = recorder.replay(write_tensors_now, lambda tensors, path: write_sharded_now(tensors, path, group),
                                      lambda text, path: write_text_now(text, path, fsync=False), write_gathered)
            io.commit(staging, final_dir, error=failure, metadata=metadata, group=group)
            self.last_durable_s = time.perf_counter() - started
            self.written += 1
            if after_commit is not None:
                after_commit(final_dir)
        except BaseException as error:  # kept for the training loop, which raises it at its next step or save
            kept = CheckpointError(f"The background write of checkpoint {final_dir} failed: {describe(error)}")
            kept.__cause__ = error
            self._error = kept

    def _writer_group(self) -> Any:
        """A gloo group of every process for the writer's collectives (made once, by every rank together)."""
        if not self._group_ready:
            self._group_ready = True
            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                self._group = dist.new_group(backend="gloo")
                self._mesh = WriterMesh(self._group)
        return self._group


WRITER_NICENESS = 10
"""With ``when_busy="skip"``, how much lower than the training threads' the writer thread's CPU priority is (Linux):
where cores are short, the loop keeps its share and the write takes the cycles left (it becomes durable later, and
more saves find it busy and are skipped). Not with ``"wait"``: the loop may have to wait for the writer, and a
thread that lowered its priority cannot raise it again without privileges."""


def _yield_cores_to_training() -> None:
    """Lower this writer thread's CPU priority (Linux schedules threads alone: ``setpriority`` on the thread id
    changes this thread only; elsewhere it would name a process, so nothing is done)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            thread_id = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, thread_id, os.getpriority(os.PRIO_PROCESS, thread_id) + WRITER_NICENESS)


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class _WritersAtExit:
    """Interpreter exit waits for the writer threads (they are not daemons); a failure left is logged then."""

    def __init__(self) -> None:
        self._writers: weakref.WeakSet[BackgroundCheckpointWriter] = weakref.WeakSet()
        atexit.register(self._flush_all)

    def add(self, writer: BackgroundCheckpointWriter) -> None:
        self._writers.add(writer)

    def _flush_all(self) -> None:
        for writer in list(self._writers):
            try:
                writer.flush()
            except CheckpointError as error:
                logger.error("%s", error)


_flush_at_exit = _WritersAtExit()


def background_writer(accelerator: Any, create: bool = True) -> BackgroundCheckpointWriter | None:
    """The Accelerator's writer when ``async_save`` is on (made on first use), else None; ``create=False``
    returns the existing one only (to flush it)."""
    writer = getattr(accelerator, "_checkpoint_writer", None)
    config = accelerator.project_configuration
    if writer is None and create and getattr(config, "async_save", False):
        writer = BackgroundCheckpointWriter(getattr(config, "async_save_when_busy", "wait"))
        accelerator._checkpoint_writer = writer
    if writer is not None and create and not getattr(config, "async_save", False):
        return None  # turned off since: saves are synchronous (the caller flushes this one first)
    return writer


def flush_background_writes(accelerator: Any) -> None:
    """Wait for the Accelerator's save in flight, if any, and raise its error."""
    writer = background_writer(accelerator, create=False)
    if writer is not None:
        writer.flush()


def raise_background_error(accelerator: Any) -> None:
    """Raise a failed background write's error now (cheap; called at every step)."""
    writer = getattr(accelerator, "_checkpoint_writer", None)
    if writer is not None:
        writer.raise_pending_error()
