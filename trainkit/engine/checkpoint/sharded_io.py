"""Sharded tensors through torch.distributed.checkpoint (DCP), kept pickle-free on the way back in.

DCP writes each rank's shards once and reads them back on any number of ranks (resharding). Two of
its defaults would run pickle on load: the ``.metadata`` file is read with ``pickle.load``, and
non-tensor values are unpickled by ``torch.load`` without the weights-only guard. So only tensors are ever given
to DCP (everything else goes to JSON), the metadata is read by an unpickler that accepts nothing but
DCP's own metadata records, and the load planner refuses non-tensor items.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import io
import pickle
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from .errors import CheckpointError, dcp_errors_as_checkpoint_errors

if TYPE_CHECKING:
    from .storage.base import CheckpointStorage

METADATA_FILE = ".metadata"
_DCP_PACKAGE = "torch.distributed.checkpoint."
_PATH_CLASSES = {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"}


class _MetadataUnpickler(pickle.Unpickler):
    """Reconstructs DCP metadata records only; any other global in the file is refused before it runs."""

    def find_class(self, module: str, name: str) -> Any:
        if module.startswith(_DCP_PACKAGE):
            found = super().find_class(module, name)
            if isinstance(found, type) and (dataclasses.is_dataclass(found) or issubclass(found, enum.Enum)):
                return found
        elif module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None), torch.dtype)):
            return getattr(torch, name)
        elif (module, name) == ("torch.serialization", "_get_layout"):
            return super().find_class(module, name)
        elif module == "pathlib" and name in _PATH_CLASSES:
            return super().find_class(module, name)
        elif (module, name) == ("collections", "OrderedDict"):
            return super().find_class(module, name)
        raise CheckpointError(f"Refusing to load {module}.{name} from a checkpoint's DCP metadata (only DCP records are allowed).")


def read_dcp_metadata(path: str, storage: CheckpointStorage | None = None) -> Metadata:
    """The DCP ``.metadata`` of the folder ``path`` (on ``storage``, default: the local disk), read without running
    code from it."""
    storage = storage or _local_storage()
    metadata_path = storage.join(path, METADATA_FILE)
    try:
        data = storage.read_bytes(metadata_path)
    except FileNotFoundError:
        raise CheckpointError(f"{path} holds no sharded checkpoint (no {METADATA_FILE}).") from None
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError) as error:
        raise CheckpointError(f"{metadata_path} cannot be read ({type(error).__name__}: {error}).") from None
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{metadata_path} does not hold DCP metadata.")
    return metadata


def _local_storage() -> CheckpointStorage:
    from .storage.shared_folder import SharedFolderStorage

    return SharedFolderStorage()


def pickle_free_reader(base: type, path: str, storage: CheckpointStorage, **options: Any) -> Any:
    """DCP's reader ``base`` (``FileSystemReader``, ``FsspecReader``) for ``path``, with its metadata read through
    ``storage`` by the pickle-free reader (tensors are read with ``weights_only=True`` by DCP)."""

    class PickleFreeReader(base):  # type: ignore[misc, valid-type]
        def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
            if kwargs.get("rank") is not None:
                raise CheckpointError("Per-rank DCP metadata files are not supported by trainkit checkpoints.")
            metadata = read_dcp_metadata(path, storage)
            from torch.distributed.checkpoint.metadata import StorageMeta

            storage_meta = getattr(metadata, "storage_meta", None)
            if storage_meta is None:
                storage_meta = metadata.storage_meta = StorageMeta()
            storage_meta.load_id = self.load_id
            return metadata

    return PickleFreeReader(path, **options)


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
