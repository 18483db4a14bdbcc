"""Who takes part in one checkpoint operation, and how they agree: every process, one node's processes, or one
process alone.

The commit protocol is collective: the processes that write a checkpoint confirm their writes, share the
checksumming and learn the outcome together. :class:`Ranks` names them explicitly (instead of "the default process
group"), so the same protocol runs for a checkpoint every process writes into one shared folder, for the part one
node writes into its own disk (its processes take part; every other process joins the same collectives, so the
nodes stay in step), for the background writer's own process group, and for the main process saving alone (no
collective at all).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch.distributed as dist

from ..errors import CheckpointError

T = TypeVar("T")

SOLO: Any = "solo"
"""The ``group`` of a process that acts alone (the others are not taking part): no collective is run."""


def describe(value: Any) -> str:
    """``TypeName: message`` of an error, for messages that cross processes."""
    return f"{type(value).__name__}: {value}" if isinstance(value, BaseException) else str(value)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


@dataclasses.dataclass(frozen=True)
class Ranks:
    """The processes of ``group`` that take part (``members``, by rank in ``group``) and this process's rank there.

    Every collective here is run by *every* process of ``group`` (members or not), so that several sets of members
    (one per node) can run the same protocol side by side; each gets its members' values.
    """

    members: tuple[int, ...]
    me: int
    group: Any = None

    @classmethod
    def everyone(cls, group: Any = None) -> Ranks:
        """Every process of ``group`` (default: all processes); this process alone when there is no process group."""
        if group is SOLO or not _distributed():
            return cls.alone()
        return cls(tuple(range(dist.get_world_size(group))), dist.get_rank(group), group)

    @classmethod
    def alone(cls, rank: int = 0) -> Ranks:
        """This process on its own: nothing waits for any other."""
        return cls((rank,), rank, SOLO)

    def among(self, members: Sequence[int]) -> Ranks:
        """The same group, other members (e.g. the processes of one node)."""
        return dataclasses.replace(self, members=tuple(sorted(members)))

    @property
    def solo(self) -> bool:
        """True when no collective runs (one process acting alone)."""
        return self.group is SOLO or not _distributed()

    @property
    def size(self) -> int:
        """How many processes take part."""
        return len(self.members)

    @property
    def index(self) -> int:
        """This process's position among the members."""
        return self.members.index(self.me)

    @property
    def leader(self) -> int:
        """The member that does the one-process work (creating, publishing): the lowest rank."""
        return self.members[0]

    @property
    def is_leader(self) -> bool:
        """True on the leader."""
        return self.me == self.leader

    @property
    def world(self) -> int:
        """Processes in the group (all of them join every collective)."""
        return 1 if self.solo else dist.get_world_size(self.group)

    def gather_all(self, value: Any) -> list[Any]:
        """Every process's ``value`` in rank order (small JSON-like values only)."""
        if self.solo:
            return [value]
        gathered: list[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(gathered, value, group=self.group)
        return gathered

    def gather(self, value: Any) -> list[Any]:
        """The members' ``value``, in member order."""
        if self.solo:
            return [value]
        everyone = self.gather_all(value)
        return [everyone[rank] for rank in self.members]

    def decide(self, action: str, function: Callable[[], T]) -> T:
        """Run ``function`` on the leader; every member gets its result. When any leader of the group fails (of
        any node, with each node's own folder), every process raises a CheckpointError naming the failures, so the
        processes never part ways in the middle of a collective protocol."""
        outcome: tuple[Any, str | None] = (None, None)
        if self.is_leader:
            try:
                outcome = (function(), None)
            except Exception as error:  # raised on every process below, so nobody waits forever
                outcome = (None, describe(error))
        everyone = self.gather_all(outcome)
        failures = list(dict.fromkeys(failure for _, failure in everyone if failure))
        if failures:
            raise CheckpointError(f"Could not {action}: " + "; ".join(failures))
        return everyone[0 if self.solo else self.leader][0]

    def raise_anywhere(self, problem: str | None, prefix: str, error: type[Exception] = CheckpointError) -> None:
        """Collective: raise ``error`` on every process when any process has a ``problem`` (each names its own)."""
        problems = list(dict.fromkeys(p for p in self.gather_all(problem) if p))
        if problems:
            raise error(prefix + "; ".join(problems))

    @staticmethod
    def raise_if_any_failed(failures: list[str | None], action: str) -> None:
        """``failures``: every process's error string or None (:meth:`gather_all`); raise one error naming every
        failing rank if any."""
        named = [f"rank {rank}: {error}" for rank, error in enumerate(failures) if error]
        if named:
            raise CheckpointError(f"Could not {action}: " + "; ".join(named))
