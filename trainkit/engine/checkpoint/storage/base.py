"""The storage contract: a backend owns the bytes of checkpoints, and the protocol that makes one visible.

A :class:`CheckpointStorage` does two jobs. It owns the bytes: create, write, list, read and delete files under
a location (a folder on a disk, a prefix in an object store), and it gives torch.distributed.checkpoint (DCP) the
``StorageWriter``/``StorageReader`` for sharded tensors there. On top of the bytes, this base class runs the one
commit protocol every backend shares: **stage** (an empty place for the files of one checkpoint, nothing visible),
**commit** (collective: every rank confirms its writes, the files are checksummed with the work split across
ranks, the manifest is written last and the checkpoint becomes visible at once; a failure on any rank abandons it
on every rank), **list** / **latest** (only checkpoints with a valid manifest count), **read** (collective:
verify sizes and SHA-256 against the manifest) and **rotate**. A backend fills in how a staged checkpoint becomes
visible (:meth:`_begin`, :meth:`_publish`, :meth:`_discard`, :meth:`_set_aside`, :meth:`_remove_checkpoint`): a
rename on a disk, the manifest itself on an object store. A new backend is one file implementing the abstract
methods below (``shared_folder.py``, ``node_local.py``, ``object_store.py`` are the three that ship).
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

from ..errors import CheckpointError, CorruptedCheckpointError, IncompleteCheckpointError
from .manifest import MANIFEST_NAME, STAGING_SUFFIX, CheckpointEntry, build_manifest, parse_manifest
from .ranks import Ranks, describe

FULL_WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
"""A model's full weights, and the index of the shards that may replace them (serialization's names)."""
logger = logging.getLogger("trainkit.engine.checkpoint.storage")

Entries = list[CheckpointEntry]  # ``list`` is a method name below
Paths = list[str]


class CheckpointStorage(ABC):
    """Where checkpoints live and how one becomes visible (see the module doc). Paths are strings: folders on a
    disk, or URLs (``s3://bucket/run``) for an object store."""

    name = "storage"
    """A short name for messages ("shared folder", "object store")."""

    # -- the bytes ----------------------------------------------------------------------------------------------
    @abstractmethod
    def exists(self, path: str) -> bool:
        """Whether a file or folder is at ``path``."""

    @abstractmethod
    def is_dir(self, path: str) -> bool:
        """Whether ``path`` is a folder (a prefix holding objects, in an object store)."""

    @abstractmethod
    def list_names(self, folder: str) -> list[str]:
        """The names directly inside ``folder`` (files and folders); empty when it does not exist."""

    @abstractmethod
    def file_sizes(self, folder: str) -> dict[str, int]:
        """Every file under ``folder`` (recursively), by ``/``-separated name relative to it, with its size."""

    @abstractmethod
    def read_bytes(self, path: str) -> bytes:
        """The file's content; ``FileNotFoundError`` when there is none."""

    @abstractmethod
    def write_bytes(self, path: str, data: bytes, *, durable: bool = True) -> None:
        """Create or replace the file at ``path`` (its folder is made as needed). ``durable=False``: the commit's
        checksum pass makes it durable later, so a flush to the disk can wait until then."""

    @abstractmethod
    def checksum(self, path: str) -> str:
        """The SHA-256 (hex) of the stored bytes, read back from the storage (made durable first, on a disk)."""

    @abstractmethod
    def delete(self, path: str) -> None:
        """Remove a file, or a folder and everything in it; nothing when it is absent."""

    @abstractmethod
    def make_dirs(self, path: str) -> None:
        """Create the folder ``path`` and its parents (nothing on a store without folders)."""

    @abstractmethod
    def dcp_writer(self, path: str) -> Any:
        """DCP's ``StorageWriter`` for a sharded-tensor folder at ``path``."""

    @abstractmethod
    def dcp_reader(self, path: str) -> Any:
        """DCP's ``StorageReader`` for the sharded-tensor folder at ``path`` (its metadata read without pickle)."""

    def local_path(self, path: str) -> str | None:
        """A path of the local file system where ``path``'s bytes can be read and written directly (memory-mapped
        safetensors, ``save_pretrained``), or None (an object store: bytes go through this object)."""
        return None

    def normalize(self, path: str) -> str:
        """The one spelling of a location (no trailing separator)."""
        return path.rstrip("/") or "/"

    def join(self, folder: str, *names: str) -> str:
        """``folder/name/...``."""
        return posixpath.join(folder, *names)

    def parent(self, path: str) -> str:
        """The folder holding ``path``."""
        return posixpath.dirname(self.normalize(path))

    def same_place(self, a: str, b: str) -> bool:
        """Whether two spellings name the same checkpoint (rotation never deletes a protected one)."""
        return self.normalize(a) == self.normalize(b)

    # -- how a staged checkpoint becomes visible: what each backend decides ---------------------------------------
    @abstractmethod
    def _begin(self, final_dir: str, replacing: bool) -> str:
        """Leader: make an empty place for the files of ``final_dir`` (removing an interrupted write's leftovers)
        and return it. ``replacing``: a complete checkpoint is there and is replaced once the new one is committed."""

    @abstractmethod
    def _publish(self, staging: str, final_dir: str, manifest: dict[str, Any]) -> str:
        """Leader: every file is written and checked; write the manifest (``files``, ``world_size``, ``metadata``)
        and make ``final_dir`` the new checkpoint at once. Returns ``final_dir``."""

    @abstractmethod
    def _discard(self, staging: str, final_dir: str) -> None:
        """Leader: remove an abandoned write (nothing of it becomes visible)."""

    @abstractmethod
    def _set_aside(self, final_dir: str) -> str:
        """Leader: keep a damaged checkpoint out of the way under ``{final_dir}.damaged-{UTC time}``; return it."""

    @abstractmethod
    def _remove_checkpoint(self, folder: str) -> None:
        """One process: delete a committed checkpoint so that no interruption leaves it looking complete."""

    def _inspect(self, final_dir: str) -> str:
        """Leader: "absent", "complete" (manifest and sizes match), "damaged" (a manifest the files no longer match),
        "incomplete" (files without a manifest) or "other" (not a folder)."""
        if not self.exists(final_dir):
            return "absent"
        if not self.is_dir(final_dir):
            return "other"
        if self.is_complete(final_dir):
            return "complete"
        return "damaged" if self.exists(self.join(final_dir, MANIFEST_NAME)) else "incomplete"

    def _agree(self, final_dir: str, existing: str, ranks: Ranks) -> str:
        """Collective: what is at ``final_dir`` as the processes writing it together see it (one place: as found)."""
        return existing

    def participants(self, location: str, ranks: Ranks) -> Ranks:
        """Collective: the processes that write or read the checkpoint at ``location`` together, as this process
        sees them (here: every process, in one shared place; a backend of per-node places answers with this
        node's processes)."""
        places = ranks.gather_all(self.normalize(location))
        if len(set(places)) > 1:
            listing = ", ".join(f"rank {rank}: {place}" for rank, place in enumerate(places))
            raise CheckpointError(f"The processes were given different checkpoint locations ({listing}); a checkpoint "
                                  f"in {self.name} is one location every process writes into. Pass the same one on "
                                  "every process.")
        return ranks

    # -- the protocol ---------------------------------------------------------------------------------------------
    def stage(self, final_dir: str, *, replace: bool = False, set_aside_damaged: bool = False,
              ranks: Ranks | None = None) -> str:
        """Collective: prepare an empty place for the files of ``final_dir`` and return it (nothing visible yet).

        An existing checkpoint is never written into: it is refused, unless ``replace`` is set and it is complete
        (the new one replaces it once committed). With ``set_aside_damaged`` (names the caller owns: the Trainer's
        ``checkpoint-N``, automatic ``checkpoint_N``) one that does not verify is kept aside as
        ``{final_dir}.damaged-{UTC time}`` with one warning; with ``replace`` alone, one whose manifest its files no
        longer match is set aside the same way. An interrupted write's leftovers are removed.
        """
        final_dir = self.normalize(final_dir)
        ranks = ranks if ranks is not None else self.participants(final_dir, Ranks.everyone())
        existing = self._agree(final_dir, ranks.decide(f"inspect {final_dir}", lambda: self._inspect(final_dir)), ranks)
        damaged = existing in ("incomplete", "damaged")
        set_aside = set_aside_damaged or (replace and existing == "damaged")
        if existing == "complete" and set_aside_damaged:
            damaged = not self._verifies(final_dir, ranks)  # collective: the checksums split across ranks

        def create() -> str:
            if existing != "absent" and damaged and set_aside:
                self._set_aside(final_dir)
                return self._begin(final_dir, replacing=False)
            if existing != "absent" and not (replace and existing == "complete"):
                raise FileExistsError(f"{final_dir} already exists; a checkpoint is never written into an existing "
                                      "folder" + (" and it is not a complete checkpoint that could be replaced."
                                                  if replace else " (choose a new name)."))
            return self._begin(final_dir, replacing=existing == "complete")

        return ranks.decide(f"start checkpoint {final_dir}", create)

    def commit(self, staging: str, final_dir: str, *, error: BaseException | str | None = None,
               metadata: dict[str, Any] | None = None, ranks: Ranks | None = None) -> str:
        """Collective: once every rank has written its files, checksum them (split across ranks), write the
        manifest last and make ``final_dir`` visible. When any rank (of any node) passes ``error``, the write is
        abandoned everywhere and every rank raises :class:`CheckpointError`. Returns ``final_dir``."""
        final_dir = self.normalize(final_dir)
        ranks = ranks or Ranks.everyone()
        failures = ranks.gather_all(None if error is None else describe(error))
        if any(failures):
            if ranks.is_leader:
                try:
                    self._discard(staging, final_dir)
                except OSError as failure:  # the write failed already; say so, keep the first cause
                    logger.warning("Could not remove the abandoned write %s: %s", staging, failure)
            ranks.raise_if_any_failed(failures, f"write checkpoint {final_dir}")
        sizes = ranks.decide("list the checkpoint's files", lambda: self.file_sizes_to_commit(staging))
        names = sorted(sizes)
        mine: dict[str, Any] = {}
        problem = None
        try:
            mine = {name: {"size": sizes[name], "sha256": self.checksum(self.join(staging, name))}
                    for name in names[ranks.index::ranks.size]}
        except OSError as failure:
            problem = f"{staging}: {describe(failure)}"
        ranks.raise_anywhere(problem, "Could not checksum the checkpoint's files: ")
        files: dict[str, Any] = {}
        for part in ranks.gather(mine):
            files.update(part)
        manifest = {"files": files, "world_size": ranks.size, "metadata": metadata or {}}
        result = ranks.decide(f"publish checkpoint {final_dir}", lambda: self._publish(staging, final_dir, manifest))
        if ranks.is_leader:
            logger.info("Saved checkpoint %s", result)
        return result

    def file_sizes_to_commit(self, staging: str) -> dict[str, int]:
        """The staged files the manifest lists (all of them, unless the backend keeps its own notes there)."""
        return self.file_sizes(staging)

    @staticmethod
    def manifest_bytes(manifest: dict[str, Any], root: str = "") -> bytes:
        """The manifest file's content for what :meth:`commit` hands :meth:`_publish`."""
        return build_manifest(manifest["files"], manifest["world_size"], manifest["metadata"], root)

    # -- reading ----------------------------------------------------------------------------------------------------
    def read_manifest(self, folder: str) -> dict[str, Any]:
        """The manifest of a complete checkpoint; :class:`IncompleteCheckpointError` when there is none."""
        path = self.join(folder, MANIFEST_NAME)
        try:
            data = self.read_bytes(path)
        except FileNotFoundError:
            raise IncompleteCheckpointError(
                f"{folder} is not a complete checkpoint: it has no {MANIFEST_NAME} (the write was interrupted, "
                "or the folder was not written by trainkit).") from None
        return parse_manifest(data, path)

    def files_at(self, folder: str, manifest: dict[str, Any] | None = None) -> str:
        """Where the files of the checkpoint ``folder`` are (its manifest may name a sub-folder)."""
        root, prefix = self.covering(folder)
        manifest = self.read_manifest(root) if manifest is None else manifest
        base = self.join(root, manifest["root"]) if manifest.get("root") else root
        return self.join(base, prefix.rstrip("/")) if prefix else base

    def covering(self, folder: str) -> tuple[str, str]:
        """``(checkpoint, prefix)``: the folder whose manifest covers ``folder`` (itself, or its parent when
        ``folder`` was written inside a larger checkpoint, e.g. ``checkpoint-N/engine_state``), and the prefix of
        ``folder``'s files in that manifest."""
        folder = self.normalize(folder)
        parent = self.parent(folder)
        if not self.exists(self.join(folder, MANIFEST_NAME)) and self.exists(self.join(parent, MANIFEST_NAME)):
            return parent, folder.rsplit("/", 1)[-1] + "/"
        return folder, ""

    def find_problems(self, folder: str, names: Iterable[str] | None = None, checksums: bool = True) -> list[str]:
        """What is wrong with ``folder``'s files (all, or ``names``) against its manifest; empty when sound."""
        manifest = self.read_manifest(folder)
        files, root = manifest["files"], self.files_at(folder, manifest)
        sizes = self.file_sizes(root)
        problems = []
        for name in sorted(files) if names is None else names:
            expected = files[name]
            if name not in sizes and self._resharded_weights(root, name, sizes):
                continue  # weights rewritten as shards with an index (as save_pretrained does): loaded from those
            if name not in sizes:
                problems.append(f"{name} is missing")
            elif sizes[name] != expected["size"]:
                problems.append(f"{name} is {sizes[name]} bytes, the manifest says {expected['size']} (truncated?)")
            elif checksums and "sha256" in expected and self.checksum(self.join(root, name)) != expected["sha256"]:
                problems.append(f"{name} has the wrong SHA-256 checksum (corrupted or altered)")
        return problems

    def _resharded_weights(self, root: str, name: str, sizes: dict[str, int]) -> bool:
        """Whether ``name`` is the full-weights file, replaced after the checkpoint was written by shards with an
        index (transformers' Trainer tests and sharding tools do this) and every shard the index names is there. The
        shards are not in the manifest, so only their presence is checked; the load checks keys and shapes."""
        if name != FULL_WEIGHTS_NAME or WEIGHTS_INDEX_NAME not in sizes:
            return False
        try:
            shards = set(json.loads(self.read_bytes(self.join(root, WEIGHTS_INDEX_NAME)))["weight_map"].values())
        except (ValueError, KeyError, TypeError, AttributeError):
            return False
        return bool(shards) and shards <= set(sizes)

    def is_complete(self, folder: str) -> bool:
        """True when ``folder`` has a manifest and every listed file exists with its size (cheap: no hashing)."""
        try:
            return not self.find_problems(folder, checksums=False)
        except (IncompleteCheckpointError, CorruptedCheckpointError, OSError):
            return False

    def read(self, folder: str, *, checksums: bool = True, ranks: Ranks | None = None) -> dict[str, Any]:
        """Collective: check every file's size (and checksum) against the manifest, the files split across ranks;
        raise the same error on every rank when any is wrong. Returns the manifest."""
        ranks = ranks or Ranks.everyone()
        root, prefix = self.covering(folder)
        incomplete = damaged = None
        manifest: dict[str, Any] = {}
        try:
            manifest = self.read_manifest(root)
            names = sorted(name for name in manifest["files"] if name.startswith(prefix))
            if not names:
                raise IncompleteCheckpointError(f"The manifest of {root} lists no files under {folder}.")
            problems = self.find_problems(root, names[ranks.index::ranks.size], checksums)
        except IncompleteCheckpointError as error:
            incomplete, problems = str(error), []
        except CorruptedCheckpointError as error:
            problems = [str(error)]
        # Agreed by every process (with each node's own folder, every node's), so all raise or none does.
        ranks.raise_anywhere(incomplete, "", IncompleteCheckpointError)
        found = sorted({problem for part in ranks.gather(problems) for problem in part})
        ranks.raise_anywhere(f"Checkpoint {folder} is damaged; nothing was loaded: " + "; ".join(found) if found else None,
                             "", CorruptedCheckpointError)
        return manifest

    def _verifies(self, folder: str, ranks: Ranks) -> bool:
        try:
            self.read(folder, ranks=ranks)
        except (IncompleteCheckpointError, CorruptedCheckpointError):
            return False
        return True

    # -- finding and rotating ------------------------------------------------------------------------------------
    def list(self, parent: str, prefix: str = "checkpoint_") -> Entries:
        """The checkpoints named ``{prefix}{N}`` under ``parent`` (and hidden leftovers of interrupted writes), by N."""
        pattern = re.compile(rf"^(\.)?{re.escape(prefix)}(\d+)({re.escape(STAGING_SUFFIX)})?$")
        entries = []
        for name in self.list_names(parent):
            match = pattern.match(name)
            if not match or bool(match.group(1)) != bool(match.group(3)):
                continue
            path = self.join(parent, name)
            if not self.is_dir(path):
                continue
            staging = bool(match.group(3))
            entries.append(CheckpointEntry(path, int(match.group(2)), complete=not staging and self.is_complete(path),
                                           staging=staging))
        return sorted(entries, key=lambda e: (e.number, e.staging))

    def latest(self, parent: str, prefix: str = "checkpoint_") -> str | None:
        """The complete checkpoint with the highest number under ``parent``; newer incomplete ones are skipped with
        a warning."""
        entries = self.list(parent, prefix)
        complete = [e for e in entries if e.complete]
        newest = complete[-1] if complete else None
        skipped = [e.path for e in entries if not e.complete and (newest is None or e.number >= newest.number)]
        if skipped:
            logger.warning("Skipping incomplete checkpoints (interrupted writes, no valid %s): %s", MANIFEST_NAME,
                           ", ".join(skipped))
        return newest.path if newest else None

    def rotate(self, parent: str, keep: int | None, protected: Iterable[str | None] = (),
               prefix: str = "checkpoint_") -> Paths:
        """Delete the oldest complete checkpoints so that at most ``keep`` remain, never the newest nor any in
        ``protected`` (the best one, the one resumed from). Call on one process."""
        if not keep or keep < 1:
            return []
        complete = [e.path for e in self.list(parent, prefix) if e.complete]
        kept = [p for p in protected if p] + complete[-1:]
        deleted: Paths = []
        for folder in complete:
            if len(complete) - len(deleted) <= keep:
                break
            if any(self.same_place(folder, other) for other in kept):
                continue
            self._remove_checkpoint(folder)
            deleted.append(folder)
        if deleted:
            logger.info("Deleted %s (limit of %d checkpoints)", ", ".join(deleted), keep)
        return deleted
