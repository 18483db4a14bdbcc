"""Who takes part in a ``save_state``: every process, or the main process alone.

Accelerate lets a script save unsharded training from the main process only (``if accelerator.is_main_process:
accelerator.save_state(folder)``), and scripts do. A checkpoint's commit is collective, so the processes first
agree, through the job's key-value store (torch.distributed's, which every process already has), on who takes
part: the main process opens save number *n*; each other process that calls ``save_state`` joins it, and one that
goes past that point instead declines it: it issues a collective the main process has not (a step's gradient
all-reduce, ``wait_for_everyone()``, any torch.distributed call; a watcher thread answers for its loop), or reaches
``load_state`` or ``end_training``. When every process joined, the save is the usual collective one. When some declined or have not come within
:data:`ALONE_AFTER_S` seconds, the main process saves alone, without waiting for anyone again: the checkpoint holds
its random states only (a resumed process without its own takes the main process's, with a warning), as in
Accelerate. A state that needs every process (sharded parameters, a streamed loader) is refused with a clear error
on the processes that took part instead, never a hang. A process that joins a save the main process has already
made alone is told so and goes on.
"""

from __future__ import annotations

import atexit
import datetime
import logging
import threading
import time
from typing import Any

import torch.distributed as dist

from .errors import CheckpointError
from .storage.ranks import Ranks

logger = logging.getLogger(__name__)

ALONE_AFTER_S = 5.0
"""How long the main process waits for the others to join or decline a ``save_state`` before saving alone (they
decline as soon as their loop issues its next collective, or reaches ``load_state`` or ``end_training``)."""
_KEY = "trainkit/save_state/"
_POLL_S = 0.002
_WATCH_TIMEOUT = datetime.timedelta(seconds=0.5)
_WATCH_POLL_S = 0.05
"""How often the watcher looks whether the main process opened a save."""


def _base_store() -> Any:
    """torch.distributed's key-value store (its TCPStore, under the process group's prefix), or None."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    store = dist.distributed_c10d._get_default_store()
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store


class SaveRendezvous:
    """One process's side of the agreement (see the module doc).

    On the other processes a watcher thread (with its own connection to the store) answers for the loop: the main
    process opens a save with the number of collectives it has issued on the default process group; once this
    process's loop has issued more (a step's gradient all-reduce, a barrier, any torch.distributed call), it went
    past that point without calling ``save_state``, and the watcher declines at once. Until then (the loop is
    computing, or about to call ``save_state``) it waits: the answer depends on what the loop does, never on timing."""

    def __init__(self) -> None:
        self._handled = 0
        """The last save number this process joined or declined."""
        self._lock = threading.Lock()
        self._watching: bool | None = None
        self._watcher: threading.Thread | None = None
        self._stop = threading.Event()

    def __getstate__(self) -> dict[str, Any]:
        """Pickled with its Accelerator: the count only (no lock, thread or connection)."""
        return {"_handled": self._handled}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]  # a fresh lock and thread after unpickling
        self._handled = state["_handled"]

    def watch(self) -> None:
        """On a process other than the main one: start the watcher (once; cheap after). Called when objects are
        prepared and at barriers, before any save can be opened."""
        if self._watching is None:
            self._start_watching()

    def take_part(self, needs_everyone: str | None) -> Ranks | None:
        """Collective among the processes that call ``save_state``: the processes that write this save (every
        process, or the main process alone); None on a process that came after the main process saved alone.
        ``needs_everyone``: why the state cannot be written by one process (then missing processes are an error)."""
        store = _base_store()
        if store is None:
            return Ranks.everyone()
        if dist.get_rank() == 0:
            return self._open(store, needs_everyone)
        return self._join(store)

    def decline(self) -> None:
        """This process is not saving now (it loads or ends): any save the main process has opened goes on
        without it."""
        store = _base_store()
        if store is None or dist.get_rank() == 0:
            return
        opened = store.add(_KEY + "opened", 0)
        with self._lock:
            for number in range(self._handled + 1, opened + 1):
                if not store.check([f"{_KEY}{number}/decision"]):
                    store.set(f"{_KEY}{number}/{dist.get_rank()}", "decline")
            self._handled = max(self._handled, opened)

    # -- the watcher (processes other than the main one) ----------------------------------------------------------
    def _start_watching(self) -> None:
        store = _base_store()
        self._watching = False
        if store is None or dist.get_rank() == 0 or not hasattr(store, "host"):
            return
        try:
            client = dist.TCPStore(store.host, store.port, is_master=False, timeout=_WATCH_TIMEOUT,
                                   wait_for_workers=False)
        except (RuntimeError, ValueError) as error:  # saves then fall back to the main process's wait
            logger.debug("No watcher for main-process-only saves: %s", error)
            return
        self._watching = True
        self._watcher = threading.Thread(target=self._watch, args=(client, dist.get_rank()),
                                         name="trainkit-save-rendezvous", daemon=True)
        self._watcher.start()
        atexit.register(self._stop_watching)

    def _stop_watching(self) -> None:
        """At exit: end the watcher while the interpreter still runs (a thread caught inside the store's C++ code
        by the interpreter's shutdown would abort the process)."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)

    def _watch(self, client: Any, rank: int) -> None:
        while not self._stop.is_set():
            with self._lock:
                number = self._handled + 1
            try:
                # check, not wait: a store wait that times out makes torch log a warning each time
                if not client.check([f"{_KEY}{number}/opened"]):
                    self._stop.wait(_WATCH_POLL_S)
                    continue
                opened_at = int(client.get(f"{_KEY}{number}/opened"))
            except Exception:  # the job ending: look again (the loop ends when the watcher is stopped)
                self._stop.wait(_WATCH_POLL_S)
                continue
            while not self._stop.is_set():
                with self._lock:
                    if self._handled >= number:
                        break  # this process's loop joined (or declined) it
                    issued = _collectives_issued()
                    if opened_at >= 0 and issued is not None and issued > opened_at:
                        # The loop went past the point where the main process opened the save: it is not coming.
                        client.set(f"{_KEY}{number}/{rank}", "decline")
                        self._handled = number
                        break
                time.sleep(_POLL_S)

    # -- the main process opens a save, the others join it ------------------------------------------------------
    def _open(self, store: Any, needs_everyone: str | None) -> Ranks:
        number = store.add(_KEY + "opened", 1)
        issued = _collectives_issued()
        store.set(f"{_KEY}{number}/opened", str(-1 if issued is None else issued))
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
                   + ("did not call it (they went on to another collective: a step, a barrier, a load or the end)"
                      if len(declined) == len(absent) else f"had not called it after {ALONE_AFTER_S:g} s"))
        if decision == "refused":
            raise CheckpointError(refusal(needs_everyone, missing))
        logger.warning("save_state was called on the main process only (%s): it saves alone, without waiting for "
                       "the others, and the checkpoint holds its random states only.", missing)
        return Ranks.alone(0)

    def _join(self, store: Any) -> Ranks | None:
        with self._lock:
            number = self._handled + 1
            while store.check([f"{_KEY}{number}/decision"]):  # made alone already, before this process came
                number += 1
            store.set(f"{_KEY}{number}/{dist.get_rank()}", "join")
            self._handled = number
        store.wait([f"{_KEY}{number}/decision"])
        decision = store.get(f"{_KEY}{number}/decision").decode()
        if decision == "everyone":
            return Ranks.everyone()
        if decision == "refused":
            raise CheckpointError(refusal(None, "the main process saw other processes missing"))
        logger.warning("save_state on process %d came after the main process had saved alone (it waited "
                       "%g s): this process's random states are not in that checkpoint.", dist.get_rank(),
                       ALONE_AFTER_S)
        return None


def _collectives_issued() -> int | None:
    """How many collectives this process has issued on the default process group (torch counts them per group);
    None where the backend does not say."""
    try:
        counter = getattr(dist.distributed_c10d._get_default_group(), "_get_sequence_number_for_group", None)
        return None if counter is None else int(counter())
    except (RuntimeError, ValueError):
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
