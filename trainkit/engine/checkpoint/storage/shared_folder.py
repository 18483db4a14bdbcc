"""A folder every process sees (one disk, or a shared file system such as NFS or Lustre): today's checkpoints.

A checkpoint is written into a hidden staging folder next to its final name (``.checkpoint_7.staging``). When
every rank has confirmed its writes, the files are checksummed (and fsynced) with the work split across ranks,
``manifest.json`` is written last, and one ``os.rename`` makes the folder visible. A process killed at any moment
leaves either no new folder or a complete one, and the previous checkpoint untouched. A complete checkpoint being
replaced is renamed out of sight only once its successor is ready, then removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
from typing import Any

from .base import CheckpointStorage
from .manifest import DAMAGED_MARK, DELETING_SUFFIX, MANIFEST_NAME, STAGING_SUFFIX, damaged_stamp
from .ranks import Ranks

logger = logging.getLogger("trainkit.engine.checkpoint.storage")

_HASH_CHUNK_BYTES = 1 << 20


def hash_file(path: str) -> str:
    """SHA-256 of a file, read in 1 MiB chunks, fsynced first (durable before the manifest publishes it)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_HASH_CHUNK_BYTES), b""):
            digest.update(chunk)
        os.fsync(handle.fileno())
    return digest.hexdigest()


def fsync_directory(path: str) -> None:
    """Make a folder's entries (a rename) durable, where the file system lets a folder be opened."""
    with contextlib.suppress(OSError):
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def staging_path(final_dir: str) -> str:
    """The hidden folder a checkpoint is written into before it is renamed to ``final_dir``."""
    parent, name = os.path.split(os.path.normpath(os.fspath(final_dir)))
    return os.path.join(parent, f".{name}{STAGING_SUFFIX}")


class SharedFolderStorage(CheckpointStorage):
    """Checkpoints in a folder every process sees, committed by one atomic rename (see the module doc)."""

    name = "a shared folder"

    # -- bytes ---------------------------------------------------------------------------------------------------
    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(path)

    def list_names(self, folder: str) -> list[str]:
        return sorted(os.listdir(folder)) if os.path.isdir(folder) else []

    def file_sizes(self, folder: str) -> dict[str, int]:
        sizes = {}
        for root, _dirs, files in os.walk(folder):
            for name in files:
                path = os.path.join(root, name)
                sizes[os.path.relpath(path, folder).replace(os.sep, "/")] = os.path.getsize(path)
        return sizes

    def read_bytes(self, path: str) -> bytes:
        with open(path, "rb") as handle:
            return handle.read()

    def write_bytes(self, path: str, data: bytes, *, durable: bool = True) -> None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())

    def checksum(self, path: str) -> str:
        return hash_file(path)

    def delete(self, path: str) -> None:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.remove(path)

    def make_dirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def local_path(self, path: str) -> str | None:
        return path

    def normalize(self, path: str) -> str:
        return os.path.normpath(os.fspath(path))

    def join(self, folder: str, *names: str) -> str:
        return os.path.join(folder, *names)

    def parent(self, path: str) -> str:
        return os.path.dirname(self.normalize(path))

    def same_place(self, a: str, b: str) -> bool:
        return os.path.realpath(a) == os.path.realpath(b)

    def dcp_writer(self, path: str) -> Any:
        from torch.distributed.checkpoint import FileSystemWriter

        return FileSystemWriter(path, single_file_per_rank=True)

    def dcp_reader(self, path: str) -> Any:
        from torch.distributed.checkpoint import FileSystemReader

        from ..dcp_metadata import pickle_free_reader

        return pickle_free_reader(FileSystemReader, path, self)

    def participants(self, location: str, ranks: Ranks) -> Ranks:
        # Compared as absolute paths: "ckpt" and "./ckpt" are one folder.
        return super().participants(os.path.abspath(location), ranks)

    # -- the commit ------------------------------------------------------------------------------------------------
    def _inspect(self, final_dir: str) -> str:
        if os.path.isdir(final_dir) and not os.listdir(final_dir):
            os.rmdir(final_dir)  # an empty folder made beforehand (a habit from non-atomic savers) holds nothing
        return super()._inspect(final_dir)

    def _begin(self, final_dir: str, replacing: bool) -> str:
        staging = staging_path(final_dir)
        if os.path.exists(staging):
            logger.warning("Removing %s, left by an interrupted checkpoint write.", staging)
            shutil.rmtree(staging)
        os.makedirs(staging)
        return staging

    def _publish(self, staging: str, final_dir: str, manifest: dict[str, Any]) -> str:
        self.write_bytes(os.path.join(staging, MANIFEST_NAME), self.manifest_bytes(manifest))
        fsync_directory(staging)
        replaced = None
        if os.path.exists(final_dir):  # stage() allowed replacing a complete checkpoint
            replaced = os.path.join(os.path.dirname(final_dir), f".{os.path.basename(final_dir)}{DELETING_SUFFIX}")
            shutil.rmtree(replaced, ignore_errors=True)
            os.rename(final_dir, replaced)
        os.rename(staging, final_dir)
        fsync_directory(os.path.dirname(final_dir) or ".")
        if replaced:
            shutil.rmtree(replaced, ignore_errors=True)
        return final_dir

    def _discard(self, staging: str, final_dir: str) -> None:
        shutil.rmtree(staging, ignore_errors=True)

    def _set_aside(self, final_dir: str) -> str:
        stamp, count = damaged_stamp(), 1
        aside = f"{final_dir}{DAMAGED_MARK}{stamp}"
        while os.path.exists(aside):
            aside, count = f"{final_dir}{DAMAGED_MARK}{stamp}-{count}", count + 1
        os.rename(final_dir, aside)
        logger.warning("%s does not verify (incomplete or corrupted); kept as %s, and a new checkpoint is written "
                       "under its name.", final_dir, aside)
        return aside

    def _remove_checkpoint(self, folder: str) -> None:
        # Renamed out of sight first, so an interruption never leaves a half-deleted folder under a checkpoint name.
        doomed = os.path.join(os.path.dirname(folder), f".{os.path.basename(folder)}{DELETING_SUFFIX}")
        shutil.rmtree(doomed, ignore_errors=True)
        os.rename(folder, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
