"""The storage seam of checkpoints: where a checkpoint folder is staged, committed, listed and read.

Everything that writes a checkpoint (``Accelerator.save_state``, the Trainer's ``checkpoint-N``, the
background writer of asynchronous saves) goes through one :class:`CheckpointIO`. The default,
:class:`AtomicPosixIO`, is the atomic POSIX protocol of :mod:`.atomic` (hidden staging folder, checksummed
manifest written last, one rename). Another backend (an object store) implements the same six methods
and is set on the Accelerator (``accelerator.checkpoint_io = MyIO()``); nothing else changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from . import atomic
from .atomic import CheckpointEntry

# Aliases: inside the classes below, ``list`` names the method.
Entries = list[CheckpointEntry]
Paths = list[str]


@runtime_checkable
class CheckpointIO(Protocol):
    """What the checkpoint writers and finders need from a storage backend.

    ``stage`` and ``commit`` are collective (every rank calls them; ``commit`` on ``group`` when given, so a
    background writer can use its own process group); the others may be called on one process.
    """

    def stage(self, final_dir: str, *, replace: bool = False, set_aside_damaged: bool = False) -> str:
        """Prepare an empty place for the files of ``final_dir`` and return its path (nothing visible yet)."""
        ...

    def commit(self, staging_dir: str, final_dir: str, *, error: BaseException | str | None = None,
               metadata: dict[str, Any] | None = None, group: Any = None) -> str:
        """Make the staged files visible as ``final_dir`` once every rank's part is written and checked
        (or, when any rank passes ``error``, abandon them and raise on every rank)."""
        ...

    def list(self, parent: str, prefix: str) -> Entries:
        """The checkpoints named ``{prefix}{N}`` under ``parent`` (and leftovers of interrupted writes), by N."""
        ...

    def latest(self, parent: str, prefix: str) -> str | None:
        """The newest complete checkpoint under ``parent``, or None."""
        ...

    def read(self, folder: str, *, checksums: bool = True) -> dict[str, Any]:
        """Collective: verify ``folder`` against its manifest and return the manifest (raises when damaged)."""
        ...

    def rotate(self, parent: str, keep: int | None, protected: Iterable[str | None] = (),
               prefix: str = "checkpoint_") -> Paths:
        """Delete the oldest complete checkpoints beyond ``keep`` (never the newest nor ``protected``)."""
        ...


class AtomicPosixIO:
    """The default backend: a local or shared POSIX filesystem, committed by one atomic rename (see :mod:`.atomic`)."""

    def stage(self, final_dir: str, *, replace: bool = False, set_aside_damaged: bool = False) -> str:
        """See :func:`.atomic.begin_checkpoint`."""
        return atomic.begin_checkpoint(final_dir, replace=replace, set_aside_damaged=set_aside_damaged)

    def commit(self, staging_dir: str, final_dir: str, *, error: BaseException | str | None = None,
               metadata: dict[str, Any] | None = None, group: Any = None) -> str:
        """See :func:`.atomic.commit_checkpoint`."""
        return atomic.commit_checkpoint(staging_dir, final_dir, error=error, metadata=metadata, group=group)

    def list(self, parent: str, prefix: str) -> Entries:
        """See :func:`.atomic.list_checkpoints`."""
        return atomic.list_checkpoints(parent, prefix)

    def latest(self, parent: str, prefix: str) -> str | None:
        """See :func:`.atomic.latest_complete_checkpoint`."""
        return atomic.latest_complete_checkpoint(parent, prefix)

    def read(self, folder: str, *, checksums: bool = True) -> dict[str, Any]:
        """See :func:`.atomic.verify_checkpoint`."""
        return atomic.verify_checkpoint(folder, checksums=checksums)

    def rotate(self, parent: str, keep: int | None, protected: Iterable[str | None] = (),
               prefix: str = "checkpoint_") -> Paths:
        """See :func:`.atomic.rotate_checkpoints`."""
        return atomic.rotate_checkpoints(parent, keep, protected, prefix)


DEFAULT_CHECKPOINT_IO: CheckpointIO = AtomicPosixIO()


def checkpoint_io_of(owner: Any) -> CheckpointIO:
    """The backend an Accelerator writes with: its ``checkpoint_io`` attribute when set, else the default."""
    chosen = getattr(owner, "checkpoint_io", None)
    return DEFAULT_CHECKPOINT_IO if chosen is None else chosen
