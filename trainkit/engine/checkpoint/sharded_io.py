"""Sharded tensors through torch.distributed.checkpoint (DCP), kept pickle-free on the way back in.

DCP writes each rank's shards once and reads them back on any number of ranks (resharding). Two of
its defaults would run pickle on load: the ``.metadata`` file is read with ``pickle.load``, and
non-tensor values are unpickled by ``torch.load`` without the weights-only guard. So only tensors are ever given
to DCP (everything else goes to JSON), the metadata is read by an unpickler that accepts nothing but
DCP's own metadata records, and the load planner refuses non-tensor items.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from . import dcp_metadata
from .dcp_metadata import METADATA_FILE
from .errors import CheckpointError, dcp_errors_as_checkpoint_errors

if TYPE_CHECKING:
    from .storage.base import CheckpointStorage

__all__ = ["METADATA_FILE", "load_full_tensors", "load_sharded", "read_dcp_metadata", "saved_tensor_shapes",
           "write_sharded_now"]


def read_dcp_metadata(path: str, storage: CheckpointStorage | None = None) -> Metadata:
    """The DCP ``.metadata`` of the folder ``path`` (on ``storage``, default: the local disk), read without pickle."""
    return dcp_metadata.read_dcp_metadata(path, storage or _local_storage())


def _local_storage() -> CheckpointStorage:
    from .storage.shared_folder import SharedFolderStorage

    return SharedFolderStorage()


class TensorsOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, except that non-tensor items (which DCP unpickles) are refused."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        raise CheckpointError(f"Refusing to unpickle the non-tensor item {read_item.dest_index.fqn!r} of a sharded checkpoint.")


def saved_tensor_shapes(path: str, storage: CheckpointStorage | None = None) -> dict[str, tuple[int, ...]]:
    """Every tensor's global shape in the sharded checkpoint at ``path``."""
    metadata = read_dcp_metadata(path, storage)
    return {key: tuple(item.size) for key, item in metadata.state_dict_metadata.items()
            if isinstance(item, TensorStorageMetadata)}


def _no_dist() -> bool:
    return not (dist.is_available() and dist.is_initialized())


@contextlib.contextmanager
def _one_process_is_intended() -> Iterator[None]:
    """DCP warns when it runs without a process group; for one process that is exactly what is meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def write_sharded_now(storage: CheckpointStorage, tensors: dict[str, torch.Tensor], path: str,
                      group: Any = None) -> None:
    """Collective on ``group`` (default: every process): write ``{key: tensor or DTensor}`` to the folder ``path``
    on ``storage``, each shard by its owner."""
    if any(not isinstance(value, torch.Tensor) for value in tensors.values()):
        raise TypeError("Sharded checkpoint files store tensors only; put other values in JSON.")
    from .storage.ranks import SOLO

    alone = group is SOLO or _no_dist()
    with dcp_errors_as_checkpoint_errors("save", path), _one_process_is_intended():
        dcp.save(tensors, storage_writer=storage.dcp_writer(path), process_group=None if alone else group,
                 no_dist=alone)


def load_sharded(storage: CheckpointStorage, targets: dict[str, torch.Tensor], path: str, group: Any = None) -> None:
    """Collective on ``group``: fill ``targets`` (tensors or DTensors, any sharding) in place from ``path``."""
    with dcp_errors_as_checkpoint_errors("load", path), _one_process_is_intended():
        dcp.load(targets, storage_reader=storage.dcp_reader(path), planner=TensorsOnlyLoadPlanner(),
                 process_group=group, no_dist=_no_dist())


def load_full_tensors(path: str) -> dict[str, torch.Tensor]:
    """Read a sharded checkpoint into full CPU tensors on this process alone (for merging to safetensors)."""
    targets: dict[str, torch.Tensor] = {}
    metadata = read_dcp_metadata(path)
    for key, item in metadata.state_dict_metadata.items():
        if not isinstance(item, TensorStorageMetadata):
            raise CheckpointError(f"{path} holds a non-tensor item {key!r}; trainkit never writes those.")
        targets[key] = torch.empty(item.size, dtype=item.properties.dtype)
    with dcp_errors_as_checkpoint_errors("load", path), _one_process_is_intended():
        dcp.load(targets, storage_reader=_local_storage().dcp_reader(path), planner=TensorsOnlyLoadPlanner(),
                 no_dist=True)
    return targets
