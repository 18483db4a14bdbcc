"""Atomic checkpoint folders: stage, confirm on every rank, write a manifest last, rename once.

A checkpoint is written into a hidden staging folder next to its final name. When every rank has
confirmed its writes, the files are checksummed (the work split across ranks), ``manifest.json``
(every file's size and SHA-256) is written last, and one ``os.rename`` makes the folder visible.
A process killed at any moment therefore leaves either no new folder or a complete one, and the
previous checkpoint untouched. A final folder is never written into; "latest" means latest complete.

Every public function may be called from all ranks of a job (the collective ones say so) or from a
single process; the Trainer's ``checkpoint-N`` folders use the same functions with ``prefix="checkpoint-"``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import logging
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from typing import Any

import torch.distributed as dist

from .errors import CheckpointError, CorruptedCheckpointError, IncompleteCheckpointError
from .state_io import read_json, write_json

logger = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "trainkit-checkpoint/1"
_STAGING_SUFFIX = ".staging"
_DELETING_SUFFIX = ".deleting"
DAMAGED_MARK = ".damaged-"
"""Suffix of a damaged checkpoint folder set aside by a later save of the same name (see begin_checkpoint)."""


# -- collectives (no-ops on one process) ----------------------------------------------------------
# ``group``: the process group the collectives run on (None: the default group). A background writer passes
# its own group, so its collectives never interleave with the training loop's on the default one.
def _world_and_rank(group: Any = None) -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(group), dist.get_rank(group)
    return 1, 0


def _all_gather(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's ``obj`` in rank order (small JSON-like values only)."""
    world, _ = _world_and_rank(group)
    if world == 1:
        return [obj]
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, obj, group=group)
    return gathered


def _raise_if_any_failed(results: list[Any], action: str) -> None:
    """``results`` are per-rank error strings or None: raise the same error on every rank if any failed."""
    failures = [f"rank {rank}: {error}" for rank, error in enumerate(results) if error]
    if failures:
        raise CheckpointError(f"Could not {action}: " + "; ".join(failures))


def decide_on_rank0(action: str, function: Any, group: Any = None) -> Any:
    """Run ``function`` on rank 0, hand its result (or its error, raised everywhere) to every rank."""
    _, rank = _world_and_rank(group)
    outcome: tuple[Any, str | None] = (None, None)
    if rank == 0:
        try:
            outcome = (function(), None)
        except Exception as error:  # reported on every rank below, so nobody waits forever
            outcome = (None, f"{type(error).__name__}: {error}")
    result, failure = _all_gather(outcome, group)[0]
    if failure:
        raise CheckpointError(f"Could not {action}: {failure}")
    return result


# -- naming ----------------------------------------------------------------------------------------
def staging_path(final_dir: str) -> str:
    """The hidden folder a checkpoint is written into before it is renamed to ``final_dir``."""
    parent, name = os.path.split(os.path.normpath(os.fspath(final_dir)))
    return os.path.join(parent, f".{name}{_STAGING_SUFFIX}")


def _fsync_directory(path: str) -> None:
    with contextlib.suppress(OSError):  # not every filesystem lets a directory be opened
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


# -- writing -----------------------------------------------------------------------------------------
def begin_checkpoint(final_dir: str, replace: bool = False, set_aside_damaged: bool = False) -> str:
    """Collective: create an empty staging folder for ``final_dir`` and return its path.

    An existing ``final_dir`` is never written into: it is refused, unless it is empty, or ``replace`` is
    set and it is a complete checkpoint (then :func:`commit_checkpoint` swaps the new one in by renames).
    With ``set_aside_damaged`` (folders whose name the caller owns: the Trainer's ``checkpoint-N``, the
    Accelerator's automatic ``checkpoint_N``), an existing folder that does not verify (incomplete,
    truncated or failing its checksums) is renamed to ``{final_dir}.damaged-{UTC time}`` and kept, with one
    warning: a run that resumed from an older checkpoint can then save over it. With ``replace`` alone, a
    folder with a manifest whose files no longer match it (a trainkit checkpoint damaged since) is set aside
    the same way, so an explicit ``save_state("ckpt")`` repeated every epoch keeps working. The leftover of
    an earlier interrupted write of the same checkpoint is removed.
    """
    final_dir = os.path.normpath(os.fspath(final_dir))
    folders = _all_gather(os.path.abspath(final_dir))
    if len(set(folders)) > 1:  # e.g. a tempfile.mkdtemp() made on each rank: rank 0 would write them all
        listing = ", ".join(f"rank {rank}: {folder}" for rank, folder in enumerate(folders))
        raise CheckpointError(f"The processes were given different checkpoint folders ({listing}); a checkpoint is "
                              "one folder that every process writes into. Pass the same path on every process "
                              "(for example make it on the main process and broadcast_object_list it).")
    staging = staging_path(final_dir)
    existing = decide_on_rank0(f"inspect {final_dir}", lambda: _inspect_existing(final_dir))
    damaged = existing in ("incomplete", "damaged")
    set_aside = set_aside_damaged or (replace and existing == "damaged")
    if existing == "complete" and set_aside_damaged:
        damaged = not _verifies(final_dir)  # collective: the checksums split across ranks

    def create() -> str:
        if existing != "absent" and damaged and set_aside:
            set_aside_damaged_folder(final_dir)
        elif existing != "absent" and not (replace and existing == "complete"):
            raise FileExistsError(f"{final_dir} already exists; a checkpoint is never written into an existing folder"
                                  + ("" if replace else " (choose a new name)")
                                  + (" and it is not a complete checkpoint that could be replaced" if replace else "") + ".")
        if os.path.exists(staging):
            logger.warning("Removing %s, left by an interrupted checkpoint write.", staging)
            shutil.rmtree(staging)
        os.makedirs(staging)
        return staging

    return decide_on_rank0(f"start checkpoint {final_dir}", create)


def _inspect_existing(final_dir: str) -> str:
    """Rank 0: "absent" (an empty folder is removed: it holds nothing), "complete" (manifest and sizes match),
    "damaged" (a manifest the files no longer match), "incomplete" (a folder without a manifest) or "other"
    (not a folder)."""
    if os.path.isdir(final_dir) and not os.listdir(final_dir):
        os.rmdir(final_dir)  # an empty folder made beforehand (a habit from non-atomic savers) holds nothing
    if not os.path.exists(final_dir):
        return "absent"
    if not os.path.isdir(final_dir):
        return "other"
    if is_complete(final_dir):
        return "complete"
    return "damaged" if os.path.isfile(os.path.join(final_dir, MANIFEST_NAME)) else "incomplete"


def _verifies(folder: str) -> bool:
    """Collective: whether ``folder``'s files match their manifest's sizes and checksums."""
    try:
        verify_checkpoint(folder)
    except (IncompleteCheckpointError, CorruptedCheckpointError):
        return False
    return True


def damaged_folder_name(final_dir: str) -> str:
    """A free name ``{final_dir}.damaged-{UTC time}`` (never matched as a checkpoint by any finder or rotation)."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    candidate, count = f"{final_dir}{DAMAGED_MARK}{stamp}", 1
    while os.path.exists(candidate):
        candidate, count = f"{final_dir}{DAMAGED_MARK}{stamp}-{count}", count + 1
    return candidate


def set_aside_damaged_folder(final_dir: str) -> str:
    """Rank 0: rename a damaged checkpoint folder out of the way (never delete evidence); one warning. Returns
    the new name."""
    aside = damaged_folder_name(final_dir)
    os.rename(final_dir, aside)
    logger.warning("%s does not verify (incomplete or corrupted); kept as %s, and a new checkpoint is written "
                   "under its name.", final_dir, aside)
    return aside


_HASH_CHUNK_BYTES = 1 << 20


def _hash_file(path: str) -> str:
    # Read in 1 MiB chunks (hashlib.file_digest does the same but needs Python 3.11; we support 3.10).
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_HASH_CHUNK_BYTES), b""):
            digest.update(chunk)
        os.fsync(handle.fileno())  # durable before the rename publishes it
    return digest.hexdigest()


def _list_files(folder: str) -> list[str]:
    found = []
    for root, _dirs, files in os.walk(folder):
        for name in files:
            found.append(os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/"))
    return sorted(found)


def _describe_files(folder: str, names: Iterable[str], checksums: bool = True) -> dict[str, dict[str, Any]]:
    described = {}
    for name in names:
        path = os.path.join(folder, name)
        entry: dict[str, Any] = {"size": os.path.getsize(path)}
        if checksums:
            entry["sha256"] = _hash_file(path)
        described[name] = entry
    return described


def commit_checkpoint(staging_dir: str, final_dir: str, *, error: BaseException | str | None = None,
                      metadata: dict[str, Any] | None = None, group: Any = None) -> str:
    """Collective (on ``group``, default: every process): once every rank has written its files, checksum
    them, write the manifest, rename.

    A rank passes ``error`` when its writes failed; every rank then raises :class:`CheckpointError`
    and the staging folder is removed. Returns ``final_dir``.
    """
    final_dir = os.path.normpath(os.fspath(final_dir))
    world, rank = _world_and_rank(group)
    errors = _all_gather(None if error is None else f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error),
                         group)
    if any(errors):
        if rank == 0:
            shutil.rmtree(staging_dir, ignore_errors=True)
        _raise_if_any_failed(errors, f"write checkpoint {final_dir}")

    names = decide_on_rank0("list the checkpoint's files", lambda: _list_files(staging_dir), group)
    mine: dict[str, Any] | str = {}
    try:
        mine = _describe_files(staging_dir, names[rank::world])
    except OSError as failure:
        mine = f"{type(failure).__name__}: {failure}"
    described = _all_gather(mine, group)
    _raise_if_any_failed([d if isinstance(d, str) else None for d in described], f"checksum {staging_dir}")

    def publish() -> str:
        files: dict[str, Any] = {}
        for part in described:
            files.update(part)
        manifest = {
            "format": MANIFEST_FORMAT,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "world_size": world,
            "files": dict(sorted(files.items())),
            "metadata": metadata or {},
        }
        write_json(manifest, os.path.join(staging_dir, MANIFEST_NAME))
        _fsync_directory(staging_dir)
        replaced = None
        if os.path.exists(final_dir):  # begin_checkpoint allowed replacing a complete checkpoint
            replaced = os.path.join(os.path.dirname(final_dir), f".{os.path.basename(final_dir)}{_DELETING_SUFFIX}")
            shutil.rmtree(replaced, ignore_errors=True)
            os.rename(final_dir, replaced)
        os.rename(staging_dir, final_dir)
        _fsync_directory(os.path.dirname(final_dir) or ".")
        if replaced:
            shutil.rmtree(replaced, ignore_errors=True)
        return final_dir

    result = decide_on_rank0(f"publish checkpoint {final_dir}", publish, group)
    if rank == 0:
        logger.info("Saved checkpoint %s", result)
    return result


@contextlib.contextmanager
def atomic_checkpoint(final_dir: str, metadata: dict[str, Any] | None = None, replace: bool = False,
                      set_aside_damaged: bool = False) -> Iterator[str]:
    """Collective: ``with atomic_checkpoint(path) as staging:`` write files into ``staging``; on leaving,
    the checkpoint is committed (or, if any rank raised, abandoned on every rank). ``replace`` and ``set_aside_damaged``:
    see :func:`begin_checkpoint`.

    Example (every rank)::

        with atomic_checkpoint("out/checkpoint-500") as staging:
            if rank == 0:
                save_file(weights, f"{staging}/model.safetensors")
    """
    staging = begin_checkpoint(final_dir, replace=replace, set_aside_damaged=set_aside_damaged)
    try:
        yield staging
    except Exception as error:
        # Tell the other ranks before re-raising, so none of them waits in commit forever.
        with contextlib.suppress(CheckpointError):
            commit_checkpoint(staging, final_dir, error=error)
        raise
    commit_checkpoint(staging, final_dir, metadata=metadata)


# -- reading ----------------------------------------------------------------------------------------
def read_manifest(folder: str) -> dict[str, Any]:
    """The manifest of a complete checkpoint; :class:`IncompleteCheckpointError` when there is none."""
    path = os.path.join(folder, MANIFEST_NAME)
    if not os.path.isfile(path):
        raise IncompleteCheckpointError(
            f"{folder} is not a complete checkpoint: it has no {MANIFEST_NAME} (the write was interrupted, "
            "or the folder was not written by trainkit)."
        )
    try:
        manifest = read_json(path)
    except ValueError as error:
        raise CorruptedCheckpointError(f"{path} is not valid JSON ({error}).") from None
    if manifest.get("format") != MANIFEST_FORMAT or not isinstance(manifest.get("files"), dict):
        raise CorruptedCheckpointError(f"{path} is not a trainkit manifest (format {manifest.get('format')!r}).")
    return manifest


def find_problems(folder: str, names: Iterable[str] | None = None, checksums: bool = True) -> list[str]:
    """What is wrong with ``folder``'s files (all, or ``names``) against its manifest; empty when sound."""
    files = read_manifest(folder)["files"]
    problems = []
    for name in (sorted(files) if names is None else names):
        expected, path = files[name], os.path.join(folder, name)
        if not os.path.isfile(path) and _resharded_weights(folder, name):
            continue  # weights rewritten as shards with an index (as save_pretrained does): loaded from those
        if not os.path.isfile(path):
            problems.append(f"{name} is missing")
        elif os.path.getsize(path) != expected["size"]:
            problems.append(f"{name} is {os.path.getsize(path)} bytes, the manifest says {expected['size']} (truncated?)")
        elif checksums and "sha256" in expected and _hash_file(path) != expected["sha256"]:
            problems.append(f"{name} has the wrong SHA-256 checksum (corrupted or altered)")
    return problems


def _resharded_weights(folder: str, name: str) -> bool:
    """Whether ``name`` is a weights file that was replaced, after the checkpoint was written, by shards with a
    ``.index.json`` (transformers' Trainer tests and sharding tools do this): every shard the index names exists.
    The shards are not in the manifest, so only their presence is checked; the load checks keys and shapes."""
    from .serialization import INDEX_NAME, WEIGHTS_NAME

    index = os.path.join(folder, INDEX_NAME)
    if name != WEIGHTS_NAME or not os.path.isfile(index):
        return False
    try:
        shards = set(read_json(index)["weight_map"].values())
    except (ValueError, KeyError, TypeError, AttributeError):
        return False
    return bool(shards) and all(os.path.isfile(os.path.join(folder, shard)) for shard in shards)


def covering_manifest(folder: str) -> tuple[str, str]:
    """``(root, prefix)``: the folder whose manifest covers ``folder`` (itself, or its parent when ``folder`` was
    written inside a larger atomic checkpoint, e.g. a Trainer's ``checkpoint-N/engine_state``), and the
    prefix of ``folder``'s files in that manifest."""
    folder = os.path.normpath(os.fspath(folder))
    parent = os.path.dirname(folder)
    if not os.path.isfile(os.path.join(folder, MANIFEST_NAME)) and os.path.isfile(os.path.join(parent, MANIFEST_NAME)):
        return parent, os.path.basename(folder) + "/"
    return folder, ""


def verify_checkpoint(folder: str, checksums: bool = True) -> dict[str, Any]:
    """Collective: check every file's size (and checksum) against the manifest, the files split across
    ranks; raise the same :class:`CorruptedCheckpointError` on every rank if any is wrong. Returns the manifest.
    """
    world, rank = _world_and_rank()
    root, prefix = covering_manifest(folder)
    outcome: list[str] | str
    manifest: dict[str, Any] = {}
    try:
        manifest = read_manifest(root)
        names = sorted(name for name in manifest["files"] if name.startswith(prefix))
        if not names:
            raise IncompleteCheckpointError(f"The manifest of {root} lists no files under {folder}.")
        outcome = find_problems(root, names[rank::world], checksums)
    except IncompleteCheckpointError as error:
        outcome = f"INCOMPLETE {error}"
    except CorruptedCheckpointError as error:
        outcome = [str(error)]
    gathered = _all_gather(outcome)
    for part in gathered:
        if isinstance(part, str):
            raise IncompleteCheckpointError(part.removeprefix("INCOMPLETE "))
    problems = sorted({problem for part in gathered for problem in part})
    if problems:
        raise CorruptedCheckpointError(f"Checkpoint {folder} is damaged; nothing was loaded: " + "; ".join(problems))
    return manifest


def is_complete(folder: str) -> bool:
    """True when ``folder`` has a manifest and every listed file exists with its recorded size (cheap: no hashing)."""
    try:
        return not find_problems(folder, checksums=False)
    except (IncompleteCheckpointError, CorruptedCheckpointError):
        return False


@dataclasses.dataclass(frozen=True)
class CheckpointEntry:
    """One checkpoint-like folder in a parent folder."""

    path: str
    number: int
    complete: bool
    staging: bool = False
    """True for the hidden leftover of an interrupted write."""


def list_checkpoints(parent: str, prefix: str = "checkpoint_") -> list[CheckpointEntry]:
    """Folders named ``{prefix}{N}`` (and staging leftovers of them) in ``parent``, by increasing N."""
    if not os.path.isdir(parent):
        return []
    pattern = re.compile(rf"^(\.)?{re.escape(prefix)}(\d+)({re.escape(_STAGING_SUFFIX)})?$")
    entries = []
    for name in os.listdir(parent):
        match = pattern.match(name)
        path = os.path.join(parent, name)
        if not match or not os.path.isdir(path) or bool(match.group(1)) != bool(match.group(3)):
            continue
        staging = bool(match.group(3))
        entries.append(CheckpointEntry(path, int(match.group(2)), complete=not staging and is_complete(path), staging=staging))
    return sorted(entries, key=lambda e: (e.number, e.staging))


def latest_complete_checkpoint(parent: str, prefix: str = "checkpoint_") -> str | None:
    """The complete checkpoint with the highest number in ``parent``; incomplete newer ones are skipped, with a warning."""
    entries = list_checkpoints(parent, prefix)
    complete = [e for e in entries if e.complete]
    newest = complete[-1] if complete else None
    skipped = [e.path for e in entries if not e.complete and (newest is None or e.number >= newest.number)]
    if skipped:
        logger.warning("Skipping incomplete checkpoints (interrupted writes, no valid %s): %s",
                       MANIFEST_NAME, ", ".join(skipped))
    return newest.path if newest else None


def rotate_checkpoints(parent: str, keep: int | None, protected: Iterable[str | None] = (),
                       prefix: str = "checkpoint_") -> list[str]:
    """Delete the oldest complete checkpoints so that at most ``keep`` remain — except the newest and any in
    ``protected`` (the best one, the one resumed from), which are never deleted. Call on one process.

    A folder is first renamed out of sight, then removed, so an interruption never leaves a
    half-deleted folder under a checkpoint name.
    """
    if not keep or keep < 1:
        return []
    complete = [e.path for e in list_checkpoints(parent, prefix) if e.complete]
    kept = {os.path.realpath(p) for p in protected if p}
    if complete:
        kept.add(os.path.realpath(complete[-1]))
    deleted: list[str] = []
    for folder in complete:
        if len(complete) - len(deleted) <= keep:
            break
        if os.path.realpath(folder) in kept:
            continue
        doomed = os.path.join(parent, f".{os.path.basename(folder)}{_DELETING_SUFFIX}")
        shutil.rmtree(doomed, ignore_errors=True)
        os.rename(folder, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        deleted.append(folder)
    if deleted:
        logger.info("Deleted %s (limit of %d checkpoints)", ", ".join(deleted), keep)
    return deleted
