"""Checkpoints that never lose work: atomic folders, pickle-free state, exact and reshardable resume.

Public pieces: the atomic writer and finder (:mod:`.atomic`, shared with the Trainer's
``checkpoint-N`` folders), the storage seam (:mod:`.storage`: ``CheckpointIO``, default ``AtomicPosixIO``),
asynchronous saves (:mod:`.async_writer`, :mod:`.staging`), the Accelerator's state (:mod:`.accelerator_state`),
and the errors.
"""

from .accelerator_state import load_accelerator_state, save_accelerator_state, write_state_files
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
from .errors import (
    CheckpointError,
    CheckpointMismatchError,
    CorruptedCheckpointError,
    IncompleteCheckpointError,
)
from .resume_folder import find_resume_folder, latest_checkpoint_in, restart_count
from .storage import AtomicPosixIO, CheckpointIO

__all__ = [
    "MANIFEST_NAME",
    "AtomicPosixIO",
    "CheckpointIO",
    "CheckpointEntry",
    "CheckpointError",
    "CheckpointMismatchError",
    "CorruptedCheckpointError",
    "IncompleteCheckpointError",
    "atomic_checkpoint",
    "begin_checkpoint",
    "commit_checkpoint",
    "is_complete",
    "latest_complete_checkpoint",
    "find_resume_folder",
    "latest_checkpoint_in",
    "list_checkpoints",
    "load_accelerator_state",
    "read_manifest",
    "restart_count",
    "rotate_checkpoints",
    "save_accelerator_state",
    "verify_checkpoint",
    "write_state_files",
]
