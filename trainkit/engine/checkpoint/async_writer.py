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

from trainkit.config.checkpointing import ASYNC_SAVE_WHEN_BUSY

from .background_gather import WriterMesh, gather_full
from .errors import CheckpointError
from .sinks import FileSink, WriteNow
from .staging import DeferredWrites, HostBufferPool, staging_fits
from .storage.base import CheckpointStorage
from .storage.ranks import Ranks, describe

logger = logging.getLogger(__name__)

WRITER_THREAD_NAME = "trainkit-checkpoint-writer"

Capture = Callable[[FileSink, str], None]
"""Fills a checkpoint: called with the sink to write through and the staging location (every rank calls it)."""
AfterCommit = Callable[[str], None]
"""Runs once the checkpoint is visible (rotation, uploads), on the process that wrote its shared files (rank 0; each
node's first with each node's own folder); it is given the final folder."""


class BackgroundCheckpointWriter:
    """One process's background checkpoint writer: at most one save in flight, its error kept for the loop.

    Made by the Accelerator's :class:`~.checkpointer.Checkpointer` when ``async_save`` is on; the loop reaches it
    through that object (``raise_pending_error`` at every ``backward``), never through ambient state."""

    def __init__(self, when_busy: str = ASYNC_SAVE_WHEN_BUSY.default) -> None:
        self.when_busy = when_busy
        """``async_save_when_busy`` as ``ProjectConfiguration`` parsed it (``trainkit.config.checkpointing``)."""
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

    def writer_ranks(self, ranks: Ranks) -> Ranks:
        """``ranks`` on the writer's own process group (the same processes, so the same ranks)."""
        if ranks.solo:
            return ranks  # the main process alone: no collective, no group (the others are not here to make one)
        group = self.prepare_group()
        return ranks if group is None else Ranks(ranks.members, ranks.me, group)

    def prepare_group(self) -> Any:
        """Collective, once: a gloo group of every process for the writer's collectives (and a device mesh over it
        for the gathers), made ahead of the first save when the objects are prepared."""
        if not self._group_ready:
            self._group_ready = True
            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                self._group = dist.new_group(backend="gloo")
                self._mesh = WriterMesh(self._group)
        return self._group

    # -- saving -----------------------------------------------------------------------------------------
    def save(self, storage: CheckpointStorage, ranks: Ranks, final_dir: str, capture: Capture, *,
             metadata: dict[str, Any] | None, replace: bool = False, set_aside_damaged: bool = False,
             after_commit: AfterCommit | None = None, dcp_group: Any = None, writes_shared: bool = True) -> str | None:
        """Collective (on ``ranks``): capture the checkpoint and start writing it in the background; return its
        final folder (visible once written), or None when skipped because another save is in flight
        (``when_busy="skip"``). ``dcp_group``: the writer-side group of sharded writes (None: the writer's own)."""
        started = time.perf_counter()
        self.raise_pending_error()
        if self.when_busy == "skip" and any(ranks.gather_all(self.busy)):  # every rank skips, or none does
            self.skipped += 1
            if ranks.is_leader and ranks.leader == 0:
                logger.warning("Checkpoint %s skipped: the previous one is still being written "
                               "(async_save_when_busy='skip').", final_dir)
            self._blocked_since(started)
            return None
        self.flush()
        background = self.writer_ranks(ranks)
        staging = storage.stage(final_dir, replace=replace, set_aside_damaged=set_aside_damaged, ranks=ranks)
        recorder = DeferredWrites(storage, staging, gathers=self._mesh is not None and not ranks.solo)
        try:
            capture(recorder, staging)
            fits, figures = staging_fits(self.pool.missing_bytes(recorder.writes, staging))
            if fits:
                self.pool.stage(recorder.writes, staging)
        except Exception as error:
            # The other ranks' writers meet this one in the commit on the writer group: all abandon it.
            with contextlib.suppress(CheckpointError):
                storage.commit(staging, final_dir, error=error, ranks=background)
            raise
        sink = WriteNow(storage, background.group if dcp_group is None else dcp_group, durable=False)

        def write() -> None:
            self._write(storage, recorder, sink, final_dir, metadata, after_commit, background, writes_shared, started)

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

    def _write(self, storage: CheckpointStorage, recorder: DeferredWrites, sink: WriteNow, final_dir: str,
               metadata: dict[str, Any] | None, after_commit: AfterCommit | None, ranks: Ranks, writes_shared: bool,
               started: float) -> None:
        if self.when_busy == "skip" and threading.current_thread().name == WRITER_THREAD_NAME:
            _yield_cores_to_training()  # training first; with "wait" the loop may wait for this thread, so not

        def write_gathered(tensors: dict[str, Any], path: str, write: bool) -> None:
            assert self._mesh is not None  # gathered writes are recorded only where the writer has a group
            full = gather_full(tensors, self._mesh, keep=writes_shared)  # every rank takes part
            if write and full:
                sink.tensors(full, path)

        try:
            # Small files are not fsynced one by one: the commit's checksum pass fsyncs every file before the
            # manifest, as it does the tensor files (one fsync per file instead of two).
            failure = recorder.replay(sink, write_gathered)
            storage.commit(recorder.root, final_dir, error=failure, metadata=metadata, ranks=ranks)
            self.last_durable_s = time.perf_counter() - started
            self.written += 1
            if after_commit is not None and writes_shared:
                after_commit(final_dir)
        except BaseException as error:  # kept for the training loop, which raises it at its next step or save
            kept = CheckpointError(f"The background write of checkpoint {final_dir} failed: {describe(error)}")
            kept.__cause__ = error
            self._error = kept


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
