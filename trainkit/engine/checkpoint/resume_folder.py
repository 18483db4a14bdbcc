"""Which checkpoint folder a run resumes from: the one function the Accelerator and the Trainer both ask.

Two folder conventions exist: the Trainer's ``output_dir/checkpoint-N`` (N = global step) and the
Accelerator's automatic naming ``project_dir/checkpoints/checkpoint_N`` (N = save count). "Latest" is
the complete checkpoint with the highest N of the first convention that has any (interrupted writes are
skipped, with a warning); resuming from the latest automatically takes the newest one that also verifies
(sizes and checksums), so one damaged checkpoint costs the steps since the one before it, not the run. When torchelastic restarts a job's workers (``trainkit launch --max_restarts``),
the unchanged script resumes from the latest by itself, or starts afresh when none was written yet.
Folders are listed and verified through the run's storage backend (:class:`~.storage.base.CheckpointStorage`), so a
backend that writes elsewhere is also where resuming looks.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import NamedTuple

from .errors import CorruptedCheckpointError, IncompleteCheckpointError
from .storage import DEFAULT_CHECKPOINT_IO
from .storage.base import CheckpointStorage
from .storage.ranks import Ranks

logger = logging.getLogger(__name__)

RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"
"""Set by torchelastic in every worker: how many times the worker group was restarted (0 on the first attempt)."""


class FolderConvention(NamedTuple):
    """Where numbered checkpoints live under a run's folder, and how they are named."""

    subfolder: str
    prefix: str


TRAINER_CONVENTION = FolderConvention("", "checkpoint-")
ACCELERATOR_CONVENTION = FolderConvention("checkpoints", "checkpoint_")
ALL_CONVENTIONS = (TRAINER_CONVENTION, ACCELERATOR_CONVENTION)


def elastic_reason(elastic: bool) -> str | None:
    """The automatic-resume reason of an elastic job (``EngineConfig.elastic``), else None. torchelastic restarts
    its workers on a membership change without counting a restart, and a joining machine's workers start at
    count 0, so in an elastic job every start of the script may be a continuation."""
    return "Elastic job (machines may have left or joined)" if elastic else None


def restart_count() -> int:
    """How many times torchelastic restarted this job's workers (``TORCHELASTIC_RESTART_COUNT``; 0 outside it)."""
    try:
        return int(os.environ.get(RESTART_COUNT_ENV, "0") or 0)
    except ValueError:
        return 0


def _parent(storage: CheckpointStorage, run_dir: str, convention: FolderConvention) -> str:
    return storage.join(run_dir, convention.subfolder) if convention.subfolder else storage.normalize(run_dir)


def latest_checkpoint_in(run_dir: str, conventions: Sequence[FolderConvention] = ALL_CONVENTIONS,
                         io: CheckpointStorage = DEFAULT_CHECKPOINT_IO) -> str | None:
    """The newest complete checkpoint under ``run_dir``, in the first convention that has one (one process)."""
    for convention in conventions:
        latest = io.latest(_parent(io, run_dir, convention), convention.prefix)
        if latest is not None:
            return latest
    return None


def _complete_newest_first(run_dir: str, conventions: Sequence[FolderConvention], io: CheckpointStorage) -> list[str]:
    """One process: the complete checkpoints of the first convention that has any, newest first."""
    for convention in conventions:
        parent = _parent(io, run_dir, convention)
        if io.latest(parent, convention.prefix) is not None:  # warns about newer incomplete ones
            return [entry.path for entry in reversed(io.list(parent, convention.prefix)) if entry.complete]
    return []


def _on_every_holder(candidates: list[str], ranks: Ranks) -> list[str]:
    """With each node's own folder: the candidates (by name) every node's folder holds complete, so that all
    nodes resume from the same checkpoint (one committed on some nodes only is skipped)."""
    if ranks.solo or ranks.size == ranks.world:
        return candidates
    named = {os.path.basename(folder): folder for folder in candidates}
    everywhere = set(named)
    for names in ranks.gather_all(sorted(named)):
        everywhere &= set(names)
    return [folder for folder in candidates if os.path.basename(folder) in everywhere]


def newest_sound_checkpoint(run_dir: str, conventions: Sequence[FolderConvention] = ALL_CONVENTIONS,
                            io: CheckpointStorage = DEFAULT_CHECKPOINT_IO, ranks: Ranks | None = None) -> str | None:
    """Collective: the newest complete checkpoint under ``run_dir`` whose files match their checksums; newer
    ones that do not are skipped with a warning naming what is wrong (and left in place)."""
    ranks = ranks or Ranks.everyone()
    candidates = ranks.decide("list the checkpoints", lambda: _complete_newest_first(run_dir, conventions, io))
    for folder in _on_every_holder(candidates, ranks):
        try:
            io.read(folder, ranks=ranks)  # raises on every process, or on none
        except (CorruptedCheckpointError, IncompleteCheckpointError) as error:
            if ranks.me == 0:
                logger.warning("Skipping %s for resuming: %s", folder, error)
            continue
        return folder
    return None


def find_resume_folder(requested: str | os.PathLike | bool | None, run_dir: str | None, *,
                       latest_when_unset: bool = False,
                       conventions: Sequence[FolderConvention] = ALL_CONVENTIONS,
                       automatic_reason: str | None = None,
                       io: CheckpointStorage = DEFAULT_CHECKPOINT_IO, ranks: Ranks | None = None) -> str | None:
    """Collective: the checkpoint folder to resume from, or None to start from the beginning.

    ``requested``: a folder (must exist; loading verifies it); ``True``: the newest checkpoint under ``run_dir``
    that verifies (:func:`newest_sound_checkpoint`; an error when there is none); ``False``: never resume; None: the
    latest when ``latest_when_unset`` (an error when there is none), else nothing. After a torchelastic restart, or
    when the caller gives an ``automatic_reason`` (e.g. "the previous run was preempted"), None means the latest, and
    finding none is not an error: the run starts afresh, and a warning says which. Rank 0 decides, so every rank
    gets one answer (with each node's own folder, the newest checkpoint every node holds).
    """
    if requested is False:
        return None
    if requested is not None and requested is not True:
        folder = io.normalize(os.fspath(requested))
        if not io.is_dir(folder):
            raise FileNotFoundError(f"Cannot resume from {folder!r}: no such folder.")
        return folder
    restarts = restart_count() if requested is None else 0
    reason = f"Restart {restarts} of this job" if restarts else automatic_reason if requested is None else None
    if requested is None and not latest_when_unset and not reason:
        return None
    if run_dir is None:
        raise ValueError("Resuming from the latest checkpoint needs the run's folder (output_dir or project_dir).")
    latest = newest_sound_checkpoint(run_dir, conventions, io, ranks)
    if latest is None and not reason:
        raise FileNotFoundError(f"No complete checkpoint under {run_dir} to resume from.")
    if reason and _is_rank0():
        if latest is None:
            logger.warning("%s: no complete checkpoint under %s yet, so nothing is loaded and training starts "
                           "from the beginning.", reason, run_dir)
        else:
            logger.warning("%s: resuming automatically from %s, the newest checkpoint that verifies.", reason, latest)
    return latest


def _is_rank0() -> bool:
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
