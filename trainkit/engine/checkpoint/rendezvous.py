"""Who takes part in a ``save_state``: every process, or the main process alone.

Accelerate lets a script save unsharded training from the main process only (``if accelerator.is_main_process:
accelerator.save_state(folder)``), and scripts do. A checkpoint's commit is collective, so the processes first
agree, through the job's key-value store (torch.distributed's, which every process already has), on who takes
part: the main process opens save number *n*; each other process that calls ``save_state`` joins it, and one that
waits in ``wait_for_everyone()`` or reaches ``load_state`` or ``end_training`` instead declines it (it is not saving
now).
When every process joined, the save is the usual collective one. When some declined or have not come within
:data:`ALONE_AFTER_S` seconds, the main process saves alone, without waiting for anyone again: the checkpoint holds
its random states only (a resumed process without its own takes the main process's, with a warning), as in
Accelerate. A state that needs every process (sharded parameters, a streamed loader) is refused with a clear error
on the processes that took part instead, never a hang. A process that joins a save the main process has already
made alone is told so and goes on.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch.distributed as dist

from .errors import CheckpointError
from .storage.ranks import Ranks

logger = logging.getLogger(__name__)

ALONE_AFTER_S = 5.0
"""How long the main process waits for the others to join or decline a ``save_state`` before saving alone (they
decline at once from ``wait_for_everyone()``, ``load_state`` and ``end_training``)."""
_KEY = "trainkit/save_state/"
_POLL_S = 0.002
_DECLINE_POLL_S = 0.01


def _store() -> Any:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    return dist.distributed_c10d._get_default_store()


class SaveRendezvous:
    """One process's side of the agreement (see the module doc)."""

    def __init__(self) -> None:
        self._handled = 0
        """The last save number this process joined or declined."""

    def take_part(self, needs_everyone: str | None) -> Ranks | None:
        """Collective among the processes that call ``save_state``: the processes that write this save (every
        process, or the main process alone); None on a process that came after the main process saved alone.
        ``needs_everyone``: why the state cannot be written by one process (then missing processes are an error)."""
        store = _store()
        if store is None:
            return Ranks.everyone()
        if dist.get_rank() == 0:
            return self._open(store, needs_everyone)
        return self._join(store)

    def decline(self) -> None:
        """This process is not saving now (it waits in a barrier, loads or ends): any save the main process has
        opened goes on without it."""
        store = _store()
        if store is None or dist.get_rank() == 0:
            return
        opened = store.add(_KEY + "opened", 0)
        for number in range(self._handled + 1, opened + 1):
            if not store.check([f"{_KEY}{number}/decision"]):
                store.set(f"{_KEY}{number}/{dist.get_rank()}", "decline")
        self._handled = max(self._handled, opened)

    def barrier(self) -> None:
        """``wait_for_everyone()`` on a process other than the main one: while it waits, it declines every save the
        main process opens (the main process is then in ``save_state``, not in this barrier)."""
        work = dist.barrier(async_op=True)
        while not work.is_completed():
            self.decline()
            time.sleep(_DECLINE_POLL_S)
        work.wait()

    def _open(self, store: Any, needs_everyone: str | None) -> Ranks:
        number = store.add(_KEY + "opened", 1)
        self._handled = number
        others = range(1, dist.get_world_size())
        answers = _answers(store, number, others)
        absent = [rank for rank in others if answers.get(rank) != "join"]
        decision = "everyone" if not absent else "refused" if needs_everyone else "alone"
        store.set(f"{_KEY}{number}/decision", decision)
        if decision == "everyone":
            return Ranks.everyone()
        declined = [rank for rank in absent if answers.get(rank) == "decline"]
        missing = (f"process{'es' if len(absent) > 1 else ''} {', '.join(map(str, absent))} "
                   + ("did not call it (they went on to wait_for_everyone, load_state or end_training)"
                      if len(declined) == len(absent) else f"had not called it after {ALONE_AFTER_S:g} s"))
        if decision == "refused":
            raise CheckpointError(refusal(needs_everyone, missing))
        logger.warning("save_state was called on the main process only (%s): it saves alone, without waiting for "
                       "the others, and the checkpoint holds its random states only.", missing)
        return Ranks.alone(0)

    def _join(self, store: Any) -> Ranks | None:
        number = self._handled + 1
        while store.check([f"{_KEY}{number}/decision"]):  # made alone already, before this process came
            number += 1
        store.set(f"{_KEY}{number}/{dist.get_rank()}", "join")
        store.wait([f"{_KEY}{number}/decision"])
        self._handled = number
        decision = store.get(f"{_KEY}{number}/decision").decode()
        if decision == "everyone":
            return Ranks.everyone()
        if decision == "refused":
            raise CheckpointError(refusal(None, "the main process saw other processes missing"))
        logger.warning("save_state on process %d came after the main process had saved alone (it waited "
                       "%g s): this process's random states are not in that checkpoint.", dist.get_rank(),
                       ALONE_AFTER_S)
        return None


def _answers(store: Any, number: int, others: range) -> dict[int, str]:
    """The other processes' answers to save ``number`` ("join", "decline"), waiting up to :data:`ALONE_AFTER_S`."""
    answers: dict[int, str] = {}
    deadline = time.monotonic() + ALONE_AFTER_S
    while True:
        for rank in others:
            key = f"{_KEY}{number}/{rank}"
            if rank not in answers and store.check([key]):
                answers[rank] = store.get(key).decode()
        if len(answers) == len(others) or time.monotonic() > deadline:
            return answers
        time.sleep(_POLL_S)


def refusal(reason: str | None, missing: str) -> str:
    """The error of a save that needs every process when some do not take part."""
    why = f" ({reason})" if reason else ""
    return (f"save_state needs every process for this state{why}, but {missing}. Call accelerator.save_state(...) "
            "on every process (not under `if accelerator.is_main_process:`); nothing was saved.")
