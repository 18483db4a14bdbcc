"""One way to write a checkpoint folder, synchronous or in the background, through the storage seam.

``Accelerator.save_state`` and the Trainer's ``checkpoint-N`` both describe *what* to write (a function that
fills the staging folder) and *what follows* (rotation, uploads); this module decides *how*: at once, with
the atomic protocol of the Accelerator's :class:`~.storage.CheckpointIO`, or, with ``async_save``, captured
now and written by the background writer (:mod:`.async_writer`) with the same protocol.
"""

from __future__ import annotations

import contextlib
from typing import Any

from .async_writer import AfterCommit, WriteFiles, background_writer
from .errors import CheckpointError
from .storage import checkpoint_io_of


def save_checkpoint_folder(accelerator: Any, final_dir: str, write_files: WriteFiles, *,
                           metadata: dict[str, Any] | None = None, replace: bool = False,
                           set_aside_damaged: bool = False, after_commit: AfterCommit | None = None,
                           synchronous: bool = False) -> str | None:
    """Collective: write ``final_dir`` atomically; return it (None: skipped while another save is in flight).

    ``synchronous`` writes this one before returning even when ``async_save`` is on (a preemption's last
    checkpoint); a save in flight is always finished first, so checkpoints become visible in order.
    """
    io = checkpoint_io_of(accelerator)
    writer = background_writer(accelerator)
    if writer is not None and not synchronous:
        return writer.save(io, final_dir, write_files, metadata=metadata, replace=replace,
                           set_aside_damaged=set_aside_damaged, after_commit=after_commit)
    existing = background_writer(accelerator, create=False)
    if existing is not None:
        existing.flush()
    staging = io.stage(final_dir, replace=replace, set_aside_damaged=set_aside_damaged)
    try:
        write_files(staging)
    except Exception as error:
        # Tell the other ranks before re-raising, so none of them waits in the commit forever.
        with contextlib.suppress(CheckpointError):
            io.commit(staging, final_dir, error=error)
        raise
    io.commit(staging, final_dir, metadata=metadata)
    if after_commit is not None:
        after_commit(final_dir)
    return final_dir
