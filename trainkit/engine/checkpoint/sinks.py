"""Where the checkpoint writers put their files: an explicit object handed to every writer.

The writers of this package (JSON, safetensors, DCP shards, full tensors gathered from shards) never open a path:
they call the :class:`FileSink` they are given. :class:`WriteNow` writes through the checkpoint's storage at once
(a synchronous save, and the background writer replaying a captured one); :class:`~.staging.DeferredWrites`
records the writes of an asynchronous save while the loop captures it, to be replayed by the background writer
into a :class:`WriteNow` (the hidden context variable the writers once consulted is gone).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .storage.base import CheckpointStorage


def write_tensors_now(storage: CheckpointStorage, tensors: dict[str, torch.Tensor], path: str) -> None:
    """Write a safetensors file now: directly on a disk, as bytes elsewhere."""
    from .serialization import safetensors_bytes, write_safetensors_file

    local = storage.local_path(path)
    if local is not None:
        storage.make_dirs(storage.parent(path))
        write_safetensors_file(tensors, local)
    else:
        storage.write_bytes(path, safetensors_bytes(tensors))


class FileSink:
    """The files of one checkpoint being written: what every writer calls."""

    defers = False
    """True while an asynchronous save is captured: tensors are staged, written later by the background writer."""

    def __init__(self, storage: CheckpointStorage) -> None:
        self.storage = storage

    def tensors(self, tensors: dict[str, torch.Tensor], path: str) -> None:
        """A safetensors file of plain tensors, written by this process."""
        raise NotImplementedError

    def sharded(self, tensors: dict[str, torch.Tensor], path: str) -> None:
        """Collective: a DCP folder of (distributed) tensors, each shard written by its owner."""
        raise NotImplementedError

    def gathered(self, tensors: dict[str, torch.Tensor], path: str) -> bool:
        """Collective: full tensors gathered from these shards by the background writer, written as one safetensors
        file; False where that is not possible (the caller gathers now)."""
        return False

    def data(self, data: bytes, path: str) -> None:
        """A small file (JSON, a tokenizer file)."""
        raise NotImplementedError


class WriteNow(FileSink):
    """Writes at once through ``storage``. ``dcp_group``: the process group DCP's collectives run on (the default
    group, the background writer's, or one node's for each node's own folder). ``durable=False``: small files are
    not flushed one by one, the commit's checksum pass makes every file durable before the manifest."""

    def __init__(self, storage: CheckpointStorage, dcp_group: Any = None, durable: bool = True) -> None:
        super().__init__(storage)
        self.dcp_group = dcp_group
        self.durable = durable

    def tensors(self, tensors: dict[str, torch.Tensor], path: str) -> None:
        write_tensors_now(self.storage, tensors, path)

    def sharded(self, tensors: dict[str, torch.Tensor], path: str) -> None:
        from .sharded_io import write_sharded_now

        write_sharded_now(self.storage, tensors, path, self.dcp_group)

    def data(self, data: bytes, path: str) -> None:
        self.storage.write_bytes(path, data, durable=self.durable)
