"""Checkpoints that never lose work: atomic, pickle-free, exact and reshardable, in any storage.

The face is the Accelerator's :class:`.checkpointer.Checkpointer` (``accelerator.checkpointer``): ``save_state`` /
``load_state`` and the Trainer's ``checkpoint-N`` folders both go through it. Storage backends live in
:mod:`.storage` (a shared folder, each node's own disk, object stores). For code that writes its own checkpoint
folders on a disk, the shared-folder protocol is also available as functions (:mod:`.atomic`), with the errors.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .accelerator_state import write_state_files
    from .atomic import (
        MANIFEST_NAME,
        CheckpointEntry,
        atomic_checkpoint,
        begin_checkpoint,
        commit_checkpoint,
        is_complete,
        latest_complete_checkpoint,
        list_checkpoints,
        read_manifest,
        rotate_checkpoints,
        verify_checkpoint,
    )
    from .checkpointer import Checkpointer
    from .errors import (
        CheckpointError,
        CheckpointMismatchError,
        CorruptedCheckpointError,
        IncompleteCheckpointError,
    )
    from .global_batch import BatchShape, GlobalBatchError, keep_global_batch
    from .resume_folder import (
        ACCELERATOR_CONVENTION,
        TRAINER_CONVENTION,
        FolderConvention,
        elastic_reason,
        find_resume_folder,
        latest_checkpoint_in,
        restart_count,
    )
    from .staged import StagedCheckpoint
    from .storage import AtomicPosixIO, CheckpointIO, CheckpointStorage
    from .storage.registry import check_location

# Names load on first use (PEP 562): the Trainer's import needs the folder conventions and the errors, not the
# checkpointer, the state readers and writers; those load when a checkpointer is made (benchmarks/first_step.py).
_EXPORTS: dict[str, str] = {
    "write_state_files": "accelerator_state",
    **{name: "atomic" for name in (
        "MANIFEST_NAME", "CheckpointEntry", "atomic_checkpoint", "begin_checkpoint", "commit_checkpoint",
        "is_complete", "latest_complete_checkpoint", "list_checkpoints", "read_manifest", "rotate_checkpoints",
        "verify_checkpoint")},
    "Checkpointer": "checkpointer",
    **{name: "errors" for name in (
        "CheckpointError", "CheckpointMismatchError", "CorruptedCheckpointError", "IncompleteCheckpointError")},
    **{name: "global_batch" for name in ("BatchShape", "GlobalBatchError", "keep_global_batch")},
    **{name: "resume_folder" for name in (
        "ACCELERATOR_CONVENTION", "TRAINER_CONVENTION", "FolderConvention", "elastic_reason", "find_resume_folder",
        "latest_checkpoint_in", "restart_count")},
    "StagedCheckpoint": "staged",
    **{name: "storage" for name in ("AtomicPosixIO", "CheckpointIO", "CheckpointStorage")},
    "check_location": "storage.registry",
}
"""Exported name -> the submodule of this package that defines it."""


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def save_accelerator_state(accelerator: Any, output_dir: str | os.PathLike | None = None, **kwargs: Any) -> str | None:
    """``accelerator.checkpointer.save_state(output_dir, ...)``."""
    return accelerator.checkpointer.save_state(output_dir, **kwargs)


def load_accelerator_state(accelerator: Any, input_dir: str | os.PathLike | None = None, **kwargs: Any) -> str | None:
    """``accelerator.checkpointer.load_state(input_dir, ...)``."""
    return accelerator.checkpointer.load_state(input_dir, **kwargs)


__all__ = [
    "ACCELERATOR_CONVENTION",
    "MANIFEST_NAME",
    "TRAINER_CONVENTION",
    "AtomicPosixIO",
    "BatchShape",
    "GlobalBatchError",
    "CheckpointEntry",
    "CheckpointError",
    "CheckpointIO",
    "CheckpointMismatchError",
    "CheckpointStorage",
    "Checkpointer",
    "CorruptedCheckpointError",
    "FolderConvention",
    "IncompleteCheckpointError",
    "StagedCheckpoint",
    "atomic_checkpoint",
    "check_location",
    "begin_checkpoint",
    "commit_checkpoint",
    "elastic_reason",
    "find_resume_folder",
    "is_complete",
    "keep_global_batch",
    "latest_checkpoint_in",
    "latest_complete_checkpoint",
    "list_checkpoints",
    "load_accelerator_state",
    "read_manifest",
    "restart_count",
    "rotate_checkpoints",
    "save_accelerator_state",
    "verify_checkpoint",
    "write_state_files",
]
