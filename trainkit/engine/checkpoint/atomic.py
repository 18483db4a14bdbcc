"""The shared-folder checkpoint protocol as functions, for code that writes its own checkpoint folders.

Each function is the default storage's (:class:`.storage.shared_folder.SharedFolderStorage`) method of the same
job: stage into a hidden folder, confirm on every rank, write a manifest last, rename once (see
docs/checkpoints.md). A process killed at any moment leaves either no new folder or a complete one. Every function
may be called from all ranks of a job (the collective ones say so) or from a single process; the Trainer's
``checkpoint-N`` folders are the same protocol with ``prefix="checkpoint-"``. Checkpoints elsewhere (each node's
own disk, an object store) go through the Accelerator's ``checkpointer``, which picks the backend.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

from .errors import CheckpointError
from .storage.manifest import DAMAGED_MARK, MANIFEST_NAME, CheckpointEntry
from .storage.ranks import Ranks
from .storage.shared_folder import SharedFolderStorage, staging_path

__all__ = ["DAMAGED_MARK", "MANIFEST_NAME", "CheckpointEntry", "atomic_checkpoint", "begin_checkpoint",
           "commit_checkpoint", "covering_manifest", "find_problems", "is_complete", "latest_complete_checkpoint",
           "list_checkpoints", "read_manifest", "rotate_checkpoints", "staging_path", "verify_checkpoint"]

_FOLDER = SharedFolderStorage()


def begin_checkpoint(final_dir: str, replace: bool = False, set_aside_damaged: bool = False) -> str:
    """Collective: create an empty staging folder for ``final_dir`` and return its path (see
    :meth:`.storage.base.CheckpointStorage.stage` for ``replace`` and ``set_aside_damaged``)."""
    return _FOLDER.stage(final_dir, replace=replace, set_aside_damaged=set_aside_damaged)


def commit_checkpoint(staging_dir: str, final_dir: str, *, error: BaseException | str | None = None,
                      metadata: dict[str, Any] | None = None, group: Any = None) -> str:
    """Collective (on ``group``, default: every process): checksum the staged files, write the manifest, rename;
    when any rank passes ``error``, every rank raises :class:`CheckpointError` and nothing becomes visible."""
    return _FOLDER.commit(staging_dir, final_dir, error=error, metadata=metadata, ranks=Ranks.everyone(group))


@contextlib.contextmanager
def atomic_checkpoint(final_dir: str, metadata: dict[str, Any] | None = None, replace: bool = False,
                      set_aside_damaged: bool = False) -> Iterator[str]:
    """Collective: ``with atomic_checkpoint(path) as staging:`` write files into ``staging``; on leaving, the
    checkpoint is committed (or, if any rank raised, abandoned on every rank)."""
    staging = begin_checkpoint(final_dir, replace=replace, set_aside_damaged=set_aside_damaged)
    try:
        yield staging
    except Exception as error:
        with contextlib.suppress(CheckpointError):  # tell the other ranks, so none waits in the commit forever
            commit_checkpoint(staging, final_dir, error=error)
        raise
    commit_checkpoint(staging, final_dir, metadata=metadata)


def read_manifest(folder: str) -> dict[str, Any]:
    """The manifest of a complete checkpoint; :class:`IncompleteCheckpointError` when there is none."""
    return _FOLDER.read_manifest(folder)


def find_problems(folder: str, names: Iterable[str] | None = None, checksums: bool = True) -> list[str]:
    """What is wrong with ``folder``'s files (all, or ``names``) against its manifest; empty when sound."""
    return _FOLDER.find_problems(folder, names, checksums)


def covering_manifest(folder: str) -> tuple[str, str]:
    """``(root, prefix)``: the checkpoint whose manifest covers ``folder``, and ``folder``'s prefix in it."""
    return _FOLDER.covering(folder)


def verify_checkpoint(folder: str, checksums: bool = True) -> dict[str, Any]:
    """Collective: check every file's size (and checksum) against the manifest; returns the manifest."""
    return _FOLDER.read(folder, checksums=checksums)


def is_complete(folder: str) -> bool:
    """True when ``folder`` has a manifest and every listed file exists with its size (no hashing)."""
    return _FOLDER.is_complete(folder)


def list_checkpoints(parent: str, prefix: str = "checkpoint_") -> list[CheckpointEntry]:
    """Folders named ``{prefix}{N}`` (and staging leftovers of them) in ``parent``, by increasing N."""
    return _FOLDER.list(parent, prefix)


def latest_complete_checkpoint(parent: str, prefix: str = "checkpoint_") -> str | None:
    """The complete checkpoint with the highest number in ``parent`` (incomplete newer ones skipped, with a warning)."""
    return _FOLDER.latest(parent, prefix)


def rotate_checkpoints(parent: str, keep: int | None, protected: Iterable[str | None] = (),
                       prefix: str = "checkpoint_") -> list[str]:
    """Delete the oldest complete checkpoints beyond ``keep`` (never the newest nor ``protected``); one process."""
    return _FOLDER.rotate(parent, keep, protected, prefix)
