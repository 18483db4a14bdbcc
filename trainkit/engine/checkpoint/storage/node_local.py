"""Each node's own disk: every process writes and reads its part of a checkpoint in a folder of its node.

For jobs whose machines share no file system (Kubernetes pods with local volumes, Ray workers on their own disks),
and for Accelerate's habit of giving ``save_state`` a different folder on each process (a ``tempfile`` folder per
rank). The processes that name the same folder on the same machine form a *holder*; each holder's first process
writes the files a single process writes in a shared folder (full weights, optimizer, JSON), every process its own
(random states, its DCP shards, with a ``.metadata`` per holder), and each holder commits its folder with the atomic
rename of :mod:`.shared_folder`. One commit all holders agree on: a failure on any process abandons the checkpoint
on every node, and the manifests carry one token, which loading checks, so the folders read together are parts of
one checkpoint. Resuming needs the same layout (the same processes per folder); a different one is refused naming
what is missing and where it was written.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from ..errors import CheckpointError
from .ranks import Ranks
from .shared_folder import SharedFolderStorage

logger = logging.getLogger("trainkit.engine.checkpoint.storage")

Holders = tuple[tuple[int, ...], ...]


class NodeLocalStorage(SharedFolderStorage):
    """Checkpoints split over each node's own folder (see the module doc).

    ``by_machine``: the same path names a different disk on every machine (``save_on_each_node=True``), so the
    processes of one machine form a holder; otherwise the processes that pass the same folder do (on one machine).
    """

    name = "each node's own folder"

    def __init__(self, by_machine: bool = True) -> None:
        self.by_machine = by_machine
        self.holders: Holders = ()
        """Every holder's processes (by rank), as the last :meth:`participants` found them."""

    def participants(self, location: str, ranks: Ranks) -> Ranks:
        key = (socket.gethostname() if self.by_machine else "", os.path.abspath(location))
        keys = ranks.gather_all(key)
        self.holders = tuple(tuple(rank for rank, other in enumerate(keys) if other == first)
                             for first in dict.fromkeys(keys))
        return ranks.among([rank for rank, other in enumerate(keys) if other == keys[ranks.me]])

    def _agree(self, final_dir: str, existing: str, ranks: Ranks) -> str:
        """A complete part whose checkpoint other nodes do not hold complete (a commit interrupted on another node)
        counts as damaged: it is set aside (or refused), never taken for a checkpoint of this run."""
        token = None
        if ranks.is_leader and existing == "complete":
            token = self.read_manifest(final_dir).get("metadata", {}).get("commit")
        seen = [found for found in ranks.gather_all((existing, token) if ranks.is_leader else None) if found]
        whole = all(state == "complete" for state, _ in seen) and len({token for _, token in seen}) == 1
        return "damaged" if existing == "complete" and not whole else existing


def layout_error(folder: str, saved: list[list[int]], rank: int, needs: list[str]) -> CheckpointError:
    """The error of a load that needs parts another node's processes wrote into their own folder."""
    where = ", ".join("+".join(map(str, holder)) for holder in saved)
    return CheckpointError(
        f"{folder} is one node's part of a checkpoint that each node wrote into its own folder (processes {where}); "
        f"rank {rank} of this run reads it and needs {', '.join(needs)}, which the other nodes' processes wrote "
        "into their own folders. Resume with the same layout (the same processes writing the same folders), or save "
        "into a folder every process shares (or an object store) to resume on another number of processes; nothing "
        "was loaded.")
