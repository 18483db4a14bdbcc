"""Checkpoint storage: a contract (:mod:`.base`), three backends and the choice between them (:mod:`.registry`).

- :class:`.shared_folder.SharedFolderStorage`: a folder every process sees, committed by one rename (the default);
- :class:`.node_local.NodeLocalStorage`: each node's own disk, every process writing and reading its part there;
- :class:`.object_store.ObjectStoreStorage`: object stores through fsspec, committed by a manifest written last.

``accelerator.checkpoint_storage = MyStorage()`` makes every checkpoint of that Accelerator (``save_state``, the
Trainer's ``checkpoint-N``, the background writer, rotation, finding and verifying the folder to resume from) go
through another backend: one file implementing :class:`.base.CheckpointStorage`.
"""

from __future__ import annotations

from .base import CheckpointStorage
from .manifest import CheckpointEntry
from .node_local import NodeLocalStorage
from .ranks import Ranks
from .registry import storage_for, url_scheme
from .shared_folder import SharedFolderStorage

CheckpointIO = CheckpointStorage
"""The contract's earlier name (``stage``, ``commit``, ``list``, ``latest``, ``read``, ``rotate`` keep their meaning)."""
AtomicPosixIO = SharedFolderStorage
"""The default backend's earlier name."""
DEFAULT_CHECKPOINT_IO: CheckpointStorage = SharedFolderStorage()


__all__ = ["AtomicPosixIO", "CheckpointEntry", "CheckpointIO", "CheckpointStorage", "DEFAULT_CHECKPOINT_IO",
           "NodeLocalStorage", "Ranks", "SharedFolderStorage", "storage_for", "url_scheme"]
