"""Object stores through fsspec (``s3://``, ``gs://``, ``az://``, ``memory://``...): no rename, so the manifest
is the commit.

The files of a checkpoint are written straight under its prefix (``s3://bucket/run/checkpoint_3/...``), tensors
through DCP's fsspec writer, with a marker object saying a write is in progress. When every rank has written its
part, every file is read back and checksummed (the work split across ranks), and ``manifest.json`` is written last:
one PUT, so the checkpoint becomes visible whole or not at all. Readers trust only prefixes with a valid manifest,
so an upload killed at any moment leaves the previous checkpoint the newest valid one; the next write of the same
name removes what the interrupted one left (recognised by its marker; a prefix holding anything else is refused
or, for names the caller owns, set aside, as on a disk). A committed checkpoint that is replaced (``save_state``
into the same URL again) keeps serving reads while its successor is written into a hidden sub-prefix; the new
manifest, naming that sub-prefix as its ``root``, switches readers over at once, then the old files are deleted.
Rotation deletes a checkpoint's manifest first, so a half-deleted one is never taken for complete.

Credentials and endpoints come from the store's usual configuration (``AWS_*`` environment variables and files,
``gcloud``, ``AZURE_*``; fsspec's ``FSSPEC_S3_ENDPOINT_URL``-style variables), or from keyword arguments given to
:class:`ObjectStoreStorage` (fsspec's storage options), set as ``accelerator.checkpoint_storage``.
"""

from __future__ import annotations

import hashlib
import logging
import posixpath
import uuid
from typing import Any

from .base import CheckpointStorage
from .manifest import DAMAGED_MARK, MANIFEST_NAME, damaged_stamp

logger = logging.getLogger("trainkit.engine.checkpoint.storage")

WRITING_MARKER = ".trainkit-writing"
"""Written first into a checkpoint's place, removed by its commit: files beside it and no manifest are the
leftovers of an interrupted write (and may be deleted)."""
REPLACEMENT_PREFIX = ".replacement-"
_CHUNK = 1 << 20


class ObjectStoreStorage(CheckpointStorage):
    """Checkpoints in an object store reached through fsspec, committed by their manifest (see the module doc).

    ``storage_options``: fsspec's keyword arguments for the store's filesystem (``endpoint_url``, ``key``,
    ``client_kwargs``...); none: the store's own configuration."""

    name = "an object store"

    def __init__(self, **storage_options: Any) -> None:
        self.storage_options = storage_options
        self._filesystems: dict[str, Any] = {}

    def _fs(self, url: str) -> tuple[Any, str]:
        """The fsspec filesystem of ``url`` (one per protocol, its listings never cached across calls) and the
        path it knows ``url`` by."""
        from fsspec.core import split_protocol, url_to_fs

        protocol = split_protocol(url)[0] or "file"
        if protocol not in self._filesystems:
            self._filesystems[protocol] = url_to_fs(url, **self.storage_options)[0]
        fs = self._filesystems[protocol]
        fs.invalidate_cache()  # another process may have written since: list what is there now
        return fs, fs._strip_protocol(url)

    # -- bytes ---------------------------------------------------------------------------------------------------
    def exists(self, path: str) -> bool:
        fs, key = self._fs(path)
        return bool(fs.exists(key))

    def is_dir(self, path: str) -> bool:
        fs, key = self._fs(path)
        return bool(fs.isdir(key))

    def list_names(self, folder: str) -> list[str]:
        fs, key = self._fs(folder)
        try:
            return sorted(posixpath.basename(item.rstrip("/")) for item in fs.ls(key, detail=False))
        except FileNotFoundError:
            return []

    def file_sizes(self, folder: str) -> dict[str, int]:
        fs, key = self._fs(folder)
        try:
            found = fs.find(key, detail=True)
        except FileNotFoundError:
            return {}
        base = key.rstrip("/") + "/"
        return {path[len(base):]: int(info["size"]) for path, info in found.items()
                if path.startswith(base) and info.get("type") != "directory"}

    def read_bytes(self, path: str) -> bytes:
        fs, key = self._fs(path)
        return bytes(fs.cat_file(key))

    def write_bytes(self, path: str, data: bytes, *, durable: bool = True) -> None:
        fs, key = self._fs(path)
        fs.pipe_file(key, data)

    def checksum(self, path: str) -> str:
        fs, key = self._fs(path)
        digest = hashlib.sha256()
        with fs.open(key, "rb", block_size=_CHUNK) as handle:
            for chunk in iter(lambda: handle.read(_CHUNK), b""):
                digest.update(chunk)
        return digest.hexdigest()

    def delete(self, path: str) -> None:
        # Objects are deleted by name: a recursive rm may also remove what it takes for empty folders, a bucket
        # among them.
        fs, key = self._fs(path)
        objects = [key] if fs.isfile(key) else [key.rstrip("/") + "/" + name for name in self.file_sizes(path)]
        if objects:
            fs.rm(objects)

    def make_dirs(self, path: str) -> None:
        """Object stores have no folders: a prefix exists once an object is under it."""

    def dcp_writer(self, path: str) -> Any:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        # sync_files would os.sync() the whole machine per file: an object is durable once its upload completes.
        return FsspecWriter(path, single_file_per_rank=True, sync_files=False, **self.storage_options)

    def dcp_reader(self, path: str) -> Any:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        from ..dcp_metadata import pickle_free_reader

        return pickle_free_reader(FsspecReader, path, self, **self.storage_options)

    # -- the commit ------------------------------------------------------------------------------------------------
    def _inspect(self, final_dir: str) -> str:
        names = self.list_names(final_dir)
        if WRITING_MARKER in names and MANIFEST_NAME not in names:
            logger.warning("Removing %s, left by an interrupted checkpoint write.", final_dir)
            self.delete(final_dir)
            return "absent"
        return super()._inspect(final_dir)

    def _begin(self, final_dir: str, replacing: bool) -> str:
        staging = self.join(final_dir, f"{REPLACEMENT_PREFIX}{uuid.uuid4().hex[:12]}") if replacing else final_dir
        self.write_bytes(self.join(staging, WRITING_MARKER), b"")
        return staging

    def file_sizes_to_commit(self, staging: str) -> dict[str, int]:
        return {name: size for name, size in self.file_sizes(staging).items()
                if name != WRITING_MARKER and not name.startswith(REPLACEMENT_PREFIX)}

    def _publish(self, staging: str, final_dir: str, manifest: dict[str, Any]) -> str:
        root = staging[len(final_dir):].strip("/")
        self.write_bytes(self.join(final_dir, MANIFEST_NAME), self.manifest_bytes(manifest, root))
        # Committed: what is not the new checkpoint (the marker, a replaced checkpoint's files) goes.
        current = {MANIFEST_NAME} | {f"{root}/{name}" if root else name for name in manifest["files"]}
        for name in self.file_sizes(final_dir):
            if name not in current:
                self.delete(self.join(final_dir, name))
        return final_dir

    def _discard(self, staging: str, final_dir: str) -> None:
        self.delete(staging)

    def _set_aside(self, final_dir: str) -> str:
        aside = f"{final_dir}{DAMAGED_MARK}{damaged_stamp()}"
        fs, _ = self._fs(final_dir)
        for name in self.file_sizes(final_dir):  # copied object by object, then deleted: there is no rename
            fs.copy(fs._strip_protocol(self.join(final_dir, name)), fs._strip_protocol(self.join(aside, name)))
        self.delete(final_dir)
        logger.warning("%s does not verify (incomplete or corrupted); kept as %s, and a new checkpoint is written "
                       "under its name.", final_dir, aside)
        return aside

    def _remove_checkpoint(self, folder: str) -> None:
        self.delete(self.join(folder, MANIFEST_NAME))  # no longer complete, even if the rest is interrupted
        self.delete(folder)
