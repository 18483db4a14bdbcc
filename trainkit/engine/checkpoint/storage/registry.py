"""Which storage backend a checkpoint location goes to.

A local path (or a ``file://`` URL) goes to a folder: :class:`.shared_folder.SharedFolderStorage`, or
:class:`.node_local.NodeLocalStorage` with ``save_on_each_node`` (each machine's own disk under the same path).
A URL whose scheme fsspec knows (``s3://``, ``gs://``, ``az://``, ``memory://``, ``hf://``...) goes to
:class:`.object_store.ObjectStoreStorage`. Any other ``scheme://`` is refused by name: it is never taken for a
folder name (``save_state("s3://bucket/run")`` once wrote a local folder ``s3:/bucket/run``).
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import CheckpointError
from .base import CheckpointStorage

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+)://")
LOCAL_SCHEMES = ("file", "local")


def url_scheme(location: str) -> str | None:
    """The ``scheme`` of ``scheme://...`` (lower case), or None for a plain path."""
    match = _URL.match(str(location))
    return match.group(1).lower() if match else None


def local_path(location: str) -> str:
    """A plain path for a local location (``file:///x`` -> ``/x``)."""
    return _URL.sub("", str(location), count=1) if url_scheme(location) in LOCAL_SCHEMES else str(location)


def check_object_store(scheme: str, location: str) -> None:
    """Refuse, by name, a URL no backend handles (fsspec has no such filesystem, or its package is missing)."""
    try:
        import fsspec
    except ImportError:  # pragma: no cover - fsspec comes with datasets
        raise CheckpointError(f"{location}: checkpoints in object stores go through fsspec, which is not installed "
                              "(pip install fsspec and the store's package, e.g. s3fs).") from None
    try:
        fsspec.get_filesystem_class(scheme)
    except ValueError:
        raise CheckpointError(
            f"No checkpoint storage handles {scheme}:// (in {location!r}): it is not a folder, and fsspec knows no "
            f"{scheme!r} filesystem. Use a local folder, or an object-store URL such as s3://, gs://, az:// or "
            "memory://.") from None
    except ImportError as error:
        raise CheckpointError(f"Checkpoints in {scheme}:// ({location}) need the package of fsspec's {scheme!r} "
                              f"filesystem: {error}") from None


def storage_for(location: str, *, per_node: bool = False, options: dict[str, Any] | None = None) -> CheckpointStorage:
    """The backend for ``location`` (see the module doc); ``per_node``: local folders are each machine's own disk."""
    scheme = url_scheme(location)
    if scheme is None or scheme in LOCAL_SCHEMES:
        from .node_local import NodeLocalStorage
        from .shared_folder import SharedFolderStorage

        return NodeLocalStorage(by_machine=True) if per_node else SharedFolderStorage()
    check_object_store(scheme, location)
    from .object_store import ObjectStoreStorage

    return ObjectStoreStorage(**(options or {}))


def check_location(location: str, where: str = "the checkpoint location") -> None:
    """Refuse, now and by name, a location no backend handles (``where`` says whose value it is)."""
    scheme = url_scheme(location)
    if scheme is not None and scheme not in LOCAL_SCHEMES:
        try:
            check_object_store(scheme, location)
        except CheckpointError as error:
            raise CheckpointError(f"{where}: {error}") from None
