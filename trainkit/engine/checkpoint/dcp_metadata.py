"""DCP's ``.metadata`` read without pickle's power to run code, through a checkpoint storage.

DCP stores its metadata with ``pickle``; loading it as DCP does would run whatever a file names. The unpickler here
accepts DCP's own metadata records and nothing else, and :func:`pickle_free_reader` makes any of DCP's readers
(``FileSystemReader``, ``FsspecReader``) read its metadata this way, through the checkpoint's storage.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import pickle
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.checkpoint.metadata import Metadata

from .errors import CheckpointError

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


def read_dcp_metadata(path: str, storage: CheckpointStorage) -> Metadata:
    """The DCP ``.metadata`` of the folder ``path`` on ``storage``, read without running code from it."""
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


def pickle_free_reader(base: type, path: str, storage: CheckpointStorage, **options: Any) -> Any:
    """DCP's reader ``base`` (``FileSystemReader``, ``FsspecReader``) for ``path``, with its metadata read through
    ``storage`` by the pickle-free reader (tensors are read with ``weights_only=True`` by DCP)."""

    class PickleFreeReader(base):  # type: ignore[misc, valid-type]  # DCP's reader class, given at run time
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
