"""The manifest that makes a checkpoint complete: every file's size and SHA-256, written after all of them.

A checkpoint is trusted only through its manifest: a folder (or an object-store prefix) without a valid
``manifest.json`` is an interrupted write, and a file whose size or checksum differs from it is damage. The format
is the same on every storage backend, so a checkpoint copied from one to another (``aws s3 sync`` down to a disk)
loads there. ``root`` (absent or empty: the checkpoint's own folder) names the sub-folder that holds the files when
an object store replaced a checkpoint in place (see :mod:`.object_store`).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from typing import Any

from ..errors import CorruptedCheckpointError

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "trainkit-checkpoint/1"
STAGING_SUFFIX = ".staging"
DELETING_SUFFIX = ".deleting"
DAMAGED_MARK = ".damaged-"
"""Suffix of a damaged checkpoint folder set aside by a later save of the same name."""


@dataclasses.dataclass(frozen=True)
class CheckpointEntry:
    """One checkpoint-like folder in a parent folder."""

    path: str
    number: int
    complete: bool
    staging: bool = False
    """True for the hidden leftover of an interrupted write."""


def build_manifest(files: dict[str, Any], world_size: int, metadata: dict[str, Any] | None,
                   root: str = "") -> bytes:
    """The manifest of a checkpoint whose files (relative names -> size and sha256) were all written and checked."""
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "world_size": world_size,
        "files": dict(sorted(files.items())),
        "metadata": metadata or {},
    }
    if root:
        manifest["root"] = root
    return json.dumps(manifest, allow_nan=False).encode("utf-8")


def parse_manifest(data: bytes, where: str) -> dict[str, Any]:
    """The manifest in ``data`` (read from ``where``); CorruptedCheckpointError when it is not one."""
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise CorruptedCheckpointError(f"{where} is not valid JSON ({error}).") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT \
            or not isinstance(manifest.get("files"), dict):
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise CorruptedCheckpointError(f"{where} is not a trainkit manifest (format {found!r}).")
    return manifest


def damaged_stamp() -> str:
    """The UTC time a damaged folder is set aside at, as it appears in its new name."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
